"""The runner: executes a stage plan (trtpipe.stage_plan) against the artifact cache, the local store with the
remote cache and the trust gate its constructor is given, and keeps the build's report and record.

For each planned stage it reuses the store's entry of the stage's key (or pulls it from the remote cache,
judged by the trust gate: trtpipe.shared_cache, which also shares and signs what is built here), and otherwise verifies the stored inputs the stage builds on and lets the stage
build into a temporary directory that the store publishes with one rename. Concurrent runs of the same key
wait on the per-key lock and then reuse the first run's result. A dry run plans with a lookup that asks
the store and the remote cache, and builds nothing. A memo's plan (trtpipe.warm) names the entry each stage
must find: anything else is `PlanStale`, and the caller resolves again. The runner knows no stage, no
backend and no layout: what enters a key and how a stage builds is the stage's.

Its callers: `trtpipe.pipeline` (resolve and plan, then `run_stages`), `trtpipe.warm` (a memo's plan,
then `run_plan`), and through them the build command, `publish --engine` and the matrix workers. This
module imports nothing that resolves, converts or serves: the warm path loads it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from trtpipe import build_record
from trtpipe.build_report import BuildReport, Outcome, StagePrinter, StageReport
from trtpipe.disk import disk_full, disk_full_error
from trtpipe.errors import DiskFull, TrtpipeError
from trtpipe.shared_cache import PushSigner, SharedCache
from trtpipe.stage_plan import InputRef, NoKey, PlannedStage, StagePlan, entry_dirs, plan_stages
from trtpipe.store.remote import RemoteUse

if TYPE_CHECKING:
    from trtpipe.store.keys import StageKey
    from trtpipe.store.local import Entry, Store

PLAIN_STEPS = ("resolve", "plan")

# Judges an entry that came from a registry: (usable, note). Unusable: the stage is rebuilt here instead.
# The release area's trust policy provides one (the runner imports nothing of it); without one, a pulled
# entry is used and the build says that no policy checked it.
PulledCheck = Callable[["Entry"], tuple[bool, str]]
# The build record of a report (and when the build started): the resolving build's from its resolution, a
# memo's from the resolution it kept.
RecordMaker = Callable[[BuildReport, str], build_record.BuildRecord]


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build. Nothing is half-written (a stage publishes by one rename); `report` says
    which stages were already stored."""

    def __init__(self, report: BuildReport) -> None:
        self.report = report
        super().__init__("build interrupted")


class PlanStale(Exception):
    """A memo's plan does not hold: a stage's stored entry is not the one it names (why, for a person)."""


class _InputRebuilt(Exception):
    """A stage's stored input failed verification and was rebuilt with other bytes: key the stage again."""


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _unchecked_pulled_note(store: Store, entry: Entry) -> str | None:
    """What to say about using a pulled entry when no trust policy judges it (None: it was built here)."""
    from trtpipe.store import signatures

    record = signatures.read_record(store.root, entry.digest)
    if record is None or not record.get("pulled_from"):
        return None
    if not record["bundles"]:
        return f"using an unsigned pulled entry (from {record['pulled_from']}); no trust policy checks it"
    # Which key signed it is not known without a key to verify against (the key id is the pusher's claim).
    return f"using a pulled entry carrying a signature (from {record['pulled_from']}), not verified: no trust policy"


class Runner:
    def __init__(
        self, store: Store, report: BuildReport, *, record: RecordMaker, dry_run: bool = False,
        force: tuple[str, ...] = (), verify: bool = False, progress: bool = True, remote: Any = None,
        remote_use: RemoteUse | None = None, pulled_check: PulledCheck | None = None,
        sign_push: PushSigner | None = None, on_stage: Callable[[StageReport], None] | None = None,
        stage_names: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.report = report
        self.record = record
        # The remote cache (trtpipe.shared_cache): pulls before building, pushes (and signs) what was built.
        self.cache = SharedCache(remote, remote_use if remote_use is not None else RemoteUse(), sign_push=sign_push,
                                 note=self.note, report=report)
        self.pulled_check = pulled_check  # judges entries that came from a registry (a trust policy), or None
        self.on_stage = on_stage  # told each step's report as it is added (a matrix worker's live progress)
        self.dry_run = dry_run
        self.force = force  # the stored stages to build again, by name
        self.verify = verify
        self.progress = progress
        self.printer = StagePrinter(progress, full_keys=dry_run)
        self.stage_names = tuple(stage_names)  # the stored stages a failure skips (the plan's, once there is one)
        self.current = PLAIN_STEPS[0]  # the step running now, which a failure is reported against
        self.ctx: Any = None  # the stages' context (trtpipe.stages.StageContext); None for a memo's plan
        self.plan: StagePlan | None = None
        self.entries: dict[str, Entry] = {}  # stage name -> its entry in this run
        self.refs: dict[str, InputRef] = {}  # stage name -> what the stages after it see of it
        self.verified: set[tuple[str, str]] = set()  # (kind, key) whose bytes this run hashed or checked
        self.storing: tuple[str, str] | None = None  # (kind, key) of the stage being stored now
        self.started_at = _now_iso()
        self._entry_dir = entry_dirs(store)
        self._leases: contextlib.ExitStack | None = None
        self._held: list[Callable[[], None]] | None = None  # lines kept back while a memo's plan is checked
        self._dry_found: dict[str, tuple[Outcome, str | None, Entry | None, float, bool]] = {}
        self._seen_corrupt = 0
        self._seen_quarantined = 0

    # -- reporting -------------------------------------------------------------------------
    def _emit(self, line: Callable[[], None]) -> None:
        if self._held is not None:
            self._held.append(line)
        else:
            line()

    def note(self, text: str, *, style: str | None = None) -> None:
        self._emit(lambda: self.printer.note(text, style=style))

    def add(self, stage: StageReport) -> StageReport:
        """A step's line: into the report, on the terminal, to the live progress."""
        self.report.stages.append(stage)
        if stage.key:
            self.report.keys[stage.name] = stage.key
        self._emit(lambda: self.printer.stage(stage))
        if self.on_stage is not None:
            self.on_stage(stage)
        return stage

    @contextlib.contextmanager
    def holding_lines(self) -> Iterator[None]:
        """Print nothing until the block ends without an error (a memo's plan that turns out stale says nothing
        but why, and the resolving build prints its own lines)."""
        self._held = []
        try:
            yield
            held, self._held = self._held, None
            for line in held:
                line()
        finally:
            self._held = None

    def _skip_rest(self, after: str, reason: str) -> None:
        names = [*PLAIN_STEPS, *(self.plan.names if self.plan is not None else self.stage_names)]
        for name in names[names.index(after) + 1:] if after in names else ():
            self.report.stages.append(StageReport(name=name, outcome="skipped", detail=reason))

    def _integrity_notes(self) -> str | None:
        """What the store found corrupt (and set aside) since the last call, as one line."""
        notes = []
        for digest in self.store.objects.corrupt[self._seen_corrupt:]:
            notes.append(f"stored object sha256:{digest[:12]} did not hold its digest's bytes (moved to quarantine)")
        for kind, key, _, problems in self.store.quarantined[self._seen_quarantined:]:
            notes.append(f"{kind} {key[:16]} failed verification ({problems[0].file}: {problems[0].reason}; quarantined)")
        self._seen_corrupt = len(self.store.objects.corrupt)
        self._seen_quarantined = len(self.store.quarantined)
        for note in notes:
            self.note(f"    warning: {note}", style="yellow")
        return "; ".join(notes) or None

    # -- the run ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The whole build, its plain steps included: a failure is reported against the step running then, the
        steps after it are skipped, and the record is written whatever the outcome (a dry run writes none)."""
        started = time.monotonic()
        try:
            with contextlib.ExitStack() as leases:
                self._leases = leases
                yield
            if self.dry_run:
                self.report.status = "dry-run"
        except TrtpipeError as err:
            self._failed(err, started)
            raise
        except PlanStale:
            raise
        except Exception as exc:
            # A write that failed for lack of space anywhere else (the digest cache, a lock, the store's
            # temp dir): one line and a failed record, like any error a user can act on.
            if not disk_full(exc, self.store.root):
                raise
            # SQLite names no file: its one here is the store's digest cache
            where = getattr(self.store.digests, "db_path", None) if "sqlite3" in type(exc).__module__ else None
            err = disk_full_error(exc, where or self.store.root, stage=self.current)
            self._failed(err, started)
            raise err from None
        except KeyboardInterrupt:
            self._kept_on_interrupt()
            self.report.status = "interrupted"
            self.report.message = "interrupted: nothing half-written" + (
                f"; stored: {', '.join(self.report.kept())}" if self.report.artifacts else "; nothing was stored")
            self._end("interrupted", "interrupted", started)
            raise BuildInterrupted(self.report) from None
        finally:
            self._leases = None
        self.report.seconds = time.monotonic() - started
        if self.report.repository_path and self.progress:
            self.printer.note(f"repository: {self.report.repository_path}")
        self._write_record()

    def run_stages(self, stages: Sequence[Any], ctx: Any) -> StagePlan:
        """Plan a backend's stored stages (StoredStage, in build order) in `ctx` and run the plan: a dry run
        plans with the store's and the remote's lookup and reports each stage as it is planned."""
        self.ctx = ctx
        self.stage_names = tuple(s.name for s in stages)
        self.current = self.stage_names[0] if self.stage_names else self.current
        self.cache.reach()
        if self.dry_run:
            self.plan = plan_stages(stages, ctx, entry_dir=self._entry_dir, on_keying=self._keying,
                                    lookup=self._dry_lookup, on_planned=self._dry_report)
            return self.plan
        plan = plan_stages(stages, ctx, entry_dir=self._entry_dir, on_keying=self._keying)
        self.run_plan(plan)
        return plan

    def run_plan(self, plan: StagePlan) -> None:
        """Reuse, pull or build each stage of the plan, in order."""
        self.plan = plan
        for planned in plan.stages:
            self._execute(planned)

    def _keying(self, name: str) -> None:
        self.current = name

    # -- a dry run -------------------------------------------------------------------------
    def _dry_lookup(self, name: str, kind: str, key: str) -> str | None:
        """What a dry run finds for a key: here (a hit), in the remote cache (would-pull), or nothing
        (would-build, as is a forced stage): the digest the stages after it are keyed with."""
        assert self._leases is not None
        forced, started = name in self.force, time.monotonic()
        self._leases.enter_context(self.store.locks.lease(kind, key))  # gc cannot remove what we look at
        entry = self.store.peek(kind, key)
        present = entry is not None and entry.current and not self.store.check(entry, digests=self.verify)
        outcome: Outcome = "hit" if present and not forced else "would-build"
        digest = entry.digest if present and entry is not None else None
        if outcome == "would-build" and not forced:
            pulled = self.cache.find(name, kind, key)
            if pulled is not None:
                outcome, digest = "would-pull", pulled
        self._dry_found[name] = (outcome, digest, entry, started, forced and present)
        return digest if outcome != "would-build" else None

    def _dry_report(self, planned: PlannedStage) -> None:
        """A dry run's line for a planned stage, and where and what would run for one that would build."""
        if planned.key is None:
            assert planned.unkeyed is not None
            report = self.add(StageReport(name=planned.name, outcome=planned.unkeyed.outcome,  # type: ignore[arg-type]
                                          detail=planned.unkeyed.reason))
            self._show(planned, report, None)
            return
        outcome, digest, entry, started, forced = self._dry_found.pop(planned.name)
        report = self.add(StageReport(
            name=planned.name, outcome=outcome, key=planned.key, seconds=time.monotonic() - started,
            digest=digest if outcome != "would-build" else None, path=str(self._entry_dir(planned.kind, planned.key)),
            detail="forced" if forced else None))
        if outcome == "hit" and entry is not None and planned.serves:
            self.report.repository_path = str(entry.path)
        if outcome == "would-build":
            self._show(planned, report, planned.key)

    def _show(self, planned: PlannedStage, report: StageReport, key: str | None) -> None:
        """Dry run: where and what a stage that would build would run."""
        preview = planned.stage.preview(self.ctx, key, dict(planned.read))
        if preview is None:
            return
        report.executor, report.command, report.container = preview.executor, preview.command, preview.container
        for note in preview.notes:
            self.note(f"    {note}")

    # -- stored stages ---------------------------------------------------------------------
    def _inputs(self, planned: PlannedStage) -> dict[str, InputRef]:
        return {name: self.refs[name] for name in planned.reads}

    def _execute(self, planned: PlannedStage) -> None:
        self.current = planned.name
        if planned.stage is None:  # a memo's plan: the entry it names, or stale
            self._stored_stage(planned, planned.key or "", None)
            return
        # The plan's key stands when nothing it was keyed with can still change (no input, or every input's
        # digest known); else the stage is keyed on what this run reused or built.
        settled = planned.keyed and all(ref.digest is not None for ref in planned.read.values())
        key = planned.stage_key if settled else None
        if key is None:
            try:
                key = planned.stage.key(self.ctx, self._inputs(planned))
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
        """The entry stage `name` produced, verified before another stage builds on it.

        Verified means: committed or checked in this run, or every file's sha256 matches its manifest by
        the digest cache's rules (a file unchanged since it was hashed is not read again). A mismatch
        quarantines the entry and rebuilds it, from inputs verified the same way."""
        entry = self.entries[name]
        if (entry.kind, entry.key) not in self.verified:
            problems = self.store.verify_entry(entry)
            if problems:
                self.store.quarantine(entry, problems)
                first = problems[0]
                self.note(
                    f"  {name:<11} stored {entry.kind} {entry.key[:16]} failed verification ({first.file}: "
                    f"{first.reason}); moved to quarantine, rebuilding it from its inputs", style="yellow")
                assert self.plan is not None
                self._execute(self.plan.stage(name))
            else:
                self.verified.add((entry.kind, entry.key))
        return self.refs[name]

    def _stored_stage(self, planned: PlannedStage, key: str, document: StageKey | None) -> Entry:
        """Reuse the entry of `key`, pull it from the remote cache, or build it (`document`: its key's
        document; None for a memo's stage, which is reused or stale)."""
        assert self._leases is not None
        kind, forced = planned.kind, planned.name in self.force
        started = time.monotonic()
        self.storing = (kind, key)  # what an interrupt asks the store about (`_kept_on_interrupt`)
        # A lease first: from here on gc cannot remove the entry we are about to use.
        self._leases.enter_context(self.store.locks.lease(kind, key))
        entry = None if forced else self.store.get(kind, key, verify=self.verify)
        if document is None and (entry is None or entry.digest != planned.digest):
            raise PlanStale(f"the stored {kind} {key[:16]} is not the one last built")
        waited = False
        outcome: Outcome = "hit"
        push_note: str | None = None
        facts: dict[str, Any] | None = None
        trust_note: str | None = None
        refused_note: str | None = None  # the remote's entry of this key did not verify: a miss, and why
        if entry is not None:
            usable, trust_note = self._judge_pulled(entry)
            if not usable:
                self.note(f"  {planned.name:<11} {trust_note}; rebuilding it here", style="yellow")
                entry, forced = None, True
        if entry is None:
            assert document is not None
            def on_wait() -> None:
                nonlocal waited
                waited = True
                self.note(f"  {planned.name:<11} waiting for another build of {kind} {key[:16]}")

            with self.store.building(kind, key, force=forced, verify=self.verify, on_wait=on_wait) as handle:
                if handle.existing is not None:
                    entry = handle.existing
                else:
                    if self.cache.remote is not None and not forced:
                        entry, refused_note = self.cache.pull_into(planned.name, handle)
                        outcome = "pulled"
                    if entry is not None and self.pulled_check is None:
                        trust_note = _unchecked_pulled_note(self.store, entry)  # with a policy, the gate judged it
                    if entry is None:
                        entry, facts = self._build_into(planned, document, handle)
                        for note in ((facts or {}).get("convert") or {}).get("notes") or []:
                            self.note(f"  {planned.name:<11} note: {note}")
                        # A stage may say what running it is called (the imported engine: "imported").
                        outcome = getattr(planned.stage, "built_outcome", "built")
                    self.verified.add((kind, key))  # its bytes were hashed (or verified on pull) just now
            # Stored from here on: an interrupted push (or anything after) still reports it as kept.
            self.report.artifacts[kind] = entry.digest
            if outcome in ("built", "imported") and self.cache.remote is not None:
                push_note = self.cache.push(entry)
        elif self.verify:
            self.verified.add((kind, key))  # `get(verify=True)` re-hashed every file
        self.entries[planned.name] = entry
        self.refs[planned.name] = InputRef(key=entry.key, digest=entry.digest, path=entry.path)
        self.report.artifacts[kind] = entry.digest
        if planned.serves:
            self.report.repository_path = str(entry.path)
        notes = self._integrity_notes()
        if trust_note and outcome not in ("built", "imported"):
            self.note(f"  {planned.name:<11} {trust_note}", style="yellow")
            notes = f"{notes}; {trust_note}" if notes else trust_note
        detail = push_note or ("reused a concurrent build" if waited and outcome == "hit" else None)
        if refused_note and outcome in ("built", "imported"):
            detail = f"{refused_note}; {detail}" if detail else refused_note
        if notes:
            detail = f"{detail}; {notes}" if detail else notes
        self.add(StageReport(name=planned.name, outcome=outcome, key=key, digest=entry.digest, path=str(entry.path),
                             seconds=time.monotonic() - started, waited=waited, detail=detail, facts=facts))
        return entry

    def _judge_pulled(self, entry: Entry) -> tuple[bool, str | None]:
        """(usable, what to say) for an entry about to be reused: one pulled from a registry is judged by the
        trust policy when there is one; else it is used, and the build says that nothing checked it."""
        if self.pulled_check is not None:
            usable, note = self.pulled_check(entry)
            return usable, note or None
        return True, _unchecked_pulled_note(self.store, entry)

    def _build_into(self, planned: PlannedStage, key: StageKey, handle: Any) -> tuple[Entry, dict[str, Any]]:
        """Build into the handle's temp dir from verified inputs and commit under the key document (content
        only); what the build reported (facts: durations, logs) goes to the build record, not the artifact."""
        stage = planned.stage
        before = self._inputs(planned)
        # Never build on stored bytes not verified in this run (a flipped byte would carry over).
        inputs = {name: self._verified_input(name) for name in planned.reads}
        if inputs != before and stage.key(self.ctx, inputs).key != key.key:
            raise _InputRebuilt  # an input came back with other bytes, and this key names the old ones
        build_started = time.monotonic()
        self.ctx.written.clear()
        try:
            facts = stage.build(self.ctx, handle.dir, inputs, key) or {}
            seconds = time.monotonic() - build_started
            # Digests travel with the bytes: files linked from the verified inputs, and those the stage hashed
            # while writing, are not read again to be hashed (issue 15).
            entry = handle.commit(inputs=key.inputs, sources=[self.entries[name] for name in planned.reads],
                                  known=dict(self.ctx.written))
        except Exception as exc:
            # Disk full while the stage writes: say where, how much it had written and how much is free,
            # measured before the store removes its temporary directory (nothing half-written stays).
            if disk_full(exc, handle.dir):
                raise disk_full_error(exc, handle.dir, stage=planned.name, written_in=handle.dir,
                                      expected=self._expected_bytes(stage)) from None
            raise
        self.store.log_built(handle.kind, handle.key, entry.digest, seconds)
        return entry, {**facts, "build_seconds": round(seconds, 6)}

    def _expected_bytes(self, stage: Any) -> int | None:
        """What the stage says it writes (an optional part of the stage protocol), for a disk-full message."""
        estimate = getattr(stage, "expected_bytes", None)
        if estimate is None or self.ctx is None:
            return None
        try:
            value = estimate(self.ctx)
        except Exception:  # an estimate is a courtesy in an error message; never a second failure
            return None
        return int(value) if isinstance(value, (int, float)) and value > 0 else None

    # -- the end ---------------------------------------------------------------------------
    def _kept_on_interrupt(self) -> None:
        """The stage being stored when Ctrl-C came may have been committed an instant before it: the store says."""
        if self.storing is None or self.dry_run or self.storing[0] in self.report.artifacts:
            return
        kind, key = self.storing
        entry = self.store.peek(kind, key)
        if entry is not None and entry.current:
            self.report.artifacts[kind] = entry.digest

    def _failed(self, err: TrtpipeError, started: float) -> None:
        self.report.status = "failed"
        self.report.error = err.one_line()
        self._end(f"{self.current} failed", err.one_line(), started)
        if self.report.message:  # the record could not be written: the error line says so too
            err.message = f"{err.message}; {self.report.message}"

    def _end(self, reason: str, detail: str, started: float) -> None:
        if not any(s.name == self.current for s in self.report.stages):
            self.report.stages.append(StageReport(name=self.current, outcome="failed", detail=detail))
        self._skip_rest(self.current, reason)
        self.report.seconds = time.monotonic() - started
        self._write_record()

    def _write_record(self) -> None:
        if self.dry_run:
            return
        try:
            self.report.record_path = str(build_record.write_record(self.store.root,
                                                                    self.record(self.report, self.started_at)))
        except Exception as exc:
            if not disk_full(exc, self.store.root):
                raise
            lost = disk_full_error(exc, build_record.records_dir(self.store.root))
            if self.report.status != "failed":
                raise DiskFull(f"every stage was stored, but the build record could not be written: {lost.message}",
                               path=lost.path, free=lost.free, fix=lost.fix) from None
            self.report.message = f"the build record could not be written either ({lost.message})"


__all__ = ["BuildInterrupted", "PLAIN_STEPS", "PlanStale", "PulledCheck", "PushSigner", "RecordMaker", "Runner"]
