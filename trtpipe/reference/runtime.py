"""A CPU reference runtime for TensorRT-LLM checkpoints, written to validate conversions.

This is plain, readable PyTorch meant for checking numbers, not for speed. It is NOT TensorRT, does not
claim to behave like TensorRT's kernels bit for bit, and is not fast. It loads a TensorRT-LLM checkpoint
directory (config.json + rank{N}.safetensors, any TP/PP split, merged back into one model), a trtpipe
reference engine directory (config.json with `pretrained_config`, `build_config`, `trtpipe_reference: true`,
and the rank files beside it) or a Hugging Face-format checkpoint as the llm-api backend serves it
(`trtpipe.reference.hf_loader`), dequantizes every weight to float32 and runs a KV-cached decoder.

Compute dtype: float32 throughout (weights are dequantized once at load time). Quantized activations
(FP8, INT8 SmoothQuant) and the FP8 KV cache are simulated by quantize-dequantize round trips with the
checkpoint's static scales; see `trtpipe.reference.dequant`.

Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (QKV bias) with RMSNorm, rope_gpt_neox
(rotary_base, linear and Llama-3.1 "llama3" rotary_scaling), a SiLU-gated MLP (`mlp.fc` = HF gate_proj,
`mlp.gate` = HF up_proj), grouped-query attention, tied or separate lm_head. Sliding attention windows are
applied per layer when the caller gives them (`attention_windows`: a checkpoint carries none; the served model gets
them from its max_attention_window_size parameter, parity from trtpipe.model_semantics): a query sees the last W keys,
itself included, as transformers' sliding mask does. A checkpoint whose vocabulary is padded beyond the tokenizer's
(`token_vocab_size`) never yields a padded id: the sampler sees only the tokenizer's ids.

Imports stay light (torch, safetensors) because the Triton Python-backend stub imports this module.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trtpipe.config_json import check_model_config, file_text
from trtpipe.errors import IntegrityError, InvalidInput, NotFound, UsageError
from trtpipe.model_semantics import TOKEN_VOCAB_KEY
from trtpipe.reference import dequant, sampling
from trtpipe.reference.dequant import Linear

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ACTIVATIONS = ("silu", "swiglu")
LAYER_PREFIX = "transformer.layers."


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class ModelConfig:
    """The fields of a TRT-LLM checkpoint config.json that the reference runtime uses."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    norm_epsilon: float
    rotary_base: float
    rotary_dim: int
    rotary_scaling: dict[str, Any] | None
    tp_size: int
    pp_size: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    share_embedding_table: bool
    embedding_sharding_dim: int
    use_parallel_embedding: bool

    @classmethod
    def from_checkpoint_config(cls, cfg: dict[str, Any], source: Path) -> ModelConfig:
        # the bounds and types every consumer of a model's shape checks (trtpipe.config_json), before any tensor
        check_model_config(cfg, source, flavour="trtllm", text=file_text(source))

        def need(key: str) -> Any:
            if key not in cfg:
                raise IntegrityError(f"{source}: field {key} is missing", path=str(source), fix="re-export the checkpoint")
            return cfg[key]

        arch = need("architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise InvalidInput(
                f"{source}: architecture {arch!r} is not supported by the reference runtime",
                fix=f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
            )
        act = cfg.get("hidden_act", "silu")
        if act not in SUPPORTED_ACTIVATIONS:
            raise InvalidInput(f"{source}: hidden_act {act!r} is not supported", fix="supported: silu")
        pos = cfg.get("position_embedding_type", "rope_gpt_neox")
        if pos != "rope_gpt_neox":
            raise InvalidInput(f"{source}: position_embedding_type {pos!r} is not supported", fix="use rope_gpt_neox")
        num_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        head_size = int(cfg.get("head_size") or hidden // num_heads)
        mapping = cfg.get("mapping") or {}
        quant = cfg.get("quantization") or {}
        quant_algo = quant.get("quant_algo")
        if quant_algo is not None and quant_algo not in dequant.SUPPORTED_QUANT_ALGOS:
            raise InvalidInput(
                f"{source}: quantization.quant_algo {quant_algo!r} is not supported by the reference runtime",
                fix=f"supported: {', '.join(dequant.SUPPORTED_QUANT_ALGOS)}",
            )
        kv_algo = quant.get("kv_cache_quant_algo")
        if kv_algo not in (None, "FP8"):
            raise InvalidInput(
                f"{source}: quantization.kv_cache_quant_algo {kv_algo!r} is not supported",
                fix="supported: FP8 or none",
            )
        tp = int(mapping.get("tp_size", 1))
        pp = int(mapping.get("pp_size", 1))
        world = int(mapping.get("world_size", tp * pp))
        if world != tp * pp:
            raise IntegrityError(f"{source}: mapping.world_size {world} != tp_size*pp_size ({tp}*{pp})", path=str(source),
                                 fix="re-export the checkpoint")
        return cls(
            architecture=arch,
            num_layers=int(need("num_hidden_layers")),
            hidden_size=hidden,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_size=head_size,
            intermediate_size=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            norm_epsilon=float(cfg.get("norm_epsilon", 1e-6)),
            rotary_base=float(cfg.get("rotary_base", 10000.0)),
            rotary_dim=int(head_size * float(cfg.get("rotary_pct", 1.0))),
            rotary_scaling=cfg.get("rotary_scaling"),
            tp_size=tp,
            pp_size=pp,
            quant_algo=quant_algo,
            kv_cache_quant_algo=kv_algo,
            share_embedding_table=bool(cfg.get("share_embedding_table", False)),
            embedding_sharding_dim=int(cfg.get("embedding_sharding_dim", 0)),
            use_parallel_embedding=bool(cfg.get("use_parallel_embedding", False)),
        )


@dataclass
class DecoderLayer:
    input_layernorm: torch.Tensor
    qkv: Linear  # full (merged) [q; k; v] along the output dim
    dense: Linear
    post_layernorm: torch.Tensor
    fc: Linear  # HF gate_proj (goes through SiLU)
    gate: Linear  # HF up_proj
    proj: Linear  # HF down_proj
    kv_cache_scale: float | None = None  # set when the KV cache is FP8


@dataclass
class KVCache:
    """Per-layer keys and values seen so far, [tokens, kv_heads, head_size] float32 each."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else int(self.keys[0].shape[0])


# ---------------------------------------------------------------------------------------------------------
# Loading and shard merging


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(checkpoint config, build config or None) from a checkpoint or reference engine directory."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise NotFound(f"{config_path} not found", what="checkpoint", ref=str(path),
                       fix="point at a TRT-LLM checkpoint or reference engine directory")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{config_path}: not valid JSON ({exc})", path=str(config_path),
                             fix="re-export the checkpoint") from exc
    if "pretrained_config" in raw:
        if not raw.get("trtpipe_reference"):
            raise InvalidInput(
                f"{config_path} is a TensorRT engine config, not a trtpipe reference engine",
                fix="the CPU reference runtime runs checkpoints and cpu-reference engines only",
            )
        return raw["pretrained_config"], raw.get("build_config")
    return raw, None


def _recorded_token_vocab(path: Path) -> int | None:
    """The tokenizer's vocabulary a trtpipe reference engine records beside a padded checkpoint, else None."""
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    value = raw.get(TOKEN_VOCAB_KEY) if isinstance(raw, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _load_rank(path: Path, rank: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # safetensors only: no pickle is ever loaded

    file = path / f"rank{rank}.safetensors"
    if not file.is_file():
        raise IntegrityError(f"{file} not found", path=str(file),
                             fix="the checkpoint's mapping.world_size says this rank exists: re-export it")
    return load_file(str(file))


def _split_layers(tensors: dict[str, torch.Tensor]) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Group one rank's tensors by layer index; the rest (embedding, ln_f, lm_head) separately."""
    layers: dict[int, dict[str, torch.Tensor]] = {}
    other: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.startswith(LAYER_PREFIX):
            index_text, _, rest = name[len(LAYER_PREFIX) :].partition(".")
            layers.setdefault(int(index_text), {})[rest] = tensor
        else:
            other[name] = tensor
    return layers, other


def _cat_rows(parts: Sequence[Linear]) -> Linear:
    """Concatenate column-parallel shards (split on the output dim)."""
    first = parts[0]
    return Linear(
        weight=torch.cat([p.weight for p in parts], dim=0),
        bias=None if first.bias is None else torch.cat([p.bias for p in parts], dim=0),  # type: ignore[misc]
        prequant_scale=first.prequant_scale,
        activation_quant=first.activation_quant,
    )


def _cat_cols(parts: Sequence[Linear]) -> Linear:
    """Concatenate row-parallel shards (split on the input dim). The bias is added once, after the reduce."""
    first = parts[0]
    return Linear(
        weight=torch.cat([p.weight for p in parts], dim=1),
        bias=first.bias,
        prequant_scale=None if first.prequant_scale is None else torch.cat([p.prequant_scale for p in parts]),  # type: ignore[misc]
        activation_quant=first.activation_quant,
    )


def _slice_rows(linear: Linear, start: int, stop: int) -> Linear:
    return Linear(
        weight=linear.weight[start:stop],
        bias=None if linear.bias is None else linear.bias[start:stop],
        prequant_scale=linear.prequant_scale,
        activation_quant=linear.activation_quant,
    )


class ReferenceModel:
    """A merged, dequantized TRT-LLM checkpoint that runs on the CPU in float32 (validation only)."""

    def __init__(
        self,
        config: ModelConfig,
        embedding: torch.Tensor,
        layers: list[DecoderLayer],
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        build_config: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.embedding = embedding
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.build_config = build_config
        self._inv_freq = rope_inverse_frequencies(config)
        self.windows: list[int | None] = [None] * len(layers)
        # The tokenizer's ids; rows past it are a checkpoint's padding (trtpipe's reference engine records it).
        self.token_vocab_size = config.vocab_size

    def set_attention_windows(self, windows: Sequence[int] | None) -> ReferenceModel:
        """Per-layer attention windows, as TensorRT-LLM's max_attention_window_size takes them: a list repeated over
        the layers (one value: every layer). None: full attention. Returns self."""
        if windows is None or not len(windows):
            self.windows = [None] * len(self.layers)
            return self
        values = [int(w) for w in windows]
        if any(w <= 0 for w in values):
            raise UsageError(f"attention windows {values} must be positive", fix="give each layer a window of 1 or more")
        self.windows = [values[i % len(values)] for i in range(len(self.layers))]
        return self

    def set_token_vocab_size(self, size: int | None) -> ReferenceModel:
        """The tokenizer's vocabulary (ids past it are padding the sampler never returns). Returns self."""
        if size is not None:
            if not 0 < int(size) <= self.config.vocab_size:
                raise UsageError(f"token vocabulary {size} is outside (0, {self.config.vocab_size}] (the checkpoint's)",
                                 fix="give the tokenizer's vocab_size")
            self.token_vocab_size = int(size)
        return self

    # -- loading ------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path, *, simulate_activation_quant: bool = True) -> ReferenceModel:
        """Load a TRT-LLM checkpoint dir or a trtpipe reference engine dir, merging all TP/PP shards; or a
        Hugging Face-format checkpoint (the llm-api artifact: `trtpipe.reference.hf_loader`)."""
        from trtpipe.reference import hf_loader

        path = Path(path)
        if hf_loader.is_hf_checkpoint(path):
            return hf_loader.load_hf_checkpoint(path, simulate_activation_quant=simulate_activation_quant)
        raw_config, build_config = _read_config(path)
        config = ModelConfig.from_checkpoint_config(raw_config, path / "config.json")
        tp, pp = config.tp_size, config.pp_size
        ranks = [[_load_rank(path, pp_rank * tp + tp_rank) for tp_rank in range(tp)] for pp_rank in range(pp)]

        layer_shards: dict[int, list[dict[str, torch.Tensor]]] = {}
        others: list[list[dict[str, torch.Tensor]]] = []
        offset = 0
        for stage in ranks:
            split = [_split_layers(t) for t in stage]
            indices = sorted(split[0][0])
            # PP stages hold disjoint layers; if a stage numbers its layers from 0 they are local indices.
            stage_offset = offset if (pp > 1 and indices and indices[0] == 0 and offset > 0) else 0
            for index in indices:
                layer_shards[index + stage_offset] = [s[0][index] for s in split]
            offset += len(indices)
            others.append([s[1] for s in split])
        if sorted(layer_shards) != list(range(config.num_layers)):
            raise IntegrityError(
                f"{path}: rank files hold layers {sorted(layer_shards)}, config says num_hidden_layers={config.num_layers}",
                fix="re-export the checkpoint",
            )
        layers = [
            cls._merge_layer(config, index, layer_shards[index], simulate_activation_quant)
            for index in range(config.num_layers)
        ]
        embedding = cls._merge_vocab(config, [r for stage in others for r in stage], "transformer.vocab_embedding.weight", path)
        final_norm = cls._first_of(others, "transformer.ln_f.weight", path).to(torch.float32)
        if config.share_embedding_table:
            lm_head = embedding  # TRT-LLM's shared table: the head multiplies by the embedding
        else:
            # A tied HF model is exported with its own lm_head copy; a missing head is an error, never the
            # embedding in its place (an untied model would then answer with the wrong head).
            lm_head = cls._merge_vocab(config, others[-1], "lm_head.weight", path)
        model = cls(config, embedding, layers, final_norm, lm_head, build_config)
        return model.set_token_vocab_size(_recorded_token_vocab(path))

    @staticmethod
    def _first_of(others: list[list[dict[str, torch.Tensor]]], name: str, path: Path) -> torch.Tensor:
        for stage in others:
            for rank in stage:
                if name in rank:
                    return rank[name]
        raise IntegrityError(f"{path}: checkpoint tensor {name} is missing from every rank file", path=str(path),
                             fix="re-export the checkpoint")

    @staticmethod
    def _merge_vocab(config: ModelConfig, rank_tensors: list[dict[str, torch.Tensor]], name: str, path: Path) -> torch.Tensor:
        """Merge an embedding-like table split on the vocab dim, dropping the vocab padding."""
        shards = [r[name].to(torch.float32) for r in rank_tensors if name in r]
        if not shards:
            raise IntegrityError(f"{path}: checkpoint tensor {name} is missing from every rank file", path=str(path),
                             fix="re-export the checkpoint")
        if len(shards) == 1 or shards[0].shape[0] >= config.vocab_size:
            table = shards[0]  # not split (replicated)
        elif name == "lm_head.weight" or config.embedding_sharding_dim == 0:
            table = torch.cat(shards[: config.tp_size], dim=0)
        else:
            table = torch.cat(shards[: config.tp_size], dim=1)
        if table.shape[0] < config.vocab_size:
            raise IntegrityError(f"{path}: {name} has {table.shape[0]} rows, fewer than vocab_size {config.vocab_size}",
                                 path=str(path), fix="re-export the checkpoint")
        return table[: config.vocab_size].contiguous()

    @staticmethod
    def _merge_layer(
        config: ModelConfig, index: int, shards: list[dict[str, torch.Tensor]], simulate_activation_quant: bool
    ) -> DecoderLayer:
        tp = config.tp_size
        q_size = config.num_heads // tp * config.head_size
        kv_heads_per_rank = max(1, config.num_kv_heads // tp)
        kv_size = kv_heads_per_rank * config.head_size
        # With fewer KV heads than ranks, TRT-LLM replicates each KV head over tp / num_kv_heads ranks.
        kv_rank_stride = max(1, tp // config.num_kv_heads)

        def linear(rank: int, name: str) -> Linear:
            return dequant.load_linear(
                shards[rank], name, config.quant_algo, simulate_activation_quant=simulate_activation_quant
            )

        where = f"{LAYER_PREFIX}{index}.attention.qkv.weight"
        q_parts, k_parts, v_parts = [], [], []
        for rank in range(tp):
            qkv = linear(rank, "attention.qkv")
            if qkv.weight.shape[0] != q_size + 2 * kv_size:
                raise IntegrityError(
                    f"checkpoint tensor {where} (rank {rank}) has {qkv.weight.shape[0]} output rows; "
                    f"expected q {q_size} + k {kv_size} + v {kv_size} for tp={tp}",
                    fix="re-export the checkpoint",
                )
            q_parts.append(_slice_rows(qkv, 0, q_size))
            if rank % kv_rank_stride == 0:
                k_parts.append(_slice_rows(qkv, q_size, q_size + kv_size))
                v_parts.append(_slice_rows(qkv, q_size + kv_size, q_size + 2 * kv_size))
        qkv_full = _cat_rows([_cat_rows(q_parts), _cat_rows(k_parts), _cat_rows(v_parts)])

        kv_scale = None
        if config.kv_cache_quant_algo == "FP8":
            key = "attention.kv_cache_scaling_factor"
            if key not in shards[0]:
                raise IntegrityError(f"checkpoint tensor {LAYER_PREFIX}{index}.{key} is missing",
                                     fix="re-export the checkpoint")
            kv_scale = float(shards[0][key].to(torch.float32).reshape(-1)[0])

        def norm(name: str) -> torch.Tensor:
            key = f"{name}.weight"
            if key not in shards[0]:
                raise IntegrityError(f"checkpoint tensor {LAYER_PREFIX}{index}.{key} is missing",
                                     fix="re-export the checkpoint")
            return shards[0][key].to(torch.float32)

        return DecoderLayer(
            input_layernorm=norm("input_layernorm"),
            qkv=qkv_full,
            dense=_cat_cols([linear(r, "attention.dense") for r in range(tp)]),
            post_layernorm=norm("post_layernorm"),
            fc=_cat_rows([linear(r, "mlp.fc") for r in range(tp)]),
            gate=_cat_rows([linear(r, "mlp.gate") for r in range(tp)]),
            proj=_cat_cols([linear(r, "mlp.proj") for r in range(tp)]),
            kv_cache_scale=kv_scale,
        )

    # -- inspection ---------------------------------------------------------------------------------------

    def named_effective_weights(self) -> dict[str, torch.Tensor]:
        """Merged float32 weights as the model applies them to raw inputs (pre-quant scales folded in).

        Keys are TRT-LLM names without `.weight`: `transformer.layers.{i}.attention.qkv` ([q; k; v]),
        `...attention.dense`, `...mlp.fc` (HF gate_proj), `...mlp.gate` (HF up_proj), `...mlp.proj`,
        plus `transformer.vocab_embedding` and `lm_head`.
        """
        out: dict[str, torch.Tensor] = {
            "transformer.vocab_embedding": self.embedding,
            "lm_head": self.lm_head,
        }
        for i, layer in enumerate(self.layers):
            for name in ("qkv", "dense"):
                out[f"{LAYER_PREFIX}{i}.attention.{name}"] = getattr(layer, name).effective_weight()
            for name in ("fc", "gate", "proj"):
                out[f"{LAYER_PREFIX}{i}.mlp.{name}"] = getattr(layer, name).effective_weight()
        return out

    # -- the decoder --------------------------------------------------------------------------------------

    def new_cache(self) -> KVCache:
        n = len(self.layers)
        return KVCache(keys=[None] * n, values=[None] * n)

    @torch.no_grad()
    def forward(self, input_ids: Sequence[int], cache: KVCache) -> torch.Tensor:
        """Run `input_ids` after the tokens already in `cache` (which it extends); float32 [len, vocab]."""
        ids = torch.as_tensor(list(input_ids), dtype=torch.long)
        if ids.numel() == 0:
            raise UsageError("input_ids is empty", fix="pass at least one token id")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise UsageError(
                f"input_ids hold a token id outside [0, {self.config.vocab_size})",
                fix="tokenize with this model's tokenizer",
            )
        start = cache.length
        positions = torch.arange(start, start + ids.numel(), dtype=torch.float32)
        cos, sin = rope_cos_sin(self._inv_freq, positions)
        hidden = self.embedding[ids]
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(index, layer, rms_norm(hidden, layer.input_layernorm, self.config.norm_epsilon), cos, sin, cache, start)
            normed = rms_norm(hidden, layer.post_layernorm, self.config.norm_epsilon)
            hidden = hidden + layer.proj(torch.nn.functional.silu(layer.fc(normed)) * layer.gate(normed))
        hidden = rms_norm(hidden, self.final_norm, self.config.norm_epsilon)
        return hidden @ self.lm_head.T

    def _attention(
        self, index: int, layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, start: int
    ) -> torch.Tensor:
        cfg = self.config
        tokens = x.shape[0]
        q_size = cfg.num_heads * cfg.head_size
        kv_size = cfg.num_kv_heads * cfg.head_size
        qkv = layer.qkv(x)
        q = qkv[:, :q_size].reshape(tokens, cfg.num_heads, cfg.head_size)
        k = qkv[:, q_size : q_size + kv_size].reshape(tokens, cfg.num_kv_heads, cfg.head_size)
        v = qkv[:, q_size + kv_size :].reshape(tokens, cfg.num_kv_heads, cfg.head_size)
        q = apply_rope(q, cos, sin, cfg.rotary_dim)
        k = apply_rope(k, cos, sin, cfg.rotary_dim)
        if layer.kv_cache_scale is not None:
            # The engine stores K (after RoPE) and V in FP8; every read sees the rounded values.
            k = dequant.fp8_kv_roundtrip(k, layer.kv_cache_scale)
            v = dequant.fp8_kv_roundtrip(v, layer.kv_cache_scale)
        past_k, past_v = cache.keys[index], cache.values[index]
        keys = k if past_k is None else torch.cat([past_k, k], dim=0)
        values = v if past_v is None else torch.cat([past_v, v], dim=0)
        cache.keys[index], cache.values[index] = keys, values

        group = cfg.num_heads // cfg.num_kv_heads
        keys_h = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, total, d]
        values_h = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (q.transpose(0, 1) @ keys_h.transpose(1, 2)) / math.sqrt(cfg.head_size)  # [heads, tokens, total]
        total = keys.shape[0]
        query_pos = torch.arange(start, start + tokens)[:, None]
        key_pos = torch.arange(total)[None, :]
        hidden_keys = key_pos > query_pos
        window = self.windows[index]
        if window is not None:
            hidden_keys = hidden_keys | (key_pos <= query_pos - window)  # outside the last `window` keys
        scores = scores.masked_fill(hidden_keys, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ values_h  # [heads, tokens, d]
        return layer.dense(attn.transpose(0, 1).reshape(tokens, q_size))

    def logits(self, input_ids: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(input_ids), vocab] for every position of a fresh sequence."""
        return self.forward(input_ids, self.new_cache())

    def generate(
        self,
        input_ids: Sequence[int],
        *,
        max_new_tokens: int,
        end_id: int | None = None,
        temperature: float = 1.0,
        top_k: int = 1,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_words_ids: Sequence[Sequence[int]] = (),
        bad_words_ids: Sequence[Sequence[int]] = (),
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        min_tokens: int = 0,
        beam_width: int = 1,
        length_penalty: float = 1.0,
    ) -> Iterator[GeneratedToken]:
        """Yield new tokens one at a time.

        Greedy when top_k == 1 or temperature == 0; otherwise sampled with a generator seeded by `seed`
        (0 when None, so runs are reproducible). Stops after max_new_tokens, when end_id is produced (the end
        token is not yielded), or when the sequence ends with a stop sequence (its tokens ARE yielded, as in
        TensorRT-LLM). Bad-word sequences are never completed.

        Repetition, presence and frequency penalties and min_tokens follow TensorRT-LLM (see
        `trtpipe.reference.sampling`). Only beam_width 1 is run; anything else is refused. length_penalty is
        accepted and has no effect at beam width 1: TensorRT-LLM uses it only to score finished beams in beam
        search (score = cum log prob / length ** length_penalty, `applyLengthPenalty` in
        cpp/tensorrt_llm/kernels/beamSearchKernels.h), and the tokens of a beam-width-1 request do not depend on it.
        """
        if max_new_tokens < 0:
            raise UsageError(f"max_new_tokens {max_new_tokens} is negative", fix="use 0 or more")
        if beam_width != 1:
            raise UsageError(
                f"beam_width {beam_width} is not supported by the CPU reference runtime (it runs beam width 1 only)",
                fix="send beam_width 1, or serve a TensorRT engine built with limits.max_beam_width > 1 for beam search",
            )
        if not math.isfinite(length_penalty):
            raise UsageError(f"length_penalty {length_penalty} is not a finite number", fix="send a finite value")
        sampling.check_sampling_args(temperature, top_k, top_p)
        penalties = sampling.Penalties(repetition_penalty, presence_penalty, frequency_penalty)
        sampling.check_penalty_args(penalties, min_tokens)
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
        context = list(input_ids)
        counts = Counter(context) if penalties.active else Counter()
        cache = self.new_cache()
        step_input = context
        for generated in range(max_new_tokens):
            next_logits = self.forward(step_input, cache)[-1].clone()
            if self.token_vocab_size < next_logits.shape[-1]:
                next_logits[self.token_vocab_size:] = float("-inf")  # padding rows: no token of the tokenizer
            sampling.ban_bad_words(next_logits, context, bad_words_ids)
            sampling.ban_end_before_min_tokens(next_logits, end_id, generated, min_tokens)
            token, logprob = sampling.choose_token(
                next_logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                counts=counts, penalties=penalties,
            )
            if end_id is not None and token == end_id:
                return
            context.append(token)
            if penalties.active:
                counts[token] += 1
            yield GeneratedToken(token_id=token, logprob=logprob)
            if sampling.ends_with_stop(context, stop_words_ids):
                return
            step_input = [token]


# ---------------------------------------------------------------------------------------------------------
# Numerics shared by every layer


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies for rope_gpt_neox, with TRT-LLM's rotary_scaling applied.

    ModelOpt 0.37 copies the HF `rope_scaling` dict verbatim into `rotary_scaling`, so the kind is under
    `rope_type` (transformers >= 4.45) or `type` (older configs, and what TRT-LLM's own converter writes).
    """
    dim = config.rotary_dim
    inv_freq = 1.0 / (config.rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rotary_scaling
    if not scaling:
        return inv_freq.to(torch.float32)
    kind = str(scaling.get("type", scaling.get("rope_type", ""))).lower()
    if kind in ("", "default", "none"):
        return inv_freq.to(torch.float32)
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return (inv_freq / factor).to(torch.float32)
    if kind == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth blend in between.
        factor = float(scaling.get("factor", 8.0))
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_context = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_context / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        result = torch.where(wavelen > old_context / low, inv_freq / factor, blended)
        result = torch.where(wavelen < old_context / high, inv_freq, result)
        return result.to(torch.float32)
    raise InvalidInput(
        f"rotary_scaling type {kind!r} is not supported by the reference runtime",
        fix="supported: linear, llama3",
    )


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    angles = positions[:, None] * inv_freq[None, :]  # [tokens, dim/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """GPT-NeoX style rotation of the first `rotary_dim` features of x [tokens, heads, head_size]."""
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return torch.cat([rot, rest], dim=-1)
