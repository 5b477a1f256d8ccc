"""Build records: what was built, where, when, by which host, with which versions, how long each stage took.

An artifact's digest covers its content only; everything about the build itself lives here and
points at the digests it produced (`artifacts`). Every `trtpipe build` (not a dry run) writes one
JSON record under `<store>/records/`, written to a temporary file and renamed into place.
`read_records` lists them newest first; `records_for_digest` finds the builds that produced an
artifact (`trtpipe cache verify --repair` rebuilds from the spec they recorded).
"""

from __future__ import annotations

import json
import platform
import socket
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from trtpipe.atomic import write_text_atomically
from trtpipe.versions import TENSORRT_DISTRIBUTIONS, TRTLLM_DISTRIBUTIONS, installed_versions

RECORD_VERSION = 1
# Installed distributions whose versions a record notes (looked up in metadata: nothing imported).
_RECORDED_PACKAGES: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in ("trtpipe", "torch", "transformers", "nvidia-modelopt", "safetensors",
                                  "tokenizers", "pydantic", "numpy")},
    "tensorrt-llm": TRTLLM_DISTRIBUTIONS,
    "tensorrt": TENSORRT_DISTRIBUTIONS,
}


class StageOutcome(BaseModel):
    name: str
    outcome: str
    seconds: float
    key: str | None = None
    digest: str | None = None
    detail: str | None = None
    facts: dict[str, Any] | None = None  # what building the stage reported: log path, converter summary, seconds


class BuildRecord(BaseModel):
    record_version: int = RECORD_VERSION
    id: str
    started_at: str
    finished_at: str
    status: str
    error: str | None = None
    message: str | None = None
    host: str
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    driver: str | None = None
    platform: str
    python: str
    versions: dict[str, str | None] = Field(default_factory=dict)
    toolchain: dict[str, Any] | None = None
    spec_path: str
    spec: dict[str, Any] | None = None
    model: str | None = None
    target: str | None = None
    keys: dict[str, str] = Field(default_factory=dict)
    artifacts: dict[str, str] = Field(default_factory=dict)
    repository_path: str | None = None
    stages: list[StageOutcome] = Field(default_factory=list)
    memory_plan: dict[str, Any] | None = None
    seconds: float = 0.0


def _host_gpus() -> tuple[list[dict[str, Any]], str | None]:
    try:
        from trtpipe.gpu import probe_host

        host = probe_host()
    except Exception:  # a record is best effort about the host; the build result stands regardless
        return [], None
    return [g.model_dump(mode="json") for g in host.gpus], host.driver_version


def make_record(*, report: Any, resolved: Any, memory_plan: dict[str, Any] | None, started_at: str) -> BuildRecord:
    spec = resolved.spec if resolved is not None else None
    return record_of(
        report=report,
        toolchain=resolved.toolchain.model_dump(mode="json") if resolved is not None else None,
        spec=spec.model_dump(mode="json") if spec is not None else None,
        memory_plan=memory_plan,
        started_at=started_at,
    )


def record_of(*, report: Any, toolchain: dict[str, Any] | None, spec: dict[str, Any] | None,
              memory_plan: dict[str, Any] | None, started_at: str,
              versions: dict[str, str | None] | None = None) -> BuildRecord:
    """The record of a build whose resolution is given as JSON (the warm path has no ResolvedSpec: it
    reuses the resolution and the installed versions its memo vouches for); the host and its GPUs are
    read now, and the versions too unless given."""
    gpus, driver = _host_gpus()
    return BuildRecord(
        id=f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:8]}",
        started_at=started_at,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        status=report.status,
        error=report.error,
        message=report.message,
        host=socket.gethostname(),
        gpus=gpus,
        driver=driver,
        platform=platform.platform(),
        python=sys.version.split()[0],
        versions=versions if versions is not None else installed_versions(_RECORDED_PACKAGES),
        toolchain=toolchain,
        spec_path=report.spec_path,
        spec=spec,
        model=report.name,
        target=report.target,
        keys=dict(report.keys),
        artifacts=dict(report.artifacts),
        repository_path=report.repository_path,
        stages=[
            StageOutcome(name=s.name, outcome=s.outcome, seconds=round(s.seconds, 6), key=s.key, digest=s.digest,
                         detail=s.detail, facts=s.facts)
            for s in report.stages
        ],
        memory_plan=memory_plan,
        seconds=round(report.seconds, 6),
    )


def records_dir(store_root: Path) -> Path:
    return Path(store_root) / "records"


def write_record(store_root: Path, record: BuildRecord) -> Path:
    """Write atomically: a reader sees the whole record or none."""
    final = records_dir(store_root) / f"{record.id}.json"
    write_text_atomically(final, record.model_dump_json(indent=1))
    return final


def read_records(store_root: Path, *, model: str | None = None, target: str | None = None) -> list[BuildRecord]:
    """Records newest first, optionally only those of one model (artifact name) or target GPU."""
    folder = records_dir(store_root)
    records: list[BuildRecord] = []
    if not folder.is_dir():
        return records
    for path in folder.glob("*.json"):
        try:
            record = BuildRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a foreign or damaged file is not a record
        if model is not None and record.model != model:
            continue
        if target is not None and record.target != target:
            continue
        records.append(record)
    records.sort(key=lambda r: (r.started_at, r.id), reverse=True)
    return records


def records_for_digest(store_root: Path, digest: str) -> list[BuildRecord]:
    """Successful builds that produced (or reused) the artifact `digest`, newest first."""
    return [r for r in read_records(store_root) if r.status == "ok" and digest in r.artifacts.values()]
