"""A dry run's plan: each stage looked up as it is keyed, and reported as it is planned; nothing is built.

The lookup asks the store (a hit), then the remote cache (would-pull), else the stage would build (as a forced
stage does); the digest it finds keys the stages after it. For a stage that would build, its `preview` says
where and what would run (the exact trtllm-build argv, the container), shown under its line. The runner
(trtpipe.runner) hands this its report, its hooks and the leases it holds for the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trtpipe.build_report import BuildReport, Outcome, StageReport
from trtpipe.shared_cache import SharedCache
from trtpipe.stage_leases import Leases
from trtpipe.stage_plan import PlannedStage, StagePlan, entry_dirs, plan_stages

if TYPE_CHECKING:
    from trtpipe.store.local import Entry, Store

AddLine = Callable[[StageReport], StageReport]
Note = Callable[..., None]


class DryRun:
    def __init__(self, store: Store, cache: SharedCache, leases: Leases, report: BuildReport, *,
                 force: tuple[str, ...], verify: bool, add: AddLine, note: Note) -> None:
        self.store, self.cache, self.leases, self.report = store, cache, leases, report
        self.force, self.verify = force, verify
        self.add, self.note = add, note  # a line into the report and to the hooks; a note to the hooks
        self.entry_dir = entry_dirs(store)
        self._found: dict[str, tuple[Outcome, str | None, Entry | None, float, bool]] = {}
        self._ctx: Any = None

    def plan(self, stages: Sequence[Any], ctx: Any, *, on_keying: Callable[[str], None]) -> StagePlan:
        self._ctx = ctx
        return plan_stages(stages, ctx, entry_dir=self.entry_dir, on_keying=on_keying, lookup=self._lookup,
                           on_planned=self._report)

    def _lookup(self, name: str, kind: str, key: str) -> str | None:
        """What a dry run finds for a key: the digest the stages after it are keyed with (None: would build)."""
        forced, started = name in self.force, time.monotonic()
        self.leases.hold(kind, key)  # gc cannot remove what we look at
        entry = self.store.peek(kind, key)
        present = entry is not None and entry.current and not self.store.check(entry, digests=self.verify)
        outcome: Outcome = "hit" if present and not forced else "would-build"
        digest = entry.digest if present and entry is not None else None
        if outcome == "would-build" and not forced:
            pulled = self.cache.find(name, kind, key)
            if pulled is not None:
                outcome, digest = "would-pull", pulled
        self._found[name] = (outcome, digest, entry, started, forced and present)
        return digest if outcome != "would-build" else None

    def _report(self, planned: PlannedStage) -> None:
        """A dry run's line for a planned stage, and where and what would run for one that would build."""
        if planned.key is None:
            assert planned.unkeyed is not None
            report = self.add(StageReport(name=planned.name, outcome=planned.unkeyed.outcome,  # type: ignore[arg-type]
                                          detail=planned.unkeyed.reason))
            self._show(planned, report, None)
            return
        outcome, digest, entry, started, forced = self._found.pop(planned.name)
        report = self.add(StageReport(
            name=planned.name, outcome=outcome, key=planned.key, seconds=time.monotonic() - started,
            digest=digest if outcome != "would-build" else None, path=str(self.entry_dir(planned.kind, planned.key)),
            detail="forced" if forced else None))
        if outcome == "hit" and entry is not None and planned.serves:
            self.report.repository_path = str(entry.path)
        if outcome == "would-build":
            self._show(planned, report, planned.key)

    def _show(self, planned: PlannedStage, report: StageReport, key: str | None) -> None:
        """Where and what a stage that would build would run (its report line is already out)."""
        preview = planned.stage.preview(self._ctx, key, dict(planned.read))
        if preview is None:
            return
        report.executor, report.command, report.container = preview.executor, preview.command, preview.container
        for note in preview.notes:
            self.note(f"    {note}")


__all__ = ["DryRun"]
