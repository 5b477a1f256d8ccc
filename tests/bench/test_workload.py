"""Workloads: seeded, exact lengths, datasets (plain and ShareGPT)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from trtpipe.commands.bench import token_counter as counter_for
from trtpipe.bench.workload import (
    HfTokenizerCounter,
    LengthDist,
    WordCounter,
    dataset_workload,
    parse_duration_s,
    synthetic_prompt,
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
    first = synthetic_workload(*args, seed=7, counter=WordCounter())
    second = synthetic_workload(*args, seed=7, counter=WordCounter())
    other = synthetic_workload(*args, seed=8, counter=WordCounter())
    assert first.model_dump() == second.model_dump()
    assert first.model_dump() != other.model_dump()
    assert first.token_counting == "words" and first.tokenizer is None
    for spec in first.requests:
        assert len(spec.prompt.split()) == spec.input_tokens  # word counting: one word, one token
        assert 3 <= spec.input_tokens <= 40


def test_tokenizer_counting_gives_exact_lengths(bpe_tokenizer_dir: Path) -> None:
    counter = HfTokenizerCounter(bpe_tokenizer_dir / "tokenizer.json")
    assert counter.special_tokens() == 0  # this tokenizer has no post-processor: nothing is added
    workload = synthetic_workload(15, LengthDist.parse("uniform:5,60"), LengthDist.parse("4"), seed=3, counter=counter)
    assert workload.token_counting == "tokenizer" and workload.tokenizer == str(bpe_tokenizer_dir / "tokenizer.json")
    assert all(counter.count(spec.prompt) == spec.input_tokens for spec in workload.requests)
    assert all(5 <= spec.input_tokens <= 60 and spec.max_tokens == 4 for spec in workload.requests)
    rng = random.Random(4)
    for n in range(1, 200):
        prompt, count = synthetic_prompt(n, rng, counter)
        assert count == n == counter.count(prompt), (n, prompt)


def test_exact_lengths_include_the_bos_the_server_adds(tiny_llama_dir: Path) -> None:
    """The example model's tokenizer prepends BOS, as the served preprocessing model does (add_special_tokens):
    the count is the engine's input length, BOS included; without special tokens it is one less."""
    with_bos = HfTokenizerCounter(tiny_llama_dir / "tokenizer.json", add_special_tokens=True)
    without = HfTokenizerCounter(tiny_llama_dir / "tokenizer.json", add_special_tokens=False)
    assert with_bos.special_tokens() == 1 and without.special_tokens() == 0
    rng = random.Random(9)
    for n in range(2, 300, 7):
        prompt, count = synthetic_prompt(n, rng, with_bos)
        assert count == n and without.count(prompt) == n - 1, (n, prompt)
    prompt, count = synthetic_prompt(1, rng, with_bos)  # BOS alone is no prompt: one word is always sent
    assert count == 2 and len(prompt.split()) == 1


UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: the server's parameters are simply not available


def test_no_tokenizer_is_a_one_line_error_naming_the_ways_to_give_one() -> None:
    with pytest.raises(UsageError) as info:
        counter_for("tokenizer", None, None, UNREACHABLE)
    line = info.value.one_line()
    assert "\n" not in line and "--tokenizer" in line and "--record" in line and "--token-counting words" in line
    counter, served, _ = counter_for("words", None, None, UNREACHABLE)  # words only when asked for
    assert isinstance(counter, WordCounter) and served is None
    with pytest.raises(UsageError, match="--token-counting must be tokenizer or words"):
        counter_for("bytes", None, None, UNREACHABLE)


def test_tokenizer_from_a_repository_is_its_preprocessing_models(tmp_path: Path, bpe_tokenizer_dir: Path, tiny_llama_dir: Path) -> None:
    """In a model repository the tokenizer is the one preprocessing/config.pbtxt names, counted with its
    add_special_tokens; another tokenizer lying elsewhere in the repository is not picked."""
    import shutil

    repo = tmp_path / "repo"
    (repo / "postprocessing" / "tokenizer").mkdir(parents=True)
    shutil.copy(bpe_tokenizer_dir / "tokenizer.json", repo / "postprocessing" / "tokenizer" / "tokenizer.json")
    (repo / "preprocessing" / "tok").mkdir(parents=True)
    shutil.copy(tiny_llama_dir / "tokenizer.json", repo / "preprocessing" / "tok" / "tokenizer.json")
    config = repo / "preprocessing" / "config.pbtxt"
    config.write_text(
        'name: "preprocessing"\nbackend: "python"\n'
        'parameters { key: "tokenizer_dir" value: { string_value: "tok" } }\n'
        'parameters { key: "add_special_tokens" value: { string_value: "false" } }\n'
    )
    counter, served, reason = counter_for("tokenizer", None, repo, UNREACHABLE)
    assert isinstance(counter, HfTokenizerCounter) and served is None and reason
    assert counter.path == repo / "preprocessing" / "tok" / "tokenizer.json" and counter.add_special_tokens is False
    counter, _, _ = counter_for("tokenizer", tiny_llama_dir, repo, UNREACHABLE)  # --tokenizer wins over --record
    assert counter.path == tiny_llama_dir / "tokenizer.json" and counter.add_special_tokens is True  # server default
    config.write_text(config.read_text().replace('"tok"', '"../../outside"'))
    with pytest.raises(UsageError, match="leaves the model directory"):
        counter_for("tokenizer", None, repo, UNREACHABLE)
    with pytest.raises(UsageError, match="neither a model repository"):
        counter_for("tokenizer", tmp_path / "empty", None, UNREACHABLE)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(UsageError, match=r"--tokenizer: cannot load .*broken/tokenizer.json"):
        counter_for("tokenizer", broken, None, UNREACHABLE)


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
    workload = dataset_workload(path, 7, LengthDist.parse("5"), seed=1, counter=WordCounter())
    prompts = {spec.prompt for spec in workload.requests}
    assert prompts == {"tell me a story", "what is a kernel", "hello there"}
    assert len(workload.requests) == 7  # cycled
    assert workload.model_dump() == dataset_workload(path, 7, LengthDist.parse("5"), seed=1, counter=WordCounter()).model_dump()


def test_dataset_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        dataset_workload(bad, 1, LengthDist.parse("5"), counter=WordCounter())
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"x": 1}\n')
    with pytest.raises(UsageError, match="no usable prompt"):
        dataset_workload(empty, 1, LengthDist.parse("5"), counter=WordCounter())
    with pytest.raises(UsageError, match="does not exist"):
        dataset_workload(tmp_path / "nope.jsonl", 1, LengthDist.parse("5"), counter=WordCounter())


def test_parse_duration() -> None:
    assert parse_duration_s("500ms", option="x") == pytest.approx(0.5)
    assert parse_duration_s("2", option="x") == 2.0
    assert parse_duration_s("1m", option="x") == 60.0
    with pytest.raises(UsageError):
        parse_duration_s("soon", option="x")
