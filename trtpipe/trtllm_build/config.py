"""A spec's complete trtllm-build configuration, and every rule it must follow, derived in one place.

`derive_engine_config(spec, toolchain, gpu, model_config)` fixes every limit and every plugin/feature
setting explicitly (never a version's default) with the reason for each: the in-flight batching
requirements, the build profile (profiles.py), the spec's `backend.plugins` overrides checked against
the toolchain's flag table (flags.py), then the pinned trtllm-build's own rules (rules.py) replayed on
the result, and trtpipe's serving rules last. A setting trtllm-build would silently change is planned
as trtllm-build ends with it (its reason says so); a spec override it would change or refuse, and every
other rule the spec breaks, is a `RuleViolation` naming the spec field to change.

`trtpipe.resolve` runs this for every spec and turns a violation into the positioned spec error, so
`spec-check` refuses exactly what a build would; the engine's build plan (trtpipe.engine.plan) is the
same derivation rendered as a command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpipe.errors import TrtpipeError
from trtpipe.spec import BuildSpec
from trtpipe.trtllm_build.flags import FlagContract, load_contract, render_value
from trtpipe.trtllm_build.profiles import (
    FP8_FAMILIES,
    Setting,
    default_max_num_tokens,
    inflight_batching_settings,
    profile_settings,
)
from trtpipe.trtllm_build.rules import BuildFacts, Finding, RuleTable, load_rules, simulate, spec_value

FieldPath = tuple[str | int, ...]


class RuleViolation(Exception):
    """The spec breaks a rule: which field to change, what is wrong, how to fix it."""

    def __init__(self, field_path: FieldPath, message: str, fix: str) -> None:
        self.field_path = field_path
        self.message = message
        self.fix = fix
        super().__init__(message)


@dataclass
class EngineConfig:
    """Everything trtllm-build is told (limits and plugin/feature settings), with the reason for each."""

    toolchain: str  # the toolchain's name: the rules' eras are keyed by it
    family: str  # the GPU catalog's architecture, or "reference"
    limits: dict[str, int | str | None]
    plugin_config: dict[str, str | bool | int | None]
    why: dict[str, str]
    overrides: list[str]  # backend.plugins keys the spec set
    facts: BuildFacts
    spec_keys: dict[str, str] = field(default_factory=dict)  # trtllm-build flag -> the backend.plugins key that set it


def is_power_of_two(value: int) -> bool:
    return value > 0 and not value & (value - 1)


def flag_table(toolchain: Any) -> str:
    """The flag table of the toolchain's trtllm-build backend (the reference backend follows it too)."""
    backend = toolchain.backend("trtllm-build")
    return backend.flags if backend is not None else toolchain.name


def derive_engine_config(spec: BuildSpec, toolchain: Any, gpu: Any, model_config: dict[str, Any], *,
                         configs: Path | None = None) -> EngineConfig:
    """The complete build configuration of `spec` (see the module doc; `configs`: the build_configs/ folder the
    flag contract is read from, None for the shipped one); raises RuleViolation."""
    spec_limits = spec.limits
    contract = load_contract(flag_table(toolchain), configs)
    family = gpu.architecture if gpu is not None else "reference"
    archs = model_config.get("architectures") or []
    architecture = archs[0] if archs else None
    algo, kv_cache = spec.quantization.algo, spec.quantization.kv_cache
    facts = BuildFacts.for_recipe(algo, kv_cache, architecture=architecture, tp_size=spec.target.tp,
                                  sm=gpu.sm if gpu is not None else None)

    tpb = spec_limits.tokens_per_block
    if not is_power_of_two(tpb):
        raise RuleViolation(("limits", "tokens_per_block"), f"tokens_per_block {tpb} is not a power of two",
                            "use 16, 32, 64 or 128 (the paged KV cache's block size)")

    settings: dict[str, Setting] = {}
    settings.update(inflight_batching_settings(tpb))
    settings.update(profile_settings(family, spec_limits.profile.value, quant_algo=algo, tp=spec.target.tp,  # type: ignore[arg-type]
                                     architecture=architecture, kv_cache=kv_cache))
    plugin_config: dict[str, str | bool | int | None] = {k: s.value for k, s in settings.items()}
    why = {k: s.why for k, s in settings.items()}
    limits = _limits(spec, why)

    overrides, spec_keys = _apply_overrides(spec, contract, limits, plugin_config, why)
    if plugin_config.get("multiple_profiles"):
        limits["opt_num_tokens"] = None
        why["opt_num_tokens"] = (
            "not passed: trtllm-build refuses --opt_num_tokens together with --multiple_profiles enable "
            "(rule opt-num-tokens-with-multiple-profiles); each optimization profile then has its own optimum"
        )
    else:
        limits["opt_num_tokens"] = min(spec_limits.max_batch_size * spec_limits.max_beam_width, int(limits["max_num_tokens"]))  # type: ignore[arg-type]
        why["opt_num_tokens"] = (
            "min(max_batch_size*max_beam_width, max_num_tokens): TRT-LLM's own default with a single profile, "
            "set explicitly so the engine config equals the plan"
        )
    config = EngineConfig(toolchain=toolchain.name, family=family, limits=limits, plugin_config=plugin_config,
                          why=why, overrides=overrides, facts=facts, spec_keys=spec_keys)
    _follow_trtllm_build(config, load_rules(configs=configs))
    _serving_rules(spec, config)
    return config


def _limits(spec: BuildSpec, why: dict[str, str]) -> dict[str, int | str | None]:
    spec_limits, chunked = spec.limits, spec.runtime.chunked_prefill
    if spec_limits.max_num_tokens is not None:
        max_num_tokens = spec_limits.max_num_tokens
        if max_num_tokens < spec_limits.max_input_len and not chunked:
            raise RuleViolation(
                ("limits", "max_num_tokens"),
                f"max_num_tokens {max_num_tokens} < max_input_len {spec_limits.max_input_len}: "
                "a full prompt could not be processed in one step",
                f"raise max_num_tokens to at least {spec_limits.max_input_len}, or set runtime.chunked_prefill: true",
            )
        why["max_num_tokens"] = "set by limits.max_num_tokens in the spec"
    else:
        default, reason = default_max_num_tokens(spec_limits.profile.value)  # type: ignore[arg-type]
        max_num_tokens = default if chunked else max(default, spec_limits.max_input_len)
        why["max_num_tokens"] = reason + ("" if chunked else "; at least max_input_len since chunked context is off")
    cap = spec_limits.max_batch_size * spec_limits.max_seq_len
    if max_num_tokens > cap:
        max_num_tokens = cap
        why["max_num_tokens"] += f"; capped at max_batch_size*max_seq_len = {cap} (TRT-LLM caps it too)"
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
        why[key] = f"limits.{key} from the spec"
    why["kv_cache_type"] = "paged KV cache: required by in-flight batching; memory is allocated per block, not per max_seq_len"
    return {
        "max_batch_size": spec_limits.max_batch_size,
        "max_input_len": spec_limits.max_input_len,
        "max_seq_len": spec_limits.max_seq_len,
        "max_num_tokens": max_num_tokens,
        "opt_num_tokens": None,  # set once multiple_profiles is final
        "max_beam_width": spec_limits.max_beam_width,
        "kv_cache_type": "paged",
    }


def _normalize_override(contract: FlagContract, key: str, value: object) -> str | bool | None:
    """An backend.plugins value as PluginConfig stores it: True/False for features, None for a disabled plugin."""
    flag = contract.lookup(key)
    assert flag is not None
    if flag.choices == ["enable", "disable"]:
        if value in (True, "enable", "true", "on"):
            return True
        if value in (False, "disable", "false", "off", None):
            return False
        return str(value)  # invalid; check_value says why
    if value in (None, False, "disable"):
        return None
    return str(value)


def _apply_overrides(
    spec: BuildSpec, contract: FlagContract, limits: dict[str, Any], plugin_config: dict[str, Any], why: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """backend.plugins on top of the profile, each checked against the toolchain's flag table."""
    overrides: list[str] = []
    spec_keys: dict[str, str] = {}
    for key, raw in spec.backend.plugins.items():  # type: ignore[union-attr]  # an engine backend's
        where = ("backend", "plugins", key)
        if key == "tokens_per_block":
            raise RuleViolation(where, "tokens_per_block is not a plugin override", "set limits.tokens_per_block")
        if key in ("paged_kv_cache", "kv_cache_type"):
            # Planned like any setting; the rules refuse what in-flight batching cannot serve.
            value = spec_value(key, raw)
            if key == "paged_kv_cache":
                value = "paged" if value is True else "continuous"
            limits["kv_cache_type"] = value
            why["kv_cache_type"] = f"set by backend.plugins.{key} in the spec"
            spec_keys["kv_cache_type"] = key
            continue
        flag = contract.lookup(key)
        if flag is None or not flag.plugin:
            hint = contract.removed.get(key)
            raise RuleViolation(
                where,
                f"{key!r} is not a trtllm-build plugin option in TensorRT-LLM {contract.trtllm_version}"
                + (f" ({hint})" if hint else ""),
                f"use one of: {', '.join(sorted(contract.plugin_flags))}",
            )
        value = _normalize_override(contract, key, raw)
        problem = contract.check_value(key, render_value(value))
        if problem:
            raise RuleViolation(where, problem, "pick an allowed value")
        plugin_config[key] = value
        why[key] = "set by backend.plugins in the spec"
        overrides.append(key)
        spec_keys[key] = key
    return overrides, spec_keys


def _command_settings(config: EngineConfig) -> dict[str, object]:
    """The configuration as trtllm-build's parsed command would hold it (rules.parse_command's form)."""
    given: dict[str, object] = {k: v for k, v in config.limits.items() if v is not None}
    given.update(config.plugin_config)
    return given


def _follow_trtllm_build(config: EngineConfig, table: RuleTable) -> None:
    """Plan every setting as the pinned trtllm-build ends with it; refuse what it refuses.

    A profile setting trtllm-build would change is replaced by trtllm-build's value, its rule the reason.
    A spec override it would change, and anything it refuses, is a violation of the spec."""
    for _ in range(8):  # each round adopts at least one change; the rules settle in a few
        sim = simulate(config.toolchain, _command_settings(config), config.facts, table=table)
        for finding in sim.refusals:
            raise _refusal(finding, config)
        if not sim.overrides:
            return
        for finding in sim.overrides:
            for key, value in finding.changes.items():
                if key in config.spec_keys:
                    spec_key = config.spec_keys[key]
                    raise RuleViolation(
                        ("backend", "plugins", spec_key),
                        f"{spec_key}: {render_value(config.plugin_config.get(key))} would not take effect: "
                        f"{finding.message}",
                        f"remove backend.plugins.{spec_key}",
                    )
                target = config.limits if key in config.limits else config.plugin_config
                target[key] = value
                config.why[key] = f"as the pinned trtllm-build ends up with it: {finding.message}"
    raise TrtpipeError(
        f"the trtllm-build rules of {config.toolchain} did not settle on one build configuration",
        fix="report this spec: build_configs/trtllm_build_flags/rules.yaml has rules that undo each other",
    )


def _refusal(finding: Finding, config: EngineConfig) -> Exception:
    blamed = [config.spec_keys[flag] for flag in finding.flags if flag in config.spec_keys]
    if blamed:
        return RuleViolation(("backend", "plugins", blamed[0]), finding.message, f"remove backend.plugins.{blamed[0]}")
    if "quant_algo" in finding.flags:
        if config.facts.quant_algo is not None:
            return RuleViolation(("quantization", "algo"), finding.message,
                                 "pick a quantization this GPU's TensorRT-LLM build supports")
        return RuleViolation(("quantization", "kv_cache"), finding.message, "use kv_cache: auto or fp8 on this GPU")
    return TrtpipeError(  # not the spec's doing: the build profile itself breaks the rule
        f"the build profile breaks a trtllm-build rule: {finding.message}",
        fix="report this spec: the profile in trtpipe/trtllm_build/profiles.py must follow the rule",
    )


def _serving_rules(spec: BuildSpec, config: EngineConfig) -> None:
    """trtpipe's own cross-setting rules (serving needs, kernel availability); blame the override that broke them.

    trtllm-build's rules are not here: `_follow_trtllm_build` applied rules.yaml before this runs."""
    pc, overrides, family = config.plugin_config, config.overrides, config.family
    fp8_weights = spec.quantization.algo == "fp8"

    def blame(key: str) -> FieldPath:
        return ("backend", "plugins", key) if key in overrides else ("backend", "plugins")

    if not pc.get("use_paged_context_fmha"):
        for option in ("chunked_prefill", "kv_cache_reuse"):
            if not getattr(spec.runtime, option):
                continue
            if "use_paged_context_fmha" in overrides:
                raise RuleViolation(blame("use_paged_context_fmha"),
                                    f"use_paged_context_fmha is off but runtime.{option} needs it",
                                    f"remove the override or set runtime.{option}: false")
            raise RuleViolation(
                ("runtime", option),
                f"runtime.{option} needs an engine built with use_paged_context_fmha, which this build turns off "
                f"({config.why.get('use_paged_context_fmha', 'see the plan')})",
                f"set runtime.{option}: false, or change the quantization/KV cache that turns it off",
            )
    for key in ("low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin", "gemm_swiglu_plugin"):
        if pc.get(key) is not None and not (fp8_weights and family == "hopper"):
            raise RuleViolation(
                blame(key),
                f"{key} runs FP8 kernels that exist for Hopper only (quantization {spec.quantization.algo}, "
                f"family {family})",
                f"remove backend.plugins.{key}",
            )
    if pc.get("gemm_plugin") == "nvfp4" and family != "blackwell":
        raise RuleViolation(blame("gemm_plugin"), "gemm_plugin nvfp4 needs a Blackwell GPU (SM100+)", "use auto")
    if pc.get("gemm_plugin") == "fp8" and not (fp8_weights and family in FP8_FAMILIES):
        raise RuleViolation(blame("gemm_plugin"), "gemm_plugin fp8 needs an FP8-quantized model on SM89+", "use auto")
