"""The head's loop: send each task to Ray when the tasks it waits for are done, collect results, retry lost ones.

A task asks for what its cell needs (`trtpipe.matrix.accelerators.Request`) and is never retried by Ray
itself (`max_retries=0`): the head decides. A worker that returns a failure (a bad spec, a refused
conversion, a build error with its diagnosis) failed for a reason that would fail again, so it is
reported and not retried. A worker or node that dies (Ray raises NodeDiedError, WorkerCrashedError ...)
is retried on whichever node can run it, at most `retries` more times. A task no alive node can run (its
node died, or an autoscaler has not added one yet) is given `pending_timeout` seconds, then refused.
Ctrl-C cancels every task still out (force: their workers stop), and says what had finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from trtpipe.matrix.accelerators import Request
from trtpipe.matrix.cluster import Node, RayCluster
from trtpipe.matrix.progress import LiveTable
from trtpipe.matrix.report import Attempt
from trtpipe.matrix.worker import CellJob, WorkerResult, run_cell

# Ray's errors for a worker process or node that went away (python/ray/exceptions.py, ray 2.60.0).
LOST_ERRORS = ("NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError",
               "OutOfMemoryError", "ObjectReconstructionFailedError", "ObjectFetchTimedOutError")
NODE_REFRESH_S = 2.0
WAIT_S = 0.5


@dataclass
class Task:
    """One Ray task: a cell, its job and its request."""

    name: str
    job: CellJob
    request: Request
    waits_for: list[str] = field(default_factory=list)
    missing: set[tuple[str, str]] = field(default_factory=set)  # (kind, key) it needs that are not shared yet
    stage_keys: dict[str, str] = field(default_factory=dict)  # stage -> key (provisional ones included)
    state: str = "waiting"  # waiting, queued, running, done
    ref: Any = None
    attempts: list[Attempt] = field(default_factory=list)
    submitted: float | None = None  # time.monotonic() of the current attempt's submission
    submitted_wall: float | None = None
    started: float | None = None
    finished: float | None = None
    node_id: str | None = None
    host: str | None = None
    result: WorkerResult | None = None
    outcome: str | None = None  # ok, failed, dry-run, refused, cancelled
    detail: str | None = None
    unplaceable_since: float | None = None
    cancel_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"

    def failed_stage_key(self) -> tuple[str, str] | None:
        """(kind, key) of the stage its worker failed in, when that is known."""
        if self.result is None:
            return None
        failed = next((s for s in self.result.stages if s.get("outcome") == "failed"), None)
        if failed is None and self.result.record:
            failed = next((s for s in self.result.record.get("stages", []) if s.get("outcome") == "failed"), None)
        if failed is None:
            return None
        name = failed.get("name")
        key = self.stage_keys.get(str(name))
        kind = {"publish": "repository"}.get(str(name), str(name))
        return (kind, key) if key else None


def placeable(request: Request, nodes: list[Node]) -> str | None:
    """The accelerator type (or "" for CPU only) the request takes on some alive node; None when none fits."""
    for node in nodes:
        accelerator = request.accelerator_on(node.resources)
        if accelerator is not None:
            return accelerator
    return None


def nodes_summary(nodes: list[Node]) -> str:
    return "; ".join(node.describe() for node in nodes) or "no alive node"


def _short(node_id: str | None) -> str:
    return node_id[:8] if node_id else "?"


class Scheduler:
    def __init__(self, cluster: RayCluster, tasks: list[Task], *, retries: int, pending_timeout: float,
                 wait_for_nodes: bool, table: LiveTable,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cluster = cluster
        self.ray = cluster.ray
        self.tasks = tasks
        self.by_name = {task.name: task for task in tasks}
        self.retries = retries
        self.pending_timeout = pending_timeout
        self.wait_for_nodes = wait_for_nodes
        self.table = table
        self.on_event = on_event
        self.submitted = 0
        self.nodes: list[Node] = []
        self._nodes_at = 0.0
        self._remote: Any = None
        self._board: Any = None
        self._lost = tuple(getattr(self.ray.exceptions, name) for name in LOST_ERRORS
                           if hasattr(self.ray.exceptions, name))

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        self._remote = self.ray.remote(run_cell)
        self._board = self.cluster.board()
        self._refresh_nodes(force=True)
        try:
            while not all(task.done for task in self.tasks):
                self._submit_ready()
                out = {task.ref: task for task in self.tasks if task.ref is not None and not task.done}
                if out:
                    ready, _ = self.ray.wait(list(out), num_returns=1, timeout=WAIT_S)
                    if ready:
                        more, _ = self.ray.wait(list(out), num_returns=len(out), timeout=0)
                        ready = list(dict.fromkeys([*ready, *more]))
                    self._drain()  # what a finished task said before it finished: its node
                    for ref in ready:
                        self._finish(out[ref])
                elif not any(task.state == "waiting" for task in self.tasks):
                    break
                self._drain()
                self._refresh_nodes()
                self._check_unplaceable()
                self.table.refresh()
        except KeyboardInterrupt:
            self._cancel_all("interrupted (Ctrl-C)")
            raise
        finally:
            self._drain()
            self.table.refresh()

    # -- submitting -------------------------------------------------------------------------------
    def _submit_ready(self) -> None:
        for task in self.tasks:
            if task.state != "waiting":
                continue
            deps = [self.by_name[name] for name in task.waits_for if name in self.by_name]
            if not all(dep.done for dep in deps):
                continue
            blocked = self._blocked_by(task, deps)
            if blocked:
                self._end(task, "failed", blocked)
                continue
            accelerator = placeable(task.request, self.nodes)
            if accelerator is None:
                if not self.wait_for_nodes:
                    self._end(task, "refused", self._unplaceable_text(task))
                    continue
                accelerator = task.request.accelerators[0] if task.request.accelerators else ""
                task.unplaceable_since = time.monotonic()
            self._submit(task, accelerator)

    def _blocked_by(self, task: Task, deps: list[Task]) -> str | None:
        """Why the task cannot succeed: a cell it waited for failed to build a stage it needs."""
        for dep in deps:
            if dep.outcome != "failed":
                continue
            stage = dep.failed_stage_key()
            if stage is not None and stage in task.missing:
                return (f"not run: it needs {stage[0]} {stage[1]}, which cell {dep.name} failed to build: "
                        f"{dep.detail}")
        return None

    def _submit(self, task: Task, accelerator: str) -> None:
        job = replace(task.job, attempt=len(task.attempts) + 1)
        options = {**task.request.ray_options(accelerator), "max_retries": 0, "retry_exceptions": False,
                   "name": f"trtpipe-cell:{task.name}"}
        task.ref = self._remote.options(**options).remote(job, self._board)
        task.job = job
        task.state = "queued"
        task.submitted, task.submitted_wall = time.monotonic(), time.time()
        task.started = task.node_id = task.host = None
        self.submitted += 1
        self.table.update(task.name, state="queued" if job.attempt == 1 else "retrying", node="", stage="")

    # -- results ----------------------------------------------------------------------------------
    def _finish(self, task: Task) -> None:
        ray = self.ray
        attempt = task.job.attempt
        try:
            data = ray.get(task.ref)
        except ray.exceptions.TaskCancelledError:
            reason = task.cancel_reason or "cancelled"
            outcome = "refused" if task.cancel_reason and not task.cancel_reason.startswith("interrupted") else "cancelled"
            task.attempts.append(Attempt(attempt=attempt, node_id=task.node_id, host=task.host, outcome=outcome,
                                         detail=reason))
            self._end(task, outcome, reason)
            return
        except self._lost as err:
            what = type(err).__name__
            task.attempts.append(Attempt(attempt=attempt, node_id=task.node_id, host=task.host, outcome="lost",
                                         detail=f"{what}: the worker or its node went away"))
            if attempt <= self.retries:
                task.state, task.ref = "waiting", None
                self.table.update(task.name, state="retrying", node="", stage="")
                return
            self._end(task, "failed", f"lost {attempt} times (last: {what} on node {_short(task.node_id)}); "
                                      f"retries are bounded ({self.retries})")
            return
        except ray.exceptions.RayError as err:
            # The task itself raised (trtpipe missing on the node, a runtime-env failure): not a lost worker.
            text = " ".join(str(err).split())[:400]
            task.attempts.append(Attempt(attempt=attempt, node_id=task.node_id, host=task.host, outcome="failed",
                                         detail=text))
            self._end(task, "failed", f"the task failed on node {_short(task.node_id)}: {text}")
            return
        result = WorkerResult.model_validate(data)
        task.result = result
        task.node_id, task.host = result.node_id, result.host
        task.attempts.append(Attempt(attempt=attempt, node_id=result.node_id, host=result.host, outcome=result.status,
                                     detail=result.error))
        built = any(stage.get("outcome") == "built" for stage in result.stages)
        self._end(task, result.status, result.error, shown="built" if built else "hit")

    def _end(self, task: Task, outcome: str, detail: str | None, *, shown: str | None = None) -> None:
        task.state, task.outcome, task.detail = "done", outcome, detail
        task.finished = time.monotonic()
        if outcome != "ok" or shown is None:
            shown = {"dry-run": "planned"}.get(outcome, outcome)
        self.table.update(task.name, state=shown, stage="", finished=task.finished if task.started is not None else None)

    # -- progress and placement -------------------------------------------------------------------
    def _drain(self) -> None:
        if self._board is None:
            return
        try:
            events = self.ray.get(self._board.drain.remote(), timeout=10)
        except Exception:  # the board's node went away: progress stops, results still arrive
            return
        for event in events:
            if self.on_event is not None:
                self.on_event(event)
            task = self.by_name.get(str(event.get("task")))
            if task is None or event.get("attempt") != task.job.attempt or task.done:
                continue
            if event.get("event") == "started":
                task.state = "running"
                task.started = time.monotonic()
                task.node_id, task.host = event.get("node_id"), event.get("host")
                task.unplaceable_since = None
                self.table.update(task.name, state="running", node=f"{task.host} {_short(task.node_id)}",
                                  started=task.started, stage="resolve")
            elif event.get("event") == "stage":
                following = {"resolve": "plan", "plan": "checkpoint", "checkpoint": "engine", "engine": "publish"}
                self.table.update(task.name, stage=following.get(str(event.get("stage")), str(event.get("stage"))))

    def _refresh_nodes(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._nodes_at >= NODE_REFRESH_S:
            self.nodes = self.cluster.nodes()
            self._nodes_at = now

    def _unplaceable_text(self, task: Task, waited: float | None = None) -> str:
        waited_text = f" for {waited:.0f}s" if waited is not None else ""
        return (f"needs {task.request.describe()}; no alive node has that{waited_text} (nodes: "
                f"{nodes_summary(self.nodes)})")

    def _check_unplaceable(self) -> None:
        now = time.monotonic()
        for task in self.tasks:
            if task.state != "queued" or task.ref is None:
                continue
            if placeable(task.request, self.nodes) is not None:
                task.unplaceable_since = None
                continue
            if task.unplaceable_since is None:
                task.unplaceable_since = now
            elif now - task.unplaceable_since > self.pending_timeout and task.cancel_reason is None:
                task.cancel_reason = self._unplaceable_text(task, now - task.unplaceable_since)
                self.ray.cancel(task.ref, force=True)

    def _cancel_all(self, reason: str) -> None:
        for task in self.tasks:
            if task.done:
                continue
            if task.ref is not None:
                task.cancel_reason = reason
                try:
                    self.ray.cancel(task.ref, force=True)
                except Exception:  # already finished or its node is gone: nothing more to stop
                    pass
            task.attempts.append(Attempt(attempt=task.job.attempt, node_id=task.node_id, host=task.host,
                                         outcome="cancelled", detail=reason))
            self._end(task, "cancelled", reason)
