"""Tied and untied output heads, for every example architecture and every format trtpipe converts.

Qwen2/2.5 0.5B-3B and Llama 3.2 1B/3B tie `lm_head` to the input embedding (`tie_word_embeddings`): the
HF weights hold `model.embed_tokens.weight` only, and transformers makes `lm_head.weight` the same tensor.
Quantizing such a model crashed with `KeyError: 'lm_head.weight'` (the untouched-parameter bookkeeping
recorded the shared tensor under both names; `named_parameters()` lists it once). Each case here converts
the tiny example model through the converter's automatic choice (streaming, layer-wise or ModelOpt's
full model: trtpipe.checkpoint.convert.choose_path), validates the checkpoint, checks that the exported
head is the model's head (its own weight, or the embedding when tied) exactly, and holds the reference
runtime to the format's parity bounds against transformers (trtpipe.reference.parity.DEFAULT_BOUNDS,
measured on the untied Llama and Qwen2; tied and Mistral models land inside them, e.g. tied Llama FP8
0.008, tied Qwen2 INT4-AWQ 0.013 against 0.05 and 0.10).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtpipe.checkpoint.recipes import convert_local
from trtpipe.checkpoint.schema import validate_checkpoint
from trtpipe.reference.parity import bounds_for, check_parity

pytestmark = pytest.mark.timeout(900)

ARCHS = ("llama", "qwen2", "mistral")
# (algo, kv_cache, tp): every format the converter produces, with the FP8 KV cache and TP 2 spread over them.
FORMATS = (
    ("none", "auto", 2),
    ("fp8", "auto", 1),
    ("fp8", "fp8", 2),
    ("int4_awq", "auto", 2),
    ("int4_awq", "fp8", 1),
    ("w4a8_awq", "auto", 1),
    ("int8_sq", "auto", 1),
)
PROMPTS = (
    "The pipeline converts the checkpoint and then builds an engine for the target",
    "Quantized weights are checked against the original model before any GPU time is spent",
    "When the cache is warm the second build finishes at once",
)


def _prompts(model_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tokenizer.encode(text, add_special_tokens=False).ids for text in PROMPTS]


def _hf_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def _merged_head(ckpt: Path, tp: int, vocab: int) -> torch.Tensor:
    shards = []
    for rank in range(tp):
        with safe_open(str(ckpt / f"rank{rank}.safetensors"), "pt") as f:
            shards.append(f.get_tensor("lm_head.weight"))
    return torch.cat(shards)[:vocab]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("arch", ARCHS)
def test_example_model_head(example_model_dir: Callable[..., Path], arch: str, tied: bool) -> None:
    model = example_model_dir(arch, tied)
    config = json.loads((model / "config.json").read_text())
    names = set(_hf_tensors(model))
    assert config["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in names) is not tied  # save_pretrained stores a tied head once, as the embedding
    assert json.loads((model / "trtpipe_example.json").read_text()).get("tied", False) is tied


@pytest.mark.parametrize(("algo", "kv_cache", "tp"), FORMATS, ids=[f"{a}-kv{k}-tp{t}" for a, k, t in FORMATS])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("arch", ARCHS)
def test_head_converts_with_parity(
    example_model_dir: Callable[..., Path], tmp_path: Path, arch: str, tied: bool, algo: str, kv_cache: str, tp: int
) -> None:
    model = example_model_dir(arch, tied)
    summary = convert_local(model, tmp_path / "ckpt", algo=algo, kv_cache=kv_cache, tp=tp, samples=8, max_seq_len=64)
    ckpt = Path(summary.out_dir)
    validate_checkpoint(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["share_embedding_table"] is False  # a tied head is exported as lm_head, like an untied one
    if arch == "qwen2":
        assert config["tie_word_embeddings"] is tied

    hf = _hf_tensors(model)
    head = hf["model.embed_tokens.weight"] if tied else hf["lm_head.weight"]
    assert torch.equal(_merged_head(ckpt, tp, config["vocab_size"]), head)  # excluded from quantization: exact

    # The format's bounds; greedy continuations of 4 tokens (not 32) keep 42 cases affordable.
    bounds = bounds_for(config["quantization"]["quant_algo"], config["quantization"]["kv_cache_quant_algo"])
    report = check_parity(model, ckpt, _prompts(model), bounds=bounds.model_copy(update={"greedy_tokens": 4}))
    assert report.passed, report.failures
    if algo != "none":
        assert report.max_rel_error > 1e-3  # quantization really happened


def test_reference_runtime_shared_table_and_missing_head(example_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """TRT-LLM's share_embedding_table: the head is the embedding. Without it, a checkpoint that lacks
    lm_head is refused by name (it never falls back to the embedding)."""
    from safetensors.torch import load_file, save_file

    from trtpipe.errors import IntegrityError
    from trtpipe.reference.runtime import ReferenceModel

    model = example_model_dir("llama", True)
    ckpt = Path(convert_local(model, tmp_path / "ckpt", algo="none").out_dir)
    prompt = _prompts(model)[0]
    expected = ReferenceModel.load(ckpt).logits(prompt)

    shared = tmp_path / "shared"
    shared.mkdir()
    tensors = load_file(str(ckpt / "rank0.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(shared / "rank0.safetensors"))
    config = json.loads((ckpt / "config.json").read_text())
    (shared / "config.json").write_text(json.dumps({**config, "share_embedding_table": True}))
    torch.testing.assert_close(ReferenceModel.load(shared).logits(prompt), expected, rtol=0, atol=0)

    (shared / "config.json").write_text(json.dumps({**config, "share_embedding_table": False}))
    with pytest.raises(IntegrityError, match="lm_head.weight"):
        ReferenceModel.load(shared)
