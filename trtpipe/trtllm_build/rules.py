"""trtllm-build's own rules between flags, per pinned TensorRT-LLM version.

The flag table (`flags.py`) knows which flags and values the parser accepts; a command can pass it and
still be refused by `trtllm-build` (a RuntimeError in `main()`, an assertion in `build_model()`), or be
built with other settings than it names (`build()` and `check_max_num_tokens()` silently override).
This module replays those steps, in upstream order, on a parsed command plus the facts the command
does not carry (the checkpoint's quantization and architecture, tensor parallelism, the build GPU's
SM). The data - which rule applies to which version, what it does, where it is written - lives in
`build_configs/trtllm_build_flags/rules.yaml`; each rule id there has exactly one check function here.

`simulate()` answers "what would the pinned trtllm-build do with this command": the settings it ends
with, and a `Finding` for every refusal and override. trtpipe.trtllm_build.config replays them on a
spec's whole build configuration, which is how `resolve` refuses what a build would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpipe import quant
from trtpipe.datafiles import read_yaml
from trtpipe.errors import IntegrityError
from trtpipe.shipped import configs_dir

Effect = Literal["refuse", "override"]
Stage = Literal["build", "spec", "serving"]

# TRT-LLM QuantAlgo names (tensorrt_llm/quantization/mode.py) grouped as the rules test them.
FP8_CONTEXT_FMHA_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")
FUSED_MLP_ALGOS = (None, "FP8", "MIXED_PRECISION")
INT_WEIGHT_ONLY_ALGOS = ("W4A16_AWQ", "W4A16", "W4A16_GPTQ", "W8A16", "W8A16_GPTQ")
SMOOTHQUANT_PREFIX = "W8A8_SQ"
REDUCE_FUSION_ARCHITECTURES = ("LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM")

_TRUE_WORDS = ("enable", "enabled", "true", "on", "yes")
_FALSE_WORDS = ("disable", "disabled", "false", "off", "no", "none")

# Flags whose command-line value is a plugin dtype (None = disabled) rather than an enable/disable feature.
_DTYPE_FLAGS = frozenset({
    "bert_attention_plugin", "gpt_attention_plugin", "gemm_plugin", "gemm_swiglu_plugin", "fp8_rowwise_gemm_plugin",
    "lora_plugin", "moe_plugin", "mamba_conv1d_plugin", "nccl_plugin", "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin", "gemm_allreduce_plugin",
})
_INT_FLAGS = frozenset({
    "max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens", "opt_num_tokens",
    "max_draft_len", "tokens_per_block", "max_encoder_input_len", "max_prompt_embedding_table_size",
})
_SWITCHES = frozenset({"gather_context_logits", "gather_generation_logits", "gather_all_token_logits"})


class Citation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    toolchains: list[str]
    source: str
    function: str
    line: int | None = None


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    commit: str | None
    verified: bool
    note: str


class Rule(BaseModel):
    """One row of rules.yaml."""

    model_config = ConfigDict(extra="forbid")

    id: str
    checks: str
    effect: Effect
    stage: Stage
    says: str
    refused_by: str = "trtllm-build"
    sets: dict[str, Any] = Field(default_factory=dict)
    cite: list[Citation]

    @property
    def toolchains(self) -> set[str]:
        return {name for c in self.cite for name in c.toolchains}


class RuleTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: dict[str, Source]
    defaults: dict[str, Any]
    rules: list[Rule]

    def for_toolchain(self, toolchain: str) -> dict[str, Rule]:
        return {rule.id: rule for rule in self.rules if toolchain in rule.toolchains}

    def citation(self, rule: Rule, toolchain: str) -> str:
        """Where the rule is written for this toolchain's era, e.g. 'tensorrt_llm/commands/build.py:545 main() @008b2b8d'."""
        parts = []
        for cite in rule.cite:
            if toolchain not in cite.toolchains:
                continue
            source = self.sources[cite.source]
            where = source.file + (f":{cite.line}" if cite.line is not None else "")
            commit = f" @{source.commit[:8]}" if source.commit else ""
            parts.append(f"{where} {cite.function}(){commit}".replace("()()", "()").replace(")()", ")"))
        return "; ".join(parts)


@lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> RuleTable:
    table = RuleTable.model_validate(read_yaml(path))
    unknown_sources = {c.source for r in table.rules for c in r.cite} - set(table.sources)
    if unknown_sources:
        raise IntegrityError(f"{path}: citations name unknown sources {sorted(unknown_sources)}", path=str(path),
                             fix="add them to sources:")
    missing = {r.id for r in table.rules} - set(CHECKS)
    if missing:
        raise IntegrityError(f"{path}: rules without a check in trtpipe/trtllm_build/rules.py: {sorted(missing)}",
                             path=str(path), fix="implement them or remove the rows")
    return table


def load_rules(path: Path | None = None, *, configs: Path | None = None) -> RuleTable:
    """The rule table (`path`, or rules.yaml of `configs`: the build_configs/ folder, None for the shipped one)."""
    path = path or configs_dir(configs) / "trtllm_build_flags" / "rules.yaml"
    return _load(path, path.stat().st_mtime_ns)


# ----------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class BuildFacts:
    """What trtllm-build knows that its command line does not say.

    `for_recipe` derives them from a spec's quantization (the checkpoint's QuantAlgo names come from the
    quantization table, trtpipe.quant)."""

    quant_algo: str | None = None  # the checkpoint's quantization.quant_algo (TRT-LLM QuantAlgo name)
    kv_cache_quant_algo: str | None = None  # "FP8", "INT8" or None
    architecture: str | None = None  # the checkpoint's architecture, e.g. LlamaForCausalLM
    tp_size: int = 1
    sm: int | None = None  # the build GPU's SM (TRT-LLM builds for the GPU it runs on); None: unknown

    @classmethod
    def for_recipe(
        cls, algo: str, kv_cache: str, *, architecture: str | None, tp_size: int, sm: int | None
    ) -> BuildFacts:
        """The facts of a checkpoint converted with quantization `algo` and KV cache `kv_cache` (spec names)."""
        return cls(
            quant_algo=quant.FORMATS[algo].checkpoint_algo,
            kv_cache_quant_algo=quant.KV_CACHES[kv_cache].checkpoint_algo,
            architecture=architecture, tp_size=tp_size, sm=sm,
        )

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache_quant_algo == "FP8"

    @property
    def int8_kv(self) -> bool:
        return self.kv_cache_quant_algo == "INT8"


@dataclass
class Finding:
    rule: str
    effect: Effect
    message: str  # one line: what happens, the rule id, and its source
    flags: tuple[str, ...]  # the flags that decide it (to blame a spec field)
    changes: dict[str, Any] = field(default_factory=dict)  # for overrides: flag -> the value trtllm-build uses


@dataclass
class Simulation:
    """What trtllm-build ends with: its settings and every refusal and override on the way."""

    settings: dict[str, Any]
    findings: list[Finding]

    @property
    def refusals(self) -> list[Finding]:
        return [f for f in self.findings if f.effect == "refuse"]

    @property
    def overrides(self) -> list[Finding]:
        return [f for f in self.findings if f.effect == "override"]


# ------------------------------------------------------------------------------------- command parsing


def command_value(flag: str, raw: str | None) -> Any:
    """A command-line value as trtllm-build holds it: int, bool for enable/disable, None for a disabled plugin."""
    if flag in _SWITCHES:
        return True
    if raw is None:
        return None
    if flag in _INT_FLAGS:
        return int(raw)
    if flag in _DTYPE_FLAGS:
        return None if raw == "disable" else raw
    if raw in ("enable", "disable"):
        return raw == "enable"
    return raw


def spec_value(flag: str, raw: Any) -> Any:
    """An `backend.plugins` value (YAML bool or word) as trtllm-build would hold it."""
    if flag == "kv_cache_type":
        return None if raw is None else str(raw).lower()
    if flag in _INT_FLAGS:
        return raw
    word = raw.lower() if isinstance(raw, str) else raw
    if flag in _DTYPE_FLAGS:
        return None if word in (None, False, *_FALSE_WORDS) else raw
    if word in (True, *_TRUE_WORDS):
        return True
    if word in (False, None, *_FALSE_WORDS):
        return False
    return raw


def parse_command(argv: list[str], switches: frozenset[str] = _SWITCHES) -> dict[str, Any]:
    """{flag: value} of a trtllm-build argv (executable first); values converted by `command_value`."""
    given: dict[str, Any] = {}
    i = 1
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            i += 1
            continue
        name = token[2:]
        if name in switches:
            given[name] = True
            i += 1
            continue
        raw = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        given[name] = command_value(name, raw)
        i += 2 if raw is not None else 1
    return given


# ----------------------------------------------------------------------------------------------- checks
#
# Each check gets the settings so far (mutable: an override changes them for the steps after it), the
# flags the command gave, and the facts. It returns None, or (flags that decide it, {flag: new value})
# for an override, or (flags, {}) for a refusal. Upstream order matters and is kept by CHECKS' order.

Outcome = tuple[tuple[str, ...], dict[str, Any]] | None
Check = Callable[[dict[str, Any], dict[str, Any], BuildFacts], Outcome]


def _gather_context_logits_with_draft_len(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    gather = s.get("gather_context_logits") or s.get("gather_all_token_logits")
    if gather and (s.get("max_draft_len") or 0) > 0:
        return ("gather_context_logits", "max_draft_len"), {}
    return None


SM100_UNSUPPORTED = ("gemm_swiglu_plugin", "fp8_rowwise_gemm_plugin", "low_latency_gemm_plugin",
                     "low_latency_gemm_swiglu_plugin", "bert_context_fmha_fp32_acc")


def _plugin_unsupported_on_sm100(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if f.sm != 100:  # PluginConfig.validate keys its table by the exact SM
        return None
    bad = tuple(name for name in SM100_UNSUPPORTED if s.get(name) not in (None, False))
    return (bad, {}) if bad else None


def _fused_mlp_needs_fp8_or_no_quant(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("use_fused_mlp") and f.quant_algo not in FUSED_MLP_ALGOS:
        return ("use_fused_mlp",), {"use_fused_mlp": False}
    return None


def _opt_num_tokens_with_multiple_profiles(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if given.get("build_config") is None and s.get("multiple_profiles") and given.get("opt_num_tokens") is not None:
        return ("opt_num_tokens", "multiple_profiles"), {}
    return None


def _kv_cache_type_conflicts_paged_kv_cache(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if "kv_cache_type" in given and "paged_kv_cache" in given:
        paged_type = str(given["kv_cache_type"]).lower() == "paged"
        if paged_type != bool(given["paged_kv_cache"]):
            return ("kv_cache_type", "paged_kv_cache"), {}
    return None


def _streamingllm_llama_only(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("streamingllm") and f.architecture is not None and f.architecture != "LlamaForCausalLM":
        return ("streamingllm",), {}
    return None


def _streamingllm_removed(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    return (("streamingllm",), {}) if s.get("streamingllm") else None


def _pp_reduce_scatter_mixtral_only(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("pp_reduce_scatter") and f.architecture is not None and f.architecture != "MixtralForCausalLM":
        return ("pp_reduce_scatter",), {}
    return None


def _max_input_len_clipped(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("max_seq_len") is not None and s["max_input_len"] > s["max_seq_len"]:
        return ("max_input_len", "max_seq_len"), {"max_input_len": s["max_seq_len"]}
    return None


def _max_num_tokens_ignored_without_packed_input(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if not s.get("remove_input_padding") and ("max_num_tokens" in given or "opt_num_tokens" in given):
        if s.get("max_seq_len") is None:
            return None
        value = s["max_batch_size"] * s["max_seq_len"]
        if value != s.get("max_num_tokens"):
            return ("remove_input_padding", "max_num_tokens"), {"max_num_tokens": value}
    return None


def _max_num_tokens_capped(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    # check_max_num_tokens returns early without packed input: this and the three checks after it only
    # run with remove_input_padding on.
    if not s.get("remove_input_padding") or s.get("max_seq_len") is None or s.get("max_num_tokens") is None:
        return None
    cap = s["max_seq_len"] * s["max_batch_size"]
    if s["max_num_tokens"] > cap:
        return ("max_num_tokens", "max_seq_len", "max_batch_size"), {"max_num_tokens": cap}
    return None


def _max_num_tokens_raised_to_max_input_len(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if not s.get("remove_input_padding") or s.get("max_num_tokens") is None:
        return None
    if not s.get("context_fmha") and s["max_num_tokens"] < s["max_input_len"]:
        return ("max_num_tokens", "context_fmha"), {"max_num_tokens": s["max_input_len"]}
    return None


def _max_num_tokens_raised_to_tokens_per_block(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    tpb = s.get("tokens_per_block")
    if not s.get("remove_input_padding") or s.get("max_num_tokens") is None:
        return None
    if s.get("context_fmha") and tpb and s["max_num_tokens"] < tpb:
        return ("max_num_tokens", "tokens_per_block"), {"max_num_tokens": tpb}
    return None


def _opt_num_tokens_capped(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    opt, most = s.get("opt_num_tokens"), s.get("max_num_tokens")
    if s.get("remove_input_padding") and opt is not None and most is not None and opt > most:
        return ("opt_num_tokens", "max_num_tokens"), {"opt_num_tokens": most}
    return None


def _streamingllm_disables_paged_context_fmha(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("streamingllm") and s.get("use_paged_context_fmha"):
        return ("streamingllm", "use_paged_context_fmha"), {"use_paged_context_fmha": False}
    return None


def _reduce_fusion_needs_tp_and_architecture(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("reduce_fusion") and (f.tp_size == 1 or f.architecture not in REDUCE_FUSION_ARCHITECTURES):
        return ("reduce_fusion",), {"reduce_fusion": False}
    return None


def _user_buffer_needs_reduce_fusion(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("user_buffer") and not s.get("reduce_fusion"):
        return ("user_buffer", "reduce_fusion"), {"user_buffer": False}
    return None


def _norm_quant_fusion_conditions(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("norm_quant_fusion") and (
        s.get("reduce_fusion") or f.architecture != "LlamaForCausalLM" or f.quant_algo != "NVFP4"
    ):
        return ("norm_quant_fusion",), {"norm_quant_fusion": False}
    return None


def _speculative_decoding_extends_max_seq_len(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("speculative_decoding_mode") and s.get("max_seq_len") is not None and (s.get("max_draft_len") or 0) > 0:
        return ("speculative_decoding_mode", "max_draft_len"), {"max_seq_len": s["max_seq_len"] + s["max_draft_len"]}
    return None


def _speculative_decoding_raises_max_num_tokens(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("speculative_decoding_mode") and s.get("max_num_tokens") is not None:
        needed = s["max_batch_size"] * ((s.get("max_draft_len") or 0) + 1)
        if s["max_num_tokens"] < needed:
            return ("speculative_decoding_mode", "max_num_tokens"), {"max_num_tokens": needed}
    return None


def _context_fmha_off_disables_fp8_and_paged(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("context_fmha"):
        return None
    changes = {k: False for k in ("use_fp8_context_fmha", "use_paged_context_fmha") if s.get(k)}
    return (("context_fmha", *changes), changes) if changes else None


def _fp8_context_off(s: dict[str, Any], f: BuildFacts, cause: tuple[str, ...]) -> Outcome:
    changes: dict[str, Any] = {}
    if s.get("use_fp8_context_fmha"):
        changes["use_fp8_context_fmha"] = False
    if s.get("use_paged_context_fmha") and f.fp8_kv:
        changes["use_paged_context_fmha"] = False
    return ((*cause, *changes), changes) if changes else None


def _fp8_context_fmha_needs_fp8_quant(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if not s.get("context_fmha") or f.quant_algo in FP8_CONTEXT_FMHA_ALGOS:
        return None
    return _fp8_context_off(s, f, ())


def _fp8_context_fmha_needs_sm89(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if not s.get("context_fmha") or f.quant_algo not in FP8_CONTEXT_FMHA_ALGOS or f.sm is None or f.sm >= 89:
        return None
    return _fp8_context_off(s, f, ())


def _fp8_context_fmha_follows_fp8_kv_cache(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if not s.get("context_fmha") or f.quant_algo not in FP8_CONTEXT_FMHA_ALGOS or (f.sm is not None and f.sm < 89):
        return None
    if s.get("use_paged_context_fmha") and bool(s.get("use_fp8_context_fmha")) != f.fp8_kv:
        return ("use_fp8_context_fmha", "use_paged_context_fmha"), {"use_fp8_context_fmha": f.fp8_kv}
    return None


def _paged_context_fmha_off_with_int8_kv(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("use_paged_context_fmha") and f.int8_kv:
        return ("use_paged_context_fmha",), {"use_paged_context_fmha": False}
    return None


def _on_sm100_family(f: BuildFacts) -> bool:
    return f.sm is not None and 100 <= f.sm < 120


def _int_quant_refused_on_sm100(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if _on_sm100_family(f) and (f.quant_algo in INT_WEIGHT_ONLY_ALGOS or f.int8_kv):
        return ("quant_algo",), {}
    return None


def _smoothquant_refused_on_sm100(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if _on_sm100_family(f) and (f.quant_algo or "").startswith(SMOOTHQUANT_PREFIX):
        return ("quant_algo",), {}
    return None


def _gemm_swiglu_needs_fused_mlp(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    # optimize_model_with_config reads plugin_config.use_fused_mlp: the flag as given, not main()'s kwargs
    flag = given.get("use_fused_mlp", s.get("_given_use_fused_mlp"))
    swiglu = tuple(k for k in ("gemm_swiglu_plugin", "low_latency_gemm_swiglu_plugin") if s.get(k))
    if swiglu and not flag:
        return (*swiglu, "use_fused_mlp"), {}
    return None


def _nvfp4_enables_gemm_plugin(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    explicitly_disabled = "gemm_plugin" in given and given["gemm_plugin"] is None
    if f.quant_algo == "NVFP4" and not explicitly_disabled and s.get("gemm_plugin") != "nvfp4":
        return ("gemm_plugin",), {"gemm_plugin": "nvfp4"}
    return None


def _eagle_needs_paged_context_fmha(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    if s.get("speculative_decoding_mode") == "eagle" and not s.get("use_paged_context_fmha"):
        return ("speculative_decoding_mode", "use_paged_context_fmha"), {"use_paged_context_fmha": True}
    return None


def _inflight_batching_requirements(s: dict[str, Any], given: dict[str, Any], f: BuildFacts) -> Outcome:
    bad: list[str] = []
    if s.get("gpt_attention_plugin") is None:
        bad.append("gpt_attention_plugin")
    if not s.get("remove_input_padding"):
        bad.append("remove_input_padding")
    kv_type = s.get("kv_cache_type")
    if kv_type is not None and str(kv_type).lower() != "paged":
        bad.append("kv_cache_type")
    elif kv_type is None and s.get("paged_kv_cache") is False:
        bad.append("paged_kv_cache")
    return (tuple(bad), {}) if bad else None


# Upstream order: main() -> build_model() -> build() -> optimize_model_with_config(); then serving.
CHECKS: dict[str, Check] = {
    "gather-context-logits-with-draft-len": _gather_context_logits_with_draft_len,
    "plugin-unsupported-on-sm100": _plugin_unsupported_on_sm100,
    "fused-mlp-needs-fp8-or-no-quant": _fused_mlp_needs_fp8_or_no_quant,
    "opt-num-tokens-with-multiple-profiles": _opt_num_tokens_with_multiple_profiles,
    "kv-cache-type-conflicts-paged-kv-cache": _kv_cache_type_conflicts_paged_kv_cache,
    "streamingllm-llama-only": _streamingllm_llama_only,
    "streamingllm-removed": _streamingllm_removed,
    "pp-reduce-scatter-mixtral-only": _pp_reduce_scatter_mixtral_only,
    "max-input-len-clipped-to-max-seq-len": _max_input_len_clipped,
    "max-num-tokens-ignored-without-packed-input": _max_num_tokens_ignored_without_packed_input,
    "max-num-tokens-capped": _max_num_tokens_capped,
    "max-num-tokens-raised-to-max-input-len": _max_num_tokens_raised_to_max_input_len,
    "max-num-tokens-raised-to-tokens-per-block": _max_num_tokens_raised_to_tokens_per_block,
    "opt-num-tokens-capped": _opt_num_tokens_capped,
    "streamingllm-disables-paged-context-fmha": _streamingllm_disables_paged_context_fmha,
    "reduce-fusion-needs-tp-and-architecture": _reduce_fusion_needs_tp_and_architecture,
    "user-buffer-needs-reduce-fusion": _user_buffer_needs_reduce_fusion,
    "norm-quant-fusion-conditions": _norm_quant_fusion_conditions,
    "speculative-decoding-extends-max-seq-len": _speculative_decoding_extends_max_seq_len,
    "speculative-decoding-raises-max-num-tokens": _speculative_decoding_raises_max_num_tokens,
    "context-fmha-off-disables-fp8-and-paged": _context_fmha_off_disables_fp8_and_paged,
    "fp8-context-fmha-needs-fp8-quant": _fp8_context_fmha_needs_fp8_quant,
    "fp8-context-fmha-needs-sm89": _fp8_context_fmha_needs_sm89,
    "fp8-context-fmha-follows-fp8-kv-cache": _fp8_context_fmha_follows_fp8_kv_cache,
    "paged-context-fmha-off-with-int8-kv": _paged_context_fmha_off_with_int8_kv,
    "int-quant-refused-on-sm100": _int_quant_refused_on_sm100,
    "smoothquant-refused-on-sm100": _smoothquant_refused_on_sm100,
    "gemm-swiglu-needs-fused-mlp": _gemm_swiglu_needs_fused_mlp,
    "nvfp4-enables-gemm-plugin": _nvfp4_enables_gemm_plugin,
    "eagle-needs-paged-context-fmha": _eagle_needs_paged_context_fmha,
    "inflight-batching-needs-paged-kv-packed-input-gpt-attention": _inflight_batching_requirements,
}

# Build-config defaults (BuildConfig dataclass fields, builder.py@008b2b8) for limits a command omits.
LIMIT_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 2048, "max_input_len": 1024, "max_seq_len": None, "max_beam_width": 1,
    "max_num_tokens": 8192, "opt_num_tokens": None, "max_draft_len": 0,
}


def _message(table: RuleTable, rule: Rule, toolchain: str, changes: dict[str, Any], flags: tuple[str, ...]) -> str:
    trtllm = toolchain.removeprefix("trtllm-")
    if rule.effect == "refuse":
        head = f"{rule.refused_by} {trtllm} refuses this ({', '.join(flags) or rule.checks}): {rule.says}"
    else:
        sets = ", ".join(f"{k} -> {render(v)}" for k, v in changes.items())
        head = f"trtllm-build {trtllm} overrides {sets}: {rule.says}"
    return f"{head} [rule {rule.id}; {table.citation(rule, toolchain)}]"


def render(value: Any) -> str:
    if value is True:
        return "enable"
    if value is False:
        return "disable"
    if value is None:
        return "disable"
    return str(value)


def simulate(
    toolchain: str,
    given: dict[str, Any],
    facts: BuildFacts,
    *,
    stages: tuple[Stage, ...] = ("build", "spec", "serving"),
    table: RuleTable | None = None,
) -> Simulation:
    """Replay the pinned trtllm-build's rules on `given` ({flag: value}, see `parse_command`)."""
    table = table or load_rules()
    rules = table.for_toolchain(toolchain)
    settings: dict[str, Any] = {**table.defaults, **LIMIT_DEFAULTS, **given}
    settings["_given_use_fused_mlp"] = settings.get("use_fused_mlp")
    findings: list[Finding] = []
    for rule_id, check in CHECKS.items():
        rule = rules.get(rule_id)
        if rule is None or rule.stage not in stages:
            continue
        outcome = check(settings, given, facts)
        if outcome is None:
            continue
        flags, changes = outcome
        if rule.effect == "override":
            changes = {k: v for k, v in changes.items() if settings.get(k) != v}
            settings.update(changes)
            # A finding only where the command named the setting: a default trtllm-build changes
            # (e.g. use_fp8_context_fmha on by default, off without FP8) is not a claim of the command.
            changes = {k: v for k, v in changes.items() if k in given}
            if not changes:
                continue
        findings.append(Finding(
            rule=rule.id, effect=rule.effect, message=_message(table, rule, toolchain, changes, flags),
            flags=flags, changes=changes,
        ))
    settings.pop("_given_use_fused_mlp", None)
    return Simulation(settings=settings, findings=findings)


def simulate_command(toolchain: str, argv: list[str], facts: BuildFacts, *, table: RuleTable | None = None) -> Simulation:
    return simulate(toolchain, parse_command(argv), facts, table=table)
