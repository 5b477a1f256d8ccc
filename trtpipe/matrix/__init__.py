"""Build matrices: models x targets x precisions x profiles x toolchains, fanned out as Ray tasks.

    loader.py        the matrix file (base spec, axes, exclude, include), read with positions
    expand.py        its cells: one build spec each, positioned in the matrix file
    plan.py          on the head: every cell resolved, planned, keyed, looked up in the shared store; merging
    accelerators.py  what a cell asks Ray for (CPUs, GPUs = tp x pp, the catalog GPU's Ray accelerator type)
    cluster.py       the Ray connection (embedded local instance, or an existing cluster), nodes, progress board
    worker.py        what a worker runs for a cell: the normal pipeline with the shared store as remote cache
    schedule.py      the head's loop: dependencies, retries of lost workers, pending timeout, Ctrl-C
    build.py         build_matrix: decide on the head what needs no task, run the rest, records, report
    progress.py      the live progress table; report.py the results

Ray is the `matrix` extra and is imported only when there is a task to send.
"""
