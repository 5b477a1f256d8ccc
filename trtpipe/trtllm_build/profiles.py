"""Build profiles: which trtllm-build plugin and feature settings to use, per GPU family and goal.

Two profiles per family: `throughput` (many concurrent requests, tokens/s per GPU) and `latency`
(few requests, time to first token and per-output-token latency). Every setting carries the reason
it is set, taken from NVIDIA's TensorRT-LLM performance guides:

- DOC_BUILD_FLAGS: docs/source/performance/performance-tuning-guide/useful-build-time-flags.md
- DOC_LIMITS: docs/source/performance/performance-tuning-guide/tuning-max-batch-size-and-max-num-tokens.md
- DOC_BEST: docs/source/performance/perf-best-practices.md
- DOC_IFB: the Triton TRT-LLM backend's in-flight batching requirement (TrtGptModelInflightBatching).

The in-flight batching requirements (GPT attention plugin, packed input, paged KV cache) are set by
`inflight_batching_settings` and are never left to a version's defaults.

The GPU family is the catalog's `architecture` (build_configs/gpus.yaml); what a quantization format
asks of the build (its GEMM plugin, whether FP8 kernels apply) is its row in trtpipe.quant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from trtpipe import quant

DOC_BUILD_FLAGS = "TRT-LLM performance-tuning-guide/useful-build-time-flags"
DOC_LIMITS = "TRT-LLM performance-tuning-guide/tuning-max-batch-size-and-max-num-tokens"
DOC_BEST = "TRT-LLM performance/perf-best-practices"
DOC_IFB = "tensorrtllm_backend: TrtGptModelInflightBatching requires GPT attention plugin, packed input, paged KV cache"

GpuFamily = Literal["ampere", "ada", "hopper", "blackwell", "reference"]  # the catalog's architectures + reference
FP8_FAMILIES = ("ada", "hopper", "blackwell")  # FP8 tensor cores
ProfileName = Literal["throughput", "latency"]

# Architectures whose TRT-LLM model implements the AllReduce + ResidualAdd + RMSNorm fusion.
REDUCE_FUSION_ARCHITECTURES = frozenset({"LlamaForCausalLM"})


class Setting(BaseModel):
    value: str | bool | int | None
    why: str


def inflight_batching_settings(tokens_per_block: int) -> dict[str, Setting]:
    """What in-flight batching in Triton needs; enforced for every profile."""
    return {
        "gpt_attention_plugin": Setting(
            value="auto",
            why=f"in-flight batching needs the GPT attention plugin (in-place KV cache update) [{DOC_IFB}]",
        ),
        "remove_input_padding": Setting(
            value=True,
            why=f"in-flight batching needs packed input; also saves compute and memory on padding [{DOC_IFB}]",
        ),
        "context_fmha": Setting(
            value=True,
            why=f"fused multi-head attention for the context phase: one kernel for MHA/MQA/GQA [{DOC_BEST}]",
        ),
        "use_paged_context_fmha": Setting(
            value=True,
            why=f"context FMHA over the paged KV cache: enables chunked context and KV cache reuse [{DOC_BUILD_FLAGS}]",
        ),
        "tokens_per_block": Setting(
            value=tokens_per_block,
            why="paged KV cache block size (limits.tokens_per_block); the serving config must use the same",
        ),
    }


_GEMM_PLUGIN_WHY = {
    None: f"FP8: TensorRT's own FP8 GEMM tactics beat the cuBLASLt plugin; keep the GEMM plugin off [{DOC_BUILD_FLAGS}]",
    "nvfp4": "NVFP4 GEMMs run through the plugin on Blackwell (TRT-LLM enables it for nvfp4 unless disabled)",
    "auto": f"FP16/BF16 GEMMs: the cuBLASLt GEMM plugin is recommended and uses the model dtype [{DOC_BUILD_FLAGS}]",
}


def profile_settings(
    family: GpuFamily,
    profile: ProfileName,
    *,
    quant_algo: str,
    tp: int,
    architecture: str | None,
    kv_cache: str = "auto",
) -> dict[str, Setting]:
    """Plugin and feature settings of one profile (beyond the in-flight batching requirements)."""
    fmt = quant.FORMATS[quant_algo]
    fp8 = fmt.fp8_gemms
    settings: dict[str, Setting] = {}

    settings["use_fused_mlp"] = Setting(
        value=True,
        why=f"horizontal fusion of the gate and up projections of a gated MLP into one GEMM [{DOC_BUILD_FLAGS}]",
    )
    settings["multiple_profiles"] = Setting(
        value=True,
        why=(
            "several TensorRT optimization profiles let TensorRT pick kernels per batch shape; longer build, "
            f"no runtime cost, recommended for production builds [{DOC_BUILD_FLAGS}]"
        ),
    )

    # GEMM plugin: cuBLASLt GEMMs help FP16/BF16 (and the unquantized GEMMs of weight-only INT4);
    # for FP8 the guide recommends leaving it off and letting TensorRT choose FP8 kernels.
    settings["gemm_plugin"] = Setting(value=fmt.gemm_plugin, why=_GEMM_PLUGIN_WHY.get(
        fmt.gemm_plugin, f"{fmt.name}: the GEMM plugin its row of the quantization table names (trtpipe.quant)"))
    for flag, value in fmt.build_plugins.items():
        settings[flag] = Setting(value=value, why=f"{fmt.name} runs its GEMMs through this plugin (trtpipe.quant)")

    fp8_fmha = fp8 and kv_cache == "fp8" and family in FP8_FAMILIES
    settings["use_fp8_context_fmha"] = Setting(
        value=fp8_fmha,
        why=(
            f"FP8 context FMHA accelerates attention of an FP8 model with an FP8 KV cache (SM89+) [{DOC_BUILD_FLAGS}]"
            if fp8_fmha
            else "only for FP8 weights with an FP8 KV cache on SM89+; off so the engine's config matches the plan"
        ),
    )

    hopper_fp8 = fp8 and family == "hopper"
    swiglu = profile == "throughput" and hopper_fp8
    settings["gemm_swiglu_plugin"] = Setting(
        value="fp8" if swiglu else None,
        why=(
            "throughput profile, FP8 on Hopper: one kernel for both gated-MLP GEMMs and SwiGLU, recommended for "
            f"large models (slight FP8 PTQ accuracy cost: one scaling factor is dropped) [{DOC_BEST}]"
            if swiglu
            else "only for FP8 on Hopper (the latency profile uses the low-latency variant instead)"
        ),
    )
    low_latency = profile == "latency" and hopper_fp8
    settings["low_latency_gemm_plugin"] = Setting(
        value="fp8" if low_latency else None,
        why=(
            f"latency profile, FP8 on Hopper: GEMM kernels tuned for small batches [{DOC_BUILD_FLAGS}]"
            if low_latency
            else "only for the latency profile with FP8 on Hopper (kernels are SM90-specific)"
        ),
    )
    settings["low_latency_gemm_swiglu_plugin"] = Setting(
        value="fp8" if low_latency else None,
        why=(
            f"latency profile, FP8 on Hopper: the small-batch GEMM + SwiGLU fusion of the gated MLP [{DOC_BEST}]"
            if low_latency
            else "only for the latency profile with FP8 on Hopper (kernels are SM90-specific)"
        ),
    )

    fusion = tp > 1 and architecture in REDUCE_FUSION_ARCHITECTURES
    settings["reduce_fusion"] = Setting(
        value=fusion,
        why=(
            "tensor parallel Llama: fuses AllReduce + ResidualAdd + RMSNorm into one kernel; NVIDIA's 70B/4xH100 "
            f"case study gains throughput and TTFT with it [{DOC_BUILD_FLAGS}]"
            if fusion
            else "only with tensor parallelism (tp>1) on Llama-family models"
        ),
    )
    user_buffer = fusion and hopper_fp8
    settings["user_buffer"] = Setting(
        value=user_buffer,
        why=(
            f"with reduce_fusion on FP8 Llama: removes the copy into the communication buffer [{DOC_BUILD_FLAGS}]"
            if user_buffer
            else "only with reduce_fusion on FP8 Llama models (Hopper)"
        ),
    )
    return settings


def default_max_num_tokens(profile: ProfileName) -> tuple[int, str]:
    """The profile's default max_num_tokens and why."""
    if profile == "throughput":
        return 8192, (
            f"throughput: 8192 batched tokens per step keeps GEMMs large while leaving memory for the KV cache [{DOC_LIMITS}]"
        )
    return 2048, (
        f"latency: a smaller token budget per step keeps a long prompt from delaying the decode steps of others [{DOC_LIMITS}]"
    )
