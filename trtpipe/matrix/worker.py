"""What a worker runs for one cell: the normal pipeline on the cell's spec, with the shared store.

The head sends a `CellJob` (the cell's spec as YAML text, where the shared store is); the worker writes the
spec into a private temporary folder and runs `trtpipe.pipeline.run_build` on it, exactly as `trtpipe build`
does. A task is a process entry on its node, as the CLI is on the head: `run_cell` reads that node's settings once
(its own TRTPIPE_HOME and registry credentials, which never travel in a job) and passes them down. With a remote
cache the worker's own workspace is its local store ($TRTPIPE_HOME on that node): a key
the remote holds is pulled (verified), a key it lacks is built and pushed, and a push writes every file
before the manifest and tags it last, so a worker lost mid-push leaves nothing the registry names. Without
one, the local store the head names is the shared store (a one-machine cluster, or a shared filesystem).

A stage this node already held (a local hit) is pushed when the remote lacks it: what a node holds alone
would otherwise never count as shared, and the head would send its cell out again on every run.

A failure is returned, never raised: the head decides about retries, and only a lost worker or node (which
Ray reports as such) is retried. The worker posts its progress (started, each step done) to the head's
board actor, and checks that it keys the cell as the head did: a node running another trtpipe, other
build_configs or other model bytes would otherwise build something the head did not plan.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

import trtpipe
from trtpipe.build_record import records_dir
from trtpipe.errors import TrtpipeError
from trtpipe.pipeline import BuildReport, StageReport, run_build
from trtpipe.settings import Settings, places
from trtpipe.stages import BACKEND_STAGES, weight_file_rule
from trtpipe.store.local import Store
from trtpipe.store.remote import open_remote


@dataclass(frozen=True)
class CellJob:
    """One task: a cell's spec and where its shared store is."""

    task: str  # the cell
    attempt: int
    spec_name: str
    spec_yaml: str
    store_dir: str | None  # the shared local store (no remote)
    remote_url: str | None  # the shared remote cache
    dry_run: bool = False
    expected_keys: dict[str, str] = field(default_factory=dict)  # stage -> the key the head computed
    trtpipe_version: str = trtpipe.__version__


class WorkerResult(BaseModel):
    """What a worker sends back for one attempt."""

    task: str
    attempt: int
    node_id: str | None = None
    host: str
    pid: int
    status: Literal["ok", "failed", "dry-run"]
    error: str | None = None
    exit_code: int = 0
    report: dict[str, Any] | None = Field(default=None, description="The run's BuildReport (ok or dry-run).")
    record: dict[str, Any] | None = Field(default=None, description="The build record the run wrote.")
    stages: list[dict[str, Any]] = Field(default_factory=list, description="Each step's report, in order.")
    shared: list[str] = Field(default_factory=list, description="Local hits this worker pushed to the remote.")
    started_at: float = 0.0
    seconds: float = 0.0


def _post(board: Any, event: dict[str, Any]) -> None:
    """Tell the head's board (best effort: progress never fails a build)."""
    if board is None:
        return
    try:
        board.post.remote(event)
    except Exception:  # the board is gone (the head stopped): the result still goes back through Ray
        pass


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # run outside Ray (tests of this module call it directly)
        return None


def _stores(job: CellJob, settings: Settings) -> tuple[Store, Any]:
    if job.remote_url is None:
        assert job.store_dir is not None
        return Store.open(job.store_dir), None
    root, _ = places(None, settings)
    return Store.open(root), open_remote(job.remote_url, settings, weight_file_rule())


def _record_of(store_root: Path, spec_path: Path, since: float) -> dict[str, Any] | None:
    """The build record this run wrote (its spec path is this task's private file)."""
    folder = records_dir(store_root)
    for path in sorted(folder.glob("*.json"), reverse=True):
        try:
            if path.stat().st_mtime < since - 2:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("spec_path") == str(spec_path):
            return data
    return None


def share_local_hits(report: BuildReport, store: Store, remote: Any) -> list[str]:
    """Push each stage the run found in this node's store that the remote lacks; returns one note per push
    (or per failed push: the build stands, the next run pushes again)."""
    kinds = {stage.name: stage.kind for backend in BACKEND_STAGES.values() for stage in backend.stages}
    notes = []
    for stage in report.stages:
        if stage.outcome != "hit" or stage.key is None or stage.name not in kinds:
            continue
        kind = kinds[stage.name]
        try:
            if remote.find(kind, stage.key) is not None:
                continue
            entry = store.peek(kind, stage.key)
            if entry is None:
                continue
            remote.push(entry)
            notes.append(f"{stage.name}: this node held it and {remote} did not; pushed")
        except TrtpipeError as err:
            notes.append(f"{stage.name}: could not push it to {remote}: {err.one_line()}")
    return notes


def _key_mismatch(job: CellJob, keys: dict[str, str], node: str | None) -> str | None:
    for stage, expected in job.expected_keys.items():
        got = keys.get(stage)
        if got is not None and got != expected:
            return (f"node {node or socket.gethostname()} keyed the {stage} {got}, the head {expected}: it runs "
                    "another trtpipe, other build_configs or sees other model bytes; install the same trtpipe "
                    "on every node and give them the same model files")
    return None


def run_cell(job: CellJob, board: Any = None) -> dict[str, Any]:
    """Run one cell's build (or dry run) here; returns a WorkerResult as a dict (what Ray sends back).

    The Ray task's entry point: like the CLI on the head, it reads this node's settings once."""
    settings = Settings.from_env()
    started = time.time()
    node = _node_id()
    base = {"task": job.task, "attempt": job.attempt, "node_id": node, "host": socket.gethostname()}
    _post(board, {**base, "event": "started", "at": started})
    result = WorkerResult(**base, pid=os.getpid(), status="failed", started_at=started)
    stages: list[dict[str, Any]] = []

    def on_stage(report: StageReport) -> None:
        stages.append(report.model_dump(mode="json"))
        _post(board, {**base, "event": "stage", "stage": report.name, "outcome": report.outcome, "at": time.time()})

    if job.trtpipe_version != trtpipe.__version__:
        result.error = (f"node {node or base['host']} runs trtpipe {trtpipe.__version__}, the head "
                        f"{job.trtpipe_version}; install the same trtpipe on every node")
        result.exit_code = 2
    else:
        with tempfile.TemporaryDirectory(prefix="trtpipe-cell-") as folder:
            spec_path = Path(folder) / f"{job.spec_name}.yaml"
            spec_path.write_text(job.spec_yaml, encoding="utf-8")
            store: Store | None = None
            try:
                store, remote = _stores(job, settings)
                report = run_build(spec_path, store=store, remote=remote, dry_run=job.dry_run, progress=False,
                                   on_stage=on_stage, settings=settings)
                result.report = report.model_dump(mode="json")
                result.status = "dry-run" if job.dry_run else "ok"
                mismatch = _key_mismatch(job, dict(report.keys), node)
                if mismatch:
                    result.status, result.error, result.exit_code = "failed", mismatch, 1
                elif remote is not None and not job.dry_run:
                    result.shared = share_local_hits(report, store, remote)
            except TrtpipeError as err:
                result.error, result.exit_code = err.one_line(), err.exit_code
            except Exception as err:  # a bug: say it in one line here, the traceback goes to the worker's log
                traceback.print_exc()
                result.error, result.exit_code = f"internal error: {type(err).__name__}: {err}", 1
            if store is not None and not job.dry_run:
                result.record = _record_of(store.root, spec_path, started)
    result.stages = stages
    result.seconds = time.time() - started
    return result.model_dump(mode="json")

