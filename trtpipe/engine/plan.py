"""The engine build plan: spec + toolchain + target GPU -> the complete trtllm-build configuration.

`make_build_plan(resolved)` fixes every limit and every plugin/feature setting explicitly (never a
version's default), records why each is set, applies the spec's `engine.plugins` overrides on top of
the profile after checking them against the toolchain's flag contract, and refuses any override
that would produce an engine Triton's in-flight batcher cannot load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from trtpipe.engine.flags import FlagContract, load_contract, render_value
from trtpipe.engine.profiles import (
    Setting,
    default_max_num_tokens,
    gpu_family,
    inflight_batching_settings,
    profile_settings,
)
from trtpipe.errors import SpecError, TrtpipeError

LIMIT_KEYS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "opt_num_tokens", "max_beam_width")


class BuildPlan(BaseModel):
    """Everything trtllm-build is told, with the reason for each setting."""

    model_config = ConfigDict(extra="forbid")

    toolchain: str
    trtllm_version: str
    tensorrt_version: str | None
    target_gpu: str
    gpu_sm: int | None
    gpu_product: str | None
    family: str
    profile: str
    tp: int
    pp: int
    dtype: str
    quant_algo: str
    kv_cache_dtype: str
    limits: dict[str, int | str]
    plugin_config: dict[str, str | bool | int | None]
    why: dict[str, str]
    overrides: list[str]
    workers: int = 1
    log_level: str = "info"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def is_reference(self) -> bool:
        return self.gpu_sm is None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def build_config(self) -> dict[str, Any]:
        """The build config as TRT-LLM's engine config.json nests it (limits + plugin_config)."""
        return {**self.limits, "plugin_config": dict(self.plugin_config)}

    def contract(self) -> FlagContract:
        return load_contract(self.toolchain)

    def render_command(
        self, checkpoint_dir: Path | str, output_dir: Path | str, *, executable: str = "trtllm-build"
    ) -> list[str]:
        """The trtllm-build argv for this plan, using exactly the flags the toolchain's version accepts."""
        argv = [
            executable,
            "--checkpoint_dir", str(checkpoint_dir),
            "--output_dir", str(output_dir),
        ]
        for key in LIMIT_KEYS:
            argv += [f"--{key}", str(self.limits[key])]
        argv += ["--kv_cache_type", str(self.limits["kv_cache_type"])]
        for key, value in self.plugin_config.items():
            argv += [f"--{key}", render_value(value)]
        argv += ["--workers", str(self.workers), "--log_level", self.log_level]
        problems = self.contract().check_command(argv)
        if problems:
            raise TrtpipeError(
                f"the build plan does not fit trtllm-build {self.trtllm_version}: {'; '.join(problems)}",
                fix="fix engine.plugins in the spec or the flag contract table",
            )
        return argv


def _spec_error(resolved: Any, field_path: tuple[str | int, ...], message: str, fix: str) -> SpecError:
    """A SpecError positioned at the spec's YAML, when the spec file can be read back."""
    loaded = getattr(resolved, "loaded", None)
    if loaded is None and getattr(resolved, "spec_path", None) is not None:
        try:
            from trtpipe.spec_loader import load_spec

            loaded = load_spec(Path(resolved.spec_path))
        except Exception:  # the position is a courtesy; the error itself must still be raised
            loaded = None
    if loaded is not None and hasattr(loaded, "error"):
        return loaded.error(field_path, message, fix)
    where = str(getattr(resolved, "spec_path", None) or "<spec>")
    return SpecError(message, file=where, field=".".join(str(p) for p in field_path), fix=fix)


def _model_dtype(resolved: Any) -> str:
    dtype = resolved.spec.model.dtype.value
    if dtype != "auto":
        return dtype
    config = resolved.model_config or {}
    found = config.get("torch_dtype") or config.get("dtype") or "float16"
    return found if found in ("float16", "bfloat16") else "float16"


def _architecture(resolved: Any) -> str | None:
    archs = (resolved.model_config or {}).get("architectures") or []
    return archs[0] if archs else None


def _normalize_override(contract: FlagContract, key: str, value: object) -> str | bool | None:
    """An engine.plugins value as PluginConfig stores it: True/False for features, None for a disabled plugin."""
    spec = contract.lookup(key)
    assert spec is not None
    is_feature = spec.choices == ["enable", "disable"]
    if is_feature:
        if value in (True, "enable", "true", "on"):
            return True
        if value in (False, "disable", "false", "off", None):
            return False
        return str(value)  # invalid; check_value reports it
    if value in (None, False, "disable"):
        return None
    return str(value)


def make_build_plan(resolved: Any) -> BuildPlan:
    """The complete build configuration for a resolved spec (see module doc)."""
    spec = resolved.spec
    toolchain = resolved.toolchain
    gpu = resolved.gpu
    contract = load_contract(toolchain.name)
    engine = spec.engine
    quant_algo = spec.quantization.algo.value
    family = gpu_family(gpu.sm if gpu is not None else None)
    profile = engine.profile.value

    tpb = engine.tokens_per_block
    if tpb & (tpb - 1):
        raise _spec_error(
            resolved, ("engine", "tokens_per_block"), f"tokens_per_block {tpb} is not a power of two",
            fix="use 16, 32, 64 or 128",
        )

    why: dict[str, str] = {}
    settings: dict[str, Setting] = {}
    settings.update(inflight_batching_settings(tpb))
    settings.update(
        profile_settings(
            family, profile, quant_algo=quant_algo, tp=spec.target.tp, architecture=_architecture(resolved),
            kv_cache=spec.quantization.kv_cache.value,
        )
    )
    plugin_config: dict[str, str | bool | int | None] = {k: s.value for k, s in settings.items()}
    why.update({k: s.why for k, s in settings.items()})

    # --- limits
    chunked = spec.triton.enable_chunked_context
    max_tokens_cap = engine.max_batch_size * engine.max_seq_len
    if engine.max_num_tokens is not None:
        max_num_tokens = engine.max_num_tokens
        if max_num_tokens < engine.max_input_len and not chunked:
            raise _spec_error(
                resolved, ("engine", "max_num_tokens"),
                f"max_num_tokens {max_num_tokens} < max_input_len {engine.max_input_len}: a full prompt would not fit one step",
                fix=f"raise max_num_tokens to at least {engine.max_input_len} or set triton.enable_chunked_context: true",
            )
        why["max_num_tokens"] = "set by engine.max_num_tokens in the spec"
    else:
        default, reason = default_max_num_tokens(profile)  # type: ignore[arg-type]
        max_num_tokens = default if chunked else max(default, engine.max_input_len)
        why["max_num_tokens"] = reason + ("" if chunked else "; at least max_input_len since chunked context is off")
    if max_num_tokens > max_tokens_cap:
        max_num_tokens = max_tokens_cap
        why["max_num_tokens"] += f"; capped at max_batch_size*max_seq_len = {max_tokens_cap} (TRT-LLM caps it too)"
    opt_num_tokens = min(engine.max_batch_size * engine.max_beam_width, max_num_tokens)
    why["opt_num_tokens"] = (
        "min(max_batch_size*max_beam_width, max_num_tokens): TRT-LLM's own rule, set explicitly so the engine "
        "config equals the plan"
    )
    limits: dict[str, int | str] = {
        "max_batch_size": engine.max_batch_size,
        "max_input_len": engine.max_input_len,
        "max_seq_len": engine.max_seq_len,
        "max_num_tokens": max_num_tokens,
        "opt_num_tokens": opt_num_tokens,
        "max_beam_width": engine.max_beam_width,
        "kv_cache_type": "paged",
    }
    why["kv_cache_type"] = "paged KV cache: required by in-flight batching; memory is allocated per block, not per max_seq_len"
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
        why[key] = f"engine.{key} from the spec"

    # --- overrides from engine.plugins, validated against the flag contract
    overrides: list[str] = []
    for key, raw in engine.plugins.items():
        where = ("engine", "plugins", key)
        if key == "tokens_per_block":
            raise _spec_error(resolved, where, "tokens_per_block is not a plugin override", fix="set engine.tokens_per_block")
        if key in ("paged_kv_cache", "kv_cache_type"):
            if raw in (False, None, "disable", "continuous", "disabled", "false", "off"):
                raise _spec_error(
                    resolved, where,
                    "in-flight batching requires a paged KV cache (TrtGptModelInflightBatching requires GPT attention "
                    "plugin with packed input and paged KV cache)",
                    fix=f"remove engine.plugins.{key}",
                )
            continue
        flag = contract.lookup(key)
        if flag is None or not flag.plugin:
            hint = contract.removed.get(key)
            known = ", ".join(sorted(contract.plugin_flags))
            raise _spec_error(
                resolved, where,
                f"{key!r} is not a trtllm-build plugin option in TensorRT-LLM {contract.trtllm_version}"
                + (f" ({hint})" if hint else ""),
                fix=f"use one of: {known}",
            )
        value = _normalize_override(contract, key, raw)
        problem = contract.check_value(key, render_value(value))
        if problem:
            raise _spec_error(resolved, where, problem, fix="pick an allowed value")
        if key == "gpt_attention_plugin" and value is None:
            raise _spec_error(
                resolved, where,
                "in-flight batching requires the GPT attention plugin (TrtGptModelInflightBatching requires GPT "
                "attention plugin with packed input and paged KV cache)",
                fix="remove engine.plugins.gpt_attention_plugin or set it to auto",
            )
        if key == "remove_input_padding" and value is False:
            raise _spec_error(
                resolved, where,
                "in-flight batching requires packed input (remove_input_padding) (TrtGptModelInflightBatching "
                "requires GPT attention plugin with packed input and paged KV cache)",
                fix="remove engine.plugins.remove_input_padding",
            )
        plugin_config[key] = value
        why[key] = "set by engine.plugins in the spec"
        overrides.append(key)

    _check_combination(resolved, plugin_config, family=family, quant_algo=quant_algo, overrides=overrides)

    return BuildPlan(
        toolchain=toolchain.name,
        trtllm_version=toolchain.trtllm_version,
        tensorrt_version=toolchain.tensorrt_version,
        target_gpu=spec.target.gpu,
        gpu_sm=gpu.sm if gpu is not None else None,
        gpu_product=gpu.product if gpu is not None else None,
        family=family,
        profile=profile,
        tp=spec.target.tp,
        pp=spec.target.pp,
        dtype=_model_dtype(resolved),
        quant_algo=quant_algo,
        kv_cache_dtype=spec.quantization.kv_cache.value,
        limits=limits,
        plugin_config=plugin_config,
        why=why,
        overrides=overrides,
        # One build worker per rank: each rank's engine is built on its own GPU, in parallel.
        workers=spec.target.world_size if gpu is not None else 1,
    )


def _check_combination(
    resolved: Any, pc: dict[str, Any], *, family: str, quant_algo: str, overrides: list[str]
) -> None:
    """Cross-setting rules; blame the override that broke them."""

    def blame(*keys: str) -> tuple[str | int, ...]:
        for key in keys:
            if key in overrides:
                return ("engine", "plugins", key)
        return ("engine", "plugins")

    triton = resolved.spec.triton
    if not pc.get("use_paged_context_fmha"):
        if triton.enable_chunked_context or triton.enable_kv_cache_reuse:
            raise _spec_error(
                resolved, blame("use_paged_context_fmha"),
                "use_paged_context_fmha is off but triton.enable_chunked_context / enable_kv_cache_reuse need it",
                fix="remove the override or turn those serving options off",
            )
    if pc.get("use_paged_context_fmha") and not pc.get("context_fmha"):
        raise _spec_error(
            resolved, blame("context_fmha", "use_paged_context_fmha"),
            "use_paged_context_fmha needs context_fmha",
            fix="keep context_fmha enabled or also disable use_paged_context_fmha",
        )
    fp8_capable = family in ("ada", "hopper", "blackwell")
    if pc.get("use_fp8_context_fmha") and not (quant_algo == "fp8" and fp8_capable):
        raise _spec_error(
            resolved, blame("use_fp8_context_fmha"),
            f"use_fp8_context_fmha needs FP8 quantization on SM89+ (quantization {quant_algo}, family {family})",
            fix="remove the override",
        )
    for key in ("low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin", "gemm_swiglu_plugin"):
        if pc.get(key) is not None and not (quant_algo == "fp8" and family == "hopper"):
            raise _spec_error(
                resolved, blame(key),
                f"{key} runs FP8 kernels that exist for Hopper only (quantization {quant_algo}, family {family})",
                fix=f"remove engine.plugins.{key}",
            )
    if pc.get("user_buffer") and not pc.get("reduce_fusion"):
        raise _spec_error(
            resolved, blame("user_buffer", "reduce_fusion"),
            "user_buffer must be enabled together with reduce_fusion",
            fix="enable reduce_fusion or drop user_buffer",
        )
    if pc.get("gemm_plugin") == "nvfp4" and family != "blackwell":
        raise _spec_error(
            resolved, blame("gemm_plugin"), "gemm_plugin nvfp4 needs a Blackwell GPU (SM100+)", fix="use auto",
        )
    if pc.get("gemm_plugin") == "fp8" and not (quant_algo == "fp8" and fp8_capable):
        raise _spec_error(
            resolved, blame("gemm_plugin"), "gemm_plugin fp8 needs an FP8-quantized model on SM89+", fix="use auto",
        )
