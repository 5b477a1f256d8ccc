"""The stage runner: resolve -> plan -> checkpoint -> engine -> publish, each stage cached by its key.

`run_build(spec_path)` computes each stage's key from exactly the inputs that determine its output
(`trtpipe.store.keys`), reuses the store entry of that key when it exists, and otherwise builds
it into a temporary directory that the store publishes with one rename. Concurrent runs of the
same spec wait on the per-key lock and then reuse the first run's result.

The stage implementations belong to other areas and are imported lazily, only when a stage
actually has to build: a warm run (every stage a hit) never imports torch, transformers or
ModelOpt. A stage whose module is not installed yet stops the run after the last stage that
exists, and the report says so.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from trtpipe.errors import TrtpipeError, UsageError
from trtpipe.store import keys as keymod
from trtpipe.store.local import Entry, Store

STAGES = ("resolve", "plan", "checkpoint", "engine", "publish")
STORED_STAGES = {"checkpoint": "checkpoint", "engine": "engine", "publish": "repository"}

Outcome = Literal["ran", "hit", "built", "pulled", "would-build", "would-pull", "skipped", "unavailable", "failed"]

# HF files that determine a converted checkpoint (tokenizer files enter the repository key instead).
_WEIGHT_SUFFIXES = (".safetensors",)
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")


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
    dry_run: bool = False
    verify: bool = False
    status: Literal["ok", "incomplete", "failed", "dry-run"] = "ok"
    message: str | None = None
    stopped_after: str | None = None
    stages: list[StageReport] = Field(default_factory=list)
    keys: dict[str, str] = Field(default_factory=dict)
    artifacts: dict[str, str] = Field(default_factory=dict, description="kind -> artifact digest")
    repository_path: str | None = None
    store: str | None = None
    remote: str | None = Field(default=None, description="oci:// shared cache consulted before building.")
    record_path: str | None = None
    seconds: float = 0.0
    error: str | None = None

    def stage(self, name: str) -> StageReport | None:
        return next((s for s in self.stages if s.name == name), None)


class StageUnavailable(Exception):
    """A stage's implementing module is not installed (yet)."""


class _InputRebuilt(Exception):
    """A stage's stored input failed verification and was rebuilt with other bytes: key the stage again."""


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _need(module: str, attr: str) -> Callable[..., Any]:
    """Import `module.attr` or raise StageUnavailable (never hides a bug inside an existing module)."""
    if not _module_exists(module):
        raise StageUnavailable(f"{module} is not available")
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        raise StageUnavailable(f"{module}.{attr} is not available")
    return getattr(mod, attr)


def _check_available(module: str, attr: str) -> None:
    """Like _need, without importing the module (it may import torch): for the warm path."""
    if not _module_exists(module):
        raise StageUnavailable(f"{module} is not available")


def check_force(force: Sequence[str]) -> tuple[str, ...]:
    wanted = tuple(dict.fromkeys(force))
    if "all" in wanted:
        return tuple(STORED_STAGES)
    for name in wanted:
        if name not in STORED_STAGES:
            raise UsageError(
                f"--force {name}: not a stored stage", fix=f"use one of {', '.join(STORED_STAGES)} or all"
            )
    return wanted


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class _Printer:
    """One line per stage on stderr (rich when it is a terminal)."""

    def __init__(self, enabled: bool, *, full_keys: bool = False) -> None:
        self.enabled = enabled
        self.full_keys = full_keys  # a dry run prints whole keys
        self._console = None

    def _out(self, text: str, *, markup: bool = True) -> None:
        if not self.enabled:
            return
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        self._console.print(text, soft_wrap=True, markup=markup)

    def stage(self, report: StageReport) -> None:
        colour = {"hit": "green", "built": "cyan", "ran": "white", "would-build": "yellow", "failed": "red"}.get(
            report.outcome, "magenta"
        )
        from rich.markup import escape

        key = (report.key if self.full_keys else report.key[:16]) if report.key else ""
        detail = f"  {escape(report.detail)}" if report.detail else ""
        self._out(
            f"  {report.name:<11} [{colour}]{report.outcome:<11}[/{colour}] {report.seconds:8.2f}s  {key}{detail}"
        )

    def note(self, text: str, *, style: str | None = None) -> None:
        if style:
            from rich.markup import escape

            self._out(f"[{style}]{escape(text)}[/{style}]")
        else:
            self._out(text, markup=False)


class _Runner:
    def __init__(
        self, spec_path: Path, store: Store, *, dry_run: bool, force: tuple[str, ...], verify: bool, progress: bool,
        remote: Any = None,
    ) -> None:
        self.spec_path = spec_path
        self.store = store
        self.remote = remote  # trtpipe.store.oci.RemoteStore, or None
        self.dry_run = dry_run
        self.force = force
        self.verify = verify
        self.progress = progress
        self.printer = _Printer(progress, full_keys=dry_run)
        self.report = BuildReport(spec_path=str(spec_path), dry_run=dry_run, verify=verify, store=str(store.root),
                                  remote=str(remote) if remote is not None else None)
        self.resolved: Any = None
        self.memory_plan: dict[str, Any] | None = None
        self.build_plan: Any = None
        self.entries: dict[str, Entry] = {}
        self.verified: set[tuple[str, str]] = set()  # (kind, key) whose bytes this run hashed or checked
        self.dry_digests: dict[str, str] = {}  # dry run: digests of entries present here or in the remote
        self._seen_corrupt = 0
        self._seen_quarantined = 0
        self.started_at = _now_iso()

    # -- helpers ---------------------------------------------------------------------------
    def _add(self, stage: StageReport) -> StageReport:
        self.report.stages.append(stage)
        if stage.key:
            self.report.keys[stage.name] = stage.key
        self.printer.stage(stage)
        return stage

    def _skip_rest(self, after: str, reason: str) -> None:
        names = STAGES[STAGES.index(after) + 1 :]
        for name in names:
            self.report.stages.append(StageReport(name=name, outcome="skipped", detail=reason))

    def _verified_input(self, stage: str, leases: contextlib.ExitStack) -> Entry:
        """The entry `stage` produced, verified before another stage builds on it.

        Verified means: committed or checked in this run, or every file's sha256 matches its manifest
        by the digest cache's rules (a file unchanged since it was hashed is not read again). A
        mismatch quarantines the entry and rebuilds it, from inputs verified the same way."""
        kind = STORED_STAGES[stage]
        entry = self.entries[kind]
        if (kind, entry.key) in self.verified:
            return entry
        problems = self.store.verify_entry(entry)
        if not problems:
            self.verified.add((kind, entry.key))
            return entry
        self.store.quarantine(entry, problems)
        first = problems[0]
        self.printer.note(
            f"  {stage:<11} stored {kind} {entry.key[:16]} failed verification ({first.file}: {first.reason}); "
            "moved to quarantine, rebuilding it from its inputs", style="yellow")
        getattr(self, f"{stage}_stage")(leases)
        return self.entries[kind]

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

    def _stored_stage(
        self,
        stage: str,
        key: keymod.StageKey,
        build: Callable[[Path], dict[str, Any] | None],
        leases: contextlib.ExitStack,
    ) -> Entry | None:
        """Reuse the entry of `key` or build it. Returns the entry (None in a dry run that would build)."""
        kind = STORED_STAGES[stage]
        forced = stage in self.force
        started = time.monotonic()
        # A lease first: from here on gc cannot remove the entry we are about to use.
        leases.enter_context(self.store.locks.lease(kind, key.key))
        if self.dry_run:
            entry = self.store.peek(kind, key.key)
            present = entry is not None and entry.current and not self.store.check(entry, digests=self.verify)
            outcome: Outcome = "hit" if present and not forced else "would-build"
            digest = entry.digest if present and entry is not None else None
            if outcome == "would-build" and not forced and self.remote is not None:
                remote = self.remote.find(kind, key.key)
                if remote is not None:
                    outcome, digest = "would-pull", remote.artifact_digest
            detail = "forced" if forced and present else None
            self._add(StageReport(name=stage, outcome=outcome, key=key.key, seconds=time.monotonic() - started,
                                  digest=digest, path=str(self.store.entry_dir(kind, key.key)), detail=detail))
            if digest is not None and outcome != "would-build":
                self.dry_digests[kind] = digest  # the next stage's key may need it
            if present and not forced:
                self.entries[kind] = entry
                return entry
            return None

        entry = None if forced else self.store.get(kind, key.key, verify=self.verify)
        waited = False
        outcome: Outcome = "hit"
        push_note: str | None = None
        facts: dict[str, Any] | None = None
        if entry is None:
            def on_wait() -> None:
                nonlocal waited
                waited = True
                self.printer.note(f"  {stage:<11} waiting for another build of {kind} {key.key[:16]}")

            with self.store.building(kind, key.key, force=forced, verify=self.verify, on_wait=on_wait) as handle:
                if handle.existing is not None:
                    entry = handle.existing
                else:
                    if self.remote is not None and not forced:
                        entry = self.remote.pull_into(handle)
                        outcome = "pulled"
                    if entry is None:
                        entry, facts = self._build_into(handle, key, build)
                        outcome = "built"
                    self.verified.add((kind, key.key))  # its bytes were hashed (or verified on pull) just now
            if outcome == "built" and self.remote is not None:
                push_note = self._push(entry)
        elif self.verify:
            self.verified.add((kind, key.key))  # `get(verify=True)` re-hashed every file
        self.entries[kind] = entry
        self.report.artifacts[kind] = entry.digest
        notes = self._integrity_notes()
        detail = push_note or ("reused a concurrent build" if waited and outcome == "hit" else None)
        if notes:
            detail = f"{detail}; {notes}" if detail else notes
        self._add(StageReport(name=stage, outcome=outcome, key=key.key, digest=entry.digest, path=str(entry.path),
                              seconds=time.monotonic() - started, waited=waited, detail=detail, facts=facts))
        return entry

    def _push(self, entry: Entry) -> str:
        """Share a built entry through the remote cache; a failed push is reported, not fatal."""
        try:
            self.remote.push(entry)
        except TrtpipeError as err:
            self.printer.note(f"warning: could not push {entry.kind} to {self.remote}: {err.one_line()}",
                              style="yellow")
            return f"push to {self.remote} failed: {err.one_line()}"
        return f"pushed to {self.remote}"

    def _build_into(
        self, handle: Any, key: keymod.StageKey, build: Callable[[Path], dict[str, Any] | None]
    ) -> tuple[Entry, dict[str, Any]]:
        """Build into the handle's temp dir and commit under the key document (content only); what
        the build reported (facts: durations, logs) goes to the build record, not the artifact."""
        build_started = time.monotonic()
        facts = build(handle.dir) or {}
        seconds = time.monotonic() - build_started
        entry = handle.commit(inputs=key.inputs)
        self.store.log_built(handle.kind, handle.key, entry.digest, seconds)
        return entry, {**facts, "build_seconds": round(seconds, 6)}

    # -- stages ----------------------------------------------------------------------------
    def resolve_stage(self) -> None:
        started = time.monotonic()
        load_spec = _need("trtpipe.spec_loader", "load_spec")
        resolve = _need("trtpipe.resolve", "resolve")
        # A dry run also works for planning-only specs (model.config, no weights): it still shows
        # the engine stage's exact trtllm-build command and container for a GPU target.
        self.resolved = resolve(load_spec(self.spec_path), need_weights=not self.dry_run)
        spec = self.resolved.spec
        self.report.name = spec.artifact_name
        self.report.target = spec.target.gpu
        self.report.toolchain = self.resolved.toolchain.name
        self._add(StageReport(name="resolve", outcome="ran", seconds=time.monotonic() - started,
                              detail=f"{spec.artifact_name} -> {spec.target.gpu} ({self.resolved.toolchain.name})"))

    def plan_stage(self) -> None:
        started = time.monotonic()
        memory_plan = _need("trtpipe.plan", "memory_plan")
        plan = memory_plan(self.resolved)
        self.memory_plan = plan.model_dump(mode="json") if hasattr(plan, "model_dump") else dict(plan)
        fits = getattr(plan, "fits", None)
        self._add(StageReport(name="plan", outcome="ran", seconds=time.monotonic() - started,
                              detail=None if fits is None else ("fits" if fits else "does NOT fit the target")))

    def checkpoint_key(self) -> keymod.StageKey:
        resolved = self.resolved
        spec = resolved.spec
        digests = self.store.digests
        hf_source = None
        weights: list[str] | None = None
        if resolved.model_dir is not None:
            files = weight_files(Path(resolved.model_dir), allow_pickle=spec.model.allow_pickle)
            if not files:
                raise TrtpipeError(
                    f"{resolved.model_dir}: no .safetensors weight files",
                    fix="point model.path at a Hugging Face directory saved with safe_serialization=True",
                )
            weights = [digests.digest(f) for f in files]
        elif spec.model.repo_id and spec.model.revision:
            hf_source = {"repo_id": spec.model.repo_id, "revision": spec.model.revision}
        else:
            raise StageUnavailable("model.config is for planning only: there are no weights to convert")
        calibration = spec.quantization.calibration
        kv = resolved.kv_cache_dtype
        calibration_digest = None
        if keymod.needs_calibration(spec.quantization.algo.value, kv):
            calibration_source = _need("trtpipe.checkpoint.calibration", "calibration_source")
            calibration_digest = digests.digest(Path(calibration_source(spec)))
        toolchain = resolved.toolchain
        return keymod.checkpoint_key(
            config_digest=digests.digest(Path(resolved.config_path)),
            weight_digests=weights,
            hf_source=hf_source,
            dtype=resolved.weight_dtype,
            algo=spec.quantization.algo.value,
            kv_cache=kv,
            group_size=spec.quantization.group_size,
            calibration_digest=calibration_digest,
            calibration_samples=calibration.samples,
            calibration_max_seq_len=calibration.max_seq_len,
            calibration_seed=calibration.seed,
            calibration_text_field=calibration.text_field,
            tp=spec.target.tp,
            pp=spec.target.pp,
            # A toolchain that pins no version converts with the installed one: key that one.
            modelopt_version=toolchain.modelopt_version or _installed("nvidia-modelopt"),
            transformers_version=toolchain.transformers_version or _installed("transformers"),
        )

    def _planning_only(self) -> bool:
        model = self.resolved.spec.model
        return self.resolved.model_dir is None and not (model.repo_id and model.revision)

    def checkpoint_stage(self, leases: contextlib.ExitStack) -> None:
        _check_available("trtpipe.checkpoint.convert", "convert_checkpoint")
        # GPU targets convert where the engine is built (its executor, on the GPU builder); the key
        # is the same wherever the conversion runs. cpu-reference converts here, in-process.
        in_executor = not self.resolved.spec.target.is_cpu_reference
        if self.dry_run and self._planning_only():
            stage = self._add(StageReport(name="checkpoint", outcome="would-build" if in_executor else "skipped",
                                          detail="planning-only spec (model.config): no weights, so no key; "
                                                 "set model.path or model.repo_id + revision to build"))
            if in_executor:
                self._show_conversion(stage, None)
            return
        key = self.checkpoint_key()

        def build(out_dir: Path) -> dict[str, Any]:
            if in_executor:
                # Checks first, in under a second: a host that cannot convert or build there fails
                # before any (possibly hours-long) work.
                convert_in_executor = _need("trtpipe.engine.conversion", "convert_in_executor")
                return convert_in_executor(self.resolved, out_dir, self._log_path("checkpoint", key.key),
                                           progress=self.progress)
            convert = _need("trtpipe.checkpoint.convert", "convert_checkpoint")
            summary = convert(self.resolved, out_dir, show_progress=self.progress)
            if hasattr(summary, "model_dump"):
                return {"convert": summary.model_dump(mode="json")}
            return {}

        self._stored_stage("checkpoint", key, build, leases)
        if self.dry_run and in_executor and self.report.stages[-1].outcome == "would-build":
            self._show_conversion(self.report.stages[-1], key.key)

    def _log_path(self, stage: str, key: str) -> Path:
        logs = self.store.root / "logs"
        logs.mkdir(exist_ok=True)
        return logs / f"{stage}-{key[:16]}-{int(time.time())}-{os.getpid()}.log"

    def _show_conversion(self, stage: StageReport, key: str | None) -> None:
        """Dry run: where the conversion would run and the exact command / container (not this host)."""
        preview = _need("trtpipe.engine.conversion", "preview_conversion")
        out_dir = self.store.root / "tmp" / f"checkpoint-{key or 'CHECKPOINT-KEY'}-XXXXXXXX"
        conversion = preview(self.resolved, out_dir)
        stage.executor, stage.command, stage.container = conversion.executor, conversion.command, conversion.container
        self.printer.note(f"    converts in the {conversion.where}")
        docker_run = (conversion.container or {}).get("docker_run")
        if docker_run:
            self.printer.note("    container: " + " ".join(str(a) for a in docker_run))
        elif conversion.command:
            self.printer.note("    command: " + " ".join(conversion.command))

    def engine_key(self, checkpoint_key: str) -> keymod.StageKey:
        resolved = self.resolved
        return keymod.engine_key(
            checkpoint=checkpoint_key,
            build_config=self.build_plan.build_config,
            trtllm_version=resolved.toolchain.trtllm_version,
            tensorrt_version=resolved.toolchain.tensorrt_version,
            gpu_sm=resolved.sm,
            gpu_product=resolved.gpu.product if resolved.gpu else resolved.spec.target.gpu,
        )

    def engine_stage(self, leases: contextlib.ExitStack) -> None:
        checkpoint_key = self.report.keys.get("checkpoint")
        _check_available("trtpipe.engine.stage", "build_engine")
        self.build_plan = _need("trtpipe.engine.plan", "make_build_plan")(self.resolved)
        if checkpoint_key is None:  # dry run of a planning-only spec: no keys, but the exact command
            self._add(StageReport(name="engine", outcome="would-build",
                                  detail="key needs the checkpoint's weights"))
            checkpoint_dir = self.store.root / "checkpoint" / "CHECKPOINT-KEY"
            out_name = "engine-ENGINE-KEY"
        else:
            key = self.engine_key(checkpoint_key)
            checkpoint_dir = self.store.entry_dir("checkpoint", checkpoint_key)
            out_name = f"engine-{key.key}-XXXXXXXX"
            if self.dry_run:
                self._stored_stage("engine", key, lambda _: None, leases)
        if self.dry_run:
            if self.resolved.spec.target.is_cpu_reference:
                return  # the reference executor runs no trtllm-build and no container
            stage = self.report.stages[-1]
            out_dir = self.store.root / "tmp" / out_name
            stage.command = [str(a) for a in self.build_plan.render_command(checkpoint_dir, out_dir)]
            self.printer.note("    command: " + " ".join(stage.command))
            if self.resolved.spec.target.executor.value in ("docker", "auto"):
                stage.container = _container_spec(self.resolved, self.build_plan, checkpoint_dir, out_dir)
                if stage.container is not None:
                    # The full spec is in --json; a person reads the equivalent docker run line.
                    docker_run = stage.container.get("docker_run") or []
                    self.printer.note("    container: " + " ".join(str(a) for a in docker_run))
            return

        def build(out_dir: Path) -> dict[str, Any]:
            build_engine = _need("trtpipe.engine.stage", "build_engine")
            # Never build on stored bytes not verified in this run (a flipped byte would carry over).
            checkpoint = self._verified_input("checkpoint", leases)
            log_path = self._log_path("engine", key.key)
            result = build_engine(self.resolved, self.build_plan, checkpoint.path, out_dir, log_path)
            facts: dict[str, Any] = {"build_log": str(log_path)}
            if hasattr(result, "model_dump"):
                facts["engine_result"] = result.model_dump(mode="json")
            return facts

        self._stored_stage("engine", key, build, leases)

    def repository_key(self, engine_digest: str) -> keymod.StageKey:
        from trtpipe import __version__
        # Light (hashlib + ~10 small files, no torch): fine on the warm path.
        from trtpipe.serving.templates import templates_digest

        resolved = self.resolved
        spec = resolved.spec
        return keymod.repository_key(
            engine_digest=engine_digest,
            serving=spec.triton.model_dump(mode="json"),
            tokenizer_digest=tokenizer_digest(self.store, resolved.tokenizer_dir),
            templates_digest=templates_digest(),
            trtpipe_version=__version__,
            name=spec.artifact_name,
            target={"gpu": spec.target.gpu, "sm": resolved.sm, "tp": spec.target.tp, "pp": spec.target.pp},
            toolchain=resolved.toolchain.name,
            quant=spec.quantization.algo.value,
            release=spec.release.model_dump(mode="json"),
        )

    def publish_stage(self, leases: contextlib.ExitStack) -> None:
        _check_available("trtpipe.serving.publish", "publish_repository")
        engine = self.entries.get("engine")
        if self.dry_run:
            digest = self.dry_digests.get("engine")
            if digest is None:  # the engine is not built yet (or a planning-only spec)
                self._add(StageReport(name="publish", outcome="would-build",
                                      detail="key follows the engine's digest, known once the engine is built"))
            else:
                hit = self._stored_stage("publish", self.repository_key(digest), lambda _: None, leases)
                if hit is not None:
                    self.report.repository_path = str(hit.path)
            return
        assert engine is not None
        for _attempt in range(2):
            key = self.repository_key(engine.digest)

            def build(out_dir: Path, engine: Entry = engine, key: keymod.StageKey = key) -> dict[str, Any]:
                publish = _need("trtpipe.serving.publish", "publish_repository")
                verified = self._verified_input("engine", leases)
                if verified.digest != engine.digest:
                    raise _InputRebuilt  # its key named the old digest: key it again
                publish(self.resolved, engine.path, engine.digest, engine.key, out_dir, repository_key=key.key)
                return {}

            try:
                entry = self._stored_stage("publish", key, build, leases)
                break
            except _InputRebuilt:
                engine = self.entries["engine"]
        else:  # pragma: no cover - a second rebuild of a just-verified engine cannot change it again
            raise TrtpipeError("the engine changed twice while publishing", fix="run the build again")
        if entry is not None:
            self.report.repository_path = str(entry.path)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> BuildReport:
        started = time.monotonic()
        steps: list[tuple[str, Callable[..., None]]] = [
            ("resolve", lambda _: self.resolve_stage()),
            ("plan", lambda _: self.plan_stage()),
            ("checkpoint", self.checkpoint_stage),
            ("engine", self.engine_stage),
            ("publish", self.publish_stage),
        ]
        current = "resolve"
        try:
            with contextlib.ExitStack() as leases:
                last_done: str | None = None
                for name, step in steps:
                    current = name
                    try:
                        step(leases)
                    except StageUnavailable as why:
                        self.report.stages.append(StageReport(name=name, outcome="unavailable", detail=str(why)))
                        self._skip_rest(name, f"stopped after {last_done or 'nothing'}")
                        self.report.status = "incomplete"
                        self.report.stopped_after = last_done
                        self.report.message = (
                            f"stopped after the {last_done} stage: {why}" if last_done else f"nothing ran: {why}"
                        )
                        self.printer.note(self.report.message, style="yellow")
                        break
                    last_done = name
                if self.report.status == "ok" and self.dry_run:
                    self.report.status = "dry-run"
        except TrtpipeError as err:
            self.report.status = "failed"
            self.report.error = err.one_line()
            if not any(s.name == current for s in self.report.stages):
                self.report.stages.append(StageReport(name=current, outcome="failed", detail=err.one_line()))
            self._skip_rest(current, f"{current} failed")
            self.report.seconds = time.monotonic() - started
            self._write_record()
            raise
        self.report.seconds = time.monotonic() - started
        if self.report.repository_path and self.progress:
            self.printer.note(f"repository: {self.report.repository_path}")
        self._write_record()
        return self.report

    def _write_record(self) -> None:
        if self.dry_run:
            return
        from trtpipe import build_record

        record = build_record.make_record(
            report=self.report, resolved=self.resolved, memory_plan=self.memory_plan, started_at=self.started_at
        )
        self.report.record_path = str(build_record.write_record(self.store.root, record))


def _container_spec(resolved: Any, plan: Any, checkpoint_dir: Path, out_dir: Path) -> dict[str, Any] | None:
    """The docker executor's container spec, when the Engine area provides `container_spec`."""
    if not _module_exists("trtpipe.engine.executors.docker"):
        return None
    module = importlib.import_module("trtpipe.engine.executors.docker")
    container_spec = getattr(module, "container_spec", None)
    if container_spec is None:
        return None
    available = {
        "resolved": resolved, "plan": plan, "checkpoint_dir": checkpoint_dir, "out_dir": out_dir,
        "output_dir": out_dir, "log_path": out_dir.parent / "engine-build.log", "toolchain": resolved.toolchain,
    }  # fmt: skip
    params = inspect.signature(container_spec).parameters
    args = {name: available[name] for name in params if name in available}
    try:
        spec = container_spec(**args)
    except Exception as err:  # a dry run reports why there is no container instead of failing
        reason = err.one_line() if isinstance(err, TrtpipeError) else f"{type(err).__name__}: {str(err).splitlines()[0]}"
        if not resolved.toolchain.triton_container:
            reason = f"toolchain {resolved.toolchain.name} pins no triton_container"
        return {"unavailable": reason}
    if hasattr(spec, "model_dump"):
        return spec.model_dump(mode="json")
    return dict(spec) if spec is not None else None


def _installed(distribution: str) -> str:
    from trtpipe.versions import installed_version

    return installed_version(distribution) or "not-installed"


def weight_files(model_dir: Path, *, allow_pickle: bool = False) -> list[Path]:
    """The HF files whose content determines a converted checkpoint (besides config.json)."""
    suffixes = _WEIGHT_SUFFIXES + _INDEX_SUFFIXES + (_PICKLE_SUFFIXES if allow_pickle else ())
    return sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(suffixes))


def tokenizer_digest(store: Store, tokenizer_dir: Path | None) -> str | None:
    if tokenizer_dir is None:
        return None
    # Exactly the tokenizer files a published repository carries (no torch behind this import).
    from trtpipe.serving.publish import TOKENIZER_FILES

    found = {n: store.digests.digest(Path(tokenizer_dir) / n) for n in TOKENIZER_FILES
             if (Path(tokenizer_dir) / n).is_file()}
    return keymod.tree_digest(found) if found else None


def open_stores(store: Store | Path | str | None, remote: Any = None) -> tuple[Store, Any]:
    """The local store, and the remote cache (`trtpipe.store.remote`) when `remote` is given or `store`
    (or $TRTPIPE_STORE) names one, e.g. `oci://host/repo` (`trtpipe.settings.places` decides).

    With a remote cache, artifacts still live in the local store; the remote is consulted before
    building a stage, and what is built is pushed to it."""
    if isinstance(store, Store):
        return store, remote
    from trtpipe.settings import from_env, places
    from trtpipe.store.remote import open_remote

    settings = from_env()
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
) -> BuildReport:
    """Build (or reuse) every stage of a spec. Raises TrtpipeError when a stage fails; the report's
    status is "incomplete" when a stage's module is not available, "dry-run" for a dry run."""
    spec_path = Path(spec_path)
    if not spec_path.is_file():
        raise UsageError(f"{spec_path}: no such spec file", fix="give the path of a build spec YAML")
    forced = check_force(force)
    opened, remote = open_stores(store, remote)
    runner = _Runner(spec_path, opened, dry_run=dry_run, force=forced, verify=verify, progress=progress,
                     remote=remote)
    try:
        return runner.run()
    finally:
        opened.digests.close()


# Exposed for tests and tools that want the keys of a spec without building anything.
def stage_keys(spec_path: Path | str, *, store: Store | Path | str | None = None) -> dict[str, str]:
    report = run_build(spec_path, dry_run=True, store=store, progress=False)
    return dict(report.keys)


__all__ = ["BuildReport", "StageReport", "STAGES", "run_build", "stage_keys", "weight_files", "tokenizer_digest"]
