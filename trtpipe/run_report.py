"""A run's report (trtpipe.build_report.BuildReport) as the runner assembles it: each step's line (told to the
run's hooks as it is added), what was stored, the step running now (a failure is reported against it), and how
the run ended: ok (or dry-run), failed (that step failed, the steps after it skipped), or interrupted (likewise,
naming what was stored, the store asked about the stage being stored when Ctrl-C came). A write that failed for
lack of space anywhere outside a stage's own build (the digest cache, a lock, the store's temp dir) is a failure
like any other, said in one line (trtpipe.disk). A memo's plan that does not hold (`PlanStale`) ends nothing:
the caller resolves again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtpipe.build_report import BuildReport, Outcome, StageReport
from trtpipe.disk import disk_full, disk_full_error
from trtpipe.errors import TrtpipeError
from trtpipe.run_hooks import Hooks

if TYPE_CHECKING:
    from trtpipe.store.local import Entry, Store

# The steps every build runs before its stored stages; they store nothing.
PLAIN_STEPS = ("resolve", "plan")


def joined(*parts: str | None) -> str | None:
    """The parts given, in order, as one detail (None: none given)."""
    return "; ".join(part for part in parts if part) or None


@dataclass
class StageResult:
    """How a stored stage came to be in the store, for its line."""

    outcome: Outcome = "hit"
    waited: bool = False  # waited for a concurrent build of the same key
    facts: dict[str, Any] | None = None  # what building it reported (the record keeps it)
    trust_note: str | None = None  # what the trust gate said of a pulled entry
    refused_note: str | None = None  # the remote's entry of this key was refused: a miss, and why
    push_note: str | None = None  # what sharing what was built here did

    @property
    def built(self) -> bool:
        return self.outcome in ("built", "imported")


class PlanStale(Exception):
    """A memo's plan does not hold: a stage's stored entry is not the one it names (why, for a person)."""


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build. Nothing is half-written (a stage publishes by one rename); `report` says
    which stages were already stored."""

    def __init__(self, report: BuildReport) -> None:
        self.report = report
        super().__init__("build interrupted")


class RunReport:
    """The report, and its lines told to the run's hooks as they are added."""

    def __init__(self, report: BuildReport, hooks: Hooks, stage_names: Sequence[str] = ()) -> None:
        self.report = report
        self.hooks = hooks
        self.stage_names = tuple(stage_names)  # the stored stages a failure skips (the plan's, once there is one)
        self.current = PLAIN_STEPS[0]  # the step running now
        self.storing: tuple[str, str] | None = None  # (kind, key) of the stage being stored now

    def note(self, text: str, *, style: str | None = None) -> None:
        self.hooks.on_note(text, style)

    def add(self, stage: StageReport) -> StageReport:
        self.report.stages.append(stage)
        if stage.key:
            self.report.keys[stage.name] = stage.key
        self.hooks.on_stage(stage)
        return stage

    def stage_done(self, name: str, key: str, entry: Entry, result: StageResult, findings: Sequence[str],
                   seconds: float) -> None:
        """A stored stage's line, after a warning for each thing the store found damaged on the way and what the
        trust gate said of an entry that was not built here."""
        for finding in findings:
            self.note(f"    warning: {finding}", style="yellow")
        trust_note = None if result.built else result.trust_note
        if trust_note:
            self.note(f"  {name:<11} {trust_note}", style="yellow")
        reused = "reused a concurrent build" if result.waited and result.outcome == "hit" else None
        detail = joined(result.refused_note if result.built else None, result.push_note or reused, *findings,
                        trust_note)
        self.add(StageReport(name=name, outcome=result.outcome, key=key, digest=entry.digest, path=str(entry.path),
                             seconds=seconds, waited=result.waited, detail=detail, facts=result.facts))

    def stored(self, kind: str, digest: str) -> None:
        """An artifact is in the store from here on: an interrupt after this still names it."""
        self.report.artifacts[kind] = digest

    @contextlib.contextmanager
    def ending(self, store: Store) -> Iterator[None]:
        """The run inside the block, ended in the report and told to the hooks however it ends."""
        started = time.monotonic()
        try:
            yield
        except TrtpipeError as err:
            self._failed(err, time.monotonic() - started)
            raise
        except PlanStale:
            raise
        except Exception as exc:
            if not disk_full(exc, store.root):
                raise
            # SQLite names no file: its one here is the store's digest cache.
            where = getattr(store.digests, "db_path", None) if "sqlite3" in type(exc).__module__ else None
            err = disk_full_error(exc, where or store.root, stage=self.current)
            self._failed(err, time.monotonic() - started)
            raise err from None
        except KeyboardInterrupt:
            self._kept_on_interrupt(store)
            self._interrupted(time.monotonic() - started)
            raise BuildInterrupted(self.report) from None
        self._finished(time.monotonic() - started)

    def _finished(self, seconds: float) -> None:
        if self.report.dry_run:
            self.report.status = "dry-run"
        self.report.seconds = seconds
        self.hooks.on_done(self.report)

    def _failed(self, err: TrtpipeError, seconds: float) -> None:
        self.report.status = "failed"
        self.report.error = err.one_line()
        self._end(f"{self.current} failed", err.one_line(), seconds)
        if self.report.message:  # the record could not be written: the error line says so too
            err.message = f"{err.message}; {self.report.message}"

    def _interrupted(self, seconds: float) -> None:
        self.report.status = "interrupted"
        self.report.message = "interrupted: nothing half-written" + (
            f"; stored: {', '.join(self.report.kept())}" if self.report.artifacts else "; nothing was stored")
        self._end("interrupted", "interrupted", seconds)

    def _kept_on_interrupt(self, store: Store) -> None:
        """The stage being stored when Ctrl-C came may have been committed an instant before it: the store says."""
        if self.storing is None or self.report.dry_run or self.storing[0] in self.report.artifacts:
            return
        kind, key = self.storing
        entry = store.peek(kind, key)
        if entry is not None and entry.current:
            self.stored(kind, entry.digest)

    def _end(self, reason: str, detail: str, seconds: float) -> None:
        if not any(s.name == self.current for s in self.report.stages):
            self.report.stages.append(StageReport(name=self.current, outcome="failed", detail=detail))
        names = [*PLAIN_STEPS, *self.stage_names]
        for name in names[names.index(self.current) + 1:] if self.current in names else ():
            self.report.stages.append(StageReport(name=name, outcome="skipped", detail=reason))
        self.report.seconds = seconds
        self.hooks.on_done(self.report)


__all__ = ["BuildInterrupted", "PLAIN_STEPS", "PlanStale", "RunReport", "StageResult", "joined"]
