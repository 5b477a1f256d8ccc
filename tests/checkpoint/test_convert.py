"""Every format converts the tiny models through ModelOpt 0.37 and passes the checkpoint schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from trtpipe.checkpoint.recipes import convert_local
from trtpipe.checkpoint.schema import validate_checkpoint

pytestmark = pytest.mark.timeout(600)

FORMATS = [
    # (algo, kv_cache, tp, checkpoint quant_algo, checkpoint kv_cache_quant_algo)
    ("none", "auto", 1, None, None),
    ("fp8", "auto", 1, "FP8", None),
    ("fp8", "fp8", 2, "FP8", "FP8"),
    ("int4_awq", "auto", 1, "W4A16_AWQ", None),
    ("int4_awq", "fp8", 2, "W4A16_AWQ", "FP8"),
    ("w4a8_awq", "auto", 1, "W4A8_AWQ", None),
    ("int8_sq", "auto", 1, "W8A8_SQ_PER_CHANNEL", None),
]


def _config(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with safe_open(str(path), "pt") as f:
        return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}


@pytest.mark.parametrize(("algo", "kv", "tp", "quant_algo", "kv_algo"), FORMATS, ids=lambda v: str(v))
def test_llama_formats_convert_and_validate(
    converted: Callable[..., Path], algo: str, kv: str, tp: int, quant_algo: str | None, kv_algo: str | None
) -> None:
    ckpt = converted("llama", algo, kv_cache=kv, tp=tp)
    config = _config(ckpt)
    assert config["architecture"] == "LlamaForCausalLM"
    assert config["dtype"] == "float16"  # auto follows the HF config's float16
    assert config["quantization"]["quant_algo"] == quant_algo
    assert config["quantization"]["kv_cache_quant_algo"] == kv_algo
    assert config["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert sorted(p.name for p in ckpt.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(tp)]
    validate_checkpoint(ckpt)  # convert already ran it; run it again on the placed directory


def test_int4_awq_layout(converted: Callable[..., Path]) -> None:
    """Two int4 values per byte along the output dim, per-group scales, activation pre-quant scale."""
    tensors = _tensors(converted("llama", "int4_awq") / "rank0.safetensors")
    assert tensors["transformer.layers.0.mlp.fc.weight"] == ("I8", (256, 256))  # [512/2, 256]
    assert tensors["transformer.layers.0.mlp.fc.weights_scaling_factor"] == ("F32", (512, 2))  # 256/128 groups
    assert tensors["transformer.layers.0.mlp.fc.prequant_scaling_factor"] == ("F16", (256,))
    assert tensors["lm_head.weight"] == ("F16", (512, 256))  # excluded from quantization


def test_tensor_parallel_splits(converted: Callable[..., Path]) -> None:
    ckpt = converted("llama", "none", tp=2)
    for rank in (0, 1):
        t = _tensors(ckpt / f"rank{rank}.safetensors")
        assert t["transformer.layers.0.attention.qkv.weight"][1] == ((256 + 2 * 128) // 2, 256)  # output dim split
        assert t["transformer.layers.0.attention.dense.weight"][1] == (256, 128)  # input dim split
        assert t["transformer.layers.0.mlp.proj.weight"][1] == (256, 256)
        assert t["lm_head.weight"][1] == (256, 256)  # vocab split


def test_pipeline_parallel_places_layers_and_ends(converted: Callable[..., Path]) -> None:
    ckpt = converted("llama", "none", pp=2)
    first, last = _tensors(ckpt / "rank0.safetensors"), _tensors(ckpt / "rank1.safetensors")
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "lm_head.weight" in last and "transformer.ln_f.weight" in last
    assert not (ckpt / "quant_cfg.json").exists()  # the empty per-layer table ModelOpt writes is dropped


def test_unquantized_export_keeps_hf_weights_exactly(converted: Callable[..., Path], tiny_llama_dir: Path) -> None:
    import torch

    with safe_open(str(tiny_llama_dir / "model.safetensors"), "pt") as hf:
        gate, up = hf.get_tensor("model.layers.0.mlp.gate_proj.weight"), hf.get_tensor("model.layers.0.mlp.up_proj.weight")
        embed = hf.get_tensor("model.embed_tokens.weight")
    with safe_open(str(converted("llama", "none") / "rank0.safetensors"), "pt") as ck:
        assert torch.equal(ck.get_tensor("transformer.layers.0.mlp.fc.weight"), gate)  # fc = gate_proj
        assert torch.equal(ck.get_tensor("transformer.layers.0.mlp.gate.weight"), up)  # gate = up_proj
        assert torch.equal(ck.get_tensor("transformer.vocab_embedding.weight"), embed)


def test_quantized_export_keeps_untouched_tensors_exact(converted: Callable[..., Path], tiny_llama_dir: Path) -> None:
    """Calibration runs in bf16, but embedding, norms and lm_head must come out at their original fp16 values."""
    import torch

    with safe_open(str(tiny_llama_dir / "model.safetensors"), "pt") as hf:
        head, norm = hf.get_tensor("lm_head.weight"), hf.get_tensor("model.layers.1.input_layernorm.weight")
    with safe_open(str(converted("llama", "fp8") / "rank0.safetensors"), "pt") as ck:
        assert torch.equal(ck.get_tensor("lm_head.weight"), head)
        assert torch.equal(ck.get_tensor("transformer.layers.1.input_layernorm.weight"), norm)


def test_bfloat16_export(converted: Callable[..., Path]) -> None:
    ckpt = converted("llama", "none", dtype="bfloat16")
    assert _config(ckpt)["dtype"] == "bfloat16"
    assert _tensors(ckpt / "rank0.safetensors")["lm_head.weight"][0] == "BF16"


@pytest.mark.parametrize("algo", ["none", "int4_awq"])
def test_qwen2_config_for_trtllm_qwen_loader(converted: Callable[..., Path], algo: str) -> None:
    ckpt = converted("qwen2", algo)
    config = _config(ckpt)
    # The fields TRT-LLM 1.2's QWenConfig/QWenForCausalLM read (tensorrt_llm/models/qwen/config.py, model.py).
    assert config["architecture"] == "Qwen2ForCausalLM"
    assert config["qwen_type"] == "qwen2"
    assert config["attn_bias"] is True and config["mlp_bias"] is False
    assert config["rotary_base"] == 10000.0
    assert config["use_logn_attn"] is False
    assert config["moe_intermediate_size"] == 0 and config["moe_shared_expert_intermediate_size"] == 0
    assert config["position_embedding_type"] == "rope_gpt_neox"
    tensors = _tensors(ckpt / "rank0.safetensors")
    assert tensors["transformer.layers.0.attention.qkv.bias"] == ("F16", (512,))  # q 256 + k 128 + v 128


def test_same_inputs_give_byte_identical_checkpoints(converted: Callable[..., Path], tiny_llama_dir: Path, tmp_path: Path) -> None:
    first = converted("llama", "int4_awq", kv_cache="fp8", tp=2)
    again = Path(convert_local(tiny_llama_dir, tmp_path / "again", algo="int4_awq", kv_cache="fp8", tp=2).out_dir)
    for name in ("config.json", "rank0.safetensors", "rank1.safetensors"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.gpu
def test_trtllm_loads_qwen2_checkpoint(converted: Callable[..., Path]) -> None:
    """Only a host with TensorRT-LLM 1.2 can confirm its Qwen loader accepts the llama-layout export."""
    trtllm = pytest.importorskip("tensorrt_llm", reason="needs TensorRT-LLM (GPU host)")
    model = trtllm.models.QWenForCausalLM.from_checkpoint(str(converted("qwen2", "int4_awq")))
    assert model.config.qwen_type == "qwen2"


def _variant(tiny_llama_dir: Path, dst: Path, **config_changes: object) -> Path:
    """The tiny Llama with config.json edited (same weights): Mistral and Llama 3.1 share Llama's tensors."""
    import shutil

    shutil.copytree(tiny_llama_dir, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_mistral_family(tiny_llama_dir: Path, tmp_path: Path) -> None:
    model = _variant(
        tiny_llama_dir, tmp_path / "mistral", architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=None
    )
    ckpt = Path(convert_local(model, tmp_path / "ck", algo="none").out_dir)
    assert _config(ckpt)["architecture"] == "MistralForCausalLM"  # TRT-LLM maps it to its Llama model


def test_llama31_rope_scaling_is_carried(tiny_llama_dir: Path, tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    model = _variant(tiny_llama_dir, tmp_path / "llama31", rope_scaling=scaling)
    config = _config(Path(convert_local(model, tmp_path / "ck", algo="none").out_dir))
    assert config["rotary_scaling"]["factor"] == 8.0
    assert config["rotary_scaling"]["type"] == config["rotary_scaling"]["rope_type"] == "llama3"
    assert config["rotary_scaling"]["original_max_position_embeddings"] == 256
