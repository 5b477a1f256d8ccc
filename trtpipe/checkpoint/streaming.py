"""Unquantized conversion, tensor by tensor: HF safetensors -> TRT-LLM checkpoint without loading the model.

For a format with nothing to calibrate (`quantization.algo: none`, the model's fp16/bf16; the pinned
ModelOpt 0.37 offers no weight-only format that needs no calibration, see trtpipe.quant), the TRT-LLM
checkpoint is a re-arrangement of the HF tensors: renamed, q/k/v concatenated, split for tensor
parallelism, layers placed on their pipeline stage, cast to the export dtype. This module does exactly
that, reading each HF tensor once in row blocks of at most `BLOCK_BYTES` and writing each block at its
place in the rank files (trtpipe.checkpoint.rank_file), so what is in memory at once is one block, not the
model; it imports torch, safetensors and transformers' config classes, never ModelOpt or a model class.

The bytes are ModelOpt 0.37's: `export_tensorrt_llm_checkpoint(model, decoder_type="llama", dtype=...,
inference_tensor_parallel=tp, inference_pipeline_parallel=pp)` of the same model loaded with
`from_pretrained(dtype=export dtype)`. tests/checkpoint/test_streaming.py compares every file byte for
byte with that export for each example architecture (Llama, Qwen2, Mistral), tied and untied heads, TP 1, 2
and 4 (4 > the KV heads: duplicated), PP 2, fp16 and bf16. The rules, from the installed ModelOpt 0.37.0
(modelopt/torch/export/):
  - names and fusions: model_config_export.py (torch_to_tensorrt_llm_checkpoint), layer_utils.py
    (build_qkv: q, k, v kept apart until after the TP split; dup_kv_weight: with more ranks than KV
    heads each rank gets the KV head tp_rank * kv_heads // tp); model_config_utils.py (merge_qkv:
    [q; k; v] per rank; mlp.fc = gate_proj, mlp.gate = up_proj, not merged for Llama);
  - TP split: postprocess.py (_split_model_config_for_tp): column-parallel weights (q, k, v, fc, gate,
    lm_head, the embedding) padded with zero rows to a multiple of tp (pad_weights) and cut on dim 0;
    row-parallel (dense, proj) cut on dim 1; column biases cut on dim 0, unpadded;
  - PP split: postprocess.py (_split_model_config_for_pp): contiguous layer blocks, numbered from 0 on
    each stage; the embedding on the first stage, ln_f and lm_head on the last; rank = tp_rank + pp_rank * tp;
  - the cast: postprocess.py (postprocess_tensors: float weights and biases `.type(dtype)`), the same torch
    conversion `from_pretrained(dtype=...)` applies (one cast from the file's dtype);
  - config.json: tensorrt_llm_utils.py (convert_to_tensorrt_llm_config, the manual path taken when
    tensorrt_llm cannot be imported), fields from the HF config through hf_config_map.py (HF_CONFIG_MAP:
    for each field the last alias present wins); the model's head is its own `lm_head` module, so
    share_embedding_table is false and a tied head is written as lm_head too. trtpipe.checkpoint.convert
    then post-processes it as it does ModelOpt's.
`streaming_refusal` says when a model falls outside what this module reproduces; the converter then takes
ModelOpt's full-model path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.checkpoint.hf_source import HfSource, dims, expected_hf_shapes
from trtpipe.checkpoint.rank_file import Layout, RankFileWriter

BLOCK_BYTES = 8 << 20  # largest slice of an HF tensor read at once

# HF config aliases ModelOpt 0.37 reads into the decoder config (hf_config_map.py, HF_CONFIG_MAP; the last
# alias present wins) for the fields that reach config.json of a llama-layout export.
_ALIASES = {
    "num_attention_heads": ("n_head", "num_attention_heads", "n_heads", "num_heads", "decoder_attention_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "num_kv", "n_head_kv", "multi_query_group_num",
                     "num_query_groups", "kv_n_heads"),
    "max_position_embeddings": ("n_positions", "max_position_embeddings", "max_seq_len", "max_sequence_length"),
    "rotary_pct": ("rotary_percentage", "rotary_percent", "rotary_pct", "partial_rotary_factor"),
    "rotary_base": ("rotary_emb_base", "rope_theta", "rotary_base", "rope_embedding_base"),
    "rope_scaling": ("rope_scaling",),
}
# Keys that change a llama-layout export in ways this module does not reproduce (alibi, an MCore position
# embedding type, mixture of experts): their presence sends the model to ModelOpt.
_UNMODELLED_KEYS = ("alibi", "position_embedding_type", "num_local_experts", "moe_num_experts", "num_moe_experts",
                    "num_experts_per_tok", "moe_top_k", "moe_router_topk")
_MODEL_TYPES = ("llama", "mistral", "qwen2")
_TORCH_DTYPES = ("float16", "bfloat16")


def _metaconfig(value: dict[str, Any], field: str, default: Any) -> Any:
    found = default
    for alias in _ALIASES[field]:
        if alias in value:
            found = value[alias]
    return found


def load_hf_config(source: HfSource) -> dict[str, Any]:
    """The HF config as transformers' config class fills it in (defaults, rope_scaling normalised): what
    ModelOpt reads as `model.config.__dict__`. Never runs remote code."""
    from transformers import AutoConfig

    return dict(vars(AutoConfig.from_pretrained(source.model_dir, trust_remote_code=False)))


def streaming_refusal(source: HfSource, hf_config: dict[str, Any], tp: int, pp: int) -> str | None:
    """Why this model cannot be streamed (None: it can), in words for the conversion summary."""
    if source.uses_pickle:
        return "the weights are pickle files"
    if hf_config.get("model_type") not in _MODEL_TYPES:
        return f"model_type {hf_config.get('model_type')!r} is not one of {', '.join(_MODEL_TYPES)}"
    if hf_config.get("hidden_act") != "silu":
        return f"hidden_act {hf_config.get('hidden_act')!r} is not silu"
    present = [key for key in _UNMODELLED_KEYS if hf_config.get(key) not in (None, False)]
    if present:
        return f"config.json sets {present[0]}"
    d = dims(source.config)
    heads = int(_metaconfig(hf_config, "num_attention_heads", d["heads"]))
    kv_heads = int(_metaconfig(hf_config, "num_kv_heads", 0)) or heads
    if (heads, kv_heads) != (d["heads"], d["kv_heads"]):
        return "the attention head counts ModelOpt reads differ from the weights' shapes"
    if heads % tp or (kv_heads % tp and tp % kv_heads) or d["intermediate"] % tp or d["hidden"] % tp:
        return f"tp {tp} does not divide the model's heads and widths"
    if d["layers"] % pp:
        return f"pp {pp} does not divide {d['layers']} layers"
    expected = expected_hf_shapes(source.config)
    found = _tensor_shapes(source.weight_files)
    extra = sorted(set(found) - set(expected))
    if extra:
        return f"the weights hold {extra[0]}, which the llama layout does not map"
    missing = sorted(set(expected) - set(found))
    if missing:
        return f"the weights lack {missing[0]}"
    return None


def _tensor_shapes(files: tuple[Path, ...]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


class HfWeights:
    """The HF tensors of a model folder, read in row blocks with safetensors' `safe_open` (memory-mapped:
    only the rows asked for are touched). Counts what it reads.

    Each block is read through its own handle and copied out before the handle closes: a handle keeps
    its whole file mapped, and every page a read touches stays resident (and in the process's RSS) as
    long as the mapping lives. Measured on a 0.96 GB file read in 32 MiB blocks and cast: one handle
    held for the whole file ends at 336 MB of file-backed RSS, a handle per block at 82 MB (the imports').
    (safetensors 0.8's `backend="pread"` was slower and higher: it reads the whole tensor per slice.)"""

    def __init__(self, files: tuple[Path, ...]) -> None:
        from safetensors import safe_open

        self._where: dict[str, tuple[Path, tuple[int, ...], int]] = {}
        self.bytes_read = 0
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    piece = handle.get_slice(name)
                    self._where[name] = (path, tuple(piece.get_shape()), _ITEM_BYTES[piece.get_dtype()])

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name][1]

    def rows(self, name: str, start: int, stop: int) -> Any:
        from safetensors import safe_open

        path, shape, item = self._where[name]
        with safe_open(str(path), framework="pt") as handle:
            block = handle.get_slice(name)[start:stop].clone()  # a copy: the mapping goes with the handle
        self.bytes_read += (stop - start) * item * math.prod(shape[1:])
        return block

    def block_rows(self, name: str) -> int:
        _, shape, item = self._where[name]
        return max(1, BLOCK_BYTES // max(1, item * math.prod(shape[1:])))

    def close(self) -> None:
        """Nothing stays open between reads (kept for callers that hold the object in a try/finally)."""


_ITEM_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_SAFETENSORS = {"float16": "F16", "bfloat16": "BF16"}


@dataclass(frozen=True)
class _Geometry:
    """Per-rank shapes of a llama-layout checkpoint."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int  # rows of the embedding and lm_head before TP padding
    layers: int
    tp: int
    pp: int

    @property
    def kv_local_heads(self) -> int:
        return self.kv_heads // self.tp if self.tp <= self.kv_heads else 1

    @property
    def qkv_rows(self) -> int:
        return (self.heads // self.tp + 2 * self.kv_local_heads) * self.head_dim

    @property
    def vocab_local(self) -> int:
        return -(-self.vocab // self.tp)

    def kv_head_of(self, tp_rank: int) -> int:
        """The first KV head tp_rank holds (duplicated heads when tp > kv_heads)."""
        return tp_rank * self.kv_local_heads if self.tp <= self.kv_heads else tp_rank * self.kv_heads // self.tp


def geometry(source: HfSource, tp: int, pp: int, *, vocab: int | None = None) -> _Geometry:
    d = dims(source.config)
    return _Geometry(d["hidden"], d["heads"], d["kv_heads"], d["head_dim"], d["intermediate"], vocab or d["vocab"],
                     d["layers"], tp, pp)


def layer_tensor_shapes(g: _Geometry, has_qkv_bias: bool) -> dict[str, tuple[int, ...]]:
    """The unquantized tensors of one decoder layer on one rank (names relative to the layer)."""
    shapes = {
        "input_layernorm.weight": (g.hidden,),
        "post_layernorm.weight": (g.hidden,),
        "attention.qkv.weight": (g.qkv_rows, g.hidden),
        "attention.dense.weight": (g.hidden, g.heads * g.head_dim // g.tp),
        "mlp.fc.weight": (g.intermediate // g.tp, g.hidden),
        "mlp.gate.weight": (g.intermediate // g.tp, g.hidden),
        "mlp.proj.weight": (g.hidden, g.intermediate // g.tp),
    }
    if has_qkv_bias:
        shapes["attention.qkv.bias"] = (g.qkv_rows,)
    return shapes


def edge_tensor_shapes(g: _Geometry, pp_rank: int) -> dict[str, tuple[int, ...]]:
    """The embedding (first stage), final norm and head (last stage) of one rank."""
    shapes: dict[str, tuple[int, ...]] = {}
    if pp_rank == 0:
        shapes["transformer.vocab_embedding.weight"] = (g.vocab_local, g.hidden)
    if pp_rank == g.pp - 1:
        shapes["transformer.ln_f.weight"] = (g.hidden,)
        shapes["lm_head.weight"] = (g.vocab_local, g.hidden)
    return shapes


def stage_of(g: _Geometry, layer: int) -> tuple[int, int]:
    """(pp rank, index within the stage) of a global layer index."""
    per_stage = g.layers // g.pp
    return layer // per_stage, layer % per_stage


def rank_of(g: _Geometry, tp_rank: int, pp_rank: int) -> int:
    return tp_rank + pp_rank * g.tp


# ------------------------------------------------------------------------------------------------- writing


class TensorSink:
    """Rank writers by rank index, with the cast to the export dtype on the way in."""

    def __init__(self, writers: dict[int, RankFileWriter], dtype: str) -> None:
        import torch

        self.writers = writers
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]

    def write(self, rank: int, name: str, block: Any) -> None:
        self.writers[rank].write(name, block.to(self.dtype) if block.is_floating_point() else block)


def write_column(weights: HfWeights, sink: TensorSink, source_name: str, rows: int, name: str,
                 ranks: list[int], *, row_range: Callable[[int], tuple[int, int]] | None = None,
                 copies: tuple[str, list[int]] | None = None) -> None:
    """Write rows of `source_name` to each rank in `ranks`: rank i gets `row_range(i)` (default: the i-th of
    len(ranks) equal parts of `rows`, the source's rows padded with zero rows, ModelOpt's pad_weights).
    `copies` = (name, ranks): the same parts also go there (a tied head: the embedding read once)."""
    import torch

    parts = len(ranks)
    total = weights.shape(source_name)[0]
    if row_range is None:
        per = -(-rows // parts)

        def row_range(i: int) -> tuple[int, int]:
            return i * per, (i + 1) * per

    step = weights.block_rows(source_name)
    for i, rank in enumerate(ranks):
        targets = [(rank, name)] + ([(copies[1][i], copies[0])] if copies is not None else [])
        start, stop = row_range(i)
        real_stop = min(stop, total)
        for a in range(start, real_stop, step):
            block = weights.rows(source_name, a, min(a + step, real_stop))
            for target_rank, target_name in targets:
                sink.write(target_rank, target_name, block)
        if stop > max(start, real_stop):
            zeros = torch.zeros((stop - max(start, real_stop),) + tuple(weights.shape(source_name)[1:]), dtype=sink.dtype)
            for target_rank, target_name in targets:
                sink.write(target_rank, target_name, zeros)


def write_row_split(weights: HfWeights, sink: TensorSink, source_name: str, name: str, ranks: list[int]) -> None:
    """Cut `source_name` on dim 1 into len(ranks) parts, reading its rows once."""
    rows, cols = weights.shape(source_name)
    per = cols // len(ranks)
    step = weights.block_rows(source_name)
    for a in range(0, rows, step):
        block = weights.rows(source_name, a, min(a + step, rows))
        for i, rank in enumerate(ranks):
            sink.write(rank, name, block[:, i * per : (i + 1) * per])


def write_replicated(weights: HfWeights, sink: TensorSink, source_name: str, name: str, ranks: list[int]) -> None:
    rows = weights.shape(source_name)[0]
    step = weights.block_rows(source_name)
    for a in range(0, rows, step):
        block = weights.rows(source_name, a, min(a + step, rows))
        for rank in ranks:
            sink.write(rank, name, block)


def write_qkv(weights: HfWeights, sink: TensorSink, g: _Geometry, hf_prefix: str, name: str, suffix: str,
              ranks: list[int]) -> None:
    """[q; k; v] per rank: q cut in tp parts, k and v per rank (duplicated heads when tp > kv_heads)."""
    q_per = g.heads * g.head_dim // g.tp
    kv_rows = g.kv_local_heads * g.head_dim
    q_name, k_name, v_name = (f"{hf_prefix}.{p}_proj.{suffix}" for p in "qkv")
    for tp_rank, rank in enumerate(ranks):
        write_column(weights, sink, q_name, 0, name, [rank], row_range=lambda _i: (tp_rank * q_per, (tp_rank + 1) * q_per))
        first = g.kv_head_of(tp_rank) * g.head_dim
        for kv_name in (k_name, v_name):
            write_column(weights, sink, kv_name, 0, name, [rank], row_range=lambda _i: (first, first + kv_rows))


def layer_sources(hf_prefix: str) -> dict[str, str]:
    return {
        "input_layernorm.weight": f"{hf_prefix}.input_layernorm.weight",
        "post_layernorm.weight": f"{hf_prefix}.post_attention_layernorm.weight",
        "attention.dense.weight": f"{hf_prefix}.self_attn.o_proj.weight",
        "mlp.fc.weight": f"{hf_prefix}.mlp.gate_proj.weight",
        "mlp.gate.weight": f"{hf_prefix}.mlp.up_proj.weight",
        "mlp.proj.weight": f"{hf_prefix}.mlp.down_proj.weight",
    }


def write_layer(weights: HfWeights, sink: TensorSink, g: _Geometry, layer: int, has_qkv_bias: bool) -> None:
    pp_rank, local = stage_of(g, layer)
    ranks = [rank_of(g, t, pp_rank) for t in range(g.tp)]
    hf = f"model.layers.{layer}"
    out = f"transformer.layers.{local}"
    src = layer_sources(hf)
    write_replicated(weights, sink, src["input_layernorm.weight"], f"{out}.input_layernorm.weight", ranks)
    write_qkv(weights, sink, g, f"{hf}.self_attn", f"{out}.attention.qkv.weight", "weight", ranks)
    if has_qkv_bias:
        write_qkv(weights, sink, g, f"{hf}.self_attn", f"{out}.attention.qkv.bias", "bias", ranks)
    write_row_split(weights, sink, src["attention.dense.weight"], f"{out}.attention.dense.weight", ranks)
    write_replicated(weights, sink, src["post_layernorm.weight"], f"{out}.post_layernorm.weight", ranks)
    for part in ("mlp.fc.weight", "mlp.gate.weight"):
        write_column(weights, sink, src[part], g.intermediate, f"{out}.{part}", ranks)
    write_row_split(weights, sink, src["mlp.proj.weight"], f"{out}.mlp.proj.weight", ranks)


def write_edges(weights: HfWeights, sink: TensorSink, g: _Geometry, *, tied: bool, which: tuple[str, ...]) -> None:
    """The embedding, ln_f and lm_head (`which` picks among "embedding", "ln_f", "lm_head"). A tied head is
    written with the embedding, from the same reads."""
    first = [rank_of(g, t, 0) for t in range(g.tp)]
    last = [rank_of(g, t, g.pp - 1) for t in range(g.tp)]
    padded = g.vocab_local * g.tp
    if "embedding" in which:
        head = ("lm_head.weight", last) if tied else None
        write_column(weights, sink, "model.embed_tokens.weight", padded, "transformer.vocab_embedding.weight", first,
                     copies=head)
    if "ln_f" in which:
        write_replicated(weights, sink, "model.norm.weight", "transformer.ln_f.weight", last)
    if "lm_head" in which and not tied:
        write_column(weights, sink, "lm_head.weight", padded, "lm_head.weight", last)


@contextmanager
def rank_writers(out_dir: Path, layouts: dict[int, Layout]) -> Iterator[dict[int, RankFileWriter]]:
    writers: dict[int, RankFileWriter] = {}
    try:
        for rank, layout in sorted(layouts.items()):
            writers[rank] = RankFileWriter(out_dir / f"rank{rank}.safetensors", layout)
        yield writers
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    for writer in writers.values():
        writer.close()


def unquantized_layouts(g: _Geometry, dtype: str, has_qkv_bias: bool) -> dict[int, Layout]:
    st = _SAFETENSORS[dtype]
    layouts: dict[int, Layout] = {}
    per_stage = g.layers // g.pp
    for pp_rank in range(g.pp):
        for tp_rank in range(g.tp):
            tensors = {name: (st, shape) for name, shape in edge_tensor_shapes(g, pp_rank).items()}
            for local in range(per_stage):
                for name, shape in layer_tensor_shapes(g, has_qkv_bias).items():
                    tensors[f"transformer.layers.{local}.{name}"] = (st, shape)
            layouts[rank_of(g, tp_rank, pp_rank)] = Layout(tensors)
    return layouts


# ------------------------------------------------------------------------------------------------- config


def trtllm_config(source: HfSource, hf_config: dict[str, Any], g: _Geometry, *, dtype: str, modelopt_version: str,
                  quantization: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json as ModelOpt 0.37's llama-layout export writes it (before trtpipe's post-processing)."""
    max_positions = _metaconfig(hf_config, "max_position_embeddings", 0) or 2048
    config: dict[str, Any] = {
        "producer": {"name": "modelopt", "version": modelopt_version},
        "architecture": (hf_config.get("architectures") or [source.architecture])[0],
        "dtype": dtype,
        "logits_dtype": "float16" if dtype == "bfloat16" else dtype,
        "num_hidden_layers": g.layers,
        "num_attention_heads": _metaconfig(hf_config, "num_attention_heads", 0),
        "num_key_value_heads": _metaconfig(hf_config, "num_kv_heads", 0) or _metaconfig(hf_config, "num_attention_heads", 0),
        "hidden_size": g.hidden,
        "norm_epsilon": hf_config["rms_norm_eps"],
        "vocab_size": g.vocab,
        "max_position_embeddings": max_positions,
        "hidden_act": "silu",
        "use_parallel_embedding": True,
        "embedding_sharding_dim": 0,
        "head_size": g.head_dim,
        "intermediate_size": g.intermediate,
        "position_embedding_type": "rope_gpt_neox",
        "share_embedding_table": False,
        "residual_mlp": False,
        "bias": False,
        "rotary_pct": _metaconfig(hf_config, "rotary_pct", 1.0),
        "rank": g.tp * g.pp - 1,
        "decoder": "llama",
        "rmsnorm": True,
        "lm_head_bias": False,
    }
    rotary_base = _metaconfig(hf_config, "rotary_base", 0)
    if rotary_base:
        config["rotary_base"] = rotary_base
    rope_scaling = _metaconfig(hf_config, "rope_scaling", None)
    if rope_scaling:
        config["rotary_scaling"] = rope_scaling
    config["mapping"] = {"world_size": g.tp * g.pp, "tp_size": g.tp, "pp_size": g.pp}
    config["quantization"] = quantization or {"quant_algo": None, "kv_cache_quant_algo": None}
    return config


def has_qkv_bias(source: HfSource) -> bool:
    return "model.layers.0.self_attn.q_proj.bias" in expected_hf_shapes(source.config)


def stream_unquantized(source: HfSource, hf_config: dict[str, Any], out_dir: Path, *, dtype: str, tp: int, pp: int,
                       advance: Callable[[int], None] = lambda n=1: None) -> dict[str, Any]:
    """Write the rank files of an unquantized checkpoint into `out_dir`; return (config.json dict, bytes read)."""
    g = geometry(source, tp, pp)
    bias = has_qkv_bias(source)
    tied = bool(hf_config.get("tie_word_embeddings", False))
    weights = HfWeights(source.weight_files)
    try:
        with rank_writers(Path(out_dir), unquantized_layouts(g, dtype, bias)) as writers:
            sink = TensorSink(writers, dtype)
            write_edges(weights, sink, g, tied=tied, which=("embedding",))
            advance(1)
            for layer in range(g.layers):
                write_layer(weights, sink, g, layer, bias)
                advance(1)
            write_edges(weights, sink, g, tied=tied, which=("ln_f", "lm_head"))
            advance(1)
    finally:
        weights.close()
    return {"bytes_read": weights.bytes_read}
