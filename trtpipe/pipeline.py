"""The runner: resolve -> plan -> the backend's stored stages (trtpipe.stages), each cached by its key.

`run_build(spec_path)` resolves the spec (every rule: trtpipe.resolve), plans it (memory and the
backend's build plan), then takes the spec's backend's declared stages in order. For each it asks the
stage for its key (the document it declares, hashed by the store), reuses the store's entry of that key
(or pulls it from the remote cache), and otherwise verifies the stored inputs the stage builds on and
lets the stage build into a temporary directory that the store publishes with one rename. Concurrent
runs of the same spec wait on the per-key lock and then reuse the first run's result. A dry run keys
what it can, builds nothing and shows what would run where. The runner knows no stage: what enters a
key and how a stage builds is the stage's.

A warm run (every stage a hit) imports no torch, transformers, ModelOpt or tritonclient: the stage
implementations import those inside the functions that convert, run or serve. A successful build also
leaves its resolution memo (trtpipe.warm), with which the next `trtpipe build` of an unchanged spec skips
this module altogether.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import build_record, warm
from trtpipe.build_report import BuildReport, Outcome, StagePrinter, StageReport
from trtpipe.disk import disk_full, disk_full_error
from trtpipe.errors import DiskFull, IntegrityError, InvalidInput, TrtpipeError, Untrusted, UsageError
from trtpipe.plan import memory_plan
from trtpipe.resolve import ResolvedSpec, resolve
from trtpipe.spec_loader import load_spec
from trtpipe.stages import BACKEND_STAGES, STORED_STAGE_NAMES, BackendStages, InputRef, NoKey, StageContext, StoredStage
from trtpipe.store.keys import StageKey
from trtpipe.store import signatures
from trtpipe.store.local import Entry, Store
from trtpipe.store.remote import RemoteUse, is_unavailable
from trtpipe.settings import Settings

PLAIN_STEPS = ("resolve", "plan")


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build. Nothing is half-written (a stage publishes by one rename); `report` says
    which stages were already stored."""

    def __init__(self, report: BuildReport) -> None:
        self.report = report
        super().__init__("build interrupted")


class _InputRebuilt(Exception):
    """A stage's stored input failed verification and was rebuilt with other bytes: key the stage again."""


def check_force(force: Sequence[str]) -> tuple[str, ...]:
    """The stage names asked for, each a stored stage of some backend ("all" stays: what it means depends on the
    spec's backend, known once it resolves; `forced_stages` settles it)."""
    wanted = tuple(dict.fromkeys(force))
    if "all" in wanted:
        return ("all",)
    for name in wanted:
        if name not in STORED_STAGE_NAMES:
            raise UsageError(f"--force {name}: not a stored stage", fix=f"use one of {', '.join(STORED_STAGE_NAMES)} or all")
    return wanted


def forced_stages(force: tuple[str, ...], backend: BackendStages, backend_kind: str) -> tuple[str, ...]:
    """The stages of this backend that `force` names. A name the backend has no stage of is refused: accepted,
    it would force nothing and the build would say exit 0 (an llm-api build has no engine, a reference build
    no export)."""
    own = tuple(s.name for s in backend.stages)
    if force == ("all",):
        return own
    for name in force:
        if name not in own:
            raise UsageError(f"--force {name}: this spec's backend ({backend_kind}) has no {name} stage",
                             fix=f"use one of {', '.join(own)} or all")
    return force


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# Judges an entry that came from a registry: (usable, note). Unusable: the stage is rebuilt here instead.
# The release area's trust policy provides one (the runner imports nothing of it); without one, a pulled
# entry is used and the build says that no policy checked it.
PulledCheck = Callable[[Entry], tuple[bool, str]]
# Signs what a build pushed (remote, what the push left, the entry) and says how, in a few words; the release
# area's `sign_pushed` with the workspace's key is one. The runner knows no key: the shell hands it one.
PushSigner = Callable[[Any, Any, Entry], str]
# Picks the stages for a resolved spec (and may adjust it): (the spec as the stages see it, its stages).
Chooser = Callable[[ResolvedSpec], tuple[ResolvedSpec, BackendStages]]


def _unchecked_pulled_note(store: Store, entry: Entry) -> str | None:
    """What to say about using a pulled entry when no trust policy judges it (None: it was built here)."""
    record = signatures.read_record(store.root, entry.digest)
    if record is None or not record.get("pulled_from"):
        return None
    if not record["bundles"]:
        return f"using an unsigned pulled entry (from {record['pulled_from']}); no trust policy checks it"
    # Which key signed it is not known without a key to verify against (the key id is the pusher's claim).
    return f"using a pulled entry carrying a signature (from {record['pulled_from']}), not verified: no trust policy"


def _empty(folder: Path) -> None:
    """Remove what a refused pull left in a build's staging folder (the folder stays)."""
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class _Runner:
    def __init__(
        self, spec_path: Path, store: Store, *, dry_run: bool, force: tuple[str, ...], verify: bool, progress: bool,
        remote: Any = None, on_stage: Callable[[StageReport], None] | None = None,
        pulled_check: PulledCheck | None = None, need_weights: bool | None = None,
        choose: Chooser | None = None, remote_use: RemoteUse | None = None, sign_push: PushSigner | None = None,
    ) -> None:
        self.spec_path = spec_path
        # Whether resolve needs the model's weights (default: a build does, a dry run does not), and what picks the
        # stages (default: the spec's backend's, BACKEND_STAGES); `trtpipe publish --engine` sets both.
        self.need_weights = (not dry_run) if need_weights is None else need_weights
        self.choose = choose
        self.on_stage = on_stage  # told each step's report as it is added (a matrix worker's live progress)
        self.store = store
        self.remote = remote  # a remote cache (probe / find / pull_into / push), or None once it is away
        self.remote_use = remote_use if remote_use is not None else RemoteUse()
        self.pulled_check = pulled_check  # judges entries that came from a registry (a trust policy), or None
        self.sign_push = sign_push  # signs each pushed entry (the workspace's key), or None: pushes are unsigned
        self.dry_run = dry_run
        self.force = force
        self.verify = verify
        self.printer = StagePrinter(progress, full_keys=dry_run)
        self.progress = progress
        self.report = BuildReport(spec_path=str(spec_path), dry_run=dry_run, verify=verify, store=str(store.root),
                                  remote=str(remote) if remote is not None else None,
                                  remote_mode=self.remote_use.mode if remote is not None else None)
        self.resolved: ResolvedSpec | None = None
        self.memory_plan: dict[str, Any] | None = None
        self.backend: BackendStages | None = None
        self.ctx: StageContext | None = None
        self.entries: dict[str, Entry] = {}  # stage name -> its entry in this run
        self.refs: dict[str, InputRef] = {}  # stage name -> what the stages after it see of it
        self.verified: set[tuple[str, str]] = set()  # (kind, key) whose bytes this run hashed or checked
        self.storing: tuple[str, str] | None = None  # (kind, key) of the stage being stored now
        self._seen_corrupt = 0
        self._seen_quarantined = 0
        self.started_at = _now_iso()

    # -- reporting -------------------------------------------------------------------------
    def _add(self, stage: StageReport) -> StageReport:
        self.report.stages.append(stage)
        if stage.key:
            self.report.keys[stage.name] = stage.key
        self.printer.stage(stage)
        if self.on_stage is not None:
            self.on_stage(stage)
        return stage

    def _names(self) -> list[str]:
        stored = [s.name for s in self.backend.stages] if self.backend else list(STORED_STAGE_NAMES)
        return [*PLAIN_STEPS, *stored]

    def _skip_rest(self, after: str, reason: str) -> None:
        names = self._names()
        for name in names[names.index(after) + 1:]:
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
            self.printer.note(f"    warning: {note}", style="yellow")
        return "; ".join(notes) or None

    # -- plain steps -----------------------------------------------------------------------
    def resolve_step(self) -> None:
        started = time.monotonic()
        # A dry run also works for planning-only specs (model.config, no weights): it still shows the
        # engine stage's exact trtllm-build command and container for a GPU target.
        resolved = resolve(load_spec(self.spec_path), need_weights=self.need_weights)
        if self.choose is not None:
            resolved, self.backend = self.choose(resolved)
        else:
            self.backend = BACKEND_STAGES[resolved.backend_kind]
        self.force = forced_stages(self.force, self.backend, resolved.backend_kind)
        self.resolved = resolved
        spec = resolved.spec
        self.report.name = spec.artifact_name
        self.report.target = spec.target.gpu
        self.report.toolchain = resolved.toolchain.name
        self.report.backend = resolved.backend_kind
        self._add(StageReport(name="resolve", outcome="ran", seconds=time.monotonic() - started,
                              detail=f"{spec.artifact_name} -> {spec.target.gpu} ({resolved.toolchain.name}, "
                                     f"{resolved.backend_kind})"))
        for note in resolved.llm_api.notes if resolved.llm_api is not None else ():
            self.printer.note(f"    note: {note}", style="yellow")  # e.g. a preview line's unverified fields

    def plan_step(self) -> None:
        assert self.resolved is not None and self.backend is not None
        started = time.monotonic()
        plan = memory_plan(self.resolved)
        self.memory_plan = plan.model_dump(mode="json")
        self.ctx = StageContext(resolved=self.resolved, build_plan=self.backend.plan(self.resolved),
                                digests=self.store.digests, store_root=self.store.root, progress=self.progress,
                                dry_run=self.dry_run)
        self._add(StageReport(name="plan", outcome="ran", seconds=time.monotonic() - started,
                              detail="fits" if plan.fits else "does NOT fit the target"))

    # -- stored stages ---------------------------------------------------------------------
    def _inputs(self, stage: StoredStage) -> dict[str, InputRef]:
        return {name: self.refs[name] for name in stage.inputs}

    def _ref(self, kind: str, key: str | None, digest: str | None) -> InputRef:
        path = self.store.entry_dir(kind, key) if key else self.store.root / kind / f"{kind.upper()}-KEY"
        return InputRef(key=key, digest=digest, path=path)

    def stored_step(self, stage: StoredStage, leases: contextlib.ExitStack) -> None:
        assert self.ctx is not None
        inputs = self._inputs(stage)
        try:
            key = stage.key(self.ctx, inputs)
        except NoKey as why:
            if not self.dry_run:  # a build resolves with the weights, so every stage has its inputs
                raise TrtpipeError(f"{stage.name}: {why.reason}", fix="report this spec") from None
            report = self._add(StageReport(name=stage.name, outcome=why.outcome, detail=why.reason))  # type: ignore[arg-type]
            self.refs[stage.name] = self._ref(stage.kind, None, None)
            self._show(stage, report, None, inputs)
            return
        if self.dry_run:
            self._dry(stage, key, inputs, leases)
            return
        for _attempt in range(2):
            try:
                self._stored_stage(stage, key, leases)
                return
            except _InputRebuilt:
                key = stage.key(self.ctx, self._inputs(stage))
        raise TrtpipeError(f"the inputs of {stage.name} changed twice while it was building",  # pragma: no cover
                           fix="run the build again")

    def _show(self, stage: StoredStage, report: StageReport, key: str | None, inputs: dict[str, InputRef]) -> None:
        """Dry run: where and what a stage that would build would run."""
        assert self.ctx is not None
        preview = stage.preview(self.ctx, key, inputs)
        if preview is None:
            return
        report.executor, report.command, report.container = preview.executor, preview.command, preview.container
        for note in preview.notes:
            self.printer.note(f"    {note}")

    def _dry(self, stage: StoredStage, key: StageKey, inputs: dict[str, InputRef], leases: contextlib.ExitStack) -> None:
        kind, forced = stage.kind, stage.name in self.force
        started = time.monotonic()
        leases.enter_context(self.store.locks.lease(kind, key.key))  # gc cannot remove what we look at
        entry = self.store.peek(kind, key.key)
        present = entry is not None and entry.current and not self.store.check(entry, digests=self.verify)
        outcome: Outcome = "hit" if present and not forced else "would-build"
        digest = entry.digest if present and entry is not None else None
        if outcome == "would-build" and not forced and self.remote is not None:
            try:
                found = self.remote.find(kind, key.key)
            except (IntegrityError, InvalidInput) as refused:  # a key tag naming no entry of this key: a miss
                self.printer.note(f"  {stage.name:<11} {refused.one_line()}; would build it here", style="yellow")
                found = None
            except TrtpipeError as err:
                if not is_unavailable(err):
                    raise
                self._remote_away(err)
                found = None
            if found is not None:
                outcome, digest = "would-pull", found.artifact_digest
        report = self._add(StageReport(
            name=stage.name, outcome=outcome, key=key.key, seconds=time.monotonic() - started,
            digest=digest if outcome != "would-build" else None, path=str(self.store.entry_dir(kind, key.key)),
            detail="forced" if forced and present else None))
        # The next stage's key may need this one's digest: known when it is here or in the remote.
        self.refs[stage.name] = self._ref(kind, key.key, digest if outcome != "would-build" else None)
        if outcome == "hit" and entry is not None:
            self.entries[stage.name] = entry
            if kind == "repository":
                self.report.repository_path = str(entry.path)
        if outcome == "would-build":
            self._show(stage, report, key.key, inputs)

    def _verified_input(self, name: str, leases: contextlib.ExitStack) -> InputRef:
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
                self.printer.note(
                    f"  {name:<11} stored {entry.kind} {entry.key[:16]} failed verification ({first.file}: "
                    f"{first.reason}); moved to quarantine, rebuilding it from its inputs", style="yellow")
                assert self.backend is not None
                self.stored_step(next(s for s in self.backend.stages if s.name == name), leases)
            else:
                self.verified.add((entry.kind, entry.key))
        return self.refs[name]

    def _stored_stage(self, stage: StoredStage, key: StageKey, leases: contextlib.ExitStack) -> Entry:
        """Reuse the entry of `key`, pull it from the remote cache, or build it."""
        assert self.ctx is not None
        kind, forced = stage.kind, stage.name in self.force
        started = time.monotonic()
        self.storing = (kind, key.key)  # what an interrupt asks the store about (`_kept_on_interrupt`)
        # A lease first: from here on gc cannot remove the entry we are about to use.
        leases.enter_context(self.store.locks.lease(kind, key.key))
        entry = None if forced else self.store.get(kind, key.key, verify=self.verify)
        waited = False
        outcome: Outcome = "hit"
        push_note: str | None = None
        facts: dict[str, Any] | None = None
        trust_note: str | None = None
        refused_note: str | None = None  # the remote's entry of this key did not verify: a miss, and why
        if entry is not None:
            usable, trust_note = self._judge_pulled(entry)
            if not usable:
                self.printer.note(f"  {stage.name:<11} {trust_note}; rebuilding it here", style="yellow")
                entry, forced = None, True
        if entry is None:
            def on_wait() -> None:
                nonlocal waited
                waited = True
                self.printer.note(f"  {stage.name:<11} waiting for another build of {kind} {key.key[:16]}")

            with self.store.building(kind, key.key, force=forced, verify=self.verify, on_wait=on_wait) as handle:
                if handle.existing is not None:
                    entry = handle.existing
                else:
                    if self.remote is not None and not forced:
                        try:
                            entry = self.remote.pull_into(handle)
                        # The pull's trust gate refused it, or what the key tag names is no entry of this key (a
                        # planted or damaged manifest): a miss, said; build it here (the push replaces the tag).
                        except (Untrusted, IntegrityError, InvalidInput) as refused:
                            self.printer.note(f"  {stage.name:<11} {refused.one_line()}; building it here",
                                              style="yellow")
                            refused_note = f"remote entry refused ({refused.message}); built here"
                            _empty(Path(handle.dir))
                            entry = None
                        except TrtpipeError as err:  # the cache went away mid-build: build it here instead
                            if not is_unavailable(err):
                                raise
                            self._remote_away(err)
                            _empty(Path(handle.dir))
                            entry = None
                        outcome = "pulled"
                    if entry is not None and self.pulled_check is None:
                        trust_note = _unchecked_pulled_note(self.store, entry)  # with a policy, the gate judged it
                    if entry is None:
                        entry, facts = self._build_into(stage, key, handle, leases)
                        for note in ((facts or {}).get("convert") or {}).get("notes") or []:
                            self.printer.note(f"  {stage.name:<11} note: {note}")
                        # A stage may say what running it is called (the imported engine: "imported").
                        outcome = getattr(stage, "built_outcome", "built")
                    self.verified.add((kind, key.key))  # its bytes were hashed (or verified on pull) just now
            # Stored from here on: an interrupted push (or anything after) still reports it as kept.
            self.report.artifacts[kind] = entry.digest
            if outcome in ("built", "imported") and self.remote is not None:
                push_note = self._push(entry)
        elif self.verify:
            self.verified.add((kind, key.key))  # `get(verify=True)` re-hashed every file
        self.entries[stage.name] = entry
        self.refs[stage.name] = InputRef(key=entry.key, digest=entry.digest, path=entry.path)
        self.report.artifacts[kind] = entry.digest
        if kind == "repository":
            self.report.repository_path = str(entry.path)
        notes = self._integrity_notes()
        if trust_note and outcome not in ("built", "imported"):
            self.printer.note(f"  {stage.name:<11} {trust_note}", style="yellow")
            notes = f"{notes}; {trust_note}" if notes else trust_note
        detail = push_note or ("reused a concurrent build" if waited and outcome == "hit" else None)
        if refused_note and outcome in ("built", "imported"):
            detail = f"{refused_note}; {detail}" if detail else refused_note
        if notes:
            detail = f"{detail}; {notes}" if detail else notes
        self._add(StageReport(name=stage.name, outcome=outcome, key=key.key, digest=entry.digest, path=str(entry.path),
                              seconds=time.monotonic() - started, waited=waited, detail=detail, facts=facts))
        return entry

    def _judge_pulled(self, entry: Entry) -> tuple[bool, str | None]:
        """(usable, what to say) for an entry about to be reused: one pulled from a registry is judged by the
        trust policy when there is one; else it is used, and the build says that nothing checked it."""
        if self.pulled_check is not None:
            usable, note = self.pulled_check(entry)
            return usable, note or None
        return True, _unchecked_pulled_note(self.store, entry)

    def _build_into(
        self, stage: StoredStage, key: StageKey, handle: Any, leases: contextlib.ExitStack
    ) -> tuple[Entry, dict[str, Any]]:
        """Build into the handle's temp dir from verified inputs and commit under the key document (content
        only); what the build reported (facts: durations, logs) goes to the build record, not the artifact."""
        assert self.ctx is not None
        before = self._inputs(stage)
        # Never build on stored bytes not verified in this run (a flipped byte would carry over).
        inputs = {name: self._verified_input(name, leases) for name in stage.inputs}
        if inputs != before and stage.key(self.ctx, inputs).key != key.key:
            raise _InputRebuilt  # an input came back with other bytes, and this key names the old ones
        build_started = time.monotonic()
        self.ctx.written.clear()
        try:
            facts = stage.build(self.ctx, handle.dir, inputs, key) or {}
            seconds = time.monotonic() - build_started
            # Digests travel with the bytes: files linked from the verified inputs, and those the stage hashed
            # while writing, are not read again to be hashed (issue 15).
            entry = handle.commit(inputs=key.inputs, sources=[self.entries[name] for name in stage.inputs],
                                  known=dict(self.ctx.written))
        except Exception as exc:
            # Disk full while the stage writes: say where, how much it had written and how much is free,
            # measured before the store removes its temporary directory (nothing half-written stays).
            if disk_full(exc, handle.dir):
                raise disk_full_error(exc, handle.dir, stage=stage.name, written_in=handle.dir,
                                      expected=self._expected_bytes(stage)) from None
            raise
        self.store.log_built(handle.kind, handle.key, entry.digest, seconds)
        return entry, {**facts, "build_seconds": round(seconds, 6)}

    def _expected_bytes(self, stage: StoredStage) -> int | None:
        """What the stage says it writes (an optional part of the stage protocol), for a disk-full message."""
        estimate = getattr(stage, "expected_bytes", None)
        if estimate is None or self.ctx is None:
            return None
        try:
            value = estimate(self.ctx)
        except Exception:  # an estimate is a courtesy in an error message; never a second failure
            return None
        return int(value) if isinstance(value, (int, float)) and value > 0 else None

    def _push(self, entry: Entry) -> str:
        """Share a built entry through the remote cache (read-write only); a failed push is reported, not fatal,
        unless the remote is required and away."""
        if not self.remote_use.pushes:
            return f"not pushed: the remote cache {self.remote} is read-only here"
        remote = self.remote
        try:
            pushed = remote.push(entry)
        except TrtpipeError as err:
            if is_unavailable(err):
                self._remote_away(err)  # raises when the remote is required
            else:
                self.printer.note(f"warning: could not push {entry.kind} to {remote}: {err.one_line()}",
                                  style="yellow")
            return f"push to {remote} failed: {err.one_line()}"
        # Under a policy an unsigned entry is never a hit anywhere: sign it here, or the cache is write-only.
        said: list[str] = []
        if self.sign_push is not None:
            try:
                said.append(self.sign_push(remote, pushed, entry))
            except TrtpipeError as err:
                if is_unavailable(err):
                    self._remote_away(err)
                self.printer.note(f"warning: pushed {entry.kind} to {remote} but could not sign it: {err.one_line()}",
                                  style="yellow")
                said.append(f"unsigned: signing failed: {err.one_line()}")
        replaced = getattr(pushed, "replaced", None)
        if replaced:
            said.append(f"its key tag named {replaced}, which did not verify here; key tag moved to this entry")
        return f"pushed to {remote}" + (f" ({'; '.join(said)})" if said else "")

    def _reach_remote(self) -> None:
        """Before the first stage: is the remote cache there, and does it take the credentials? (One short
        request; a required cache that is away fails the build here, before anything is built.)"""
        if self.remote is None:
            return
        try:
            self.remote.probe()
        except TrtpipeError as err:
            if not is_unavailable(err):
                raise
            self._remote_away(err)

    def _remote_away(self, err: TrtpipeError) -> None:
        """The remote cache is down or refused the credentials. Required: the build fails with that one line.
        Else (a build cache, like Bazel's remote cache or sccache): say so once and go on with the local store."""
        if self.remote_use.required:
            err.message = f"the build requires its remote cache {self.remote}, and it is away: {err.message}"
            raise err
        note = (f"remote cache {self.remote} is away ({err.one_line()}); building with the local store only "
                "(TRTPIPE_REQUIRE_REMOTE=1 makes this an error)")
        self.printer.note(f"warning: {note}", style="yellow")
        self.report.remote_unavailable = note
        self.remote = None

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> BuildReport:
        started = time.monotonic()
        current = "resolve"
        try:
            with contextlib.ExitStack() as leases:
                self.resolve_step()
                current = "plan"
                self.plan_step()
                assert self.backend is not None
                current = self.backend.stages[0].name if self.backend.stages else current
                self._reach_remote()
                for stage in self.backend.stages:
                    current = stage.name
                    self.stored_step(stage, leases)
            if self.dry_run:
                self.report.status = "dry-run"
        except TrtpipeError as err:
            self._failed(current, err, started)
            raise
        except Exception as exc:
            # A write that failed for lack of space anywhere else (the digest cache, a lock, the store's
            # temp dir): one line and a failed record, like any error a user can act on.
            if not disk_full(exc, self.store.root):
                raise
            # SQLite names no file: its one here is the store's digest cache
            where = getattr(self.store.digests, "db_path", None) if "sqlite3" in type(exc).__module__ else None
            err = disk_full_error(exc, where or self.store.root, stage=current)
            self._failed(current, err, started)
            raise err from None
        except KeyboardInterrupt:
            self._kept_on_interrupt()
            self.report.status = "interrupted"
            self.report.message = "interrupted: nothing half-written" + (
                f"; stored: {', '.join(self.report.kept())}" if self.report.artifacts else "; nothing was stored")
            self._end(current, "interrupted", "interrupted", started)
            raise BuildInterrupted(self.report) from None
        self.report.seconds = time.monotonic() - started
        if self.report.repository_path and self.progress:
            self.printer.note(f"repository: {self.report.repository_path}")
        self._write_record()
        return self.report

    def _kept_on_interrupt(self) -> None:
        """The stage being stored when Ctrl-C came may have been committed an instant before it: the store says."""
        if self.storing is None or self.dry_run or self.storing[0] in self.report.artifacts:
            return
        kind, key = self.storing
        entry = self.store.peek(kind, key)
        if entry is not None and entry.current:
            self.report.artifacts[kind] = entry.digest

    def _failed(self, current: str, err: TrtpipeError, started: float) -> None:
        self.report.status = "failed"
        self.report.error = err.one_line()
        self._end(current, f"{current} failed", err.one_line(), started)
        if self.report.message:  # the record could not be written: the error line says so too
            err.message = f"{err.message}; {self.report.message}"

    def _end(self, current: str, reason: str, detail: str, started: float) -> None:
        if not any(s.name == current for s in self.report.stages):
            self.report.stages.append(StageReport(name=current, outcome="failed", detail=detail))
        self._skip_rest(current, reason)
        self.report.seconds = time.monotonic() - started
        self._write_record()

    def _write_record(self) -> None:
        if self.dry_run:
            return
        record = build_record.make_record(
            report=self.report, resolved=self.resolved, memory_plan=self.memory_plan, started_at=self.started_at
        )
        try:
            self.report.record_path = str(build_record.write_record(self.store.root, record))
        except Exception as exc:
            if not disk_full(exc, self.store.root):
                raise
            lost = disk_full_error(exc, build_record.records_dir(self.store.root))
            if self.report.status != "failed":
                raise DiskFull(f"every stage was stored, but the build record could not be written: {lost.message}",
                               path=lost.path, free=lost.free, fix=lost.fix) from None
            self.report.message = f"the build record could not be written either ({lost.message})"


def _remote_use_from_settings(settings: Settings) -> RemoteUse:
    from trtpipe.store.remote import remote_use

    return remote_use(settings)


def open_stores(store: Store | Path | str | None, remote: Any = None, *, settings: Settings) -> tuple[Store, Any]:
    """The local store, and the remote cache (`trtpipe.store.remote`) when `remote` is given or `store`
    (or the settings' TRTPIPE_STORE) names one, e.g. `oci://host/repo` (`trtpipe.settings.places` decides).

    With a remote cache, artifacts still live in the local store; the remote is consulted before
    building a stage, and what is built is pushed to it."""
    if isinstance(store, Store):
        return store, remote
    from trtpipe.settings import places
    from trtpipe.store.remote import open_remote

    root, remote_url = places(store, settings)
    if remote is None and remote_url is not None:
        remote = open_remote(remote_url, settings)
    return Store.open(root), remote


def run_build(
    spec_path: Path | str,
    *,
    dry_run: bool = False,
    force: Sequence[str] = (),
    verify: bool = False,
    store: Store | Path | str | None = None,
    progress: bool = True,
    remote: Any = None,
    on_stage: Callable[[StageReport], None] | None = None,
    pulled_check: PulledCheck | None = None,
    remote_use: RemoteUse | None = None,
    sign_push: PushSigner | None = None,
    settings: Settings,
) -> BuildReport:
    """Build (or reuse) every stage of a spec. Raises TrtpipeError when a stage fails (BuildInterrupted on
    Ctrl-C); the report's status is "dry-run" for a dry run.

    `store`: a Store, a store root, or `oci://HOST/REPO` (the default store with that remote cache);
    `remote`: a remote cache (probe / find / pull_into / push) to consult before building and push to after;
    `remote_use`: how (read-write or read-only, required or best effort: `trtpipe.store.remote.RemoteUse`;
    default: as the settings' TRTPIPE_REMOTE_MODE and TRTPIPE_REQUIRE_REMOTE say, else read-write and best
    effort, where a cache that is away is a warning and a local build);
    `settings`: the caller's (`trtpipe.settings.Settings`): the store, the remote's credentials, the remote mode;
    `on_stage`: called with each step's report as soon as it is known;
    `sign_push`: signs each entry the build pushes (the workspace's signing key), or None: pushed unsigned."""
    spec_path = Path(spec_path)
    if not spec_path.is_file():
        raise UsageError(f"{spec_path}: no such spec file", fix="give the path of a build spec YAML")
    forced = check_force(force)
    opened, remote = open_stores(store, remote, settings=settings)
    remote_use = remote_use if remote_use is not None else _remote_use_from_settings(settings)
    started_ns = time.time_ns()  # before anything is read: the memo's inputs must be older (trtpipe.warm)
    runner = _Runner(spec_path, opened, dry_run=dry_run, force=forced, verify=verify, progress=progress,
                     remote=remote, on_stage=on_stage, pulled_check=pulled_check, remote_use=remote_use,
                     sign_push=sign_push)
    try:
        report = runner.run()
    finally:
        opened.digests.close()
    if report.status == "ok" and runner.resolved is not None and runner.backend is not None:
        # What this build read and concluded, for the next `trtpipe build` of the spec (trtpipe.warm).
        warm.remember(opened.root, spec_path, resolved=runner.resolved, report=report,
                      stage_kinds={s.name: s.kind for s in runner.backend.stages}, started_ns=started_ns)
    return report


def stage_keys(spec_path: Path | str, *, store: Store | Path | str | None = None, settings: Settings) -> dict[str, str]:
    """The keys of a spec's stages without building anything (a dry run)."""
    report = run_build(spec_path, dry_run=True, store=store, progress=False, settings=settings)
    return dict(report.keys)


# --------------------------------------------------------------------------- an engine built outside trtpipe
class PublishRequest(BaseModel):
    """`trtpipe publish SPEC --engine DIR [--tokenizer DIR]`: publish a repository for an engine built elsewhere."""

    spec: Path
    engine: Path
    tokenizer: Path | None = None  # default: the spec's tokenizer (model.tokenizer, the model folder), else the
                                   # engine folder's own tokenizer.json


class PublishOutcome(BaseModel):
    """What `run_publish` did: the artifacts (digests), where the repository is, what the checks noted."""

    status: str
    name: str | None
    target: str | None
    toolchain: str | None
    imported_from: str
    tokenizer: str | None
    engine_digest: str | None
    repository_digest: str | None
    repository_path: str | None
    keys: dict[str, str]
    notes: list[str]
    record_path: str | None
    stages: list[StageReport]
    seconds: float


def _publish_chooser(request: PublishRequest, stage_box: list[Any], tokenizer_box: list[Path]) -> Chooser:
    from trtpipe.stages import BACKEND_STAGES

    def choose(resolved: ResolvedSpec) -> tuple[ResolvedSpec, BackendStages]:
        imported = BACKEND_STAGES[resolved.backend_kind].imported
        if imported is None:
            takers = [kind for kind, stages in BACKEND_STAGES.items() if stages.imported is not None]
            where = ("target", "gpu") if resolved.is_cpu_reference else ("backend",)
            raise resolved.error(where, f"an engine built outside trtpipe is published for a {' or '.join(takers)} "
                                 f"spec, and this spec's backend is {resolved.backend_kind}",
                                 f"target a GPU with backend {' or '.join(takers)}")
        tokenizer = _publish_tokenizer(request, resolved)
        tokenizer_box.append(tokenizer)
        backend = imported(request.engine)
        stage_box.append(backend.stages[0])
        # The tokenizer enters the repository's key and files as the spec's own would (trtpipe.stages.publish).
        return dataclasses.replace(resolved, tokenizer_dir=tokenizer), backend

    return choose


def _publish_tokenizer(request: PublishRequest, resolved: ResolvedSpec) -> Path:
    """The tokenizer folder the repository's models get: the request's, the spec's, else the engine folder's."""
    from trtpipe.errors import NotFound
    from trtpipe.model_folder import check_tokenizer

    folder = request.tokenizer or resolved.tokenizer_dir or resolved.model_dir
    if folder is None and (Path(request.engine) / "tokenizer.json").is_file():
        folder = Path(request.engine)  # tokenizer files kept beside the engine files (they stay out of the engine)
    if folder is None:
        raise NotFound(f"{resolved.spec_path}: model.tokenizer: the spec names no tokenizer (model.tokenizer) and no "
                       f"model folder, and the engine folder {request.engine} holds no tokenizer.json",
                       what="tokenizer", ref=str(resolved.spec_path),
                       fix="set model.tokenizer to the model's tokenizer folder, or copy its tokenizer files "
                           "(tokenizer.json ...) into the engine folder")
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise NotFound(f"{folder}: no tokenizer.json (the serving models read the tokenizer with the tokenizers "
                       "library)", what="tokenizer", ref=str(folder),
                       fix="give the folder the model's tokenizer was saved to (tokenizer.save_pretrained writes it)")
    check_tokenizer(folder)  # it must load as the serving models load it, before anything is stored
    return folder


def run_publish(
    request: PublishRequest, *, store: Store | Path | str | None = None, remote: Any = None, progress: bool = True,
    remote_use: RemoteUse | None = None, settings: Settings,
) -> PublishOutcome:
    """Check an engine built outside trtpipe against its spec, store it (stage outcome "imported"; its build record
    names the folder it came from) and publish its repository through the publish stage, as `build` would. The spec
    is resolved without weights: a planning-only spec (model.config) is enough, since nothing is converted.
    Raises EngineMismatch (trtpipe.engine.imported) for an engine that does not fit the spec."""
    from trtpipe.engine.imported import read_engine_config

    spec_path = Path(request.spec)
    if not spec_path.is_file():
        raise UsageError(f"{spec_path}: no such spec file", fix="give the path of a build spec YAML")
    read_engine_config(request.engine)  # a folder that is no engine is one line before the spec is resolved
    opened, remote = open_stores(store, remote, settings=settings)
    stage_box: list[Any] = []
    tokenizer_box: list[Path] = []
    runner = _Runner(spec_path, opened, dry_run=False, force=(), verify=False, progress=progress, remote=remote,
                     need_weights=False, choose=_publish_chooser(request, stage_box, tokenizer_box),
                     remote_use=remote_use if remote_use is not None else _remote_use_from_settings(settings))
    try:
        # No resolution memo (trtpipe.warm): that is `build`'s, and this spec's build would convert and build.
        report = runner.run()
    finally:
        opened.digests.close()
    outside = stage_box[0].checked(runner.ctx) if stage_box and runner.ctx is not None else None
    return PublishOutcome(
        status=report.status, name=report.name, target=report.target, toolchain=report.toolchain,
        imported_from=outside.folder if outside is not None else str(Path(request.engine).resolve()),
        tokenizer=str(tokenizer_box[0]) if tokenizer_box else None,
        engine_digest=report.artifacts.get("engine"), repository_digest=report.artifacts.get("repository"),
        repository_path=report.repository_path, keys=dict(report.keys),
        notes=list(outside.notes) if outside is not None else [], record_path=report.record_path,
        stages=list(report.stages), seconds=report.seconds,
    )


__all__ = ["BuildInterrupted", "BuildReport", "PublishOutcome", "PublishRequest", "StageReport", "run_build",
           "run_publish", "stage_keys"]
