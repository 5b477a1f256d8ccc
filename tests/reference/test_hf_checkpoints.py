"""The reference runtime on Hugging Face-format checkpoints (the llm-api artifact), against transformers.

Exports are real (ModelOpt 0.37's export_hf_checkpoint on the tiny trained Llama and Qwen2, the `llmapi_artifact`
fixture); the bounds are the quantization table's per format (trtpipe.quant `parity`, `parity_with_kv`, measured on
the TRT-LLM checkpoint path), so both artifact kinds are held to the same numbers. Error model: the reference
dequantizes exactly what the checkpoint stores and applies it as the PyTorch backend loads it; what remains is the
quantization error itself plus float16 storage, which the table's bounds were set to cover with margin.
Measured here (2 cores, the tiny models): relative logit error 0.0 (none, against the float16 weights' own
rounding), about 0.014 (FP8 + FP8 KV), about 0.02 (INT4-AWQ); a swapped gate/up in one INT4 layer gives several
times the bound.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtpipe.errors import IntegrityError
from trtpipe.reference.hf_loader import is_hf_checkpoint, load_hf_checkpoint
from trtpipe.reference.parity import bounds_for, check_parity
from trtpipe.reference.runtime import ReferenceModel

PROMPT_TEXTS = (
    "The pipeline converts the checkpoint and then builds an engine for the target",
    "A small model is trained for a few seconds so that its logits are not flat",
    "Every stage writes into a temporary directory and renames it into place when done",
    "The server streams tokens back to the client while the batch keeps running",
)

FORMATS = [("none", "auto"), ("fp8", "auto"), ("int4_awq", "fp8")]


def _prompts(model_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in PROMPT_TEXTS]


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("algo,kv_cache", FORMATS)
def test_exported_checkpoint_within_the_formats_bounds(llmapi_artifact, tiny_llama_dir, tiny_qwen2_dir, arch, algo, kv_cache):
    artifact = llmapi_artifact(arch, algo, kv_cache)
    hf_dir = tiny_llama_dir if arch == "llama" else tiny_qwen2_dir
    assert is_hf_checkpoint(artifact)
    report = check_parity(hf_dir, artifact, _prompts(hf_dir))
    expected = bounds_for(*{"none": (None, None), "fp8": ("FP8", None), "int4_awq": ("W4A16_AWQ", "FP8")}[algo])
    assert report.bounds == expected  # the format was read from hf_quant_config.json
    assert report.passed, report.failures
    if algo == "none":
        assert report.greedy_equal_all


def test_load_dispatches_to_the_hf_loader(llmapi_artifact):
    artifact = llmapi_artifact("llama", "fp8", "auto")
    model = ReferenceModel.load(artifact)
    assert model.config.quant_algo == "FP8" and model.config.kv_cache_quant_algo is None
    assert model.build_config is None
    # FP8: every fused GEMM has one static FP8 input scale, as the PyTorch backend's fused layer does.
    layer = model.layers[0]
    assert layer.qkv.activation_quant is not None and layer.qkv.activation_quant.kind == "fp8"
    assert layer.fc.activation_quant == layer.gate.activation_quant


def test_fp8_kv_cache_uses_the_pytorch_backends_scale(llmapi_artifact):
    model = load_hf_checkpoint(llmapi_artifact("llama", "int4_awq", "fp8"))
    assert model.config.kv_cache_quant_algo == "FP8"
    assert {layer.kv_cache_scale for layer in model.layers} == {1.0}


def test_swapped_gate_and_up_fails_the_bound(llmapi_artifact, tiny_llama_dir, tmp_path):
    broken = _writable_copy(llmapi_artifact("llama", "int4_awq", "fp8"), tmp_path / "broken")

    def swap(tensors: dict[str, torch.Tensor]) -> None:
        for suffix in ("weight", "weight_scale"):
            gate, up = f"model.layers.0.mlp.gate_proj.{suffix}", f"model.layers.0.mlp.up_proj.{suffix}"
            tensors[gate], tensors[up] = tensors[up].clone(), tensors[gate].clone()

    _edit(broken, swap)
    report = check_parity(tiny_llama_dir, broken, _prompts(tiny_llama_dir))
    assert not report.passed
    assert report.max_rel_error > report.bounds.max_rel_error


def test_wrong_fp8_weight_scale_fails_the_bound(llmapi_artifact, tiny_llama_dir, tmp_path):
    broken = _writable_copy(llmapi_artifact("llama", "fp8", "auto"), tmp_path / "broken")

    def double(tensors: dict[str, torch.Tensor]) -> None:
        for index in range(2):
            key = f"model.layers.{index}.mlp.down_proj.weight_scale"
            tensors[key] = tensors[key] * 4

    _edit(broken, double)
    report = check_parity(tiny_llama_dir, broken, _prompts(tiny_llama_dir))
    assert not report.passed


def test_fused_pre_quant_scale_is_refused(llmapi_artifact, tmp_path):
    broken = _writable_copy(llmapi_artifact("llama", "int4_awq", "fp8"), tmp_path / "broken")
    _edit(broken, lambda t: t.__setitem__("model.layers.1.self_attn.q_proj.pre_quant_scale",
                                          torch.ones(256, dtype=torch.float16)))
    with pytest.raises(IntegrityError, match="q_proj.pre_quant_scale.*fused W4A16_AWQ"):
        load_hf_checkpoint(broken)


def test_missing_scale_is_refused(llmapi_artifact, tmp_path):
    broken = _writable_copy(llmapi_artifact("llama", "fp8", "auto"), tmp_path / "broken")
    _edit(broken, lambda t: t.pop("model.layers.0.self_attn.o_proj.weight_scale"))
    with pytest.raises(IntegrityError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight_scale is missing"):
        load_hf_checkpoint(broken)


def test_quant_configs_that_disagree_are_refused(llmapi_artifact, tmp_path):
    broken = _writable_copy(llmapi_artifact("llama", "fp8", "auto"), tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"]["quant_algo"] = "W4A16_AWQ"
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(IntegrityError, match="differs from hf_quant_config.json"):
        load_hf_checkpoint(broken)


def test_trtllm_checkpoints_are_not_taken_for_hf(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM"}))
    assert not is_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert is_hf_checkpoint(tmp_path)
