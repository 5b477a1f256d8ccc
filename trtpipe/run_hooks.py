"""What a run tells its watchers: each step's line, a note, and its end (trtpipe.runner calls these hooks).

The runner keeps the report; everything that shows or keeps it elsewhere is a hook its caller hands it: the
terminal's lines (`PrinterHook`), lines held back until a memo's plan is known to hold (`HeldLines`), a matrix
worker's live progress (`StageCallback`) and the build record (`trtpipe.run_record.RecordWriter`). A hook that
raises fails the run, as the runner's own code would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from trtpipe.build_report import BuildReport, StagePrinter, StageReport


class RunHooks(Protocol):
    def on_stage(self, stage: StageReport) -> None:
        """A step's line, as it is added to the report (ran, hit, pulled, built, would-build ...)."""

    def on_note(self, text: str, style: str | None) -> None:
        """A line that is not a step's (a warning, what a dry run would run)."""

    def on_done(self, report: BuildReport) -> None:
        """The run ended: its report's status says how (ok, dry-run, failed, interrupted)."""


class Hooks:
    """Several hooks as one, called in the order given."""

    def __init__(self, hooks: Sequence[RunHooks]) -> None:
        self.hooks = tuple(hooks)

    def on_stage(self, stage: StageReport) -> None:
        for hook in self.hooks:
            hook.on_stage(stage)

    def on_note(self, text: str, style: str | None) -> None:
        for hook in self.hooks:
            hook.on_note(text, style)

    def on_done(self, report: BuildReport) -> None:
        for hook in self.hooks:
            hook.on_done(report)

    def note(self, text: str, *, style: str | None = None) -> None:
        """`on_note` as trtpipe.shared_cache's `Note` calls it."""
        self.on_note(text, style)


class PrinterHook:
    """The build's lines on stderr (trtpipe.build_report.StagePrinter), and where the repository is once it ends."""

    def __init__(self, printer: StagePrinter) -> None:
        self.printer = printer

    def on_stage(self, stage: StageReport) -> None:
        self.printer.stage(stage)

    def on_note(self, text: str, style: str | None) -> None:
        self.printer.note(text, style=style)

    def on_done(self, report: BuildReport) -> None:
        # A failed or interrupted build's last line is its error, which the shell prints.
        if report.status in ("ok", "dry-run") and report.repository_path:
            self.printer.note(f"repository: {report.repository_path}")


class HeldLines:
    """Holds another hook's lines until the run ends well: a memo's plan that turns out stale says nothing but why
    (the resolving build then prints its own lines), and a failed one leaves only its error."""

    def __init__(self, inner: RunHooks) -> None:
        self.inner = inner
        self._held: list[Callable[[], None]] = []

    def on_stage(self, stage: StageReport) -> None:
        self._held.append(lambda: self.inner.on_stage(stage))

    def on_note(self, text: str, style: str | None) -> None:
        self._held.append(lambda: self.inner.on_note(text, style))

    def on_done(self, report: BuildReport) -> None:
        held, self._held = self._held, []
        if report.status == "ok":
            for line in held:
                line()
        self.inner.on_done(report)


class StageCallback:
    """Each step's report handed to a callable as soon as it is known (a matrix worker's live progress)."""

    def __init__(self, call: Callable[[StageReport], None]) -> None:
        self.call = call

    def on_stage(self, stage: StageReport) -> None:
        self.call(stage)

    def on_note(self, text: str, style: str | None) -> None:
        pass

    def on_done(self, report: BuildReport) -> None:
        pass


__all__ = ["HeldLines", "Hooks", "PrinterHook", "RunHooks", "StageCallback"]
