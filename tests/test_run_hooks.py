"""The runner's hooks (trtpipe.run_hooks): what each shows of a run, and when."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trtpipe.build_report import BuildReport, StagePrinter, StageReport
from trtpipe.run_hooks import HeldLines, Hooks, PrinterHook, StageCallback


class Recorder:
    """A hook that keeps what it heard, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def on_stage(self, stage: StageReport) -> None:
        self.heard.append(("stage", stage.name))

    def on_note(self, text: str, style: str | None) -> None:
        self.heard.append(("note", text))

    def on_done(self, report: BuildReport) -> None:
        self.heard.append(("done", report.status))


def _report(status: str, repository: str | None = None) -> BuildReport:
    return BuildReport(spec_path="spec.yaml", status=status, repository_path=repository)  # type: ignore[arg-type]


def test_held_lines_reach_the_hook_only_when_the_run_ends_well() -> None:
    ok, failed = Recorder(), Recorder()
    for inner, status in ((ok, "ok"), (failed, "failed")):
        held = HeldLines(inner)
        held.on_stage(StageReport(name="resolve", outcome="hit"))
        held.on_note("a warning", None)
        assert inner.heard == []  # nothing while the run goes on
        held.on_done(_report(status))
    assert ok.heard == [("stage", "resolve"), ("note", "a warning"), ("done", "ok")]
    assert failed.heard == [("done", "failed")]  # a failed run's lines are dropped; its end is still told


def test_hooks_are_called_in_the_order_given_and_the_callback_hears_only_stages() -> None:
    first, second = Recorder(), Recorder()
    seen: list[str] = []
    hooks = Hooks([first, StageCallback(lambda stage: seen.append(stage.name)), second])
    hooks.on_stage(StageReport(name="engine", outcome="built"))
    hooks.note("pushed", style="yellow")
    hooks.on_done(_report("ok"))
    assert first.heard == second.heard == [("stage", "engine"), ("note", "pushed"), ("done", "ok")]
    assert seen == ["engine"]


@pytest.mark.parametrize(("status", "said"), [("ok", True), ("dry-run", True), ("failed", False),
                                              ("interrupted", False)])
def test_the_printer_names_the_repository_only_for_a_run_that_ended_well(
        status: str, said: bool, capsys: pytest.CaptureFixture[str]) -> None:
    PrinterHook(StagePrinter(True)).on_done(_report(status, repository="/store/repository/abc"))
    assert ("repository: /store/repository/abc" in capsys.readouterr().err) is said


def test_a_quiet_printer_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    hook = PrinterHook(StagePrinter(False))
    hook.on_stage(StageReport(name="plan", outcome="ran"))
    hook.on_note("note", None)
    hook.on_done(_report("ok", repository="/r"))
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- how a run ends (trtpipe.run_report)
class _NoStore:
    """A store that holds nothing (what `ending` asks of one: its root, its digest cache, peek)."""

    root = Path("/nonexistent-store")
    digests = None

    def peek(self, kind: str, key: str) -> None:
        return None


def test_a_failed_step_is_reported_the_steps_after_it_skipped_and_the_hooks_told() -> None:
    from trtpipe.errors import TrtpipeError
    from trtpipe.run_report import RunReport

    heard = Recorder()
    report = BuildReport(spec_path="spec.yaml")
    steps = RunReport(report, Hooks([heard]), stage_names=("checkpoint", "engine", "publish"))
    with pytest.raises(TrtpipeError, match="no such model"):
        with steps.ending(_NoStore()):  # type: ignore[arg-type]
            steps.add(StageReport(name="resolve", outcome="ran"))
            steps.current = "plan"
            steps.current = "checkpoint"
            raise TrtpipeError("no such model")
    assert report.status == "failed" and report.error is not None and "no such model" in report.error
    assert [(s.name, s.outcome) for s in report.stages] == [
        ("resolve", "ran"), ("checkpoint", "failed"), ("engine", "skipped"), ("publish", "skipped")]
    assert report.stage("engine").detail == "checkpoint failed"  # type: ignore[union-attr]
    assert heard.heard == [("stage", "resolve"), ("done", "failed")]


def test_an_interrupt_names_what_was_stored_and_raises_the_report() -> None:
    from trtpipe.run_report import BuildInterrupted, RunReport

    report = BuildReport(spec_path="spec.yaml")
    steps = RunReport(report, Hooks([]), stage_names=("checkpoint", "engine"))
    with pytest.raises(BuildInterrupted) as raised:
        with steps.ending(_NoStore()):  # type: ignore[arg-type]
            steps.current = "engine"
            steps.stored("checkpoint", "sha256:" + "1" * 64)
            steps.storing = ("engine", "k" * 64)  # the store has no entry of it: not named
            raise KeyboardInterrupt
    assert raised.value.report is report and report.status == "interrupted"
    assert report.message == f"interrupted: nothing half-written; stored: checkpoint sha256:{'1' * 64}"
    assert [(s.name, s.outcome) for s in report.stages] == [("engine", "failed")]
