"""One stored stage built: into the store's temporary folder for its key, committed under its key document.

The runner (trtpipe.runner) calls `build_into` once it has verified the inputs; this module says what a full
disk while the stage writes means (where, how much the stage had written, what it expected to write, what is
free), and logs each stage actually built to the store's builds.log. It knows no stage: a stage's optional
`expected_bytes(ctx)` is read with getattr.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trtpipe.disk import disk_full, disk_full_error
from trtpipe.stage_plan import InputRef, PlannedStage

if TYPE_CHECKING:
    from trtpipe.store.keys import StageKey
    from trtpipe.store.local import Entry, Store


def build_into(store: Store, planned: PlannedStage, key: StageKey, handle: Any, ctx: Any,
               inputs: dict[str, InputRef], sources: Sequence[Entry]) -> tuple[Entry, dict[str, Any]]:
    """Build into the handle's temp dir from verified `inputs` (whose entries are `sources`) and commit under the
    key document (content only); what the build reported (facts: durations, logs) goes to the build record, not
    the artifact."""
    started = time.monotonic()
    ctx.written.clear()
    try:
        facts = planned.stage.build(ctx, handle.dir, inputs, key) or {}
        seconds = time.monotonic() - started
        # Digests travel with the bytes: files linked from the verified inputs, and those the stage hashed while
        # writing, are not read again to be hashed (issue 15).
        entry = handle.commit(inputs=key.inputs, sources=list(sources), known=dict(ctx.written))
    except Exception as exc:
        # Disk full while the stage writes: say where, how much it had written and how much is free, measured
        # before the store removes its temporary directory (nothing half-written stays).
        if disk_full(exc, handle.dir):
            raise disk_full_error(exc, handle.dir, stage=planned.name, written_in=handle.dir,
                                  expected=expected_bytes(planned.stage, ctx)) from None
        raise
    store.log_built(handle.kind, handle.key, entry.digest, seconds)
    return entry, {**facts, "build_seconds": round(seconds, 6)}


def expected_bytes(stage: Any, ctx: Any) -> int | None:
    """What the stage says it writes (an optional part of the stage protocol), for a disk-full message."""
    estimate = getattr(stage, "expected_bytes", None)
    if estimate is None or ctx is None:
        return None
    try:
        value = estimate(ctx)
    except Exception:  # an estimate is a courtesy in an error message; never a second failure
        return None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


__all__ = ["build_into", "expected_bytes"]
