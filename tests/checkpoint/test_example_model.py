"""The tiny example model: loadable by transformers and tokenizers, trained (not flat), deterministic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trtpipe.checkpoint.example_model import write_example_model
from trtpipe.errors import UsageError


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.timeout(120)
def test_same_bytes_on_every_run(tiny_llama_dir: Path, tmp_path: Path) -> None:
    again = write_example_model(tmp_path / "again", arch="llama")
    assert _digests(again) == _digests(tiny_llama_dir)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dir left behind"


def test_hf_directory_layout(tiny_llama_dir: Path) -> None:
    names = {p.name for p in tiny_llama_dir.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    } <= names
    assert not any(n.endswith((".bin", ".pt", ".pth")) for n in names)
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] % 128 == 0 and config["intermediate_size"] % 128 == 0
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query attention
    assert 2 <= config["num_hidden_layers"] <= 4


def test_tokenizer_loads_both_ways(tiny_llama_dir: Path) -> None:
    import tokenizers
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_llama_dir)
    plain = tokenizers.Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    text = "The harbour was quiet before dawn, 42 gulls."
    ids = hf(text)["input_ids"]
    assert ids == plain.encode(text).ids
    assert ids[0] == hf.bos_token_id == 0
    assert (hf.eos_token_id, hf.pad_token_id) == (1, 2)
    assert hf.decode(ids, skip_special_tokens=True) == text  # byte-level: lossless


def test_trained_logits_are_peaked(tiny_llama_dir: Path) -> None:
    """Random weights give near-uniform next-token distributions over 512 tokens; training must change that."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    ids = tokenizer("The library closes at eight on weekdays and at five on Saturdays.", return_tensors="pt")
    with torch.no_grad():
        out = model(**ids, labels=ids["input_ids"])
    uniform_loss = torch.log(torch.tensor(float(model.config.vocab_size)))
    assert out.loss < uniform_loss - 1.0
    top1 = out.logits.softmax(-1).max(-1).values.mean()
    assert top1 > 10.0 / model.config.vocab_size


def test_qwen2_variant_has_qkv_bias(tiny_qwen2_dir: Path) -> None:
    from safetensors import safe_open

    config = json.loads((tiny_qwen2_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    with safe_open(tiny_qwen2_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert f"model.layers.0.self_attn.{proj}.bias" in keys


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "file.txt").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        write_example_model(tmp_path / "occupied")


def test_refuses_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="llama"):
        write_example_model(tmp_path / "m", arch="gpt2")
