"""`trtpipe cache verify --repair`: restore damaged artifacts to exactly the digest they had.

An artifact's digest is its content's, so restoring is rebuilding: from the registry (`--store
oci://...`: the pulled bytes are verified against the very digest wanted), else from its inputs, by
running the build again on the spec its build record holds (`trtpipe.build_record`). Either way the
result counts only if the entry that comes back has exactly the old digest; otherwise the damaged
copy stays in quarantine (gc keeps it while a channel pins it) and the outcome says why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel

from typing import TYPE_CHECKING

from trtpipe.errors import TrtpipeError
from trtpipe.store.local import Store

if TYPE_CHECKING:
    from trtpipe.settings import Settings
    from trtpipe.store.remote import ArtifactRemote


class Damaged(BaseModel):
    kind: str
    key: str
    digest: str
    channels: list[str] = []


class RepairOutcome(BaseModel):
    kind: str
    key: str
    digest: str
    channels: list[str]
    restored: bool
    how: str | None = None  # "already healthy" | "pulled from oci://..." | "rebuilt from the spec of build <id>"
    detail: str = ""


def repair(store: Store, damaged: list[Damaged], *, remote: ArtifactRemote | None = None,
           settings: Settings) -> list[RepairOutcome]:
    """Restore each damaged artifact from `remote` (when given and it holds that digest), else by rebuilding
    (with the caller's `settings`)."""
    return [_repair_one(store, item, remote, settings) for item in damaged]


def _repair_one(store: Store, item: Damaged, remote: ArtifactRemote | None, settings: Settings) -> RepairOutcome:
    def outcome(restored: bool, how: str | None, detail: str = "") -> RepairOutcome:
        return RepairOutcome(kind=item.kind, key=item.key, digest=item.digest, channels=item.channels,
                             restored=restored, how=how, detail=detail)

    if store.healthy(item.kind, item.key, item.digest) is not None:
        return outcome(True, "already healthy")
    reasons: list[str] = []
    if remote is not None:
        try:
            if _pull(store, item, remote):
                return outcome(True, f"pulled from {remote.url}")
            reasons.append(f"{remote.url} holds no {item.kind} of that digest")
        except TrtpipeError as err:
            reasons.append(f"pull from {remote.url} failed: {err.one_line()}")
    from trtpipe.build_record import records_for_digest

    records = [r for r in records_for_digest(store.root, item.digest) if r.spec]
    if not records:
        reasons.append("no build record names this digest, so its inputs are unknown")
        return outcome(False, None, "; ".join(reasons) + "; a remote cache that holds it can restore it")
    record = records[0]
    try:
        _rebuild(store, record.spec, settings)
    except TrtpipeError as err:
        reasons.append(f"rebuilding from the spec of build {record.id} failed: {err.one_line()}")
        return outcome(False, None, "; ".join(reasons))
    if store.healthy(item.kind, item.key, item.digest) is not None:
        return outcome(True, f"rebuilt from the spec of build {record.id}")
    now = store.peek(item.kind, item.key)
    reasons.append(
        f"rebuilt from the spec of build {record.id}, but got {now.digest if now else 'no entry'}: its inputs "
        "(model files, toolchain, templates or trtpipe version) changed since"
    )
    return outcome(False, None, "; ".join(reasons))


def _pull(store: Store, item: Damaged, remote: ArtifactRemote) -> bool:
    found = remote.find(item.kind, item.key)
    if found is None or found.artifact_digest != item.digest:
        return False
    with store.building(item.kind, item.key, force=store.peek(item.kind, item.key) is not None) as handle:
        entry = remote.pull_into(handle)
    return entry is not None and entry.digest == item.digest


def _rebuild(store: Store, spec: dict, settings: Settings) -> None:
    """Run the build on a spec as a build record holds it (loaded: paths absolute)."""
    import yaml

    from trtpipe.pipeline import run_build

    with tempfile.TemporaryDirectory(prefix="trtpipe-repair-") as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        run_build(path, store=store, progress=False, settings=settings)
