"""What changes when a spec moves from backend trtllm-build to backend llm-api (`trtpipe migrate SPEC`).

The same spec is resolved twice, as written (or with backend trtllm-build where it names none) and with backend
llm-api, by the one rules pass (trtpipe.resolve); nothing is built. The report lists:
- `maps`: every spec setting that carries over, what trtllm-build made of it and the LLM() argument it becomes
  (trtpipe.llm_api.derive's mapping, each with its reason);
- `no_equivalent`: the settings of the spec's backend section that the llm-api section has no place for
  (trtpipe.backend_options.LlmApiOptions.not_offered), with why; `blocking` when the spec writes one (the llm-api
  section refuses it: remove it first). The trtllm-build plugin settings the build profile chose are listed here
  too: the PyTorch backend compiles no engine and picks kernels at run time;
- `shape`: for a spec written in the earlier shape (engine:, triton:, backend: NAME), where each of its fields
  lives today (trtpipe.spec_shape);
- `refused`: the one-line reason when the llm-api spec is refused for something else (a quantization the PyTorch
  backend does not run on that GPU, say), with the field to change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from trtpipe import spec_shape
from trtpipe.backend_options import LlmApiOptions
from trtpipe.errors import TrtpipeError
from trtpipe.resolve import resolve
from trtpipe.spec import BuildSpec
from trtpipe.spec_loader import LoadedSpec, format_field, load_spec


class MappedSetting(BaseModel):
    spec_field: str | None
    value: Any
    trtllm_build: str | None = Field(description="What the trtllm-build path made of it (a flag or setting).")
    llm_api: str = Field(description="The LLM() argument it becomes, `name = value`.")
    reason: str


class UnmappedSetting(BaseModel):
    spec_field: str
    value: Any
    reason: str
    blocking: bool = Field(description="Written in the spec: the llm-api backend section refuses it.")


class ShapeMove(BaseModel):
    """A field of a spec in the earlier shape and where it lives today."""

    earlier: str
    today: str


class MigrationReport(BaseModel):
    spec: str
    name: str
    target: str
    toolchain: str
    from_backend: str
    to_backend: Literal["llm-api"] = "llm-api"
    verdict: Literal["ready", "needs changes", "refused"]
    maps: list[MappedSetting] = Field(default_factory=list)
    no_equivalent: list[UnmappedSetting] = Field(default_factory=list)
    shape: list[ShapeMove] = Field(default_factory=list)
    refused: str | None = None
    llm_args: dict[str, Any] | None = None
    serving: str | None = None
    notes: list[str] = Field(default_factory=list)


# The trtllm-build setting each LLM() argument's spec field was rendered as (for the side-by-side column).
_TRTLLM_BUILD_FIELD = {
    "limits.max_batch_size": "--max_batch_size",
    "limits.max_input_len": "--max_input_len",
    "limits.max_seq_len": "--max_seq_len",
    "limits.max_beam_width": "--max_beam_width",
    "limits.max_num_tokens": "--max_num_tokens",
    "limits.profile": "--max_num_tokens (the profile's)",
    "limits.tokens_per_block": "--tokens_per_block",
    "target.tp": "checkpoint tp (rank files)",
    "target.pp": "checkpoint pp (rank files)",
    "model.dtype": "checkpoint dtype",
    "quantization.kv_cache": "checkpoint kv_cache_quant_algo",
    "runtime.kv_cache_free_fraction": "tensorrt_llm config.pbtxt kv_cache_free_gpu_mem_fraction",
    "runtime.kv_cache_reuse": "tensorrt_llm config.pbtxt enable_kv_cache_reuse",
    "runtime.chunked_prefill": "tensorrt_llm config.pbtxt enable_chunked_context",
    "runtime.scheduler_policy": "tensorrt_llm config.pbtxt batch_scheduler_policy",
    "model.trust_remote_code": "conversion's trust_remote_code",
}


def without_equivalent(loaded: LoadedSpec) -> list[UnmappedSetting]:
    """The settings of the spec's backend section that the llm-api section has no place for (one row per field of
    a nested section), as the user wrote them; `blocking` when written (in the earlier shape: when it would not be
    dropped, trtpipe.spec_shape)."""
    options = loaded.spec.backend
    rows: list[UnmappedSetting] = []
    for name, why in LlmApiOptions.not_offered.items():
        if name not in type(options).model_fields:
            continue
        value = getattr(options, name)
        fields = ([((name, key), getattr(value, key)) for key in type(value).model_fields]
                  if isinstance(value, BaseModel) else [((name,), value)])
        for path, leaf in fields:
            written = loaded.position(("backend", *path)) is not None
            if ("backend", *path) in loaded.written_as:  # the earlier shape: what it would drop needs no change
                written = not spec_shape.drops(("backend", *path), leaf)
            rows.append(UnmappedSetting(spec_field=loaded.shown(("backend", *path)), value=leaf, blocking=written,
                                        reason=why if written else why + " (not written: nothing to do)"))
    return rows


def _llm_api_variant(spec: BuildSpec) -> BuildSpec:
    """The spec with an llm-api backend section (what carries over: the conversion timeout)."""
    return spec.model_copy(update={"backend": LlmApiOptions(conversion_timeout=spec.backend.conversion_timeout)})


def migration_plan(spec_path: Path, configs: Path | None = None) -> MigrationReport:
    """The migration report of `spec_path` (see the module doc; `configs`: the build_configs/ folder to resolve
    with, None for the shipped one). Raises only for a spec invalid as written."""
    loaded = load_spec(Path(spec_path))
    spec = loaded.spec
    current = resolve(loaded, need_weights=False, configs=configs)  # the spec as written must be valid
    from_backend = current.backend_kind
    report = MigrationReport(spec=str(spec_path), name=spec.artifact_name, target=spec.target.gpu,
                             toolchain=current.toolchain.name, from_backend=from_backend, verdict="ready")
    if from_backend == "llm-api":
        report.notes.append("the spec already builds with backend llm-api")
    engine_config = None
    if from_backend in ("trtllm-build", "reference"):
        engine_config = current.engine_config()

    report.shape = [ShapeMove(earlier=format_field(old), today=format_field(new))
                    for new, old in loaded.written_as.items() if spec_shape.is_move(old, new)]
    report.no_equivalent += without_equivalent(loaded)
    if engine_config is not None and engine_config.plugin_config:
        chosen = ", ".join(f"{k}={v}" for k, v in sorted(engine_config.plugin_config.items())
                           if k != "tokens_per_block")  # that one maps (kv_cache_config.tokens_per_block)
        report.no_equivalent.append(UnmappedSetting(
            spec_field=loaded.shown(("limits", "profile")), value=spec.limits.profile.value, blocking=False,
            reason=f"the trtllm-build plugin settings the {spec.limits.profile.value} profile chose ({chosen}): the "
                   "PyTorch backend compiles no engine and picks its kernels at run time; the profile still sets "
                   "max_num_tokens"))
    # Resolve the llm-api variant without the settings it has no place for, so the mapping is shown even for a
    # spec that must change first; a refusal for any other reason is the report's `refused`.
    variant = _llm_api_variant(spec)
    try:
        target = resolve(dataclasses.replace(loaded, spec=variant), need_weights=False, configs=configs)
    except TrtpipeError as err:
        report.refused = err.one_line()
        report.verdict = "refused"
        return report
    plan = target.llm_api
    assert plan is not None
    report.llm_args = plan.args
    for source in plan.sources:
        report.maps.append(MappedSetting(
            spec_field=source.spec_field, value=source.value,
            trtllm_build=_TRTLLM_BUILD_FIELD.get(source.spec_field or "") if from_backend != "llm-api" else None,
            llm_api=f"{source.arg} = {source.value!r}", reason=source.reason))
    report.notes += plan.notes
    containers = [c.image for c in target.toolchain.triton_containers if "llm-api" in c.backends]
    if target.is_cpu_reference:
        report.serving = "cpu-reference: the llmapi repository's tensorrt_llm model runs trtpipe's reference runtime"
    elif containers:
        report.serving = f"Triton's llmapi Python model in {target.toolchain.triton_container} (containers with " \
                         f"llm-api: {', '.join(containers)})"
    report.notes.append("the artifact changes from a TRT-LLM checkpoint + engine to ModelOpt's unified HF export + "
                        "llm_args.json (one stage fewer: no trtllm-build); keys, digests and the repository change")
    if any(u.blocking for u in report.no_equivalent):
        report.verdict = "needs changes"
    return report
