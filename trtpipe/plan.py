"""Memory plan: does this model, at this precision and these engine limits, fit the target GPU?

Pure arithmetic over the HF config.json and the GPU catalog:
- weight bytes for the chosen precision, per GPU under tp/pp;
- KV cache bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes of the KV dtype;
- memory left for the KV cache = (GPU memory - weights per GPU - runtime overhead) x kv_cache_free_gpu_mem_fraction
  (the fraction Triton's tensorrt_llm model hands the KV cache manager);
- tokens that fit, concurrent sequences at max_seq_len, and a decode TPOT floor = weight bytes per GPU / bandwidth.
When it does not fit, concrete changes are recomputed with their new figures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pydantic import BaseModel, Field

from trtpipe import hostfacts, model_semantics, quant
from trtpipe.gpu import GpuInfo
from trtpipe.resolve import ResolvedSpec, gemm_input_widths, head_counts, intermediate_size

GIB = 2**30
# Runtime overhead per GPU besides weights and KV cache: CUDA context, cuBLAS/TensorRT workspaces and
# Triton's own buffers (fixed), NCCL buffers when tp*pp > 1, plus the activation buffers sized by
# max_num_tokens. An estimate, stated in every plan; measured engines usually land within it.
FIXED_OVERHEAD_BYTES = 2 * GIB
MULTI_GPU_OVERHEAD_BYTES = GIB // 2
OVERHEAD_ASSUMPTION = (
    "runtime overhead per GPU = 2 GiB (CUDA context, cuBLAS/TensorRT workspaces, Triton) "
    "+ 0.5 GiB NCCL buffers when tp*pp > 1 "
    "+ activations max_num_tokens x (4 x hidden + 2 x intermediate / tp) x 2 bytes "
    "+ logits max_batch_size x vocab / tp x 4 bytes"
)

DTYPE_BYTES = quant.DTYPE_BYTES
# Bits per weight of the quantized linear layers come from the quantization table (trtpipe.quant);
# embeddings, norms and lm_head stay in the model dtype (ModelOpt's default recipes leave lm_head unquantized).


class ModelShape(BaseModel):
    """The sizes of a decoder LLM that memory depends on."""

    architecture: str | None
    layers: int
    hidden_size: int
    intermediate_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    linear_params_per_layer: int
    embedding_params: int
    lm_head_params: int
    total_params: int


def model_shape(config: dict[str, Any]) -> ModelShape:
    heads, kv_heads, head_dim = head_counts(config)
    hidden = int(config["hidden_size"])
    inter = intermediate_size(config)
    vocab = int(config["vocab_size"])
    layers = int(config["num_hidden_layers"])
    tied = bool(config.get("tie_word_embeddings", False))
    qkv_bias = bool(config.get("attention_bias", False)) or config.get("model_type") == "qwen2"
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attention = hidden * (q_out + 2 * kv_out) + q_out * hidden
    mlp = 3 * hidden * inter  # gate, up, down (SwiGLU)
    linear = attention + mlp
    norms_and_bias = 2 * hidden + ((q_out + 2 * kv_out) if qkv_bias else 0)
    embedding = vocab * hidden
    lm_head = 0 if tied else vocab * hidden
    total = layers * (linear + norms_and_bias) + embedding + lm_head + hidden
    archs = config.get("architectures") or [None]
    return ModelShape(
        architecture=archs[0],
        layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        qkv_bias=qkv_bias,
        linear_params_per_layer=linear,
        embedding_params=embedding,
        lm_head_params=vocab * hidden,  # a tied lm_head is still a separate engine weight in TRT-LLM
        total_params=total,
    )


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """Everything the arithmetic needs; suggestions change one field and recompute."""

    shape: ModelShape
    algo: str  # a format of trtpipe.quant
    group_size: int
    dtype_bytes: int
    kv_dtype: str
    tp: int
    pp: int
    memory_bytes: int
    bandwidth_gbs: float | None
    max_batch_size: int
    max_seq_len: int
    max_input_len: int
    max_num_tokens: int
    kv_fraction: float
    tokens_per_block: int
    # Per layer, the attention window the runtime is given (trtpipe.model_semantics); None: every layer sees
    # max_seq_len. A windowed layer keeps at most its window of keys and values per sequence.
    attention_windows: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Figures:
    weight_bytes_total: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    overhead_bytes: int
    kv_cache_bytes_per_gpu: int
    kv_tokens: int
    sequences_at_max_seq_len: int
    tokens_needed: int
    tpot_floor_ms: float | None
    weights_fit: bool
    fits: bool


def _linear_bytes(params: int, inputs: PlanInputs) -> float:
    fmt = quant.FORMATS[inputs.algo]
    if fmt.weight_bits is None:
        return params * inputs.dtype_bytes
    data = params * fmt.weight_bits / 8
    block = inputs.group_size if fmt.grouped else fmt.scale_block
    if block:  # one scale per group (AWQ: in the model dtype) or per block (NVFP4: one FP8 scale per 16)
        data += params / block * (fmt.scale_bytes or inputs.dtype_bytes)
    return data


def compute(inputs: PlanInputs) -> Figures:
    s = inputs.shape
    layer_linear = _linear_bytes(s.linear_params_per_layer, inputs)
    layer_rest = (2 * s.hidden_size + (s.attention_heads + 2 * s.kv_heads) * s.head_dim * s.qkv_bias) * inputs.dtype_bytes
    embedding = s.embedding_params * inputs.dtype_bytes
    lm_head = s.lm_head_params * inputs.dtype_bytes
    total = s.layers * (layer_linear + layer_rest) + embedding + (0 if s.tie_word_embeddings else lm_head)
    # Per GPU: linear layers split over tp, layers over pp. The embedding table is kept whole on the first
    # pipeline stage (TRT-LLM's default, use_parallel_embedding off); lm_head is split over tp on the last.
    stage_layers = math.ceil(s.layers / inputs.pp)
    stage = stage_layers * (layer_linear / inputs.tp + layer_rest)
    if inputs.pp == 1:
        per_gpu = stage + embedding + lm_head / inputs.tp
    else:
        per_gpu = stage + max(embedding, lm_head / inputs.tp)
    kv_bytes = DTYPE_BYTES[inputs.kv_dtype]
    kv_per_token = 2 * s.layers * s.kv_heads * s.head_dim * kv_bytes
    kv_heads_per_gpu = math.ceil(s.kv_heads / inputs.tp)  # fewer KV heads than tp: each GPU keeps a copy of one
    kv_per_token_gpu = 2 * stage_layers * kv_heads_per_gpu * s.head_dim * kv_bytes
    activations = inputs.max_num_tokens * (4 * s.hidden_size + 2 * s.intermediate_size // inputs.tp) * 2
    logits = inputs.max_batch_size * s.vocab_size // inputs.tp * 4
    overhead = FIXED_OVERHEAD_BYTES + activations + logits
    if inputs.tp * inputs.pp > 1:
        overhead += MULTI_GPU_OVERHEAD_BYTES
    free = inputs.memory_bytes - per_gpu - overhead
    kv_budget = max(0, int(free * inputs.kv_fraction))
    # The KV cache is handed out in blocks of tokens_per_block tokens.
    kv_tokens = (kv_budget // (kv_per_token_gpu * inputs.tokens_per_block)) * inputs.tokens_per_block
    # A sequence at max_seq_len holds, per layer, min(window, max_seq_len) tokens of K and V (whole blocks): the
    # stage with the most of them bounds how many sequences fit.
    block = inputs.tokens_per_block
    windows = inputs.attention_windows or (inputs.max_seq_len,) * s.layers
    per_layer = [-(-min(w, inputs.max_seq_len) // block) * block for w in windows]
    stages = [per_layer[i * stage_layers:(i + 1) * stage_layers] for i in range(inputs.pp)]
    tokens_per_sequence_layers = max(sum(stage_tokens) for stage_tokens in stages if stage_tokens)
    layer_token_bytes = kv_per_token_gpu // max(1, stage_layers)
    sequence_bytes = max(1, tokens_per_sequence_layers * layer_token_bytes)
    sequences = kv_budget // sequence_bytes
    tpot = None
    if inputs.bandwidth_gbs:
        tpot = per_gpu / (inputs.bandwidth_gbs * 1e9) * 1000
    weights_fit = free > 0
    return Figures(
        weight_bytes_total=int(total),
        weight_bytes_per_gpu=int(per_gpu),
        kv_bytes_per_token=kv_per_token,
        kv_bytes_per_token_per_gpu=kv_per_token_gpu,
        overhead_bytes=int(overhead),
        kv_cache_bytes_per_gpu=kv_budget,
        kv_tokens=kv_tokens,
        sequences_at_max_seq_len=sequences,
        tokens_needed=inputs.max_batch_size * inputs.max_seq_len,
        tpot_floor_ms=round(tpot, 3) if tpot is not None else None,
        weights_fit=weights_fit,
        fits=weights_fit and sequences >= inputs.max_batch_size,
    )


class Suggestion(BaseModel):
    """One change that would make the plan fit (or fit better), with its new figures."""

    change: str = Field(description="What to change, in words.")
    spec_changes: dict[str, Any] = Field(description="Dotted spec field -> new value.")
    weight_bytes_per_gpu: int
    kv_tokens: int
    sequences_at_max_seq_len: int
    max_seq_len: int
    max_batch_size: int
    gpu_count: int
    fits: bool
    note: str = ""


class MemoryPlan(BaseModel):
    """The memory plan of one resolved spec."""

    spec_name: str
    target: str
    gpu_product: str | None
    sm: int | None
    tp: int
    pp: int
    gpu_count: int
    model: ModelShape
    weight_precision: str
    weight_bytes_total: int
    weight_bytes_per_gpu: int
    kv_cache_dtype: str
    kv_bytes_per_token: int = Field(description="2 x layers x kv_heads x head_dim x bytes, whole model.")
    kv_bytes_per_token_per_gpu: int
    memory_bytes_per_gpu: int
    memory_source: str
    overhead_bytes: int
    overhead_assumption: str = OVERHEAD_ASSUMPTION
    kv_cache_free_gpu_mem_fraction: float
    kv_cache_bytes_per_gpu: int
    kv_tokens: int = Field(description="Tokens of KV cache that fit (whole blocks).")
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    sequences_at_max_seq_len: int
    attention_window: str | None = Field(default=None, description="max_attention_window_size given to the runtime "
                                         "when the model has a window shorter than max_seq_len.")
    tokens_needed: int = Field(description="max_batch_size x max_seq_len.")
    memory_bandwidth_gbs: float | None
    tpot_floor_ms: float | None = Field(description="Decode floor: weight bytes per GPU / memory bandwidth.")
    fits: bool
    verdict: str
    reason: str
    suggestions: list[Suggestion] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def effective_max_num_tokens(resolved: ResolvedSpec) -> int:
    """The engine's max_num_tokens exactly as its build configuration sets it (trtpipe.trtllm_build.config), or,
    for backend llm-api, as the LLM() arguments do (trtpipe.llm_api.derive)."""
    if resolved.llm_api is not None:
        return int(resolved.llm_api.args["max_num_tokens"])
    config = resolved.engine_config()
    return int(config.limits["max_num_tokens"])  # type: ignore[arg-type]


def _precision_label(algo: str, dtype: str, group_size: int) -> str:
    fmt = quant.FORMATS[algo]
    if fmt.weight_bits is None:
        return dtype
    if fmt.grouped:
        return f"{algo} (group {group_size}; embeddings/lm_head {dtype})"
    return f"{algo} (embeddings/lm_head {dtype})"


def _runs(gpu: GpuInfo | None, precision: str | None) -> bool:
    return gpu is None or gpu.has_precision(precision)


def _suggestions(inputs: PlanInputs, figures: Figures, gpu: GpuInfo | None, config: dict[str, Any]) -> list[Suggestion]:
    """Changes that would make the plan fit; each one a spec `trtpipe.resolve` accepts (same rules, same table)."""
    out: list[Suggestion] = []

    def add(change: str, spec_changes: dict[str, Any], new: PlanInputs, note: str = "") -> None:
        f = compute(new)
        out.append(
            Suggestion(
                change=change,
                spec_changes=spec_changes,
                weight_bytes_per_gpu=f.weight_bytes_per_gpu,
                kv_tokens=f.kv_tokens,
                sequences_at_max_seq_len=f.sequences_at_max_seq_len,
                max_seq_len=new.max_seq_len,
                max_batch_size=new.max_batch_size,
                gpu_count=new.tp * new.pp,
                fits=f.fits,
                note=note,
            )
        )

    if figures.weights_fit and figures.kv_tokens > 0:
        block = inputs.tokens_per_block
        seq = (figures.kv_tokens // inputs.max_batch_size) // block * block
        if inputs.max_input_len < seq < inputs.max_seq_len:
            add(f"shorten limits.max_seq_len to {seq}", {"limits.max_seq_len": seq}, dataclasses.replace(inputs, max_seq_len=seq))
        if 1 <= figures.sequences_at_max_seq_len < inputs.max_batch_size:
            batch = figures.sequences_at_max_seq_len
            add(
                f"lower limits.max_batch_size to {batch}",
                {"limits.max_batch_size": batch},
                dataclasses.replace(inputs, max_batch_size=batch),
            )
    current = quant.FORMATS[inputs.algo]
    s = inputs.shape
    int4 = quant.FORMATS["int4_awq"]
    awq_divides = all(width % 128 == 0 for width in gemm_input_widths(config, inputs.tp).values())
    if current.weight_bits != 4 and _runs(gpu, int4.precision) and awq_divides:
        add(
            "quantize weights to INT4-AWQ (W4A16, runs on SM80+)",
            {"quantization.algo": "int4_awq", "quantization.group_size": 128},
            dataclasses.replace(inputs, algo="int4_awq", group_size=128),
            note="needs calibration; check its accuracy with a parity check against the original model",
        )
    fp8 = quant.FORMATS["fp8"]
    if inputs.algo != "fp8" and (current.weight_bits or 16) >= 8 and gpu is not None and gpu.has_precision(fp8.precision):
        add("quantize weights to FP8", {"quantization.algo": "fp8"}, dataclasses.replace(inputs, algo="fp8"))
    # Only KV caches the converter offers on this format (the INT8 KV cache it does not offer at all).
    fp8_kv = quant.KV_CACHES["fp8"]
    if (inputs.kv_dtype != "fp8" and "fp8" in current.kv_caches and gpu is not None
            and gpu.has_precision(fp8_kv.precision)):
        add("store the KV cache in FP8", {"quantization.kv_cache": "fp8"}, dataclasses.replace(inputs, kv_dtype="fp8"))
    for tp in (inputs.tp * 2, inputs.tp * 4):
        if (tp <= 8 and s.attention_heads % tp == 0 and (s.kv_heads % tp == 0 or tp % s.kv_heads == 0)
                and s.intermediate_size % tp == 0):
            add(
                f"split over tp={tp} ({tp * inputs.pp} GPUs)",
                {"target.tp": tp, "target.gpu_count": tp * inputs.pp},
                dataclasses.replace(inputs, tp=tp),
            )
            if compute(dataclasses.replace(inputs, tp=tp)).fits:
                break
    return out


def _windows(resolved: ResolvedSpec) -> tuple[int, ...] | None:
    windows = model_semantics.attention_windows(resolved.model_config, resolved.spec.limits.max_seq_len)
    return tuple(windows) if windows is not None else None


def memory_plan(resolved: ResolvedSpec) -> MemoryPlan:
    """The memory plan of a resolved spec (planning needs only its config.json)."""
    spec = resolved.spec
    shape = model_shape(resolved.model_config)
    dtype = resolved.weight_dtype
    notes: list[str] = []
    if resolved.gpu is not None:
        memory_bytes = resolved.gpu.memory_bytes
        memory_source = f"{resolved.gpu.product}: {resolved.gpu.memory_gib:g} GiB (catalog)"
        bandwidth: float | None = resolved.gpu.memory_bandwidth_gbs
        target = resolved.gpu.name
    else:
        memory_bytes = hostfacts.memory_bytes()  # a host fact: the resolution memo records it
        memory_source = f"cpu-reference: this host's RAM ({memory_bytes / GIB:.1f} GiB)"
        bandwidth = None
        target = "cpu-reference"
        notes.append("cpu-reference runs on the CPU: the plan uses this host's RAM and gives no TPOT floor")
    inputs = PlanInputs(
        shape=shape,
        algo=spec.quantization.algo,
        group_size=spec.quantization.group_size,
        dtype_bytes=DTYPE_BYTES[dtype],
        kv_dtype="float16" if resolved.kv_cache_dtype in ("float16", "bfloat16") else resolved.kv_cache_dtype,
        tp=spec.target.tp,
        pp=spec.target.pp,
        memory_bytes=memory_bytes,
        bandwidth_gbs=bandwidth,
        max_batch_size=spec.limits.max_batch_size,
        max_seq_len=spec.limits.max_seq_len,
        max_input_len=spec.limits.max_input_len,
        max_num_tokens=effective_max_num_tokens(resolved),
        kv_fraction=spec.runtime.kv_cache_free_fraction,
        tokens_per_block=spec.limits.tokens_per_block,
        attention_windows=_windows(resolved),
    )
    figures = compute(inputs)
    window = model_semantics.describe_windows(resolved.model_config, inputs.max_seq_len)
    if window is not None:
        full = compute(dataclasses.replace(inputs, attention_windows=None))
        notes.append(f"{window}: {figures.sequences_at_max_seq_len} sequences of {inputs.max_seq_len} tokens fit, "
                     f"{full.sequences_at_max_seq_len} with full attention")
    if not figures.weights_fit:
        verdict = "does not fit"
        reason = (
            f"weights ({figures.weight_bytes_per_gpu / 1e9:.1f} GB per GPU) plus overhead "
            f"({figures.overhead_bytes / 1e9:.1f} GB) exceed {memory_bytes / 1e9:.1f} GB"
        )
    elif figures.fits:
        verdict = "fits"
        windowed = " (within their attention window)" if inputs.attention_windows else ""
        reason = (
            f"{figures.kv_tokens:,} KV tokens hold {figures.sequences_at_max_seq_len} sequences of "
            f"{inputs.max_seq_len} tokens{windowed}, >= max_batch_size {inputs.max_batch_size}"
        )
    else:
        verdict = "does not fit"
        reason = (
            f"{figures.kv_tokens:,} KV tokens hold {figures.sequences_at_max_seq_len} sequences of "
            f"{inputs.max_seq_len} tokens, fewer than max_batch_size {inputs.max_batch_size} "
            f"(needs {figures.tokens_needed:,})"
        )
        if figures.sequences_at_max_seq_len >= 1:
            notes.append(
                "it would still run: in-flight batching queues requests the KV cache cannot hold, "
                "so fewer sequences run at once than max_batch_size"
            )
    suggestions = [] if figures.fits else _suggestions(inputs, figures, resolved.gpu, resolved.model_config)
    return MemoryPlan(
        spec_name=spec.artifact_name,
        target=target,
        gpu_product=resolved.gpu.product if resolved.gpu else None,
        sm=resolved.sm,
        tp=inputs.tp,
        pp=inputs.pp,
        gpu_count=inputs.tp * inputs.pp,
        model=shape,
        weight_precision=_precision_label(inputs.algo, dtype, inputs.group_size),
        weight_bytes_total=figures.weight_bytes_total,
        weight_bytes_per_gpu=figures.weight_bytes_per_gpu,
        kv_cache_dtype=resolved.kv_cache_dtype,
        kv_bytes_per_token=figures.kv_bytes_per_token,
        kv_bytes_per_token_per_gpu=figures.kv_bytes_per_token_per_gpu,
        memory_bytes_per_gpu=memory_bytes,
        memory_source=memory_source,
        overhead_bytes=figures.overhead_bytes,
        kv_cache_free_gpu_mem_fraction=inputs.kv_fraction,
        kv_cache_bytes_per_gpu=figures.kv_cache_bytes_per_gpu,
        kv_tokens=figures.kv_tokens,
        max_batch_size=inputs.max_batch_size,
        max_input_len=inputs.max_input_len,
        max_seq_len=inputs.max_seq_len,
        max_num_tokens=inputs.max_num_tokens,
        sequences_at_max_seq_len=figures.sequences_at_max_seq_len,
        attention_window=(model_semantics.window_parameter(resolved.model_config, inputs.max_seq_len)
                          if inputs.attention_windows else None),
        tokens_needed=figures.tokens_needed,
        memory_bandwidth_gbs=bandwidth,
        tpot_floor_ms=figures.tpot_floor_ms,
        fits=figures.fits,
        verdict=verdict,
        reason=reason,
        suggestions=suggestions,
        notes=notes,
    )
