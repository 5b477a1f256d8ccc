"""What a stored stage is: a small protocol the runner (trtpipe.pipeline) drives without knowing any stage.

A stage says what it is (`name`, and the artifact `kind` the store keeps), which stored stages it builds
on (`inputs`), the document that enters its key (`key`: the store hashes it), how it builds into a
directory (`build`: what it returns goes to the build record, never into the artifact), and, for a dry
run, what would run where (`preview`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtpipe.resolve import ResolvedSpec
from trtpipe.store.digest_cache import DigestCache
from trtpipe.store.keys import StageKey
from trtpipe.stage_plan import InputRef, NoKey  # noqa: F401 - the stages' protocol names them


@dataclass
class Preview:
    """What a dry run shows of a stage that would build: where and exactly what would run."""

    executor: str | None = None
    command: list[str] | None = None
    container: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # lines for a person, under the stage's line


@dataclass
class StageContext:
    """What every stage of one run shares: the resolved spec, the plans, where files are hashed and logged."""

    resolved: ResolvedSpec
    build_plan: Any  # the backend's build plan (trtpipe.engine.plan.BuildPlan for trtllm-build and reference)
    digests: DigestCache
    store_root: Path
    progress: bool
    dry_run: bool
    facts: dict[str, Any] = field(default_factory=dict)
    # Files a stage wrote whose sha256 it already knows (hashed while writing): {path: sha256 hex}. The
    # runner hands them to the store with the commit, which then does not read them again.
    written: dict[Path, str] = field(default_factory=dict)

    def log_path(self, stage: str, key: str) -> Path:
        logs = self.store_root / "logs"
        logs.mkdir(exist_ok=True)
        return logs / f"{stage}-{key[:16]}-{int(time.time())}-{os.getpid()}.log"

    def temp_dir(self, kind: str, key: str | None) -> Path:
        """Where the store would have the stage build (for a dry run's command lines)."""
        return self.store_root / "tmp" / f"{kind}-{key or kind.upper() + '-KEY'}-XXXXXXXX"


class StoredStage(Protocol):
    """One stage whose output the store keeps under its key."""

    name: str  # the report's and --force's name: checkpoint, engine, publish
    kind: str  # the artifact kind in the store: checkpoint, engine, repository
    inputs: tuple[str, ...]  # names of the stored stages it builds on, in order
    # Which of its files hold weights (a regex over the entry-relative path): those may be as large as one GPU's
    # share of a model, every other file is a config, template or tokenizer file (trtpipe.store.manifest).
    weight_files: str

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        """The stage's key (its declared document, hashed by the store); NoKey in a dry run that cannot say."""
        ...

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        """Build into out_dir from verified inputs (under `key`); return what the build record keeps (logs,
        summaries): never part of the artifact."""
        ...

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        """Dry run: where and what would run (None: nothing worth showing)."""
        ...

    # Optional: `expected_bytes(ctx) -> int | None`, about how many bytes the stage writes, which a disk-full
    # error quotes as what was needed (the runner reads it with getattr; a stage may leave it out).
