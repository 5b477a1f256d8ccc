"""The LLM-API artifact, exported for real with ModelOpt 0.37 on the CPU: what transformers loads, how close the
dequantized weights are to the original model, byte-identical re-export, llm_args.json, tp/pp not in the weights.

What loads in transformers 4.57.3 (the version TensorRT-LLM 1.2.1 pins):
- algo none: the artifact is a plain HF folder; it loads as it is and holds exactly the original's tensors.
- FP8 and INT4-AWQ: transformers has no quantizer for `quant_method: modelopt` (it warns and skips the
  quantization config), so an FP8 folder loads with its float8 weights cast and their scales dropped (wrong
  values) and an INT4 folder does not load at all (packed [out/2, in] weights). These tests dequantize the
  exported tensors themselves (weight x weight_scale; int4 unpacked x per-group scale x pre_quant_scale where it
  is exported) into a plain HF state dict, load that in transformers and compare logits with the original model.

Error model: the bound is the quantization table's parity bound for the format (trtpipe.quant, measured for the
reference runtime, which also quantizes the activations and the KV cache); a weight-only dequantization in
float32 has no more error than that, so the table's bound holds with margin. A broken export (INT4 nibbles read
in the wrong order, one FP8 scale doubled) must exceed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trtpipe import quant
from trtpipe.checkpoint.hf_export import ARTIFACT_TOKENIZER_FILES, LLM_ARGS_FILE
from trtpipe.llm_api.args import check_llm_args, load_args_table
from trtpipe.reference.dequant import unpack_int4

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox jumps over the lazy dog while the river runs to the sea."
SCALES = ("weight_scale", "input_scale", "pre_quant_scale", "k_scale", "v_scale")


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("model*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def dequantized_state_dict(folder: Path, *, swap_nibbles: bool = False,
                           scale_factor: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
    """The artifact's weights as a plain float32 HF state dict (see the module doc)."""
    tensors = _tensors(folder)
    group = json.loads((folder / "hf_quant_config.json").read_text())["quantization"].get("group_size")
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.rsplit(".", 1)[-1] in SCALES:
            continue
        prefix = name.removesuffix(".weight")
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors[f"{prefix}.weight_scale"].float() * (scale_factor or {}).get(prefix, 1.0)
            weight = tensor.float() * scale
        elif tensor.dtype == torch.uint8:
            packed = tensor.view(torch.int8)
            values = unpack_int4(packed)
            if swap_nibbles:
                values = values.reshape(-1, 2, values.shape[1]).flip(1).reshape(values.shape)
            weight = values * tensors[f"{prefix}.weight_scale"].float().repeat_interleave(group, dim=1)
        else:
            plain[name] = tensor.float()
            continue
        if f"{prefix}.pre_quant_scale" in tensors:
            weight = weight * tensors[f"{prefix}.pre_quant_scale"].float()[None, :]
        plain[name] = weight
    return plain


def _hf_model(folder: Path, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path, tiny_qwen2_dir: Path):
    """(arch) -> (original float32 logits on PROMPT, token ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(arch: str) -> tuple[torch.Tensor, torch.Tensor]:
        if arch not in cache:
            folder = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[arch]
            ids = AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt").input_ids
            # the export dtype is float16: the original rounded to it is what the artifact starts from
            original = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16).float().eval()
            cache[arch] = (_logits(original, ids), ids)
        return cache[arch]

    return get


def rel_error(logits: torch.Tensor, reference_logits: torch.Tensor) -> float:
    return float(torch.linalg.norm(logits - reference_logits) / torch.linalg.norm(reference_logits))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_unquantized_artifact_is_the_original_model_and_loads_in_transformers(exported, reference, arch,
                                                                                tiny_llama_dir, tiny_qwen2_dir) -> None:
    from transformers import AutoModelForCausalLM

    folder = exported(arch, "none")
    assert not (folder / "hf_quant_config.json").exists()
    assert json.loads((folder / "config.json").read_text())["dtype"] == "float16"
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    original = AutoModelForCausalLM.from_pretrained({"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[arch],
                                                    dtype=torch.float16)
    mine, theirs = loaded.state_dict(), original.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k].half(), theirs[k]) for k in theirs), "the float16 re-save changed a tensor"
    if arch == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in _tensors(folder)
    logits, ids = reference(arch)
    assert rel_error(_logits(loaded.float().eval(), ids), logits) == 0.0


@pytest.mark.parametrize(("arch", "algo", "kv_cache"), [
    ("llama", "fp8", "auto"), ("llama", "fp8", "fp8"), ("llama", "int4_awq", "auto"), ("llama", "int4_awq", "fp8"),
    ("qwen2", "fp8", "fp8"), ("qwen2", "int4_awq", "auto"),
])
def test_quantized_artifacts_dequantize_within_the_formats_bound(exported, reference, arch, algo, kv_cache) -> None:
    folder = exported(arch, algo, kv_cache)
    fmt = quant.FORMATS[algo]
    hf_quant = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    config = json.loads((folder / "config.json").read_text())
    assert hf_quant["quant_algo"] == config["quantization_config"]["quant_algo"] == fmt.checkpoint_algo
    assert hf_quant["kv_cache_quant_algo"] == quant.KV_CACHES[kv_cache].checkpoint_algo
    assert hf_quant["exclude_modules"] == ["lm_head"] and config["dtype"] == "float16"
    tensors = _tensors(folder)
    if kv_cache == "fp8":
        assert "model.layers.0.self_attn.k_proj.k_scale" in tensors
    logits, ids = reference(arch)
    error = rel_error(_logits(_hf_model(folder, dequantized_state_dict(folder)), ids), logits)
    assert error < fmt.parity.max_rel_error, f"{arch} {algo}: relative logit error {error:.4f}"


def test_a_broken_export_fails_the_bound(exported, reference) -> None:
    logits, ids = reference("llama")
    int4 = exported("llama", "int4_awq")
    swapped = rel_error(_logits(_hf_model(int4, dequantized_state_dict(int4, swap_nibbles=True)), ids), logits)
    assert swapped > quant.FORMATS["int4_awq"].parity.max_rel_error
    fp8 = exported("llama", "fp8")
    doubled = dequantized_state_dict(fp8, scale_factor={"model.layers.0.mlp.down_proj": 2.0})
    assert rel_error(_logits(_hf_model(fp8, doubled), ids), logits) > quant.FORMATS["fp8"].parity.max_rel_error


def test_what_plain_transformers_makes_of_quantized_artifacts(exported, reference) -> None:
    """transformers 4.57.3 has no `modelopt` quantizer: FP8 loads without its scales, INT4 does not load."""
    import warnings

    from transformers import AutoModelForCausalLM

    logits, ids = reference("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        naive = AutoModelForCausalLM.from_pretrained(exported("llama", "fp8")).float().eval()
        assert rel_error(_logits(naive, ids), logits) > quant.FORMATS["fp8"].parity.max_rel_error
        with pytest.raises(RuntimeError, match="size mismatch"):
            AutoModelForCausalLM.from_pretrained(exported("llama", "int4_awq"))


def test_a_re_export_is_byte_identical(exported, tiny_spec, export_spec, tmp_path) -> None:
    first = exported("llama", "int4_awq", "fp8")
    second = export_spec(tiny_spec(algo="int4_awq", kv_cache="fp8"), tmp_path / "again")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_the_artifact_carries_the_tokenizer_and_llm_args_the_table_takes(exported, tiny_llama_dir) -> None:
    folder = exported("llama", "fp8", "fp8")
    for name in ARTIFACT_TOKENIZER_FILES:
        if (tiny_llama_dir / name).is_file():
            assert (folder / name).read_bytes() == (tiny_llama_dir / name).read_bytes()
    args = json.loads((folder / LLM_ARGS_FILE).read_text())
    check_llm_args(args, load_args_table("trtllm-1.2.1"), where=LLM_ARGS_FILE)
    assert args["kv_cache_config"]["dtype"] == "fp8" and args["dtype"] == "float16" and "model" not in args


def test_tp_and_pp_change_llm_args_but_no_weight_byte(tiny_spec, export_spec, tmp_path) -> None:
    """The unified HF export is not sharded: TensorRT-LLM splits the weights when it loads them."""
    one = export_spec(tiny_spec(), tmp_path / "tp1")
    two = export_spec(tiny_spec(tp=2, pp=2), tmp_path / "tp2pp2")
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    args = json.loads((two / LLM_ARGS_FILE).read_text())
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (2, 2)
    assert json.loads((one / LLM_ARGS_FILE).read_text())["tensor_parallel_size"] == 1
