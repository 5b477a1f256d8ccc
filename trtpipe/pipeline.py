"""A build: resolve -> plan -> the backend's stage plan, which the runner (trtpipe.runner) executes.

`run_build(spec_path)` resolves the spec (every rule: trtpipe.resolve), plans it (memory and the backend's
build plan), then hands the spec's backend's declared stages (trtpipe.stages) to the runner, which keys them
into a stage plan (trtpipe.stage_plan) and reuses, pulls or builds each stage by its key. A dry run plans
with what the store and the remote cache hold, builds nothing and shows what would run where. Neither this
module nor the runner knows a stage: what enters a key and how a stage builds is the stage's.

A warm run (every stage a hit) imports no torch, transformers, ModelOpt or tritonclient: the stage
implementations import those inside the functions that convert, run or serve. A successful build also
leaves its resolution memo (trtpipe.warm): its stage plan, which the next `trtpipe build` of an unchanged
spec hands to the runner without loading this module at all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import build_record, warm
from trtpipe.build_report import BuildReport, StageReport
from trtpipe.errors import UsageError
from trtpipe.plan import memory_plan
from trtpipe.resolve import ResolvedSpec, resolve
from trtpipe.build_report import StagePrinter
from trtpipe.pulled_trust import PulledCheck, PulledTrust
from trtpipe.run_hooks import Hooks, PrinterHook, RunHooks, StageCallback
from trtpipe.run_record import RecordWriter
from trtpipe.runner import BuildInterrupted, Runner
from trtpipe.shared_cache import PushSigner, SharedCache
from trtpipe.spec_loader import load_spec
from trtpipe.stages import BACKEND_STAGES, STORED_STAGE_NAMES, BackendStages, StageContext, weight_file_rule
from trtpipe.store.local import Store
from trtpipe.store.remote import RemoteUse
from trtpipe.settings import Settings
from trtpipe.shipped import build_configs_dir

# Picks the stages for a resolved spec (and may adjust it): (the spec as the stages see it, its stages).
Chooser = Callable[[ResolvedSpec], tuple[ResolvedSpec, BackendStages]]


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


@dataclass
class _Resolution:
    """What a build's plain steps concluded: the resolved spec, its backend's stages and plans (the record, the
    memo and `publish --engine` read them)."""

    resolved: ResolvedSpec | None = None
    backend: BackendStages | None = None
    memory_plan: dict[str, Any] | None = None
    ctx: StageContext | None = None

    def record(self, report: BuildReport, started_at: str) -> build_record.BuildRecord:
        return build_record.make_record(report=report, resolved=self.resolved, memory_plan=self.memory_plan,
                                        started_at=started_at)


def _resolve_step(runner: Runner, spec_path: Path, done: _Resolution, *, force: tuple[str, ...],
                  need_weights: bool, choose: Chooser | None, configs: Path) -> None:
    started = time.monotonic()
    # A dry run also works for planning-only specs (model.config, no weights): it still shows the
    # engine stage's exact trtllm-build command and container for a GPU target.
    resolved = resolve(load_spec(spec_path), need_weights=need_weights, configs=configs)
    if choose is not None:
        resolved, backend = choose(resolved)
    else:
        backend = BACKEND_STAGES[resolved.backend_kind]
    runner.force = forced_stages(force, backend, resolved.backend_kind)
    runner.steps.stage_names = tuple(s.name for s in backend.stages)
    done.resolved, done.backend = resolved, backend
    spec, report = resolved.spec, runner.report
    report.name = spec.artifact_name
    report.target = spec.target.gpu
    report.toolchain = resolved.toolchain.name
    report.backend = resolved.backend_kind
    runner.add(StageReport(name="resolve", outcome="ran", seconds=time.monotonic() - started,
                           detail=f"{spec.artifact_name} -> {spec.target.gpu} ({resolved.toolchain.name}, "
                                  f"{resolved.backend_kind})"))
    for note in resolved.notes:  # e.g. the spec's earlier shape, a preview line's unverified fields
        runner.note(f"    note: {note}", style="yellow")


def _plan_step(runner: Runner, done: _Resolution, *, progress: bool) -> None:
    assert done.resolved is not None and done.backend is not None
    runner.begin("plan")
    started = time.monotonic()
    plan = memory_plan(done.resolved)
    done.memory_plan = plan.model_dump(mode="json")
    done.ctx = StageContext(resolved=done.resolved, build_plan=done.backend.plan(done.resolved),
                            digests=runner.store.digests, store_root=runner.store.root, progress=progress,
                            dry_run=runner.report.dry_run)
    runner.add(StageReport(name="plan", outcome="ran", seconds=time.monotonic() - started,
                           detail="fits" if plan.fits else "does NOT fit the target"))


def _run(
    spec_path: Path, store: Store, *, dry_run: bool, force: tuple[str, ...], verify: bool, progress: bool,
    remote: Any = None, remote_use: RemoteUse, on_stage: Callable[[StageReport], None] | None = None,
    pulled_check: PulledCheck | None = None, sign_push: PushSigner | None = None, need_weights: bool | None = None,
    choose: Chooser | None = None, configs: Path,
) -> tuple[BuildReport, _Resolution]:
    """Resolve and plan the spec, then run its backend's stage plan (trtpipe.runner).

    `configs`: the build_configs/ folder the caller's settings chose (trtpipe.shipped.build_configs_dir);
    `need_weights`: whether resolve needs the model's weights (default: a build does, a dry run does not);
    `choose`: picks the stages (default: the spec's backend's, BACKEND_STAGES); `publish --engine` sets both."""
    report = BuildReport(spec_path=str(spec_path), dry_run=dry_run, verify=verify, store=str(store.root),
                         remote=str(remote) if remote is not None else None,
                         remote_mode=remote_use.mode if remote is not None else None)
    done = _Resolution()
    # What watches the run: the terminal (a dry run prints whole keys), the live progress, the record (a dry
    # run writes none).
    watchers: list[RunHooks] = [PrinterHook(StagePrinter(progress, full_keys=dry_run))]
    if on_stage is not None:
        watchers.append(StageCallback(on_stage))
    if not dry_run:
        watchers.append(RecordWriter(store.root, done.record))
    hooks = Hooks(watchers)
    cache = SharedCache(remote, remote_use, sign_push=sign_push, note=hooks.note, report=report)
    runner = Runner(store, report, hooks=hooks, cache=cache, trust=PulledTrust(store, pulled_check), force=force,
                    verify=verify, stage_names=STORED_STAGE_NAMES)
    with runner.running():
        _resolve_step(runner, spec_path, done, force=force, need_weights=(not dry_run) if need_weights is None
                      else need_weights, choose=choose, configs=configs)
        _plan_step(runner, done, progress=progress)
        assert done.backend is not None
        runner.run_stages(done.backend.stages, done.ctx)
    return report, done


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
        remote = open_remote(remote_url, settings, weight_file_rule())
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
    try:
        report, done = _run(spec_path, opened, dry_run=dry_run, force=forced, verify=verify, progress=progress,
                            remote=remote, on_stage=on_stage, pulled_check=pulled_check, remote_use=remote_use,
                            sign_push=sign_push, configs=build_configs_dir(settings))
    finally:
        opened.digests.close()
    if report.status == "ok" and done.resolved is not None and done.backend is not None:
        # What this build read and concluded, for the next `trtpipe build` of the spec (trtpipe.warm).
        warm.remember(opened.root, spec_path, resolved=done.resolved, report=report, stages=done.backend.stages,
                      started_ns=started_ns)
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
    try:
        # No resolution memo (trtpipe.warm): that is `build`'s, and this spec's build would convert and build.
        report, done = _run(spec_path, opened, dry_run=False, force=(), verify=False, progress=progress, remote=remote,
                            need_weights=False, choose=_publish_chooser(request, stage_box, tokenizer_box),
                            configs=build_configs_dir(settings),
                            remote_use=remote_use if remote_use is not None else _remote_use_from_settings(settings))
    finally:
        opened.digests.close()
    outside = stage_box[0].checked(done.ctx) if stage_box and done.ctx is not None else None
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
