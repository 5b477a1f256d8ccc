"""Load a Hugging Face-format checkpoint (the llm-api artifact) into the CPU reference runtime.

The llm-api backend serves what ModelOpt's unified HF export writes (`export_hf_checkpoint`: config.json with a
`quantization_config`, hf_quant_config.json, model*.safetensors) or, unquantized, plain HF safetensors. This module
reads those tensors and builds the same `ReferenceModel` the TRT-LLM checkpoint path builds, applying each weight
the way TensorRT-LLM's PyTorch backend loads it, so the reference answers what that backend would compute.

Tensors per linear layer, as ModelOpt 0.37 exports them (read from exports of the tiny Llama and Qwen2 here):
- unquantized: `weight` [out, in] in the checkpoint dtype (`bias` [out] on Qwen2's q/k/v).
- FP8: `weight` float8_e4m3fn [out, in], `weight_scale` f32 scalar, `input_scale` f32 scalar; with an FP8 KV
  cache also `k_proj.k_scale` and `v_proj.v_scale`.
- W4A16_AWQ: `weight` uint8 [out/2, in] (output row 2k in the low nibble of byte row k, row 2k+1 in the high
  nibble: modelopt/torch/export/quant_utils.py pack_int4_in_uint8, the same packing as the TRT-LLM checkpoint),
  `weight_scale` f32 [out, in/group]; `pre_quant_scale` [in] on o_proj and down_proj only: the export folds the
  q/k/v and gate/up pre-quant scales into the preceding RMSNorm weights.

How the PyTorch backend applies them (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/modules/linear.py; read from the
code index at 00bbf71e796406ea8593a77cbfb828356182db16 and another indexed copy, not at the v1.2.1 tag):
- q/k/v are one fused linear, gate/up another (WeightMode.FUSED_QKV_LINEAR / FUSED_GATE_UP_LINEAR).
- FP8 (FP8QDQLinearMethod.load_weights_fused_qkv_linear / _gate_up_linear): the fused layer takes the largest
  input_scale and the largest weight_scale of its parts; each part is dequantized with its own scale in the model
  dtype and requantized to FP8 with the shared one. Activations are quantized statically with input_scale.
- W4A16_AWQ (W4A16_AWQ_LinearMethod): fused parts are concatenated with their per-group scales; no pre-quant
  scale is read for a fused layer ("we can see the tensor only for o_proj and down_proj"), so an export that
  carries one there is refused here rather than silently run differently. o_proj/down_proj multiply their input
  by pre_quant_scale (load_weights_vanilla).
- FP8 KV cache: the attention backend keeps kv_cache_scaling_factor = 1.0 (tensorrt_llm/_torch/attention_backend/
  trtllm.py TrtllmAttention.__init__); modules/attention.py passes the checkpoint's k/v scales only for an FP4
  KV cache. So K and V are rounded to FP8 with scale 1.0, whatever k_scale/v_scale say.
The runtime still computes in float32 (see trtpipe.reference.runtime); only the roundings above are simulated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trtpipe.errors import IntegrityError, InvalidInput, NotFound
from trtpipe.reference.dequant import FP8_MAX, ActivationQuant, Linear, unpack_int4

HF_QUANT_CONFIG = "hf_quant_config.json"
SUPPORTED_HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# quant_algo values of the llm-api artifact (what ModelOpt 0.37's unified export writes for trtpipe's formats).
SUPPORTED_HF_QUANT_ALGOS = (None, "FP8", "W4A16_AWQ")
PYTORCH_BACKEND_KV_SCALE = 1.0  # see the module docstring: the FP8 KV cache scale the PyTorch backend uses


def is_hf_checkpoint(path: Path) -> bool:
    """A Hugging Face model folder (config.json with `architectures`), not a TRT-LLM checkpoint or engine."""
    config_path = Path(path) / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and isinstance(raw.get("architectures"), list) and "architecture" not in raw \
        and "pretrained_config" not in raw


def hf_end_id(path: Path) -> int | None:
    """The end token the LLM API stops on for the checkpoint at `path`: generation_config.json's eos_token_id
    (its first, when a list), else tokenizer_config.json's eos_token looked up in tokenizer.json."""
    from trtpipe.model_folder import end_token_id

    return end_token_id(Path(path), "llm-api")


def hf_quantization(path: Path) -> tuple[str | None, str | None, dict[str, Any]]:
    """(quant_algo, kv_cache_quant_algo, the whole quantization section) of an HF checkpoint folder.

    hf_quant_config.json is what TensorRT-LLM's LLM API reads for a ModelOpt checkpoint; config.json's
    `quantization_config` carries the same quant_algo. Both must agree when both are there."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    from_config = config.get("quantization_config") or {}
    section: dict[str, Any] = {}
    qc_path = path / HF_QUANT_CONFIG
    if qc_path.is_file():
        try:
            section = dict(json.loads(qc_path.read_text(encoding="utf-8")).get("quantization") or {})
        except json.JSONDecodeError as err:
            raise IntegrityError(f"{qc_path}: not valid JSON ({err})", path=str(qc_path), fix="export the checkpoint again") from None
    elif from_config:
        raise IntegrityError(f"{path}: config.json has a quantization_config but there is no {HF_QUANT_CONFIG}",
                             path=str(path), fix="export the checkpoint again with ModelOpt's export_hf_checkpoint")
    algo = section.get("quant_algo")
    if from_config and from_config.get("quant_algo") != algo:
        raise IntegrityError(
            f"{path}: config.json quantization_config.quant_algo {from_config.get('quant_algo')!r} differs from "
            f"{HF_QUANT_CONFIG} quant_algo {algo!r}", path=str(path), fix="export the checkpoint again")
    return algo, section.get("kv_cache_quant_algo"), section


def _model_config(path: Path, raw: dict[str, Any]):  # -> runtime.ModelConfig
    from trtpipe.reference.runtime import ModelConfig

    source = path / "config.json"

    def need(key: str) -> Any:
        if key not in raw:
            raise IntegrityError(f"{source}: field {key} is missing", path=str(source), fix="export the checkpoint again")
        return raw[key]

    arch = need("architectures")[0] if need("architectures") else None
    if arch not in SUPPORTED_HF_ARCHITECTURES:
        raise InvalidInput(f"{source}: architecture {arch!r} is not supported by the reference runtime",
                           fix=f"supported: {', '.join(SUPPORTED_HF_ARCHITECTURES)}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise InvalidInput(f"{source}: hidden_act {act!r} is not supported", fix="supported: silu")
    quant_algo, kv_algo, _ = hf_quantization(path)
    if quant_algo not in SUPPORTED_HF_QUANT_ALGOS:
        raise InvalidInput(f"{path}/{HF_QUANT_CONFIG}: quant_algo {quant_algo!r} is not supported by the reference "
                           "runtime for Hugging Face-format checkpoints",
                           fix=f"supported: none, {', '.join(a for a in SUPPORTED_HF_QUANT_ALGOS if a)}")
    if kv_algo not in (None, "FP8"):
        raise InvalidInput(f"{path}/{HF_QUANT_CONFIG}: kv_cache_quant_algo {kv_algo!r} is not supported",
                           fix="supported: FP8 or none")
    num_heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_size = int(raw.get("head_dim") or hidden // num_heads)
    return ModelConfig(
        architecture=arch,
        num_layers=int(need("num_hidden_layers")),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_size=head_size,
        intermediate_size=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        norm_epsilon=float(raw.get("rms_norm_eps", 1e-6)),
        rotary_base=float(raw.get("rope_theta", 10000.0)),
        rotary_dim=int(head_size * float(raw.get("partial_rotary_factor", 1.0))),
        rotary_scaling=raw.get("rope_scaling"),
        tp_size=1,
        pp_size=1,
        quant_algo=quant_algo,
        kv_cache_quant_algo=kv_algo,
        share_embedding_table=bool(raw.get("tie_word_embeddings", False)),
        embedding_sharding_dim=0,
        use_parallel_embedding=False,
    )


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # safetensors only: no pickle is ever loaded

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise NotFound(f"{path} holds no .safetensors files", what="checkpoint", ref=str(path),
                       fix="point at the exported Hugging Face checkpoint folder")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            if name in tensors:
                raise IntegrityError(f"{path}: tensor {name} appears in two safetensors files", path=str(path),
                                     fix="export the checkpoint again")
            tensors[name] = tensor
    return tensors


class _Layer:
    """Reads one decoder layer's tensors and builds its linears the way the PyTorch backend loads them."""

    def __init__(self, tensors: dict[str, torch.Tensor], index: int, quant_algo: str | None, dtype: torch.dtype,
                 simulate_activation_quant: bool) -> None:
        self.tensors = tensors
        self.prefix = f"model.layers.{index}."
        self.quant_algo = quant_algo
        self.dtype = dtype
        self.simulate = simulate_activation_quant

    def get(self, name: str) -> torch.Tensor:
        key = self.prefix + name
        if key not in self.tensors:
            raise IntegrityError(f"checkpoint tensor {key} is missing",
                                 fix="export the checkpoint again; its quantization config and its tensors disagree")
        return self.tensors[key]

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

    def bias(self, parts: list[str]) -> torch.Tensor | None:
        present = [self.has(f"{p}.bias") for p in parts]
        if not any(present):
            return None
        if not all(present):
            raise IntegrityError(f"{self.prefix}{parts}: some fused parts have a bias and some do not",
                                 fix="export the checkpoint again")
        return torch.cat([self.get(f"{p}.bias").to(torch.float32) for p in parts])

    def _quantized(self, part: str) -> bool:
        return self.get(f"{part}.weight").dtype in (torch.float8_e4m3fn, torch.uint8)

    def linear(self, parts: list[str]) -> Linear:
        """One linear of the backend: `parts` fused along the output dim (q/k/v, gate/up) or a single one."""
        quantized = [self._quantized(p) for p in parts]
        if any(quantized) and not all(quantized):
            raise IntegrityError(f"{self.prefix}{'/'.join(parts)}: fused parts are quantized differently",
                                 fix="export the checkpoint again")
        bias = self.bias(parts)
        if not quantized[0]:
            weight = torch.cat([self.get(f"{p}.weight").to(torch.float32) for p in parts])
            return Linear(weight=weight, bias=bias)
        if self.quant_algo == "FP8":
            return self._fp8(parts, bias)
        if self.quant_algo == "W4A16_AWQ":
            return self._awq(parts, bias)
        raise IntegrityError(f"{self.prefix}{parts[0]}.weight is quantized but quant_algo is {self.quant_algo!r}",
                             fix="export the checkpoint again")

    def _fp8(self, parts: list[str], bias: torch.Tensor | None) -> Linear:
        weights = [self.get(f"{p}.weight") for p in parts]
        scales = [float(self.get(f"{p}.weight_scale").to(torch.float32).reshape(-1)[0]) for p in parts]
        if len(parts) == 1:
            weight = weights[0].to(torch.float32) * scales[0]
        else:
            # Dequantize each part with its scale in the model dtype, requantize with the largest (the fused layer's).
            shared = max(scales)
            fused = torch.cat([w.to(self.dtype) * torch.tensor(s, dtype=self.dtype) for w, s in zip(weights, scales)])
            requantized = (fused / torch.tensor(shared, dtype=self.dtype)).to(torch.float32).clamp(-FP8_MAX, FP8_MAX)
            weight = requantized.to(torch.float8_e4m3fn).to(torch.float32) * shared
        act = None
        if self.simulate and all(self.has(f"{p}.input_scale") for p in parts):
            scale = max(float(self.get(f"{p}.input_scale").to(torch.float32).reshape(-1)[0]) for p in parts)
            act = ActivationQuant(kind="fp8", scale=scale)
        return Linear(weight=weight, bias=bias, activation_quant=act)

    def _awq(self, parts: list[str], bias: torch.Tensor | None) -> Linear:
        weights = []
        for part in parts:
            packed = self.get(f"{part}.weight")
            scale = self.get(f"{part}.weight_scale").to(torch.float32)
            values = unpack_int4(packed)
            out_dim, in_dim = values.shape
            if scale.dim() != 2 or scale.shape[0] != out_dim or in_dim % scale.shape[1] != 0:
                raise IntegrityError(
                    f"checkpoint tensor {self.prefix}{part}.weight_scale has shape {tuple(scale.shape)}; expected "
                    f"[{out_dim}, {in_dim}/group_size] for W4A16_AWQ", fix="export the checkpoint again")
            weights.append(values * scale.repeat_interleave(in_dim // scale.shape[1], dim=1))
        prequant = None
        if len(parts) > 1:
            carrying = [p for p in parts if self.has(f"{p}.pre_quant_scale")]
            if carrying:
                raise IntegrityError(
                    f"checkpoint tensor {self.prefix}{carrying[0]}.pre_quant_scale: TensorRT-LLM's PyTorch backend does "
                    "not read a pre-quant scale for a fused W4A16_AWQ layer (q/k/v, gate/up), so it would run this "
                    "checkpoint without it", fix="export with ModelOpt's export_hf_checkpoint, which folds it into the norm")
        elif self.has(f"{parts[0]}.pre_quant_scale"):
            prequant = self.get(f"{parts[0]}.pre_quant_scale").to(torch.float32)
        else:
            raise IntegrityError(f"checkpoint tensor {self.prefix}{parts[0]}.pre_quant_scale is missing (the PyTorch "
                                 "backend reads it for every unfused W4A16_AWQ layer)", fix="export the checkpoint again")
        return Linear(weight=torch.cat(weights), bias=bias, prequant_scale=prequant)


def load_hf_checkpoint(path: Path, *, simulate_activation_quant: bool = True):  # -> runtime.ReferenceModel
    """A `ReferenceModel` of the Hugging Face-format checkpoint at `path` (see the module docstring)."""
    from trtpipe.reference.runtime import DecoderLayer, ReferenceModel

    path = Path(path)
    config_path = path / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"{config_path} not found", what="checkpoint", ref=str(path),
                       fix="point at the exported Hugging Face checkpoint folder") from None
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{config_path}: not valid JSON ({err})", path=str(config_path),
                             fix="export the checkpoint again") from None
    config = _model_config(path, raw)
    dtype = getattr(torch, str(raw.get("torch_dtype") or raw.get("dtype") or "float16"), torch.float16)
    tensors = _load_tensors(path)

    def top(name: str) -> torch.Tensor:
        if name not in tensors:
            raise IntegrityError(f"checkpoint tensor {name} is missing", path=str(path), fix="export the checkpoint again")
        return tensors[name].to(torch.float32)

    kv_scale = PYTORCH_BACKEND_KV_SCALE if config.kv_cache_quant_algo == "FP8" else None
    layers = []
    for index in range(config.num_layers):
        layer = _Layer(tensors, index, config.quant_algo, dtype, simulate_activation_quant)
        # gate/up are one fused linear in the backend (FP8: one shared weight and input scale); split it back
        # into the runtime's fc (HF gate_proj, through SiLU) and gate (HF up_proj).
        gate_up = layer.linear(["mlp.gate_proj", "mlp.up_proj"])
        half = config.intermediate_size

        def rows(linear: Linear, start: int, stop: int) -> Linear:
            return Linear(weight=linear.weight[start:stop], bias=None if linear.bias is None else linear.bias[start:stop],
                          prequant_scale=linear.prequant_scale, activation_quant=linear.activation_quant)

        layers.append(DecoderLayer(
            input_layernorm=layer.get("input_layernorm.weight").to(torch.float32),
            qkv=layer.linear(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
            dense=layer.linear(["self_attn.o_proj"]),
            post_layernorm=layer.get("post_attention_layernorm.weight").to(torch.float32),
            fc=rows(gate_up, 0, half),
            gate=rows(gate_up, half, 2 * half),
            proj=layer.linear(["mlp.down_proj"]),
            kv_cache_scale=kv_scale,
        ))
    stray = sorted(k for k in tensors if k.startswith("model.layers.") and int(k.split(".")[2]) >= config.num_layers)
    if stray:
        raise IntegrityError(f"{path}: tensor {stray[0]} is beyond num_hidden_layers={config.num_layers}",
                             path=str(path), fix="export the checkpoint again")
    embedding = top("model.embed_tokens.weight")
    lm_head = embedding if config.share_embedding_table or "lm_head.weight" not in tensors else top("lm_head.weight")
    for name, table in (("model.embed_tokens.weight", embedding), ("lm_head.weight", lm_head)):
        if table.shape[0] < config.vocab_size:
            raise IntegrityError(f"{path}: {name} has {table.shape[0]} rows, fewer than vocab_size {config.vocab_size}",
                                 path=str(path), fix="export the checkpoint again")
    return ReferenceModel(config, embedding[: config.vocab_size], layers, top("model.norm.weight"),
                          lm_head[: config.vocab_size], None)
