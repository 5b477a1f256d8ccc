"""Fixtures of the bench tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE `tokenizer.json`, trained here so the test needs no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from trtpipe.bench.workload import _WORDS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [" ".join(_WORDS[i:] + _WORDS[:i]) for i in range(len(_WORDS))]
    tok.train_from_iterator(text, trainer=trainer)
    out = tmp_path_factory.mktemp("tokenizer")
    tok.save(str(out / "tokenizer.json"))
    return out
