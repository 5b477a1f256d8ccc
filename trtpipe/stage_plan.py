"""The stage plan: a backend's stored stages in build order, each keyed as far as can be known now, with what
it reads. One pure function makes it (`plan_stages`); the real build, the dry run and `matrix plan` each
call it with their own lookup, and the resolution memo (trtpipe.warm) stores one and hands it back, so
every way of running a build walks the same plan (trtpipe.runner executes it).

A stage's key is its declared document (`StoredStage.key`). A stage that builds on another is keyed with
that input's key and, where it reads them, the input's artifact digest. That digest is known when the
input is stored (here or in the shared cache: the lookup says); otherwise the stage cannot be keyed yet
(`NoKey`, with the reason a dry run shows). For `matrix plan`, such a stage is also keyed provisionally:
twice, the missing digest standing in with two different values derived from the input's key. A key
that changes follows a digest not known yet; since a key is built once and then reused, two cells have
the same provisional key exactly when they will have the same key.

This module imports no stage, no resolve and no store implementation: the memo's warm path loads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtpipe.store.keys import StageKey


class NoKey(Exception):
    """A stage cannot be keyed yet (planning-only spec, input not built): why, and the outcome a dry run shows."""

    def __init__(self, reason: str, *, outcome: str = "would-build") -> None:
        self.reason = reason
        self.outcome = outcome
        super().__init__(reason)


@dataclass(frozen=True)
class InputRef:
    """A stored stage's result as the stages after it see it: its key, its artifact digest and its entry
    folder (None where they are not known yet)."""

    key: str | None
    digest: str | None
    path: Path


@dataclass(frozen=True)
class PlannedStage:
    """One stored stage of a plan."""

    name: str  # the report's and --force's name
    kind: str  # the artifact kind the store keeps
    reads: tuple[str, ...]  # the stored stages it builds on
    key: str | None  # None: not keyable now (`unkeyed` says why)
    stage_key: StageKey | None = None  # the hashed document; None for a memo's stage (its entry has it)
    provisional: bool = False  # keyed with a stand-in for an input digest not known yet (matrix plan only)
    digest: str | None = None  # the stored artifact of `key`, as the lookup found it; the memo's: what must be there
    unkeyed: NoKey | None = None  # why the stage has no key yet
    serves: bool = False  # its entry is the repository a server serves
    read: Mapping[str, InputRef] = field(default_factory=dict)  # the inputs it was keyed with
    stage: Any = None  # the StoredStage that builds it; None in a memo's plan, which builds nothing

    @property
    def keyed(self) -> bool:
        """Keyed for good: a key that does not wait on an input's digest."""
        return self.key is not None and not self.provisional


@dataclass(frozen=True)
class StagePlan:
    """A build's stored stages, in order."""

    stages: tuple[PlannedStage, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def stage(self, name: str) -> PlannedStage:
        return next(s for s in self.stages if s.name == name)


# (stage name, kind, key) -> the artifact digest stored under that key, or None
Lookup = Callable[[str, str, str], "str | None"]
# (kind, key or None) -> the entry folder a key names
EntryDir = Callable[[str, "str | None"], Path]


def entry_dirs(store: Any) -> EntryDir:
    """Where `store` (trtpipe.store.local.Store) keeps a key's entry; for a stage not keyed yet, the placeholder
    a dry run's command lines show."""

    def entry_dir(kind: str, key: str | None) -> Path:
        return store.entry_dir(kind, key) if key else store.root / kind / f"{kind.upper()}-KEY"

    return entry_dir


def _stand_in(kind: str, key: str, variant: str) -> str:
    return "sha256:" + hashlib.sha256(f"trtpipe-matrix-stand-in:{variant}:{kind}:{key}".encode()).hexdigest()


def _nothing_stored(name: str, kind: str, key: str) -> None:
    return None


def plan_stages(
    stages: Sequence[Any], ctx: Any, *, entry_dir: EntryDir, lookup: Lookup = _nothing_stored,
    provisional: bool = False, on_keying: Callable[[str], None] | None = None,
    on_planned: Callable[[PlannedStage], None] | None = None,
) -> StagePlan:
    """Key `stages` (StoredStage, in build order) in `ctx` (trtpipe.stages.StageContext).

    `lookup`: what is stored under a key (default: nothing, as for a real build, which learns each digest by
    building or reusing the stage); `provisional`: also key, with stand-ins, a stage that waits on a digest;
    `on_keying(name)` before a stage is keyed and `on_planned(stage)` after (a dry run reports as it goes)."""
    real: dict[str, InputRef] = {}
    variants: dict[str, dict[str, InputRef]] = {"a": {}, "b": {}}
    planned: list[PlannedStage] = []
    for stage in stages:
        if on_keying is not None:
            on_keying(stage.name)
        read = {name: real[name] for name in stage.inputs}
        stage_key: StageKey | None = None
        unkeyed: NoKey | None = None
        waits = False
        try:
            stage_key = stage.key(ctx, read)
        except NoKey as why:
            unkeyed = why
            if provisional:
                try:
                    stage_key = stage.key(ctx, {name: variants["a"][name] for name in stage.inputs})
                    waits = True
                except NoKey:
                    stage_key = None
        key = stage_key.key if stage_key is not None else None
        digest = lookup(stage.name, stage.kind, key) if key is not None and not waits else None
        step = PlannedStage(name=stage.name, kind=stage.kind, reads=tuple(stage.inputs), key=key, stage_key=stage_key,
                            provisional=waits, digest=digest, unkeyed=unkeyed, serves=getattr(stage, "serves", False),
                            read=read, stage=stage)
        planned.append(step)
        real[stage.name] = InputRef(key=key if step.keyed else None, digest=digest,
                                    path=entry_dir(stage.kind, key if step.keyed else None))
        for variant, refs in variants.items():
            refs[stage.name] = InputRef(
                key=key, digest=digest or (_stand_in(stage.kind, key, variant) if key is not None else None),
                path=entry_dir(stage.kind, key))
        if on_planned is not None:
            on_planned(step)
    return StagePlan(stages=tuple(planned))


def run_key(planned: PlannedStage, ctx: Any, inputs: Mapping[str, InputRef]) -> StageKey:
    """The key a run stores a planned stage under: the plan's when nothing it was keyed with can still change (no
    input, or every input's digest known), else the stage keyed on `inputs`, what the run reused or built (NoKey:
    it cannot be keyed)."""
    settled = planned.keyed and all(ref.digest is not None for ref in planned.read.values())
    if settled and planned.stage_key is not None:
        return planned.stage_key
    return planned.stage.key(ctx, dict(inputs))


__all__ = ["EntryDir", "InputRef", "Lookup", "NoKey", "PlannedStage", "StagePlan", "entry_dirs", "plan_stages",
           "run_key"]
