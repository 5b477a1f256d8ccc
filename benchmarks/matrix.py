"""Benchmark of build matrices on the local Ray cluster. Prints one JSON object.

1. An N-cell matrix of tiny cpu-reference builds (Llama and Qwen2 x none/fp8/int4_awq: N = 6) built by
   `trtpipe matrix build` on the embedded local Ray, against the same builds run one by one, in the same
   run, each from an empty store: (a) `trtpipe build CELL.yaml` per cell, a fresh process each (what a CI
   job without the matrix runs), (b) `run_build` per cell in one warm process (the strictest baseline:
   imports paid once, nothing scheduled). The matrix wall time is given with and without starting Ray.
2. Scheduler overhead per cell, from the same matrix run: dispatch (submitted -> the worker starts, for
   the cells that found a free CPU slot, so no queueing is in it) and return (the worker ends -> the head
   has the result), next to each cell's own run time.
3. Deciding an all-hit matrix of 50 cells (one tiny model x 50 engine profiles, built first by the
   matrix itself): `trtpipe matrix build` the second time decides every cell on the head and sends no
   task. Against the shared store as a local folder and as an OCI registry (Debian's docker-registry on
   127.0.0.1), with the same 50 warm builds run one by one in-process (`run_build`, every stage a hit)
   as the baseline.

Usage: .venv/bin/python benchmarks/matrix.py [--workdir DIR]   (about 5 minutes on 2 cores)
Needs ray (the matrix extra) and, for the registry figures, the docker-registry binary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml
from trtpipe.settings import Settings

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LIMITS = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128}


def _matrix_text(models: dict[str, Path], quantizations: list[Any], profiles: list[Any] | None = None) -> str:
    data: dict[str, Any] = {
        "name": "bench",
        "base": {"engine": dict(LIMITS)},
        "axes": {
            "models": [{"label": label, "path": str(path), "dtype": "float16"} for label, path in models.items()],
            "targets": ["cpu-reference"],
            "quantizations": quantizations,
        },
    }
    if profiles:
        data["axes"]["profiles"] = profiles
    return yaml.safe_dump(data, sort_keys=False)


def _cell_specs(matrix: Path, folder: Path) -> list[Path]:
    from trtpipe.matrix.expand import expand
    from trtpipe.matrix.loader import load_matrix

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for cell in expand(load_matrix(matrix)):
        path = folder / f"{cell.name}.yaml"
        path.write_text(yaml.safe_dump(cell.data, sort_keys=False))
        paths.append(path)
    return paths


def _cli_build(spec: Path, home: Path) -> float:
    env = dict(os.environ, TRTPIPE_HOME=str(home), PYTHONPATH=str(REPO))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "build", str(spec), "--json"], env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"trtpipe build {spec} failed: {done.stderr[-2000:]}")
    return elapsed


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"median": round(statistics.median(values), 4), "mean": round(statistics.fmean(values), 4),
            "max": round(max(values), 4), "n": len(values)}


@contextmanager
def _registry(work: Path) -> Iterator[str | None]:
    """docker-registry on 127.0.0.1 without auth (a benchmark, not a test of credentials); None if absent."""
    binary = shutil.which("docker-registry")
    if binary is None:
        yield None
        return
    import requests

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (work / "registry").mkdir()
    config = work / "registry.yml"
    config.write_text("\n".join([
        "version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:",
        f"    rootdirectory: {work / 'registry'}", "http:", f"  addr: 127.0.0.1:{port}", "  secret: bench",
        "  draintimeout: 5s", ""]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("docker-registry did not start")
            time.sleep(0.05)
        yield f"oci://127.0.0.1:{port}/bench/cache"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_matrix_vs_one_by_one(work: Path, models: dict[str, Path]) -> dict[str, Any]:
    import ray

    from trtpipe.matrix.build import build_matrix
    from trtpipe.pipeline import run_build
    from trtpipe.store.local import Store

    matrix = work / "six.yaml"
    matrix.write_text(_matrix_text(models, ["none", "fp8", "int4_awq"]))
    specs = _cell_specs(matrix, work / "six-cells")

    cli = [_cli_build(spec, work / "one-by-one-cli") for spec in specs]

    store = Store.open(work / "one-by-one-in-process")
    in_process = []
    for spec in specs:
        started = time.perf_counter()
        run_build(spec, store=store, progress=False, settings=Settings.from_env())
        in_process.append(time.perf_counter() - started)
    store.close()

    started = time.perf_counter()
    ray.init(address="local", object_store_memory=200 * 1024 * 1024, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", namespace="trtpipe")
    ray_start = time.perf_counter() - started
    cpus = ray.cluster_resources().get("CPU", 0)
    store = Store.open(work / "matrix-store")
    started = time.perf_counter()
    report = build_matrix(matrix, store=store, progress=False, settings=Settings.from_env())
    matrix_wall = time.perf_counter() - started
    store.close()
    ray.shutdown()
    assert report.counts["built"] == len(specs), report.model_dump_json(indent=1)

    cells = report.cells
    first = sorted(cells, key=lambda c: c.queued_seconds or 0.0)[: int(cpus)]  # found a free slot at once
    dispatch = [c.queued_seconds for c in first if c.queued_seconds is not None]
    returned = [c.overhead_seconds - c.queued_seconds for c in cells
                if c.overhead_seconds is not None and c.queued_seconds is not None]
    return {
        "cells": len(specs),
        "ray_cpus": cpus,
        "one_by_one_cli_s": {"sum": round(sum(cli), 3), "per_cell": [round(x, 3) for x in cli]},
        "one_by_one_in_process_s": {"sum": round(sum(in_process), 3), "per_cell": [round(x, 3) for x in in_process]},
        "embedded_ray_start_s": round(ray_start, 3),
        "matrix_wall_s": round(matrix_wall, 3),
        "matrix_wall_with_ray_start_s": round(matrix_wall + ray_start, 3),
        "matrix_decide_s": round(report.decide_seconds, 4),
        "matrix_vs_cli_sum": round((matrix_wall + ray_start) / sum(cli), 3),
        "matrix_vs_in_process_sum": round((matrix_wall + ray_start) / sum(in_process), 3),
        "worker_run_s": _stats([c.seconds for c in cells if c.seconds is not None]),
        "scheduler_overhead_per_cell_s": {
            "dispatch_free_slot": _stats(dispatch),
            "return": _stats(returned),
        },
    }


def bench_all_hit_50(work: Path, llama: Path, remote_url: str | None, label: str) -> dict[str, Any]:
    import ray

    from trtpipe.matrix.build import build_matrix
    from trtpipe.pipeline import run_build
    from trtpipe.settings import Settings
    from trtpipe.store.local import Store
    from trtpipe.store.remote import open_remote

    profiles = [{"label": f"b{n}", "max_batch_size": n} for n in range(1, 51)]
    folder = work / f"fifty-{label}"
    folder.mkdir()
    matrix = folder / "fifty.yaml"
    matrix.write_text(_matrix_text({"llama": llama}, ["none"], profiles))
    remote = open_remote(remote_url, Settings()) if remote_url else None

    store = Store.open(folder / "head")
    ray.init(address="local", object_store_memory=200 * 1024 * 1024, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", namespace="trtpipe")
    started = time.perf_counter()
    first = build_matrix(matrix, store=store, remote=remote, progress=False, settings=Settings.from_env())
    cold = time.perf_counter() - started
    ray.shutdown()
    assert first.counts["built"] == 50, first.model_dump_json(indent=1)

    # The second run, from a fresh head (with a registry) or the same store (a folder): all hits.
    head = Store.open(folder / "head-2") if remote is not None else store
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        again = build_matrix(matrix, store=head, remote=remote, progress=False, settings=Settings.from_env())
        runs.append((time.perf_counter() - started, again.decide_seconds))
        assert again.counts["hit"] == 50 and again.tasks == 0 and again.ray is None
    head.close()

    # Baseline: the same 50 builds one by one in one warm process, every stage a hit in a local store.
    specs = _cell_specs(matrix, folder / "cells")
    local = Store.open(folder / "head") if remote is None else Store.open(folder / "baseline")
    if remote is not None:
        for spec in specs:  # fill the baseline's store from the registry first (not timed)
            run_build(spec, store=local, remote=remote, progress=False, settings=Settings.from_env())
    started = time.perf_counter()
    for spec in specs:
        report = run_build(spec, store=local, progress=False, settings=Settings.from_env())
        assert all(s.outcome in ("ran", "hit") for s in report.stages)
    baseline = time.perf_counter() - started
    local.close()
    store.close()
    best = min(runs)
    return {
        "shared_store": label,
        "cells": 50,
        "first_build_s": round(cold, 3),
        "tasks_first_build": first.tasks,
        "all_hit_wall_s": round(best[0], 4),
        "all_hit_decide_s": round(best[1], 4),
        "all_hit_per_cell_ms": round(best[0] / 50 * 1000, 2),
        "one_by_one_warm_builds_s": round(baseline, 4),
        "all_hit_vs_one_by_one": round(best[0] / baseline, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the temporary work (made if missing)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="trtpipe-bench-matrix-", dir=args.workdir))
    os.environ["TRTPIPE_HOME"] = str(work / "home")
    try:
        from trtpipe.checkpoint.example_model import write_example_model

        models = {"llama": work / "tiny-llama", "qwen2": work / "tiny-qwen2"}
        for arch, path in (("llama", models["llama"]), ("qwen2", models["qwen2"])):
            write_example_model(path, arch=arch)
        time.sleep(2.1)  # let the files age past the digest cache's racy window, as real inputs are
        result: dict[str, Any] = {"host_cpus": os.cpu_count(), "load_average": os.getloadavg()}
        result["matrix_vs_one_by_one"] = bench_matrix_vs_one_by_one(work, models)
        result["all_hit_50"] = [bench_all_hit_50(work, models["llama"], None, "local folder")]
        with _registry(work) as url:
            if url is not None:
                result["all_hit_50"].append(bench_all_hit_50(work, models["llama"], url, "oci registry"))
            else:
                result["all_hit_50_registry"] = "skipped: docker-registry is not installed"
        result["load_average_after"] = os.getloadavg()
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
