"""Streaming conversion (quantization.algo none): tensor by tensor from the safetensors files, never the whole
model, and byte for byte what ModelOpt's full-model export writes.

ModelOpt remains the reference: every case converts twice, with `quantization.converter: modelopt` (load the
model, `export_tensorrt_llm_checkpoint`) and with the automatic choice (streaming), and compares every file.
Memory and time are measured by benchmarks/convert.py, not here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from trtpipe.checkpoint.recipes import convert_local

pytestmark = pytest.mark.timeout(900)

# (tp, pp, dtype): TP 4 exceeds the example models' 2 KV heads (ModelOpt duplicates them); PP 2 splits the layers.
LAYOUTS = ((1, 1, "auto"), (2, 1, "auto"), (4, 1, "auto"), (1, 2, "auto"), (2, 2, "bfloat16"))


def _convert_both(model: Path, work: Path, **recipe: object) -> tuple[Path, Path, object]:
    reference = Path(convert_local(model, work / "modelopt", converter="modelopt", **recipe).out_dir)
    summary = convert_local(model, work / "auto", **recipe)
    return reference, Path(summary.out_dir), summary


def _assert_same_files(reference: Path, streamed: Path) -> None:
    names = sorted(p.name for p in reference.iterdir())
    assert names == sorted(p.name for p in streamed.iterdir())
    for name in names:
        assert (streamed / name).read_bytes() == (reference / name).read_bytes(), name


def _model_bytes(model: Path) -> int:
    """The tensor data in the model's safetensors files (each file's size less its header)."""
    total = 0
    for path in model.glob("*.safetensors"):
        with path.open("rb") as f:
            total += path.stat().st_size - 8 - int.from_bytes(f.read(8), "little")
    return total


@pytest.mark.parametrize(("tp", "pp", "dtype"), LAYOUTS, ids=[f"tp{t}-pp{p}-{d}" for t, p, d in LAYOUTS])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_streamed_checkpoint_is_modelopts(
    example_model_dir: Callable[..., Path], tmp_path: Path, arch: str, tied: bool, tp: int, pp: int, dtype: str
) -> None:
    model = example_model_dir(arch, tied)
    reference, streamed, summary = _convert_both(model, tmp_path, tp=tp, pp=pp, dtype=dtype)
    assert summary.path == "streaming", summary.path_reason
    _assert_same_files(reference, streamed)
    # Each HF byte is read once (a tied head is written from the embedding's reads); with more ranks than
    # KV heads, each duplicated k/v row is read once per copy.
    d = json.loads((model / "config.json").read_text())
    head_dim = d["hidden_size"] // d["num_attention_heads"]
    kv_row_bytes = (d["hidden_size"] + (arch == "qwen2")) * 2  # a weight row (and a bias value), float16
    extra_kv_rows = 2 * (tp - d["num_key_value_heads"]) * head_dim * d["num_hidden_layers"] if tp > 2 else 0
    assert summary.bytes_read == _model_bytes(model) + extra_kv_rows * kv_row_bytes


def _synthetic_llama(out: Path, tokenizer_from: Path, **config: object) -> Path:
    """A random-weight Llama saved by transformers (shapes the example models do not have)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = config.pop("dtype", torch.float16)
    shard = config.pop("max_shard_size", None)
    base = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**base, **config})).to(dtype)
    model.config.dtype = dtype
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_from / name, out / name)
    return out


@pytest.mark.parametrize(
    ("variant", "config"),
    [
        # a vocabulary TP 2 does not divide (zero rows padded), stored in bf16, exported in fp16 and bf16
        ("odd-vocab-bf16", {"vocab_size": 1001, "dtype": "bfloat16"}),
        # float32 storage, tied head
        ("float32-tied", {"dtype": "float32", "tie_word_embeddings": True}),
        # Llama 3.1's rope scaling and an integer rope_theta (copied as written)
        ("llama31", {"rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}),
        # weights in several files with an index
        ("sharded", {"max_shard_size": "600KB"}),
    ],
)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_other_shapes_and_storage(tiny_llama_dir: Path, tmp_path: Path, variant: str, config: dict, dtype: str) -> None:
    import torch

    config = dict(config)
    if isinstance(config.get("dtype"), str):
        config["dtype"] = getattr(torch, config["dtype"])
    model = _synthetic_llama(tmp_path / "model", tiny_llama_dir, **config)
    if variant == "sharded":
        assert len(list(model.glob("*.safetensors"))) > 1
    reference, streamed, summary = _convert_both(model, tmp_path, tp=2, dtype=dtype)
    assert summary.path == "streaming", summary.path_reason
    _assert_same_files(reference, streamed)


def test_unmapped_tensor_takes_modelopts_path(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """A tensor the llama layout does not map (here a stray rotary table, as some old checkpoints carry) is
    left to ModelOpt's loader, which knows what transformers ignores; the summary says why."""
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    tensors = load_file(str(model / "model.safetensors"))
    import torch

    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(32)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    summary = convert_local(model, tmp_path / "ckpt", algo="none")
    assert summary.path == "modelopt"
    assert "model.layers.0.self_attn.rotary_emb.inv_freq" in summary.path_reason


def test_converter_modelopt_forces_the_full_model(tiny_llama_dir: Path, tmp_path: Path) -> None:
    summary = convert_local(tiny_llama_dir, tmp_path / "ckpt", algo="none", converter="modelopt")
    assert (summary.path, summary.path_reason) == ("modelopt", "quantization.converter: modelopt")
    assert summary.bytes_read is None  # transformers' loader is not counted


def test_streaming_imports_no_model_code(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """What keeps its memory small: no ModelOpt, no transformers model class, no model object."""
    script = (
        "import sys; from pathlib import Path\n"
        "from trtpipe.checkpoint.recipes import convert_local\n"
        f"s = convert_local(Path({str(tiny_llama_dir)!r}), Path({str(tmp_path / 'ckpt')!r}), algo='none', tp=2)\n"
        "loaded = [m for m in sys.modules if m.startswith(('modelopt', 'transformers.models.llama.modeling'))]\n"
        "import json; print(json.dumps({'path': s.path, 'loaded': loaded}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"path": "streaming", "loaded": []}
