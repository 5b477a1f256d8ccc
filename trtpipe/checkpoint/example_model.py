"""A tiny, deterministic, briefly trained Hugging Face model for tests, examples and the README's main job.

Why trained: with random weights the logits are almost flat, so even a correct INT4 export flips the top-1
token at a large share of positions and quantized parity bounds mean nothing. A few hundred seeded steps on
the shipped text (`trtpipe/data/calibration.txt`) give peaked, text-like distributions.

Why these widths: every GEMM input width (hidden 256; per-rank 128 at TP=2; intermediate 512; per-rank 256
at TP=2) is a multiple of 128, so INT4-AWQ with the default group size 128 works at TP=1 and TP=2. Attention
is grouped-query (4 query heads, 2 KV heads, head_dim 64), like Llama 3 and Qwen2.

Determinism: the tokenizer is trained single-threaded, weights are initialised from a fixed seed and trained
on one thread, and every file is written by deterministic serialisers, so the same call on the same machine
and library versions writes the same bytes, whatever OMP_NUM_THREADS says (checked: 1, 2 and 4 give one
digest). Across CPUs they differ: torch's kernels round differently per vector ISA (ATEN_CPU_CAPABILITY
avx512 / avx2 / default, MKL_CBWR each gave another digest, even training in float64), and 100 AdamW steps
amplify that (AVX2 vs AVX-512: 162 of 1.4M fp16 weights differ after 1 step, nearly all after 100). So a
test may rely on what is true of any such trained model, never on one machine's numbers.
The directory is written beside `out_dir` and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import InvalidInput, UsageError
from trtpipe.shipped import data_file

ARCHITECTURES = ("llama", "qwen2", "mistral")

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2

VOCAB_SIZE = 512
HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
MAX_POSITIONS = 2048
SEED = 20261130
TRAIN_STEPS = 100
TRAIN_SEQ_LEN = 64
TRAIN_BATCH = 8
LEARNING_RATE = 3e-3


def shipped_text_path() -> Path:
    """The team-written text shipped with trtpipe (tokenizer training and default calibration data)."""
    return data_file("calibration.txt")


def shipped_paragraphs() -> list[str]:
    text = shipped_text_path().read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


@contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch on one thread: reduction order, hence the trained bytes, must not depend on the core count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train_tokenizer(paragraphs: list[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style bytes) that prepends BOS, trained offline on `paragraphs`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    # The BPE trainer is deterministic; turning parallelism off removes any doubt and keeps CI quiet.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(paragraphs, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


class Variant(BaseModel):
    """What a test model changes from the default tiny model: the config fields whose meaning must survive conversion
    (trtpipe.model_semantics). Every field at its default gives the default model, byte for byte."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sliding_window: int | None = Field(default=None, gt=0, description="mistral only: the attention window")
    vocab_size: int = Field(default=VOCAB_SIZE, ge=64, le=4096, description="the tokenizer's (and model's) ids")
    head_dim: int = Field(default=HEAD_DIM, ge=8, le=256, description="per-head width (hidden 256 / 4 heads = 64)")
    num_kv_heads: int = Field(default=NUM_KV_HEADS, ge=1, le=NUM_HEADS, description="KV heads (4: MHA)")

    def marker(self) -> dict[str, Any]:
        """The fields that differ from the default, for trtpipe_example.json."""
        return self.model_dump(exclude_defaults=True)


DEFAULT_VARIANT = Variant()


def _model_config(arch: str, rope_scaling: dict[str, Any] | None, tied: bool = False,
                  variant: Variant = DEFAULT_VARIANT) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    if variant.sliding_window is not None and arch != "mistral":
        raise UsageError(f"a sliding window is offered for the mistral example model, not {arch}")
    if NUM_HEADS % variant.num_kv_heads:
        raise UsageError(f"num_kv_heads {variant.num_kv_heads} does not divide the {NUM_HEADS} attention heads")
    common: dict[str, Any] = dict(
        vocab_size=variant.vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=variant.num_kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        dtype="float16",
    )
    if arch == "llama":
        return LlamaConfig(**common, head_dim=variant.head_dim, rope_scaling=rope_scaling, attention_bias=False)
    if rope_scaling is not None:
        raise UsageError(f"rope_scaling is only offered for the llama example model, not {arch}")
    if arch == "qwen2":
        if variant.head_dim != HEAD_DIM:
            raise UsageError("an explicit head_dim is offered for the llama and mistral example models")
        # Qwen2 always has q/k/v bias: the point of this variant.
        return Qwen2Config(**common, use_sliding_window=False, sliding_window=None)
    return MistralConfig(**common, head_dim=variant.head_dim, sliding_window=variant.sliding_window)


def _training_batches(token_ids: list[int], steps: int, generator: Any) -> Iterator[Any]:
    import torch

    stream = torch.tensor(token_ids, dtype=torch.long)
    windows = len(stream) - TRAIN_SEQ_LEN - 1
    for _ in range(steps):
        starts = torch.randint(0, windows, (TRAIN_BATCH,), generator=generator)
        yield torch.stack([stream[s : s + TRAIN_SEQ_LEN] for s in starts.tolist()])


def build_example_model(
    arch: str = "llama", *, rope_scaling: dict[str, Any] | None = None, tied: bool = False, steps: int = TRAIN_STEPS,
    variant: Variant = DEFAULT_VARIANT,
):
    """Return (model, tokenizer) in memory: the trained tiny model (float16) and its `tokenizers.Tokenizer`.

    `tied`: the output head shares the input embedding's weight (`tie_word_embeddings`, as in Qwen2/2.5
    0.5B-3B and Llama 3.2 1B/3B); the saved safetensors then hold `model.embed_tokens.weight` only."""
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHITECTURES:
        raise UsageError(f"unknown example architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    paragraphs = shipped_paragraphs()
    tokenizer = train_tokenizer(paragraphs, variant.vocab_size)
    if tokenizer.get_vocab_size() != variant.vocab_size:
        raise UsageError(f"the shipped text trains a tokenizer of {tokenizer.get_vocab_size()} ids, not the "
                         f"{variant.vocab_size} asked for", fix="ask for a smaller vocab_size")
    bos, eos = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    token_ids: list[int] = []
    for encoding in tokenizer.encode_batch(paragraphs):
        token_ids.extend(encoding.ids + [eos])  # encoding already starts with BOS
    assert token_ids[0] == bos

    config = _model_config(arch, rope_scaling, tied, variant)
    with _single_thread():
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
        generator = torch.Generator().manual_seed(SEED)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
        model.train()
        for batch in _training_batches(token_ids, steps, generator):
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
    model = model.to(torch.float16)
    model.config.dtype = torch.float16
    return model, tokenizer


def _save(model: Any, tokenizer: Any, target: Path, variant: Variant = DEFAULT_VARIANT) -> None:
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model.save_pretrained(target, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: decoder-only
    )
    fast.save_pretrained(target)
    # A small marker that says where this model came from (tests and the README check for it).
    marker: dict[str, Any] = {"generator": "trtpipe.checkpoint.example_model", "arch": model.config.architectures[0]}
    if model.config.tie_word_embeddings:
        marker["tied"] = True  # only when tied: the untied models' bytes stay what they were
    marker.update(variant.marker())  # likewise: only what differs from the default model
    (target / "trtpipe_example.json").write_text(json.dumps(marker, indent=2) + "\n")


def write_example_model(
    out_dir: Path,
    arch: str = "llama",
    *,
    rope_scaling: dict[str, Any] | None = None,
    tied: bool = False,
    overwrite: bool = False,
    variant: Variant = DEFAULT_VARIANT,
) -> Path:
    """Write the tiny example model as a normal HF directory at `out_dir` and return its path.

    `arch`: "llama" (default), "qwen2" (QKV bias) or "mistral". `rope_scaling`: e.g. Llama 3.1's
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256}. `tied`: tie the output head to the input embedding
    (`tie_word_embeddings: true`). A non-empty existing `out_dir` is refused unless `overwrite`.
    """
    out_dir = Path(out_dir)
    if arch not in ARCHITECTURES:
        raise UsageError(f"unknown example architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise UsageError(f"{out_dir} exists and is not empty", fix="choose a new or empty directory, or replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    model, tokenizer = build_example_model(arch, rope_scaling=rope_scaling, tied=tied, variant=variant)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _save(model, tokenizer, staging, variant)
        _place(staging, out_dir, overwrite=overwrite)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _place(staging: Path, out_dir: Path, *, overwrite: bool) -> None:
    """Rename the finished directory into place; never leave a half-written `out_dir`."""
    if out_dir.exists() and overwrite:
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / out_dir.name) if out_dir.is_dir() else out_dir.unlink()
        shutil.rmtree(old, ignore_errors=True)
    elif out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    try:
        os.rename(staging, out_dir)
    except OSError as err:
        # Another process placed the same (deterministic) model first: theirs is as good as ours.
        if out_dir.is_dir() and (out_dir / "trtpipe_example.json").is_file():
            return
        raise InvalidInput(f"could not place example model at {out_dir}: {err.strerror}",
                           fix="choose a directory this user can write") from err
