"""What a build spec implies for `tensorrt_llm.LLM()` on the PyTorch backend, and the rules it must pass there.

`derive_llm_args(spec, toolchain, gpu, model_config)` returns the keyword arguments (llm_args.json) with the spec
field each comes from and why, or raises LlmApiRuleViolation naming the spec field to change. trtpipe.resolve
calls it once (so `spec-check` refuses what the LLM-API backend would), the artifact stage writes its result, and
`trtpipe migrate` prints it beside the trtllm-build settings.

The mapping (TorchLlmArgs names from build_configs/llm_api_args/<release>.yaml):
  target.tp / target.pp                     -> tensor_parallel_size / pipeline_parallel_size
  model.dtype (resolved)                    -> dtype
  model.trust_remote_code                   -> trust_remote_code
  limits.max_batch_size, max_input_len,
  max_seq_len, max_beam_width               -> the fields of the same names
  limits.max_num_tokens (else the profile's)  -> max_num_tokens
  limits.tokens_per_block                   -> kv_cache_config.tokens_per_block
  quantization.kv_cache                     -> kv_cache_config.dtype: "fp8" for fp8, else "auto" (the weights')
  runtime.kv_cache_free_fraction            -> kv_cache_config.free_gpu_memory_fraction
  runtime.kv_cache_reuse                    -> kv_cache_config.enable_block_reuse
  runtime.chunked_prefill                   -> enable_chunked_prefill
  runtime.scheduler_policy                  -> scheduler_config.capacity_scheduler_policy
  (GPU targets)                             -> cuda_graph_config {max_batch_size: limits.max_batch_size,
                                               enable_padding: true}: decode steps replay CUDA graphs up to the
                                               batch limit, batches padded to the nearest captured size
Settings with no LLM-API equivalent (trtllm-build plugins, the engine build timeout, the inflight_batcher_llm
Triton options) have no place in the llm-api backend section (trtpipe.backend_options.LlmApiOptions): the spec's
schema refuses them where they are written, so a spec never builds with a setting silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpipe import model_semantics, quant
from trtpipe.errors import InternalError
from trtpipe.llm_api.args import LlmArgsTable, llm_args_problems, load_args_table
from trtpipe.spec import BuildSpec
from trtpipe.trtllm_build.profiles import default_max_num_tokens

FieldPath = tuple[str | int, ...]

_POLICIES = {"max_utilization": "MAX_UTILIZATION", "guaranteed_no_evict": "GUARANTEED_NO_EVICT"}


class LlmApiRuleViolation(Exception):
    """The spec breaks an LLM-API rule: which field to change, what is wrong, how to fix it."""

    def __init__(self, field_path: FieldPath, message: str, fix: str) -> None:
        self.field_path = field_path
        self.message = message
        self.fix = fix
        super().__init__(message)


@dataclass(frozen=True)
class ArgSource:
    """Where one llm_args entry comes from: the spec field and why it takes that value."""

    arg: str
    value: Any
    spec_field: str | None
    reason: str


@dataclass
class LlmApiPlan:
    """The LLM() arguments a spec implies, each with its source, for one pinned release."""

    toolchain: str
    trtllm_version: str
    args: dict[str, Any]
    sources: list[ArgSource]
    gpu_sm: int | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "toolchain": self.toolchain,
            "trtllm_version": self.trtllm_version,
            "llm_args": self.args,
            "sources": [s.__dict__ for s in self.sources],
            "notes": list(self.notes),
        }


def _check_quantization(spec: BuildSpec, table: LlmArgsTable, gpu: Any, architecture: str | None) -> None:
    q = spec.quantization
    fmt, kv = quant.FORMATS[q.algo], quant.KV_CACHES[q.kv_cache]
    if fmt.llm_api_refused:
        offered = [f.name for f in quant.FORMATS.values() if f.refused is None and f.llm_api_refused is None]
        raise LlmApiRuleViolation(("quantization", "algo"), f"{q.algo} with backend llm-api: {fmt.llm_api_refused}",
                                  f"use quantization.algo {', '.join(offered)}, or backend: trtllm-build")
    recipes = []
    if fmt.checkpoint_algo is not None:
        recipes.append((("quantization", "algo"), fmt.checkpoint_algo, q.algo))
    if kv.checkpoint_algo == "FP8":
        recipes.append((("quantization", "kv_cache"), "FP8_KV", "fp8 KV cache"))
    source = table.sources.get("quantization", {})
    cite = f"{source.get('file', 'the quantization matrix')} @{str(source.get('commit', ''))[:8]}"
    for path, name, label in recipes:
        support = table.quantization.get(name)
        if support is None:
            raise LlmApiRuleViolation(path, f"TensorRT-LLM {table.trtllm_version}'s PyTorch backend lists no {label} "
                                      f"recipe ({cite})", "pick another quantization, or backend: trtllm-build")
        if gpu is not None and gpu.architecture not in support.architectures:
            raise LlmApiRuleViolation(
                path, f"{label} ({support.recipe}) runs on {', '.join(support.architectures)} GPUs in TensorRT-LLM "
                      f"{table.trtllm_version}'s PyTorch backend, not on {gpu.name} ({gpu.architecture}) ({cite}, "
                      "Hardware Support Matrix)",
                f"on {gpu.name} use another quantization, or backend: trtllm-build")
        if architecture is not None and support.models.get(architecture) is False:
            raise LlmApiRuleViolation(
                path, f"{label} ({support.recipe}) is not listed for {architecture} in TensorRT-LLM "
                      f"{table.trtllm_version}'s PyTorch backend ({cite}, Model Supported Matrix)",
                "pick another quantization, or backend: trtllm-build")


def derive_llm_args(spec: BuildSpec, toolchain: Any, gpu: Any, model_config: dict[str, Any],
                    *, weight_dtype: str, args_table: str, configs: Path | None = None) -> LlmApiPlan:
    """The LLM() arguments `spec` implies on `toolchain`'s PyTorch backend (see the module doc), or a violation.
    `args_table`: the TorchLlmArgs table the spec's backend names (its `args`)."""
    table = load_args_table(args_table, configs)
    archs = model_config.get("architectures") or [None]
    _check_quantization(spec, table, gpu, archs[0])
    q, limits, runtime, target = spec.quantization, spec.limits, spec.runtime, spec.target
    kv = quant.KV_CACHES[q.kv_cache]
    if kv.checkpoint_algo is None and kv.dtype is not None and kv.dtype != weight_dtype:
        raise LlmApiRuleViolation(
            ("quantization", "kv_cache"),
            f"a {kv.dtype} KV cache under {weight_dtype} weights: the PyTorch backend's KvCacheConfig.dtype takes "
            "auto (the weights' dtype) or fp8 (sync_quant_config_with_kv_cache_config_dtype maps no other value)",
            "set quantization.kv_cache: auto (or fp8), or model.dtype to the KV dtype you want")
    sources: list[ArgSource] = []

    def put(arg: str, value: Any, spec_field: str | None, reason: str) -> Any:
        sources.append(ArgSource(arg, value, spec_field, reason))
        return value

    if limits.max_num_tokens is not None:
        max_num_tokens = put("max_num_tokens", limits.max_num_tokens, "limits.max_num_tokens", "set in the spec")
    else:
        tokens, why = default_max_num_tokens(limits.profile.value)  # type: ignore[arg-type]
        max_num_tokens = put("max_num_tokens", tokens, "limits.profile", why)
    kv_config = {
        "dtype": put("kv_cache_config.dtype", "fp8" if kv.checkpoint_algo == "FP8" else "auto",
                     "quantization.kv_cache", "fp8 KV cache" if kv.checkpoint_algo == "FP8"
                     else f"the weights' dtype ({weight_dtype})"),
        "enable_block_reuse": put("kv_cache_config.enable_block_reuse", runtime.kv_cache_reuse,
                                  "runtime.kv_cache_reuse", "KV cache block reuse across requests"),
        "free_gpu_memory_fraction": put("kv_cache_config.free_gpu_memory_fraction",
                                        runtime.kv_cache_free_fraction, "runtime.kv_cache_free_fraction",
                                        "share of free GPU memory the KV cache takes"),
        "tokens_per_block": put("kv_cache_config.tokens_per_block", limits.tokens_per_block,
                                "limits.tokens_per_block", "tokens per KV cache block"),
    }
    windows = model_semantics.attention_windows(model_config, limits.max_seq_len)
    if windows is not None:  # a checkpoint carries no window: the LLM's KV cache config must (model_semantics)
        kv_config["max_attention_window"] = put(
            "kv_cache_config.max_attention_window", windows, None,
            "the model's sliding attention window per layer (config.json sliding_window)")
    args: dict[str, Any] = {
        "tensor_parallel_size": put("tensor_parallel_size", target.tp, "target.tp", "tensor parallelism"),
        "pipeline_parallel_size": put("pipeline_parallel_size", target.pp, "target.pp", "pipeline parallelism"),
        "dtype": put("dtype", weight_dtype, "model.dtype", "the exported weights' dtype"),
        "trust_remote_code": put("trust_remote_code", spec.model.trust_remote_code, "model.trust_remote_code",
                                 "run the model's own code from its folder"),
        "max_batch_size": put("max_batch_size", limits.max_batch_size, "limits.max_batch_size", "requests per step"),
        "max_input_len": put("max_input_len", limits.max_input_len, "limits.max_input_len", "longest prompt"),
        "max_seq_len": put("max_seq_len", limits.max_seq_len, "limits.max_seq_len", "prompt plus output"),
        "max_beam_width": put("max_beam_width", limits.max_beam_width, "limits.max_beam_width", "beam search width"),
        "max_num_tokens": max_num_tokens,
        "kv_cache_config": kv_config,
        "enable_chunked_prefill": put("enable_chunked_prefill", runtime.chunked_prefill,
                                      "runtime.chunked_prefill", "split long prompts over steps"),
        "scheduler_config": {"capacity_scheduler_policy": put(
            "scheduler_config.capacity_scheduler_policy", _POLICIES[runtime.scheduler_policy.value],
            "runtime.scheduler_policy", "how requests are admitted against KV cache capacity")},
    }
    if gpu is not None:
        args["cuda_graph_config"] = {
            "max_batch_size": put("cuda_graph_config.max_batch_size", limits.max_batch_size, "limits.max_batch_size",
                                  "capture decode CUDA graphs up to the batch limit"),
            "enable_padding": put("cuda_graph_config.enable_padding", True, None,
                                  "pad a batch to the nearest captured size, so every decode step replays a graph"),
        }
    problems = llm_args_problems(args, table)
    if problems:  # trtpipe's own mapping broke the table: not the spec's doing
        raise InternalError(f"trtpipe derived llm_args that {table.toolchain}'s table refuses: {problems[0]}",
                            fix="report this with the spec attached")
    notes = []
    unverified = table.unverified(args)
    if unverified:
        notes.append(f"{table.toolchain} is a preview line: {', '.join(unverified)} were not seen in its source "
                     "(carried from the 1.2.1 table)")
    return LlmApiPlan(toolchain=toolchain.name, trtllm_version=table.trtllm_version, args=args, sources=sources,
                      gpu_sm=gpu.sm if gpu is not None else None, notes=notes)
