"""What a build reports: one line per stage while it runs (stderr) and the report it returns (`--json`).

The runner (trtpipe.runner: its report assembled by trtpipe.run_report, its lines printed by
trtpipe.run_hooks.PrinterHook) reports through these for the resolving build and the warm path (trtpipe.warm)
alike, so a build that reuses its last resolution prints exactly what a resolving build prints. Nothing here imports
more than pydantic; rich loads only to print on a terminal.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from pydantic import BaseModel, Field

# "imported": an engine built outside trtpipe, checked against the spec and stored (`trtpipe publish --engine`).
Outcome = Literal["ran", "hit", "built", "imported", "pulled", "would-build", "would-pull", "skipped", "failed"]


class StageReport(BaseModel):
    name: str
    outcome: Outcome
    seconds: float = 0.0
    key: str | None = None
    digest: str | None = None
    path: str | None = None
    detail: str | None = None
    waited: bool = Field(default=False, description="Waited for a concurrent build of the same key.")
    command: list[str] | None = Field(
        default=None, description="Dry run: the trtllm-build argv (engine), the conversion argv (checkpoint of a GPU target).")
    container: dict[str, Any] | None = Field(default=None, description="Dry run: the docker container spec that runs it.")
    executor: str | None = Field(default=None, description="Dry run, checkpoint of a GPU target: local or docker.")
    facts: dict[str, Any] | None = Field(
        default=None, description="What building the stage reported (durations, logs, converter summary): the build "
                                  "record keeps it; the artifact (and its digest) never does.")


class BuildReport(BaseModel):
    spec_path: str
    name: str | None = None
    target: str | None = None
    toolchain: str | None = None
    backend: str | None = None
    dry_run: bool = False
    verify: bool = False
    status: Literal["ok", "failed", "dry-run", "interrupted"] = "ok"
    message: str | None = None
    stages: list[StageReport] = Field(default_factory=list)
    keys: dict[str, str] = Field(default_factory=dict)
    artifacts: dict[str, str] = Field(default_factory=dict, description="kind -> artifact digest")
    repository_path: str | None = None
    store: str | None = None
    remote: str | None = Field(default=None, description="The shared cache consulted before building.")
    remote_mode: Literal["read-write", "read-only"] | None = Field(
        default=None, description="read-write: pulls hits and pushes what it built; read-only: pulls, never pushes.")
    remote_unavailable: str | None = Field(
        default=None, description="Why the build went on without its remote cache (down, credentials refused).")
    record_path: str | None = None
    seconds: float = 0.0
    error: str | None = None

    def stage(self, name: str) -> StageReport | None:
        return next((s for s in self.stages if s.name == name), None)

    def kept(self) -> list[str]:
        """`kind digest` of every artifact this run left in the store (built, pulled or reused)."""
        return [f"{kind} {digest}" for kind, digest in self.artifacts.items()]


_COLOURS = {"hit": "green", "built": "cyan", "imported": "cyan", "ran": "white", "would-build": "yellow", "failed": "red"}


class StagePrinter:
    """One line per stage on stderr: rich (colours) on a terminal, the same text plain anywhere else (a CI
    log, a pipe), where rich would print it without colour anyway."""

    def __init__(self, enabled: bool, *, full_keys: bool = False) -> None:
        self.enabled = enabled
        self.full_keys = full_keys  # a dry run prints whole keys
        self._console: Any = None

    def _out(self, plain: str, styled: list[tuple[str, str | None]]) -> None:
        """`plain` as it reads; `styled`: the same text in pieces, each with its style (None: as is)."""
        if not sys.stderr.isatty():
            print(plain, file=sys.stderr, flush=True)
            return
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        from rich.text import Text

        self._console.print(Text.assemble(*((piece, style or "") for piece, style in styled)), soft_wrap=True)

    def stage(self, report: StageReport) -> None:
        if not self.enabled:
            return
        key = (report.key if self.full_keys else report.key[:16]) if report.key else ""
        detail = f"  {report.detail}" if report.detail else ""
        head, outcome, tail = f"  {report.name:<11} ", f"{report.outcome:<11}", f" {report.seconds:8.2f}s  {key}{detail}"
        self._out(head + outcome + tail, [(head, None), (outcome, _COLOURS.get(report.outcome, "magenta")), (tail, None)])

    def note(self, text: str, *, style: str | None = None) -> None:
        if not self.enabled:
            return
        self._out(text, [(text, style)])
