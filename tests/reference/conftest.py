"""Fixtures for the reference-runtime proofs: checkpoints converted once per session through the real path
(spec YAML -> load_spec -> resolve -> trtpipe.checkpoint.convert.convert_checkpoint), prompts, broken copies."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# Prompts written for these tests (not taken from the calibration text), so parity is measured on text the
# quantizer did not calibrate on.
PROMPT_TEXTS = (
    "The pipeline converts the checkpoint and then builds an engine for the target",
    "A small model is trained for a few seconds so that its logits are not flat",
    "Every stage writes into a temporary directory and renames it into place when done",
    "The server streams tokens back to the client while the batch keeps running",
    "Quantized weights are checked against the original model before any GPU time is spent",
    "When the cache is warm the second build finishes at once",
)

# Small calibration so a conversion takes seconds on this 2-core machine.
CALIBRATION_SAMPLES = 8
CALIBRATION_SEQ_LEN = 64


def _spec_yaml(hf_dir: Path, algo: str, tp: int, pp: int, kv_cache: str, group_size: int) -> str:
    return (
        "name: reference-proof\n"
        "model:\n"
        f"  path: {json.dumps(str(hf_dir))}\n"
        "  dtype: float16\n"
        "target:\n"
        "  gpu: cpu-reference\n"
        f"  tp: {tp}\n"
        f"  pp: {pp}\n"
        "quantization:\n"
        f"  algo: {algo}\n"
        f"  kv_cache: {kv_cache}\n"
        f"  group_size: {group_size}\n"
        "  calibration:\n"
        f"    samples: {CALIBRATION_SAMPLES}\n"
        f"    max_seq_len: {CALIBRATION_SEQ_LEN}\n"
        "engine:\n"
        "  max_batch_size: 1\n"
        "  max_input_len: 256\n"
        "  max_seq_len: 512\n"
    )


def convert_tiny(
    hf_dir: Path, work: Path, *, algo: str = "none", tp: int = 1, pp: int = 1, kv_cache: str = "auto", group_size: int = 128
) -> Path:
    """Convert `hf_dir` with trtpipe's converter; returns the checkpoint directory."""
    from trtpipe.checkpoint.convert import convert_checkpoint
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / "spec.yaml"
    spec_path.write_text(_spec_yaml(hf_dir, algo, tp, pp, kv_cache, group_size), encoding="utf-8")
    out = work / "ckpt"
    out.mkdir()
    convert_checkpoint(resolve(load_spec(spec_path)), out)
    return out


ConvertFn = Callable[..., Path]


@pytest.fixture(scope="session")
def converted(
    tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> ConvertFn:
    """converted(arch, algo="none", tp=1, pp=1, kv_cache="auto") -> checkpoint dir, converted once per session."""
    cache: dict[tuple[str, str, int, int, str], Path] = {}
    models = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}

    def get(arch: str, algo: str = "none", tp: int = 1, pp: int = 1, kv_cache: str = "auto") -> Path:
        key = (arch, algo, tp, pp, kv_cache)
        if key not in cache:
            work = tmp_path_factory.mktemp(f"ckpt-{arch}-{algo}-tp{tp}-pp{pp}-kv{kv_cache}")
            cache[key] = convert_tiny(models[arch], work, algo=algo, tp=tp, pp=pp, kv_cache=kv_cache)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def hf_dirs(tiny_llama_dir: Path, tiny_qwen2_dir: Path) -> dict[str, Path]:
    return {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}


@pytest.fixture(scope="session")
def prompts(tiny_llama_dir: Path) -> list[list[int]]:
    """Token ids of PROMPT_TEXTS (the llama and qwen2 example models share one tokenizer)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    return [tokenizer.encode(text, add_special_tokens=False).ids for text in PROMPT_TEXTS]


def hf_state_dict(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return {k: v.to(torch.float32) for k, v in tensors.items()}


def hf_weight_for(hf: dict[str, torch.Tensor], trtllm_name: str) -> torch.Tensor:
    """The HF weight a merged TRT-LLM linear corresponds to (qkv = cat(q, k, v))."""
    if trtllm_name == "transformer.vocab_embedding":
        return hf["model.embed_tokens.weight"]
    if trtllm_name == "lm_head":
        return hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    layer = trtllm_name.split(".")[2]
    base = f"model.layers.{layer}"
    if trtllm_name.endswith("attention.qkv"):
        return torch.cat([hf[f"{base}.self_attn.{p}_proj.weight"] for p in "qkv"])
    mapping = {
        "attention.dense": "self_attn.o_proj",
        "mlp.fc": "mlp.gate_proj",
        "mlp.gate": "mlp.up_proj",
        "mlp.proj": "mlp.down_proj",
    }
    for suffix, hf_name in mapping.items():
        if trtllm_name.endswith(suffix):
            return hf[f"{base}.{hf_name}.weight"]
    raise KeyError(trtllm_name)


# ---------------------------------------------------------------------------------------------------------
# Deliberately broken copies of a checkpoint


def _rewrite_ranks(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor], dict], dict[str, torch.Tensor]]) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    for file in sorted(src.glob("rank*.safetensors")):
        tensors = load_file(str(file))
        save_file(edit(tensors, config), str(dst / file.name), metadata={"format": "pt"})
    return dst


def swap_fc_and_gate(src: Path, dst: Path, layers: set[int] | None = None) -> Path:
    """Copy with every tensor of mlp.fc exchanged with its mlp.gate counterpart (weights and scales)."""

    def edit(tensors: dict[str, torch.Tensor], _config: dict) -> dict[str, torch.Tensor]:
        out = dict(tensors)
        for name, tensor in tensors.items():
            if ".mlp.fc." in name and (layers is None or int(name.split(".")[2]) in layers):
                partner = name.replace(".mlp.fc.", ".mlp.gate.")
                out[name], out[partner] = tensors[partner], tensor
        return out

    return _rewrite_ranks(src, dst, edit)


def put_k_before_q(src: Path, dst: Path) -> Path:
    """Copy with each rank's fused qkv reordered to [k; q; v] (a wrong fused-QKV order).

    With GQA, q and k differ in size, so this is the shape-preserving way to "swap q and k": every row
    keeps its shape and dtype, only the order inside qkv is wrong. INT4 packs two output rows per byte row.
    """

    def edit(tensors: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
        tp = config["mapping"]["tp_size"]
        head = config["head_size"]
        q_rows = config["num_attention_heads"] // tp * head
        k_rows = max(1, config["num_key_value_heads"] // tp) * head
        int4 = (config.get("quantization") or {}).get("quant_algo") in ("W4A16_AWQ", "W4A8_AWQ")
        out = dict(tensors)
        for name, tensor in tensors.items():
            if ".attention.qkv." not in name or tensor.numel() == 1 or name.endswith("prequant_scaling_factor"):
                continue  # per-tensor scales and [in]-shaped pre-quant scales do not depend on the row order
            per = 2 if (int4 and name.endswith(".weight")) else 1
            q, k = q_rows // per, k_rows // per
            out[name] = torch.cat([tensor[q : q + k], tensor[:q], tensor[q + k :]]).contiguous()
        return out

    return _rewrite_ranks(src, dst, edit)


class CheckpointSurgery:
    """The helpers above, handed to tests as a fixture (tests cannot import conftest under importlib mode)."""

    swap_fc_and_gate = staticmethod(swap_fc_and_gate)
    put_k_before_q = staticmethod(put_k_before_q)
    hf_state_dict = staticmethod(hf_state_dict)
    hf_weight_for = staticmethod(hf_weight_for)


@pytest.fixture(scope="session")
def surgery() -> type[CheckpointSurgery]:
    return CheckpointSurgery
