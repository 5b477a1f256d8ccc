"""The runner: walks a stage plan (trtpipe.stage_plan) against the artifact cache its constructor is given (the
store, the remote cache: trtpipe.shared_cache, the trust gate: trtpipe.pulled_trust) and tells its hooks
(trtpipe.run_hooks: the printer, the record, a matrix worker's progress) what happened.

For each planned stage: reuse the store's entry of its key, else pull it from the remote cache, else build it
(trtpipe.stage_build) on inputs verified in this run, into a temporary folder the store publishes with one
rename; then store it (and share it). Concurrent runs of one key wait on its lock and reuse the first run's
result. A dry run plans with a lookup and builds nothing (trtpipe.dry_run). A memo's plan (trtpipe.warm) names
the entry each stage must find: anything else is `PlanStale`. The report is assembled by trtpipe.run_report.
The runner knows no stage, backend or layout; it imports nothing that resolves, converts or serves.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trtpipe.build_report import BuildReport, StageReport
from trtpipe.dry_run import DryRun
from trtpipe.errors import TrtpipeError
from trtpipe.input_check import InputCheck
from trtpipe.integrity_watch import IntegrityWatch
from trtpipe.pulled_trust import PulledTrust
from trtpipe.run_hooks import Hooks
from trtpipe.run_report import BuildInterrupted, PlanStale, RunReport, StageResult
from trtpipe.shared_cache import SharedCache
from trtpipe.stage_build import build_into
from trtpipe.stage_leases import Leases
from trtpipe.stage_plan import InputRef, NoKey, PlannedStage, StagePlan, entry_dirs, plan_stages, run_key
from trtpipe.store.remote import RemoteUse

if TYPE_CHECKING:
    from trtpipe.store.keys import StageKey
    from trtpipe.store.local import Entry, Store


class _InputRebuilt(Exception):
    """A stage's stored input failed verification and was rebuilt with other bytes: key the stage again."""


class Runner:
    def __init__(self, store: Store, report: BuildReport, *, hooks: Hooks, cache: SharedCache | None = None,
                 trust: PulledTrust | None = None, force: tuple[str, ...] = (), verify: bool = False,
                 stage_names: Sequence[str] = ()) -> None:
        self.store, self.report, self.hooks = store, report, hooks
        # None: no remote cache (a memo's plan), no trust policy.
        self.cache = cache if cache is not None else SharedCache(None, RemoteUse(), sign_push=None, note=hooks.note,
                                                                 report=report)
        self.trust = trust if trust is not None else PulledTrust(store)
        self.force, self.verify = force, verify  # force: the stored stages to build again, by name
        self.steps = RunReport(report, hooks, stage_names)
        self.leases = Leases(store.locks)
        self.integrity = IntegrityWatch(store)
        self.inputs = InputCheck(store, self.note)
        self.ctx: Any = None  # the stages' context (trtpipe.stages.StageContext); None for a memo's plan
        self.plan: StagePlan | None = None
        self.entries: dict[str, Entry] = {}  # stage name -> its entry in this run
        self.refs: dict[str, InputRef] = {}  # stage name -> what the stages after it see of it

    def note(self, text: str, *, style: str | None = None) -> None:
        self.steps.note(text, style=style)

    def add(self, stage: StageReport) -> StageReport:
        """A step's line: into the report, then to the hooks."""
        return self.steps.add(stage)

    def begin(self, name: str) -> None:
        """`name` is the step running now: a failure from here on is reported against it."""
        self.steps.current = name

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The whole build, its plain steps included, holding its leases; how it ends goes into the report and to
        the hooks (trtpipe.run_report)."""
        with self.steps.ending(self.store), self.leases.held():
            yield

    def run_stages(self, stages: Sequence[Any], ctx: Any) -> StagePlan:
        """Plan a backend's stored stages (StoredStage, in build order) in `ctx` and run the plan; a dry run
        plans with the store's and the remote's lookup and reports each stage as it is planned."""
        self.ctx = ctx
        self.steps.stage_names = tuple(s.name for s in stages)
        self.begin(stages[0].name if stages else self.steps.current)
        self.cache.reach()
        if self.report.dry_run:
            dry = DryRun(self.store, self.cache, self.leases, self.report, force=self.force, verify=self.verify,
                         add=self.add, note=self.note)
            self.plan = dry.plan(stages, ctx, on_keying=self.begin)
            return self.plan
        plan = plan_stages(stages, ctx, entry_dir=entry_dirs(self.store), on_keying=self.begin)
        self.run_plan(plan)
        return plan

    def run_plan(self, plan: StagePlan) -> None:
        """Reuse, pull or build each stage of the plan, in order."""
        self.plan = plan
        self.steps.stage_names = plan.names
        for planned in plan.stages:
            self._execute(planned)

    def _inputs(self, planned: PlannedStage) -> dict[str, InputRef]:
        return {name: self.refs[name] for name in planned.reads}

    def _execute(self, planned: PlannedStage) -> None:
        self.begin(planned.name)
        if planned.stage is None:  # a memo's plan: the entry it names, or stale
            self._stored_stage(planned, planned.key or "", None)
            return
        try:
            key = run_key(planned, self.ctx, self._inputs(planned))
        except NoKey as why:  # a build resolves with the weights, so every stage has its inputs
            raise TrtpipeError(f"{planned.name}: {why.reason}", fix="report this spec") from None
        for _attempt in range(2):
            try:
                self._stored_stage(planned, key.key, key)
                return
            except _InputRebuilt:
                key = planned.stage.key(self.ctx, self._inputs(planned))
        raise TrtpipeError(f"the inputs of {planned.name} changed twice while it was building",  # pragma: no cover
                           fix="run the build again")

    def _verified_input(self, name: str) -> InputRef:
        """The entry stage `name` produced, verified before another stage builds on it (else rebuilt)."""
        if not self.inputs.holds(name, self.entries[name]):
            assert self.plan is not None
            self._execute(self.plan.stage(name))
        return self.refs[name]

    def _stored_stage(self, planned: PlannedStage, key: str, document: StageKey | None) -> Entry:
        """Reuse the entry of `key`, else pull or build it (`document`: its key's document; None for a memo's
        stage, which is reused or stale)."""
        name, kind, forced, started = planned.name, planned.kind, planned.name in self.force, time.monotonic()
        self.steps.storing = (kind, key)  # what an interrupt asks the store about
        self.leases.hold(kind, key)  # first: from here on gc cannot remove the entry we are about to use
        entry = None if forced else self.store.get(kind, key, verify=self.verify)
        if document is None and (entry is None or entry.digest != planned.digest):
            raise PlanStale(f"the stored {kind} {key[:16]} is not the one last built")
        result = StageResult()
        if entry is not None:
            usable, result.trust_note = self.trust.judge_reused(entry)
            if not usable:
                self.note(f"  {name:<11} {result.trust_note}; rebuilding it here", style="yellow")
                entry, forced = None, True
        if entry is None:
            assert document is not None
            entry = self._pulled_or_built(planned, document, forced, result)
        elif self.verify:
            self.inputs.mark(kind, key)  # `get(verify=True)` re-hashed every file
        self.entries[name] = entry
        self.refs[name] = InputRef(key=entry.key, digest=entry.digest, path=entry.path)
        self.steps.stored(kind, entry.digest)
        if planned.serves:
            self.report.repository_path = str(entry.path)
        self.steps.stage_done(name, key, entry, result, self.integrity.new_findings(), time.monotonic() - started)
        return entry

    def _pulled_or_built(self, planned: PlannedStage, key: StageKey, forced: bool, result: StageResult) -> Entry:
        """Under the key's build lock: a concurrent run's entry, else the remote cache's, else built here (and
        shared)."""
        name, entry = planned.name, None

        def on_wait() -> None:
            result.waited = True
            self.note(f"  {name:<11} waiting for another build of {planned.kind} {key.key[:16]}")

        with self.store.building(planned.kind, key.key, force=forced, verify=self.verify, on_wait=on_wait) as handle:
            if handle.existing is not None:
                return handle.existing
            if self.cache.remote is not None and not forced:
                entry, result.refused_note = self.cache.pull_into(name, handle)
                result.outcome = "pulled"
            if entry is not None:
                result.trust_note = self.trust.note_pulled(entry)
            else:
                entry, facts = self._build_into(planned, key, handle)
                result.facts = facts
                for note in (facts.get("convert") or {}).get("notes") or []:
                    self.note(f"  {name:<11} note: {note}")
                # A stage may say what running it is called (the imported engine: "imported").
                result.outcome = getattr(planned.stage, "built_outcome", "built")
            self.inputs.mark(planned.kind, key.key)  # its bytes were hashed (or verified on pull) just now
        self.steps.stored(planned.kind, entry.digest)  # an interrupted push (or anything after) still names it
        if result.built and self.cache.remote is not None:
            result.push_note = self.cache.push(entry)
        return entry

    def _build_into(self, planned: PlannedStage, key: StageKey, handle: Any) -> tuple[Entry, dict[str, Any]]:
        """Build on inputs verified in this run (a flipped byte would carry over), keyed as `key` says."""
        before = self._inputs(planned)
        inputs = {name: self._verified_input(name) for name in planned.reads}
        if inputs != before and planned.stage.key(self.ctx, inputs).key != key.key:
            raise _InputRebuilt  # an input came back with other bytes, and this key names the old ones
        return build_into(self.store, planned, key, handle, self.ctx, inputs, [self.entries[n] for n in planned.reads])


__all__ = ["BuildInterrupted", "PlanStale", "Runner"]
