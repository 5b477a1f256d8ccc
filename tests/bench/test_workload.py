"""Workloads: seeded, exact lengths, datasets (plain and ShareGPT)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from trtpipe.bench.workload import (
    LengthDist,
    WordCounter,
    dataset_workload,
    make_counter,
    parse_duration_s,
    synthetic_workload,
)
from trtpipe.errors import UsageError


def test_length_dist_parsing_and_bounds() -> None:
    assert LengthDist.parse("128").kind == "fixed"
    uni = LengthDist.parse("uniform:4,9")
    rng = random.Random(1)
    draws = [uni.draw(rng) for _ in range(500)]
    assert min(draws) == 4 and max(draws) == 9
    normal = LengthDist.parse("normal:3,10")
    assert min(normal.draw(rng) for _ in range(500)) >= 1  # clipped to at least one token
    for bad in ("", "uniform:9,4", "normal:5", "gamma:1,2", "0", "abc"):
        with pytest.raises(UsageError):
            LengthDist.parse(bad)


def test_seeded_synthetic_workloads_are_identical() -> None:
    args = (20, LengthDist.parse("uniform:3,40"), LengthDist.parse("normal:8,3"))
    first = synthetic_workload(*args, seed=7)
    second = synthetic_workload(*args, seed=7)
    other = synthetic_workload(*args, seed=8)
    assert first.model_dump() == second.model_dump()
    assert first.model_dump() != other.model_dump()
    for spec in first.requests:
        assert len(spec.prompt.split()) == spec.input_tokens  # word counting: one word, one token
        assert 3 <= spec.input_tokens <= 40


def test_tokenizer_counting_gives_exact_lengths(bpe_tokenizer_dir: Path) -> None:
    counter = make_counter(bpe_tokenizer_dir)
    assert counter.kind == "tokenizer"
    workload = synthetic_workload(15, LengthDist.parse("uniform:5,60"), LengthDist.parse("4"), seed=3, counter=counter)
    assert workload.token_counting == "tokenizer"
    exact = sum(1 for spec in workload.requests if counter.count(spec.prompt) == spec.input_tokens)
    assert exact == len(workload.requests)
    assert all(spec.max_tokens == 4 for spec in workload.requests)


def test_missing_tokenizer_falls_back_to_words(tmp_path: Path) -> None:
    assert isinstance(make_counter(tmp_path), WordCounter)
    assert isinstance(make_counter(None), WordCounter)


def test_dataset_plain_and_sharegpt(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = [
        {"prompt": "tell me a story"},
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "what is a kernel"},
                           {"from": "gpt", "value": "a function"}]},
        {"unrelated": 1},
        {"text_input": "hello there"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    workload = dataset_workload(path, 7, LengthDist.parse("5"), seed=1)
    prompts = {spec.prompt for spec in workload.requests}
    assert prompts == {"tell me a story", "what is a kernel", "hello there"}
    assert len(workload.requests) == 7  # cycled
    assert workload.model_dump() == dataset_workload(path, 7, LengthDist.parse("5"), seed=1).model_dump()


def test_dataset_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        dataset_workload(bad, 1, LengthDist.parse("5"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"x": 1}\n')
    with pytest.raises(UsageError, match="no usable prompt"):
        dataset_workload(empty, 1, LengthDist.parse("5"))
    with pytest.raises(UsageError, match="does not exist"):
        dataset_workload(tmp_path / "nope.jsonl", 1, LengthDist.parse("5"))


def test_parse_duration() -> None:
    assert parse_duration_s("500ms", option="x") == pytest.approx(0.5)
    assert parse_duration_s("2", option="x") == 2.0
    assert parse_duration_s("1m", option="x") == 60.0
    with pytest.raises(UsageError):
        parse_duration_s("soon", option="x")
