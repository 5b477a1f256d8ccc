"""Calibration data: the shipped default, plain text and JSONL, deterministic selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.checkpoint.calibration import calibration_samples, calibration_source, read_texts
from trtpipe.checkpoint.example_model import shipped_text_path
from trtpipe.errors import TrtpipeError
from trtpipe.spec import BuildSpec


def _spec(**calibration: object) -> BuildSpec:
    return BuildSpec.model_validate({"model": {"path": "m"}, "quantization": {"calibration": calibration}})


def test_default_is_the_shipped_text() -> None:
    path = calibration_source(_spec())
    assert path == shipped_text_path() and path.is_file()
    assert len(path.read_bytes()) > 4000
    assert len(read_texts(path)) >= 20


def test_spec_dataset_wins(tmp_path: Path) -> None:
    data = tmp_path / "cal.txt"
    data.write_text("one\n\ntwo\n")
    assert calibration_source(_spec(dataset=str(data))) == data
    assert read_texts(data) == ["one", "two"]


def test_jsonl_text_field(tmp_path: Path) -> None:
    data = tmp_path / "cal.jsonl"
    data.write_text("\n".join(json.dumps({"body": f"sample {i}", "id": i}) for i in range(3)) + "\n")
    assert read_texts(data, "body") == ["sample 0", "sample 1", "sample 2"]
    with pytest.raises(TrtpipeError, match=r"cal\.jsonl:1: no string field 'text'"):
        read_texts(data, "text")
    data.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(TrtpipeError, match=r"cal\.jsonl:2: not valid JSON"):
        read_texts(data)


def test_missing_dataset(tmp_path: Path) -> None:
    with pytest.raises(TrtpipeError, match="does not exist"):
        read_texts(tmp_path / "nope.txt")


def test_selection_is_deterministic_and_seeded(tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    texts = read_texts(shipped_text_path())
    a = calibration_samples(tokenizer, texts, samples=6, max_seq_len=64, seed=1)
    b = calibration_samples(tokenizer, texts, samples=6, max_seq_len=64, seed=1)
    c = calibration_samples(tokenizer, texts, samples=6, max_seq_len=64, seed=2)
    assert a == b and a != c
    assert len(a) == 6 and all(len(w) == 64 for w in a)
    many = calibration_samples(tokenizer, texts, samples=10_000, max_seq_len=256, seed=1)
    assert 5 < len(many) < 10_000  # a short text gives what it has, never padding or repeats
