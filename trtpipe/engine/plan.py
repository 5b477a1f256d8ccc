"""The engine build plan: spec + toolchain + target GPU -> the complete trtllm-build configuration.

`make_build_plan(resolved)` fixes every limit and every plugin/feature setting explicitly (never a
version's default), records why each is set, applies the spec's `engine.plugins` overrides on top of
the profile after checking them against the toolchain's flag contract, and then replays the pinned
trtllm-build's own rules (`rules.py`) on the result:
- a setting the pinned trtllm-build would silently change is planned as trtllm-build ends with it, and
  its reason says so (e.g. INT4-AWQ: the gated MLP is not fused, so `--use_fused_mlp disable`);
- a spec override that trtllm-build would change or refuse is a positioned SpecError naming the rule;
- `render_command` refuses any command the flag table or the rules would refuse or change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from trtpipe.engine.flags import FlagContract, load_contract, render_value
from trtpipe.engine.rules import (
    TRTLLM_KV_CACHE_QUANT_ALGO,
    TRTLLM_QUANT_ALGO,
    BuildFacts,
    Finding,
    parse_command,
    simulate,
    spec_value,
)
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
    limits: dict[str, int | str | None]
    plugin_config: dict[str, str | bool | int | None]
    why: dict[str, str]
    overrides: list[str]
    workers: int = 1
    log_level: str = "info"
    architecture: str | None = None  # the model's architecture (config.json), which some trtllm-build rules test

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

    def facts(self) -> BuildFacts:
        """What the pinned trtllm-build will know beyond the command: checkpoint quantization, architecture, tp, SM."""
        return BuildFacts(
            quant_algo=TRTLLM_QUANT_ALGO.get(self.quant_algo),
            kv_cache_quant_algo=TRTLLM_KV_CACHE_QUANT_ALGO.get(self.kv_cache_dtype),
            architecture=self.architecture,
            tp_size=self.tp,
            sm=self.gpu_sm,
        )

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
            if self.limits[key] is not None:  # opt_num_tokens is left out with multiple profiles
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
        # The pinned trtllm-build's own rules: a command it would refuse, or build with other settings
        # than it names, never leaves trtpipe.
        findings = simulate(self.toolchain, parse_command(argv), self.facts()).findings
        if findings:
            raise TrtpipeError(
                "; ".join(f.message for f in findings),
                fix="the plan must follow trtllm-build's rules (build_configs/trtllm_build_flags/rules.yaml); "
                "change engine.plugins or report the plan that produced this command",
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
    limits: dict[str, int | str | None] = {
        "max_batch_size": engine.max_batch_size,
        "max_input_len": engine.max_input_len,
        "max_seq_len": engine.max_seq_len,
        "max_num_tokens": max_num_tokens,
        "opt_num_tokens": None,  # set below, once multiple_profiles is final
        "max_beam_width": engine.max_beam_width,
        "kv_cache_type": "paged",
    }
    why["kv_cache_type"] = "paged KV cache: required by in-flight batching; memory is allocated per block, not per max_seq_len"
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
        why[key] = f"engine.{key} from the spec"

    # --- overrides from engine.plugins, validated against the flag contract
    overrides: list[str] = []
    spec_keys: dict[str, str] = {}  # a trtllm-build flag -> the engine.plugins key that set it
    for key, raw in engine.plugins.items():
        where = ("engine", "plugins", key)
        if key == "tokens_per_block":
            raise _spec_error(resolved, where, "tokens_per_block is not a plugin override", fix="set engine.tokens_per_block")
        if key in ("paged_kv_cache", "kv_cache_type"):
            # Planned like any setting; the rules below refuse what in-flight batching cannot serve.
            value = spec_value(key, raw)
            if key == "paged_kv_cache":
                value = "paged" if value is True else "continuous"
            limits["kv_cache_type"] = value
            why["kv_cache_type"] = f"set by engine.plugins.{key} in the spec"
            spec_keys["kv_cache_type"] = key
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
        plugin_config[key] = value
        why[key] = "set by engine.plugins in the spec"
        overrides.append(key)
        spec_keys[key] = key

    if plugin_config.get("multiple_profiles"):
        limits["opt_num_tokens"] = None
        why["opt_num_tokens"] = (
            "not passed: trtllm-build refuses --opt_num_tokens together with --multiple_profiles enable "
            "(rule opt-num-tokens-with-multiple-profiles); each optimization profile then has its own optimum"
        )
    else:
        limits["opt_num_tokens"] = min(engine.max_batch_size * engine.max_beam_width, int(limits["max_num_tokens"]))
        why["opt_num_tokens"] = (
            "min(max_batch_size*max_beam_width, max_num_tokens): TRT-LLM's own default with a single profile, "
            "set explicitly so the engine config equals the plan"
        )

    plan = BuildPlan(
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
        architecture=_architecture(resolved),
    )
    _follow_trtllm_build(resolved, plan, spec_keys)
    _check_combination(resolved, plan.plugin_config, family=family, quant_algo=quant_algo, overrides=overrides,
                       why=plan.why)
    return plan


def _command_settings(plan: BuildPlan) -> dict[str, object]:
    """The plan as trtllm-build's parsed command would hold it (rules.parse_command's form)."""
    given: dict[str, object] = {k: v for k, v in plan.limits.items() if v is not None}
    given.update(plan.plugin_config)
    return given


def _follow_trtllm_build(resolved: Any, plan: BuildPlan, spec_keys: dict[str, str]) -> None:
    """Plan every setting as the pinned trtllm-build ends with it; refuse what it refuses.

    A profile setting that trtllm-build would change is replaced by trtllm-build's value, with its rule
    as the reason. A spec override it would change or refuse is the spec's error, positioned at it.
    """
    facts = plan.facts()
    for _ in range(8):  # each round adopts at least one change; the rules settle in a few
        sim = simulate(plan.toolchain, _command_settings(plan), facts)
        for finding in sim.refusals:
            raise _rule_error(resolved, finding, spec_keys)
        if not sim.overrides:
            return
        for finding in sim.overrides:
            for key, value in finding.changes.items():
                if key in spec_keys:
                    raise _spec_error(
                        resolved, ("engine", "plugins", spec_keys[key]),
                        f"{spec_keys[key]}: {render_value(plan.plugin_config.get(key))} would not take effect: "
                        f"{finding.message}",
                        fix=f"remove engine.plugins.{spec_keys[key]}",
                    )
                target = plan.limits if key in plan.limits else plan.plugin_config
                target[key] = value
                plan.why[key] = f"as the pinned trtllm-build ends up with it: {finding.message}"
    raise TrtpipeError(
        f"the trtllm-build {plan.trtllm_version} rules did not settle on one build configuration",
        fix="report this spec: build_configs/trtllm_build_flags/rules.yaml has rules that undo each other",
    )


def _rule_error(resolved: Any, finding: Finding, spec_keys: dict[str, str]) -> TrtpipeError:
    blamed = [spec_keys[flag] for flag in finding.flags if flag in spec_keys]
    if blamed:
        return _spec_error(
            resolved, ("engine", "plugins", blamed[0]), finding.message, fix=f"remove engine.plugins.{blamed[0]}",
        )
    if "quant_algo" in finding.flags:
        return _spec_error(resolved, ("quantization", "algo"), finding.message,
                           fix="pick a quantization this GPU's TensorRT-LLM build supports")
    return TrtpipeError(
        f"the build profile breaks a trtllm-build rule: {finding.message}",
        fix="report this spec: the profile in trtpipe/engine/profiles.py must follow the rule",
    )


def _check_combination(
    resolved: Any, pc: dict[str, Any], *, family: str, quant_algo: str, overrides: list[str],
    why: dict[str, str] | None = None,
) -> None:
    """trtpipe's own cross-setting rules (serving needs, kernel availability); blame the override that broke them.

    trtllm-build's rules are not here: `_follow_trtllm_build` applies rules.yaml before this runs.
    """

    def blame(*keys: str) -> tuple[str | int, ...]:
        for key in keys:
            if key in overrides:
                return ("engine", "plugins", key)
        return ("engine", "plugins")

    triton = resolved.spec.triton
    if not pc.get("use_paged_context_fmha"):
        for option in ("enable_chunked_context", "enable_kv_cache_reuse"):
            if not getattr(triton, option):
                continue
            if "use_paged_context_fmha" in overrides:
                raise _spec_error(
                    resolved, blame("use_paged_context_fmha"),
                    f"use_paged_context_fmha is off but triton.{option} needs it",
                    fix=f"remove the override or set triton.{option}: false",
                )
            raise _spec_error(
                resolved, ("triton", option),
                f"triton.{option} needs an engine built with use_paged_context_fmha, which this build turns off "
                f"({(why or {}).get('use_paged_context_fmha', 'see the plan')})",
                fix=f"set triton.{option}: false, or change the quantization/KV cache that turns it off",
            )
    for key in ("low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin", "gemm_swiglu_plugin"):
        if pc.get(key) is not None and not (quant_algo == "fp8" and family == "hopper"):
            raise _spec_error(
                resolved, blame(key),
                f"{key} runs FP8 kernels that exist for Hopper only (quantization {quant_algo}, family {family})",
                fix=f"remove engine.plugins.{key}",
            )
    fp8_capable = family in ("ada", "hopper", "blackwell")
    if pc.get("gemm_plugin") == "nvfp4" and family != "blackwell":
        raise _spec_error(
            resolved, blame("gemm_plugin"), "gemm_plugin nvfp4 needs a Blackwell GPU (SM100+)", fix="use auto",
        )
    if pc.get("gemm_plugin") == "fp8" and not (quant_algo == "fp8" and fp8_capable):
        raise _spec_error(
            resolved, blame("gemm_plugin"), "gemm_plugin fp8 needs an FP8-quantized model on SM89+", fix="use auto",
        )
