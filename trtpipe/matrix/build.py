"""`build_matrix`: plan every cell on the head, decide what needs no task, send the rest to Ray, report.

On the head, before anything is scheduled:
  - a cell the rules refuse is refused (its positioned one-line reason);
  - a cell whose every stage is in the shared store is a hit, decided from the store (the registry's
    manifests): no task goes to any node, and a build record says so;
  - a planning-only cell (model.config, no weights) is planned: the runner's dry run renders what a GPU
    node would run;
  - a stage key several cells share is built once: the first cell that needs it builds it, the others
    wait for that cell and reuse it;
  - every task's request is compared with the nodes: a cell no node can run is refused at once, naming
    what it needs (or, with `wait_for_nodes`, given the pending timeout for an autoscaler to add one).
Then the tasks run (`trtpipe.matrix.schedule`), and every cell that ran gets a build record in the head's
workspace, as a single build would (its spec path is `MATRIX#CELL`). A dry run sends every cell that is not
refused, so it shows where each would run and what it would run there.
"""

from __future__ import annotations

import tempfile
import time
from datetime import datetime, timezone
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trtpipe import build_record
from trtpipe.errors import Interrupted
from trtpipe.matrix.cluster import RayCluster
from trtpipe.matrix.plan import MatrixPlan, PlannedCell, plan_matrix
from trtpipe.matrix.progress import LiveTable
from trtpipe.matrix.report import Attempt, CellResult, MatrixReport
from trtpipe.matrix.schedule import Scheduler, Task, nodes_summary, placeable
from trtpipe.matrix.worker import CellJob
from trtpipe.pipeline import BuildReport, StageReport, run_build
from trtpipe.settings import Settings
from trtpipe.shipped import build_configs_dir
from trtpipe.store.local import Store

DEFAULT_RETRIES = 2
DEFAULT_PENDING_TIMEOUT_S = 600.0
STAGE_FIELDS = ("name", "outcome", "key", "digest", "detail", "executor", "command", "container")


class MatrixInterrupted(KeyboardInterrupt):
    """Ctrl-C during a matrix build; `report` says what finished and what was cancelled."""

    def __init__(self, report: MatrixReport) -> None:
        self.report = report
        super().__init__("matrix build interrupted")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _spec_path(plan: MatrixPlan, cell: str) -> str:
    return f"{plan.file}#{cell}"


def _stages(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: s[k] for k in STAGE_FIELDS if s.get(k) is not None} for s in stages]


# ------------------------------------------------------------------------------------------- on the head


def _head_hit(plan: MatrixPlan, item: PlannedCell, store: Store, remote: Any) -> CellResult:
    """A cell whose every stage is shared: decided here, recorded as a build whose stages were all hits."""
    where = f"in the shared store {remote}" if remote is not None else f"in the store {store.root}"
    stages = [StageReport(name=s.name, outcome="hit", key=s.key, digest=s.digest, detail=f"{where}; decided on the head")
              for s in item.plan.stages]
    report = BuildReport(spec_path=_spec_path(plan, item.cell.name), name=item.cell.name, target=item.plan.gpu,
                         toolchain=item.plan.toolchain, backend=item.plan.backend, stages=stages,
                         keys={s.name: s.key for s in item.plan.stages},
                         artifacts={s.kind: s.digest for s in item.plan.stages if s.digest},
                         store=str(store.root), remote=str(remote) if remote is not None else None)
    record = build_record.make_record(report=report, resolved=item.resolved, memory_plan=item.memory_plan,
                                      started_at=_now())
    path = build_record.write_record(store.root, record)
    return CellResult(cell=item.cell.name, outcome="hit", where="head", detail=f"every stage {where}",
                      keys=dict(report.keys), artifacts=dict(report.artifacts), record_path=str(path),
                      stages=_stages([s.model_dump(mode="json") for s in stages]))


def _head_dry_run(item: PlannedCell, store: Store, remote: Any, settings: Settings) -> CellResult:
    """A planning-only cell: the runner's dry run on the head (keys where it can, the commands it would run)."""
    with tempfile.TemporaryDirectory(prefix="trtpipe-matrix-") as folder:
        spec_path = Path(folder) / f"{item.cell.name}.yaml"
        spec_path.write_text(yaml.safe_dump(item.cell.data, sort_keys=False), encoding="utf-8")
        report = run_build(spec_path, dry_run=True, store=store, remote=remote, progress=False, settings=settings)
    return CellResult(cell=item.cell.name, outcome="planned", where="head", detail=item.plan.reason,
                      keys=dict(report.keys), stages=_stages([s.model_dump(mode="json") for s in report.stages]))


# ------------------------------------------------------------------------------------------- tasks


def _tasks(plan: MatrixPlan, planned: list[PlannedCell], store: Store, remote: Any, dry_run: bool) -> list[Task]:
    sendable = {"build", "hit", "planned"} if dry_run else {"build"}
    tasks: dict[str, Task] = {}
    for item in planned:
        cell = item.plan
        if cell.status not in sendable or item.request is None:
            continue
        job = CellJob(task=cell.cell, attempt=1, spec_name=cell.cell,
                      spec_yaml=yaml.safe_dump(item.cell.data, sort_keys=False),
                      store_dir=None if remote is not None else str(store.root),
                      remote_url=str(remote) if remote is not None else None, dry_run=dry_run,
                      expected_keys=dict(cell.keys))
        tasks[cell.cell] = Task(name=cell.cell, job=job, request=item.request,
                                waits_for=[] if dry_run else list(cell.waits_for), missing=set(cell.missing),
                                stage_keys={s.name: s.key for s in cell.stages})
    return list(tasks.values())


def _attempts_text(attempts: list[Attempt]) -> str | None:
    lost = [a for a in attempts if a.outcome == "lost"]
    if not lost:
        return None
    said = "; ".join(f"attempt {a.attempt} on {a.host or '?'} {(a.node_id or '?')[:8]} lost ({a.detail})" for a in lost)
    last = attempts[-1]
    if last.outcome in ("ok", "dry-run"):
        said += f"; retried: attempt {last.attempt} finished on {last.host} {(last.node_id or '?')[:8]}"
    return said


def _task_result(task: Task) -> CellResult:
    result = task.result
    retried = _attempts_text(task.attempts)
    common: dict[str, Any] = {"cell": task.name, "node_id": task.node_id, "host": task.host,
                              "attempts": list(task.attempts), "where": "worker" if task.attempts else "head"}
    if result is not None:
        common["seconds"] = round(result.seconds, 6)
        if task.submitted_wall is not None:
            common["queued_seconds"] = round(max(0.0, result.started_at - task.submitted_wall), 6)
        if task.submitted is not None and task.finished is not None:
            common["overhead_seconds"] = round(max(0.0, task.finished - task.submitted - result.seconds), 6)
    if task.outcome in ("ok", "dry-run") and result is not None and result.report is not None:
        report = result.report
        built = any(s.get("outcome") == "built" for s in report.get("stages", []))
        outcome = "planned" if task.outcome == "dry-run" else ("built" if built else "hit")
        detail = "; ".join([*([retried] if retried else []), *result.shared]) or None
        return CellResult(**common, outcome=outcome, detail=detail, keys=report.get("keys", {}),
                          artifacts=report.get("artifacts", {}), stages=_stages(report.get("stages", [])))
    outcome = task.outcome if task.outcome in ("refused", "cancelled") else "failed"
    detail = "; ".join(d for d in (task.detail, retried) if d) or outcome
    stages = _stages(result.stages) if result is not None else []
    return CellResult(**common, outcome=outcome, detail=detail, stages=stages)


def _record_task(plan: MatrixPlan, task: Task, result: CellResult, store: Store, item: PlannedCell) -> None:
    """A build record for a cell that ran: the worker's, copied into the head's workspace, or one the head
    writes for a cell whose worker could write none (lost every time, or not run because an input failed)."""
    if task.job.dry_run or task.outcome in ("refused", "cancelled"):
        return
    worker_record = task.result.record if task.result is not None else None
    if worker_record is not None:
        record = build_record.BuildRecord.model_validate(worker_record)
        record = record.model_copy(update={"spec_path": _spec_path(plan, task.name)})
    else:
        report = BuildReport(spec_path=_spec_path(plan, task.name), name=task.name, target=item.plan.gpu,
                             toolchain=item.plan.toolchain, backend=item.plan.backend, status="failed",
                             error=result.detail)
        record = build_record.make_record(report=report, resolved=item.resolved, memory_plan=item.memory_plan,
                                          started_at=_now())
    result.record_path = str(build_record.write_record(store.root, record))


# ------------------------------------------------------------------------------------------- the build


def build_matrix(
    matrix_path: Path | str,
    *,
    store: Store,
    remote: Any = None,
    ray_address: str | None = None,
    dry_run: bool = False,
    retries: int = DEFAULT_RETRIES,
    pending_timeout: float = DEFAULT_PENDING_TIMEOUT_S,
    wait_for_nodes: bool = False,
    progress: bool = True,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    settings: Settings,
) -> MatrixReport:
    """Build every cell of a matrix file on Ray (see the module doc). Raises MatrixInterrupted on Ctrl-C.

    `store`: the head's workspace store (records; the shared store itself when `remote` is None, so a
    cluster without a remote cache must see it at the same path on every node); `remote`: the shared
    remote cache; `ray_address`: an existing cluster (None: an embedded local Ray instance); `on_event`: told
    each progress event a worker posts ({task, attempt, event: started|stage, node_id, host, stage ...});
    `settings`: the head's (`trtpipe.settings.Settings`, for its own dry runs; a worker reads its node's)."""
    started = time.monotonic()
    plan, planned = plan_matrix(matrix_path, store, remote, configs=build_configs_dir(settings))
    report = MatrixReport(matrix=plan.matrix, file=plan.file, store=plan.store, remote=plan.remote, dry_run=dry_run,
                          decide_seconds=round(time.monotonic() - started, 6))
    by_cell = {item.cell.name: item for item in planned}
    results: dict[str, CellResult] = {}
    for item in planned:
        cell = item.plan
        if cell.status == "refused":
            results[cell.cell] = CellResult(cell=cell.cell, outcome="refused", where="head", detail=cell.reason)
        elif not dry_run and cell.status == "hit":
            results[cell.cell] = _head_hit(plan, item, store, remote)
        elif not dry_run and cell.status == "planned":
            results[cell.cell] = _head_dry_run(item, store, remote, settings)
    tasks = _tasks(plan, planned, store, remote, dry_run)
    interrupted = False
    if tasks:
        table = LiveTable(progress)
        for task in tasks:
            table.add(task.name)
        with RayCluster(ray_address) as cluster:
            report.ray = cluster.where
            nodes = cluster.nodes()
            runnable = []
            for task in tasks:
                if placeable(task.request, nodes) is None and not wait_for_nodes:
                    task.state, task.outcome = "done", "refused"
                    task.detail = (f"needs {task.request.describe()}; no node of the cluster has that, so Ray "
                                   f"would leave it pending forever (nodes: {nodes_summary(nodes)})")
                    table.update(task.name, state="refused")
                else:
                    runnable.append(task)
            scheduler = Scheduler(cluster, tasks, retries=retries, pending_timeout=pending_timeout,
                                  wait_for_nodes=wait_for_nodes, table=table, on_event=on_event)
            try:
                with table:
                    if runnable:
                        scheduler.run()
            except KeyboardInterrupt:
                interrupted = True
            report.tasks = scheduler.submitted
        for task in tasks:
            results[task.name] = _task_result(task)
            _record_task(plan, task, results[task.name], store, by_cell[task.name])
    for item in planned:
        result = results[item.cell.name]
        result.waits_for = list(item.plan.waits_for)
        if not result.keys:
            result.keys = dict(item.plan.keys)
    report.cells = [results[item.cell.name] for item in planned]
    report.seconds = round(time.monotonic() - started, 6)
    if interrupted:
        report.status = "interrupted"
        finished = [f"{c.cell} ({c.outcome})" for c in report.cells if c.outcome != "cancelled"]
        report.message = ("interrupted: every task still out was cancelled; nothing partial is in the shared store "
                          "(an artifact is named only after all its files are there); finished: "
                          + (", ".join(finished) or "none"))
        raise MatrixInterrupted(report)
    report.status = "ok" if report.exit_code == 0 else "failed"
    return report


def interrupted_error(report: MatrixReport) -> Interrupted:
    """The CLI's one line for a Ctrl-C, naming what finished."""
    kept = [f"{c.cell} {c.repository}" for c in report.cells if c.repository]
    return Interrupted(report.message or "interrupted", kept=kept)


__all__ = ["DEFAULT_PENDING_TIMEOUT_S", "DEFAULT_RETRIES", "MatrixInterrupted", "build_matrix", "interrupted_error"]
