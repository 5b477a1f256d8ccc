"""Validation of an exported TRT-LLM checkpoint: every rank file against the tensors its config implies.

A failure here means the exporter (or a hand edit) produced something a TRT-LLM build would reject or,
worse, accept and run wrongly; the error names the offending file and tensor. Only safetensors headers are
read (names, dtypes, shapes), so validating a large checkpoint costs milliseconds.

Expected layout (ModelOpt 0.37 export, llama layout, also used for Qwen2; shapes are per rank):
  rank r = pp_rank * tp + tp_rank; pp ranks hold contiguous layer blocks, numbered from 0 on each rank;
  the first pp rank holds transformer.vocab_embedding [vocab/tp, hidden] (parallel embedding, dim 0),
  the last holds transformer.ln_f and lm_head [pad(vocab, tp)/tp, hidden].
  Per layer: input_layernorm, post_layernorm [hidden]; attention.qkv [(q + 2 kv)/tp, hidden] (+ bias for
  Qwen2); attention.dense [hidden, q/tp]; mlp.fc and mlp.gate [inter/tp, hidden]; mlp.proj [hidden, inter/tp].
  Quantized GEMMs (all of qkv, dense, fc, gate, proj; lm_head excluded): the tensors of the checkpoint's
  format in the quantization table (trtpipe.quant, `tensors`), e.g. FP8: weight F8_E4M3 [out, in] with
  weights_scaling_factor and activation_scaling_factor F32 [1]; W4A16_AWQ: weight I8 [out/2, in],
  weights_scaling_factor F32 [out, in/group], prequant_scaling_factor <dtype> [in].
  A quantized KV cache: its scale tensors per attention layer (FP8: kv_cache_scaling_factor F32 [1];
  k_/v_cache_scaling_factor [1] may accompany it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe import quant
from trtpipe.errors import IntegrityError
from trtpipe.resolve import SUPPORTED_ARCHITECTURES
from trtpipe.spec import BuildSpec

SAFETENSORS_DTYPE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
# The checkpoint formats an exporter here writes: those whose tensors the quantization table knows.
EXPORTED_FORMATS = {f.checkpoint_algo: f for f in quant.FORMATS.values() if f.tensors is not None and f.refused is None}
EXPORTED_KV = {k.checkpoint_algo: k for k in quant.KV_CACHES.values() if k.checkpoint_algo and k.refused is None}
RANK_FILE = re.compile(r"^rank(\d+)\.safetensors$")


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # safetensors dtype string: F16, BF16, F32, I8, F8_E4M3
    shape: tuple[int, ...]


def _fail(where: Path, message: str, fix: str | None = None) -> IntegrityError:
    return IntegrityError(
        f"checkpoint {where}: {message}", path=str(where),
        fix=fix or "this is a bug in the conversion: report it with the spec and the ModelOpt version",
    )


def _linear_tensors(
    name: str, out: int, inp: int, dtype: str, algo: str | None, group: int | None
) -> dict[str, TensorSpec]:
    fmt = EXPORTED_FORMATS[algo]
    return {key: TensorSpec(*spec) for key, spec in quant.linear_tensors(fmt, name, out, inp, dtype, group).items()}


def expected_rank_tensors(config: dict[str, Any], rank: int) -> dict[str, TensorSpec]:
    """Every tensor (name -> dtype, shape) rank `rank` of a checkpoint with this config.json must hold."""
    mapping = config["mapping"]
    tp, pp = int(mapping["tp_size"]), int(mapping["pp_size"])
    pp_rank = rank // tp
    dtype = SAFETENSORS_DTYPE[config["dtype"]]
    quantization = config.get("quantization") or {}
    algo = quantization.get("quant_algo")
    group = quantization.get("group_size")
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head = int(config.get("head_size") or hidden // heads)
    inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    layers = int(config["num_hidden_layers"]) // pp
    q_local = heads * head // tp
    kv_local = max(kv_heads // tp, 1) * head  # fewer KV heads than ranks: each rank keeps a copy
    qkv_out = q_local + 2 * kv_local
    has_qkv_bias = config.get("architecture") == "Qwen2ForCausalLM" or bool(config.get("attn_bias"))

    tensors: dict[str, TensorSpec] = {}
    if pp_rank == 0:
        tensors["transformer.vocab_embedding.weight"] = TensorSpec(dtype, (-(-vocab // tp), hidden))
    if pp_rank == pp - 1:
        tensors["transformer.ln_f.weight"] = TensorSpec(dtype, (hidden,))
        tensors["lm_head.weight"] = TensorSpec(dtype, (-(-vocab // tp), hidden))
    for i in range(layers):
        p = f"transformer.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = TensorSpec(dtype, (hidden,))
        tensors[f"{p}.post_layernorm.weight"] = TensorSpec(dtype, (hidden,))
        tensors.update(_linear_tensors(f"{p}.attention.qkv", qkv_out, hidden, dtype, algo, group))
        if has_qkv_bias:
            tensors[f"{p}.attention.qkv.bias"] = TensorSpec(dtype, (qkv_out,))
        tensors.update(_linear_tensors(f"{p}.attention.dense", hidden, q_local, dtype, algo, group))
        tensors.update(_linear_tensors(f"{p}.mlp.fc", inter // tp, hidden, dtype, algo, group))
        tensors.update(_linear_tensors(f"{p}.mlp.gate", inter // tp, hidden, dtype, algo, group))
        tensors.update(_linear_tensors(f"{p}.mlp.proj", hidden, inter // tp, dtype, algo, group))
        kv = EXPORTED_KV.get(quantization.get("kv_cache_quant_algo"))
        for scale in kv.scale_tensors if kv is not None else ():
            tensors[f"{p}.attention.{scale}"] = TensorSpec("F32", (1,))
    return tensors


def _read_header(path: Path) -> dict[str, TensorSpec]:
    from safetensors import safe_open

    found: dict[str, TensorSpec] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                found[name] = TensorSpec(piece.get_dtype(), tuple(piece.get_shape()))
    except Exception as exc:
        raise _fail(path, f"not a readable safetensors file ({exc})") from None
    return found


def _check_config(ckpt_dir: Path, config: dict[str, Any], spec: BuildSpec | None) -> None:
    where = ckpt_dir / "config.json"
    for key in ("architecture", "dtype", "mapping", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "vocab_size"):
        if key not in config:
            raise _fail(where, f"missing field {key!r}")
    if config["architecture"] not in SUPPORTED_ARCHITECTURES:
        raise _fail(where, f"architecture {config['architecture']!r} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    if config["dtype"] not in SAFETENSORS_DTYPE:
        raise _fail(where, f"dtype {config['dtype']!r} is not float16, bfloat16 or float32")
    quantization = config.get("quantization") or {}
    fmt = EXPORTED_FORMATS.get(quantization.get("quant_algo"))
    if fmt is None:
        raise _fail(where, f"quantization.quant_algo {quantization.get('quant_algo')!r} is not one trtpipe exports")
    if fmt.grouped and not quantization.get("group_size"):
        raise _fail(where, f"{fmt.checkpoint_algo} quantization without a group_size")
    kv_algo = quantization.get("kv_cache_quant_algo")
    if kv_algo is not None and kv_algo not in EXPORTED_KV:
        raise _fail(where, f"kv_cache_quant_algo {kv_algo!r} is not one trtpipe exports "
                           f"({', '.join(map(str, EXPORTED_KV))} or null)")
    if config["architecture"] == "Qwen2ForCausalLM" and config.get("qwen_type") != "qwen2":
        raise _fail(where, "a Qwen2 checkpoint needs qwen_type 'qwen2' (TRT-LLM's Qwen loader reads it)")
    mapping = config["mapping"]
    if mapping.get("world_size") != mapping.get("tp_size", 0) * mapping.get("pp_size", 0):
        raise _fail(where, f"mapping {mapping} has world_size != tp_size * pp_size")
    if config["num_hidden_layers"] % mapping["pp_size"]:
        raise _fail(where, f"num_hidden_layers {config['num_hidden_layers']} not divisible by pp {mapping['pp_size']}")
    if spec is None:
        return
    fix = "the checkpoint does not match the spec: convert again"
    if (mapping["tp_size"], mapping["pp_size"]) != (spec.target.tp, spec.target.pp):
        raise _fail(
            where,
            f"mapping tp={mapping['tp_size']} pp={mapping['pp_size']} but the spec asks tp={spec.target.tp} pp={spec.target.pp}",
            fix,
        )
    wanted_format = quant.FORMATS[spec.quantization.algo]
    wanted = wanted_format.checkpoint_algo
    if quantization.get("quant_algo") != wanted:
        raise _fail(where, f"quant_algo {quantization.get('quant_algo')} but the spec asks {wanted}", fix)
    wanted_kv = quant.KV_CACHES[spec.quantization.kv_cache].checkpoint_algo
    if quantization.get("kv_cache_quant_algo") != wanted_kv:
        raise _fail(where, f"kv_cache_quant_algo {quantization.get('kv_cache_quant_algo')} but the spec asks {wanted_kv}", fix)
    if wanted_format.grouped and quantization.get("group_size") != spec.quantization.group_size:
        raise _fail(where, f"group_size {quantization.get('group_size')} but the spec asks {spec.quantization.group_size}", fix)
    if spec.model.dtype.value != "auto" and config["dtype"] != spec.model.dtype.value:
        raise _fail(where, f"dtype {config['dtype']} but the spec asks {spec.model.dtype.value}", fix)


def validate_checkpoint(ckpt_dir: Path, spec: BuildSpec | None = None) -> None:
    """Raise an IntegrityError naming the file and tensor if the checkpoint is not what its config (and spec) say."""
    ckpt_dir = Path(ckpt_dir)
    config_path = ckpt_dir / "config.json"
    if not config_path.is_file():
        raise _fail(ckpt_dir, "no config.json", "give a TRT-LLM checkpoint directory")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _fail(config_path, f"not valid JSON ({exc.msg})") from None
    _check_config(ckpt_dir, config, spec)
    world = int(config["mapping"]["world_size"])
    ranks = sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if (m := RANK_FILE.match(p.name)))
    if ranks != list(range(world)):
        raise _fail(ckpt_dir, f"rank files {ranks} but world_size {world} needs rank0..rank{world - 1}.safetensors")
    kv = EXPORTED_KV.get((config.get("quantization") or {}).get("kv_cache_quant_algo"))
    optional = kv.optional_scale_tensors if kv is not None else ()
    for rank in range(world):
        path = ckpt_dir / f"rank{rank}.safetensors"
        found = _read_header(path)
        expected = expected_rank_tensors(config, rank)
        for name, want in expected.items():
            have = found.get(name)
            if have is None:
                raise _fail(path, f"tensor {name} is missing (expected {want.dtype} {list(want.shape)})")
            if have.dtype != want.dtype:
                raise _fail(path, f"tensor {name} has dtype {have.dtype}, expected {want.dtype}")
            if have.shape != want.shape:
                raise _fail(path, f"tensor {name} has shape {list(have.shape)}, expected {list(want.shape)}")
        for name, have in found.items():
            if name in expected:
                continue
            if name.rsplit(".", 1)[-1] in optional and have == TensorSpec("F32", (1,)):
                continue
            raise _fail(path, f"unexpected tensor {name} ({have.dtype} {list(have.shape)})")
