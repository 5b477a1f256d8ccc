"""The quantization table: every format trtpipe knows, and everything each stage needs to know about it.

One row per `quantization.algo` of a spec (`FORMATS`) and per `quantization.kv_cache` (`KV_CACHES`).
Every stage reads its facts here and nowhere else: the spec's allowed values, resolve's rules (which
GPUs have the tensor cores, which group sizes, which KV caches on top, what the pinned converter
refuses and why), the memory plan (bits per weight, scale overhead), the checkpoint key (calibrated,
grouped), the converter (ModelOpt config), the checkpoint schema (tensors per quantized linear layer),
the reference runtime (dequantization, activation quantization), parity (bounds), the build profile
(GEMM plugin, FP8 kernels) and the trtllm-build rules (the checkpoint's QuantAlgo names).

Sources:
  [modelopt-0.37]  nvidia-modelopt 0.37.0 (the version TensorRT-LLM 1.1/1.2 pin), installed here:
                   modelopt/torch/quantization/config.py (the *_CFG names) and
                   modelopt/torch/export/quant_utils.py (the quant_algo each exported quantizer gets).
  [export-here]    the tensors of each format, read from checkpoints exported with [modelopt-0.37] on this
                   machine (tiny Llama, tp 1 and 2; tests/checkpoint/test_schema.py re-checks every export).
  [trtllm-mode]    TensorRT-LLM tensorrt_llm/quantization/mode.py, class QuantAlgo (the names).
  [parity]         bounds measured on the tiny example models: tests/reference/test_quantized_parity.py.
Adding a format is one row here (plus its ModelOpt config if the pinned ModelOpt has one); a new kind
of dequantization or tensor layout is the only reason to touch another file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Tensor-core precisions a format's GEMMs run in: a GPU can run the format when the GPU catalog
# (build_configs/gpus.yaml, `precisions`) lists it.
Precision = Literal["fp16", "bf16", "int8", "fp8", "fp4"]
# How the reference runtime turns a quantized weight back into float32 (trtpipe.reference.dequant).
Dequant = Literal["fp8", "int4-grouped", "int8-per-channel"]
# Quantization of the activations the engine applies before a GEMM (static per-tensor scale).
ActivationQuant = Literal["fp8", "int8"]

# trtpipe's converter (trtpipe.checkpoint.convert) is written against ModelOpt 0.37's configs and
# TensorRT-LLM exporter, and passes `dtype=` to `from_pretrained`, an argument transformers added in 4.56.0
# (huggingface/transformers PR #39782; older versions ignore it and load float32). A toolchain whose pins
# fall outside converts with an exporter nobody checked: trtpipe.resolve refuses it.
CONVERTER_MODELOPT = "0.37"
CONVERTER_MIN_TRANSFORMERS = (4, 56)

GROUP_SIZES = (32, 64, 128)  # AWQ group sizes ModelOpt 0.37's INT4/W4A8 AWQ configs accept (block_sizes[-1])


@dataclass(frozen=True)
class TensorRule:
    """One tensor of a quantized linear layer in a TRT-LLM checkpoint (per rank).

    `dtype` is a safetensors dtype (F32, I8, F8_E4M3) or "model" (the checkpoint's dtype); `shape` is
    made of "out", "in", "out/2", "in/group" and "1", per rank."""

    suffix: str
    dtype: str
    shape: tuple[str, ...]


@dataclass(frozen=True)
class ParityBound:
    """What a conversion in this format must meet against transformers (trtpipe.reference.parity)."""

    max_rel_error: float
    min_top1_agreement: float
    require_greedy_equal: bool = False


@dataclass(frozen=True)
class QuantFormat:
    """One `quantization.algo`."""

    name: str  # the spec's quantization.algo
    checkpoint_algo: str | None  # config.json quantization.quant_algo [trtllm-mode]; None: unquantized
    precision: Precision | None  # tensor cores the GEMMs need; None: the model's dtype
    weight_bits: int | None  # bits per weight of the quantized linear layers; None: the model's dtype
    scale_block: int | None = None  # weights per scale in the memory plan (grouped: the group size; None: per
                                    # tensor or per channel, negligible)
    scale_bytes: int | None = None  # bytes per scale (None: the model's dtype)
    grouped: bool = False  # AWQ: quantization.group_size shapes the checkpoint (one of GROUP_SIZES)
    calibrated: bool = False  # needs calibration data (enters the checkpoint key)
    kv_caches: tuple[str, ...] = ()  # quantized KV caches the converter offers on top of this format
    modelopt_config: str | None = None  # [modelopt-0.37] config name; None: nothing to quantize
    layerwise: bool = False  # calibrates one decoder layer at a time with the full-model result (trtpipe.checkpoint.
                             # layerwise; equal bytes checked by tests/checkpoint/test_layerwise.py)
    tensors: tuple[TensorRule, ...] | None = None  # per quantized linear layer; None: no exporter here writes it
    dequant: Dequant | None = None  # None: unquantized, or the reference runtime cannot run it
    weight_scale: str = "weights_scaling_factor"  # the tensor holding the weight's scale(s): [1], [out] or groups
    activation_quant: ActivationQuant | None = None
    parity: ParityBound | None = None
    parity_with_kv: dict[str, ParityBound] = field(default_factory=dict)  # KV cache name -> bound
    refused: str | None = None  # why trtpipe's converter refuses it (None: it converts)
    alternatives: str = ""  # what to use instead, when refused
    # Why the llm-api backend's artifact (ModelOpt's unified HF export, served by TensorRT-LLM's PyTorch backend)
    # refuses a format the TRT-LLM checkpoint converter makes (None: the llm-api artifact exports it too).
    llm_api_refused: str | None = None
    gemm_plugin: str | None = "auto"  # trtllm-build --gemm_plugin the build profile sets for it
    fp8_gemms: bool = False  # the build profile may use the FP8 GEMM plugins and FP8 context FMHA
    build_plugins: dict[str, str] = field(default_factory=dict)  # other plugins its kernels need (flag -> value)
    source: str = ""


@dataclass(frozen=True)
class KvCacheFormat:
    """One `quantization.kv_cache`."""

    name: str  # the spec's quantization.kv_cache
    dtype: str | None  # what the engine stores: float16, bfloat16, fp8, int8; None: the weights' dtype
    checkpoint_algo: str | None = None  # config.json quantization.kv_cache_quant_algo
    precision: Precision | None = None
    calibrated: bool = False  # its scales come from calibration
    modelopt_config: str | None = None  # [modelopt-0.37] config whose `*[kv]_bmm_quantizer` entry is added
    scale_tensors: tuple[str, ...] = ()  # per attention layer, F32 [1]
    optional_scale_tensors: tuple[str, ...] = ()  # may accompany them
    refused: str | None = None
    alternatives: str = ""
    source: str = ""


_SCALAR = ("1",)

FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat(
        name="none", checkpoint_algo=None, precision=None, weight_bits=None,
        parity=ParityBound(max_rel_error=0.01, min_top1_agreement=0.99, require_greedy_equal=True),
        tensors=(TensorRule("weight", "model", ("out", "in")),),
        source="weights in the model's dtype",
    ),
    QuantFormat(
        name="fp8", checkpoint_algo="FP8", precision="fp8", weight_bits=8, calibrated=True, kv_caches=("fp8",),
        modelopt_config="FP8_DEFAULT_CFG", layerwise=True,
        tensors=(TensorRule("weight", "F8_E4M3", ("out", "in")), TensorRule("weights_scaling_factor", "F32", _SCALAR),
                 TensorRule("activation_scaling_factor", "F32", _SCALAR)),
        dequant="fp8", activation_quant="fp8",
        parity=ParityBound(max_rel_error=0.05, min_top1_agreement=0.90),
        parity_with_kv={"fp8": ParityBound(max_rel_error=0.06, min_top1_agreement=0.90)},
        gemm_plugin=None, fp8_gemms=True,
        source="[modelopt-0.37] FP8_DEFAULT_CFG -> FP8; tensors [export-here]",
    ),
    QuantFormat(
        name="int4_awq", checkpoint_algo="W4A16_AWQ", precision="fp16", weight_bits=4, grouped=True,
        calibrated=True, kv_caches=("fp8",), modelopt_config="INT4_AWQ_CFG", layerwise=True,
        tensors=(TensorRule("weight", "I8", ("out/2", "in")),
                 TensorRule("weights_scaling_factor", "F32", ("out", "in/group")),
                 TensorRule("prequant_scaling_factor", "model", ("in",))),
        dequant="int4-grouped",
        parity=ParityBound(max_rel_error=0.10, min_top1_agreement=0.85),
        parity_with_kv={"fp8": ParityBound(max_rel_error=0.11, min_top1_agreement=0.85)},
        source="[modelopt-0.37] INT4_AWQ_CFG (block_sizes[-1] = group_size) -> W4A16_AWQ; W4A16 runs its GEMMs in "
               "fp16/bf16 (weights dequantized in the kernel); tensors [export-here]",
    ),
    QuantFormat(
        name="w4a8_awq", checkpoint_algo="W4A8_AWQ", precision="fp8", weight_bits=4, grouped=True,
        calibrated=True, kv_caches=("fp8",), modelopt_config="W4A8_AWQ_BETA_CFG", layerwise=True,
        tensors=(TensorRule("weight", "I8", ("out/2", "in")),
                 TensorRule("weights_scaling_factor", "F32", ("out", "in/group")),
                 TensorRule("prequant_scaling_factor", "model", ("in",)),
                 TensorRule("weights_scaling_factor_2", "F32", _SCALAR),
                 TensorRule("activation_scaling_factor", "F32", _SCALAR)),
        dequant="int4-grouped", activation_quant="fp8",
        parity=ParityBound(max_rel_error=0.12, min_top1_agreement=0.85),
        parity_with_kv={"fp8": ParityBound(max_rel_error=0.13, min_top1_agreement=0.85)},
        llm_api_refused="trtpipe's llm-api artifact covers none, fp8 and int4_awq (+ an fp8 KV cache): the unified HF "
                        "export of W4A8 AWQ and its dequantization by the reference runtime are not verified here "
                        "(the PyTorch backend itself lists W4A8 AWQ on Ada and Hopper only)",
        source="[modelopt-0.37] W4A8_AWQ_BETA_CFG -> W4A8_AWQ (FP8 activations); tensors [export-here]",
    ),
    QuantFormat(
        name="int8_sq", checkpoint_algo="W8A8_SQ_PER_CHANNEL", precision="int8", weight_bits=8, calibrated=True,
        modelopt_config="INT8_SMOOTHQUANT_CFG", layerwise=True,
        tensors=(TensorRule("weight", "I8", ("out", "in")), TensorRule("weights_scaling_factor", "F32", ("out",)),
                 TensorRule("activation_scaling_factor", "F32", _SCALAR),
                 TensorRule("prequant_scaling_factor", "model", ("in",))),
        dequant="int8-per-channel", activation_quant="int8",
        parity=ParityBound(max_rel_error=0.06, min_top1_agreement=0.90),
        llm_api_refused="TensorRT-LLM's PyTorch backend has no INT8 SmoothQuant recipe (docs/source/features/"
                        "quantization.md @09d4c79b lists FP4, FP8 per tensor/block/rowwise, FP8 KV, W4A16/W4A8 "
                        "GPTQ and AWQ)",
        source="[modelopt-0.37] INT8_SMOOTHQUANT_CFG -> W8A8_SQ_PER_CHANNEL; tensors [export-here]",
    ),
    QuantFormat(
        name="int8_wo", checkpoint_algo="W8A16", precision="fp16", weight_bits=8,
        dequant="int8-per-channel",
        parity=ParityBound(max_rel_error=0.03, min_top1_agreement=0.95),
        refused="nvidia-modelopt 0.37 (pinned by TensorRT-LLM 1.2) has no INT8 weight-only config, and its exporter "
                "writes every 8-bit weight as W8A8_SQ_PER_CHANNEL, so no INT8 weight-only checkpoint can be made",
        alternatives="use int8_sq (INT8 SmoothQuant) or int4_awq",
        source="[modelopt-0.37] quant_utils.py maps 8-bit weight quantizers to W8A8_SQ_PER_CHANNEL; W8A16 "
               "[trtllm-mode]; the reference runtime dequantizes W8A16 checkpoints made elsewhere",
    ),
    QuantFormat(
        name="nvfp4", checkpoint_algo="NVFP4", precision="fp4", weight_bits=4, scale_block=16, scale_bytes=1,
        calibrated=True, gemm_plugin="nvfp4",
        refused="trtpipe's converter has no NVFP4 recipe: ModelOpt's NVFP4 calibration needs CUDA kernels, and "
                "neither the checkpoint schema nor the reference runtime covers NVFP4",
        alternatives="use fp8 or int4_awq",
        source="[trtllm-mode] NVFP4: FP4 weights with one FP8 scale per 16 values (Blackwell tensor cores)",
    ),
)}

KV_CACHES: dict[str, KvCacheFormat] = {k.name: k for k in (
    KvCacheFormat(name="auto", dtype=None, source="the weights' dtype"),
    KvCacheFormat(name="fp16", dtype="float16", precision="fp16"),
    KvCacheFormat(name="bf16", dtype="bfloat16", precision="bf16"),
    KvCacheFormat(
        name="fp8", dtype="fp8", checkpoint_algo="FP8", precision="fp8", calibrated=True, modelopt_config="FP8_KV_CFG",
        scale_tensors=("kv_cache_scaling_factor",), optional_scale_tensors=("k_cache_scaling_factor",
                                                                            "v_cache_scaling_factor"),
        source="[modelopt-0.37] FP8_KV_CFG's `*[kv]_bmm_quantizer` -> kv_cache_quant_algo FP8; tensors [export-here]",
    ),
    KvCacheFormat(
        name="int8", dtype="int8", checkpoint_algo="INT8", precision="int8", calibrated=True,
        refused="nvidia-modelopt 0.37 has no INT8 KV-cache config for TensorRT-LLM export",
        alternatives="use kv_cache: fp8 (on fp8, int4_awq or w4a8_awq) or auto",
        source="[trtllm-mode] INT8 KV cache; [modelopt-0.37] has FP8_KV_CFG and NVFP4_KV_CFG only",
    ),
)}

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "int8": 1}


def convertible_formats() -> list[str]:
    """The formats trtpipe's converter produces (what a spec may ask for)."""
    return [f.name for f in FORMATS.values() if f.refused is None]


def by_checkpoint_algo(quant_algo: str | None) -> QuantFormat | None:
    """The format of a checkpoint's `quantization.quant_algo` (None for an unknown name)."""
    return next((f for f in FORMATS.values() if f.checkpoint_algo == quant_algo), None)


def kv_by_checkpoint_algo(kv_algo: str | None) -> KvCacheFormat | None:
    return next((k for k in KV_CACHES.values() if k.checkpoint_algo == kv_algo and k.checkpoint_algo), None)


def kv_dtype(kv_cache: str, weight_dtype: str) -> str:
    """What the engine stores in its KV cache: float16, bfloat16, fp8 or int8."""
    return KV_CACHES[kv_cache].dtype or weight_dtype


def needs_calibration(algo: str, kv_cache: str) -> bool:
    """Whether converting `algo` with `kv_cache` (a spec name, or the resolved KV dtype) reads calibration data."""
    kv = KV_CACHES.get(kv_cache) or next((k for k in KV_CACHES.values() if k.dtype == kv_cache), None)
    return FORMATS[algo].calibrated or (kv is not None and kv.calibrated)


def linear_tensors(
    fmt: QuantFormat, name: str, out: int, inp: int, dtype: str, group: int | None
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors (name -> safetensors dtype, shape) of one linear layer `name` in format `fmt`, per rank."""
    assert fmt.tensors is not None, f"{fmt.name}: no exporter here writes it"
    dims = {"out": out, "in": inp, "out/2": out // 2, "1": 1, "in/group": inp // group if group else -1}
    return {f"{name}.{t.suffix}": (dtype if t.dtype == "model" else t.dtype, tuple(dims[d] for d in t.shape))
            for t in fmt.tensors}
