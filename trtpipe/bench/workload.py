"""Workloads: the exact list of requests a benchmark sends.

A workload is built up front from a seed, so two runs with the same arguments send identical
requests in the same order (prompts, input lengths and `max_tokens`).

Synthetic prompts of N tokens: when the served tokenizer is available (a `tokenizer.json`
inside the model repository, or a tokenizer directory given explicitly) prompts are made of
random words and trimmed until the tokenizer counts exactly N tokens (or the closest it can
get: a few tokenizers merge across the cut). Without a tokenizer, one word stands for one
token, an approximation that real BPE tokenizers exceed by 10-30% on English text; the
recorded `input_tokens` then says "words", and the JSON marks `token_counting: "words"`.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import UsageError

# A fixed word pool keeps synthetic prompts readable and deterministic for a given seed.
_WORDS = (
    "the model serves tokens over a stream while the client measures latency and throughput "
    "engine kernel batch cache memory request response server queue prefill decode layer "
    "attention weight tensor graph plugin build spec artifact digest channel promote release "
    "river mountain window garden light paper music story number table window morning evening "
    "simple quick bright quiet green yellow careful honest gentle strong small large early late"
).split()


class LengthDist(BaseModel):
    """A distribution of token counts: fixed, uniform (inclusive bounds) or normal (mean, stddev).

    Parsed from `"128"`, `"fixed:128"`, `"uniform:64,256"` or `"normal:128,32"`.
    Draws are rounded and clipped to at least `minimum` (1).
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fixed", "uniform", "normal"]
    a: float
    b: float = 0.0
    minimum: int = 1

    @classmethod
    def parse(cls, text: str, *, option: str = "--input-len") -> "LengthDist":
        raw = text.strip().lower()
        fix = f"write {option} as 128, uniform:64,256 or normal:128,32"
        kind, _, params = raw.partition(":") if ":" in raw else ("fixed", "", raw)
        try:
            numbers = [float(p) for p in params.split(",") if p.strip()]
        except ValueError:
            raise UsageError(f"{option}: cannot read {text!r} as a length distribution", fix=fix) from None
        expected = {"fixed": 1, "uniform": 2, "normal": 2}
        if kind not in expected or len(numbers) != expected[kind]:
            raise UsageError(f"{option}: cannot read {text!r} as a length distribution", fix=fix)
        if any(n < 0 or not math.isfinite(n) for n in numbers):
            raise UsageError(f"{option}: lengths must be finite and non-negative, got {text!r}", fix=fix)
        if kind == "fixed" and numbers[0] < 1:
            raise UsageError(f"{option}: a length must be at least 1, got {text!r}", fix=fix)
        if kind == "uniform" and (numbers[0] > numbers[1] or numbers[1] < 1):
            raise UsageError(f"{option}: uniform needs low <= high and high >= 1, got {text!r}", fix=fix)
        if kind == "normal" and numbers[0] < 1:
            raise UsageError(f"{option}: the mean must be at least 1, got {text!r}", fix=fix)
        return cls(kind=kind, a=numbers[0], b=numbers[1] if len(numbers) > 1 else 0.0)

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(round(self.a)), int(round(self.b)))
        else:
            value = rng.gauss(self.a, self.b)
        return max(self.minimum, int(round(value)))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)},{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"


class RequestSpec(BaseModel):
    """One request of a workload: what is sent, and what the reply should contain."""

    model_config = ConfigDict(extra="forbid")

    index: int
    prompt: str
    input_tokens: int = Field(description="prompt length as counted by the workload's tokenizer (or words)")
    max_tokens: int = Field(description="output length asked for through max_tokens")


class Workload(BaseModel):
    """The requests of a benchmark, in sending order, and how they were made."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="'synthetic' or the dataset path")
    seed: int
    input_len: str | None = None
    output_len: str
    token_counting: Literal["tokenizer", "words"]
    requests: list[RequestSpec]


class TokenCounter(Protocol):
    """Counts and trims tokens of text; the `tokenizers.Tokenizer` adapter and the word counter follow it."""

    kind: Literal["tokenizer", "words"]

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, n_tokens: int) -> str: ...


class WordCounter:
    """One whitespace-separated word stands for one token (used when no tokenizer is available)."""

    kind: Literal["tokenizer", "words"] = "words"

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, n_tokens: int) -> str:
        return " ".join(text.split()[:n_tokens])


class HfTokenizerCounter:
    """Counts with a Hugging Face `tokenizer.json` (the `tokenizers` library; no torch import)."""

    kind: Literal["tokenizer", "words"] = "tokenizer"

    def __init__(self, tokenizer_json: Path) -> None:
        from tokenizers import Tokenizer

        self.path = tokenizer_json
        self._tok = Tokenizer.from_file(str(tokenizer_json))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, n_tokens: int) -> str:
        ids = self._tok.encode(text, add_special_tokens=False).ids[:n_tokens]
        return self._tok.decode(ids, skip_special_tokens=True)


def find_tokenizer(path: Path) -> Path | None:
    """The `tokenizer.json` inside a tokenizer dir or a published model repository, if any.

    Searches at most four levels deep, in sorted order so the choice is stable.
    """
    if path.is_file() and path.name == "tokenizer.json":
        return path
    if not path.is_dir():
        return None
    for depth in range(0, 5):
        pattern = "/".join(["*"] * depth + ["tokenizer.json"])
        found = sorted(path.glob(pattern))
        if found:
            return found[0]
    return None


def make_counter(tokenizer: Path | None) -> TokenCounter:
    """A tokenizer-based counter when a `tokenizer.json` is found under `tokenizer`, else words."""
    if tokenizer is not None:
        found = find_tokenizer(tokenizer)
        if found is not None:
            return HfTokenizerCounter(found)
    return WordCounter()


def synthetic_prompt(n_tokens: int, rng: random.Random, counter: TokenCounter) -> tuple[str, int]:
    """A prompt of random words that `counter` counts as `n_tokens` (returns the prompt and its count)."""
    words = [rng.choice(_WORDS) for _ in range(n_tokens)]
    text = " ".join(words)
    if counter.kind == "words":
        return text, n_tokens
    # Every word is at least one token, so n words give >= n tokens; trim to exactly n.
    trimmed = counter.truncate(text, n_tokens)
    count = counter.count(trimmed)
    # Decoding then re-encoding can merge or split at the cut; nudge by words a few times.
    for _ in range(8):
        if count == n_tokens:
            break
        if count > n_tokens:
            trimmed = counter.truncate(trimmed, max(1, n_tokens - (count - n_tokens)))
        else:
            trimmed = f"{trimmed} {rng.choice(_WORDS)}"
            trimmed = counter.truncate(trimmed, n_tokens)
        count = counter.count(trimmed)
    return trimmed, count


def synthetic_workload(
    n_requests: int,
    input_len: LengthDist,
    output_len: LengthDist,
    *,
    seed: int = 0,
    counter: TokenCounter | None = None,
) -> Workload:
    """`n_requests` synthetic requests; identical for identical arguments."""
    if n_requests < 1:
        raise UsageError(f"--requests must be at least 1, got {n_requests}")
    counter = counter or WordCounter()
    rng = random.Random(seed)
    requests = []
    for index in range(n_requests):
        want_in = input_len.draw(rng)
        want_out = output_len.draw(rng)
        prompt, got_in = synthetic_prompt(want_in, rng, counter)
        requests.append(RequestSpec(index=index, prompt=prompt, input_tokens=got_in, max_tokens=want_out))
    return Workload(
        source="synthetic",
        seed=seed,
        input_len=input_len.describe(),
        output_len=output_len.describe(),
        token_counting=counter.kind,
        requests=requests,
    )


def _prompt_of(record: object) -> str | None:
    """The prompt of one JSONL record: {"prompt"|"text_input"|"text": ...} or ShareGPT conversations."""
    if not isinstance(record, dict):
        return None
    for key in ("prompt", "text_input", "text"):
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value
    turns = record.get("conversations") or record.get("conversation")
    if isinstance(turns, list):
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            speaker = str(turn.get("from", turn.get("role", ""))).lower()
            value = turn.get("value", turn.get("content"))
            if speaker in ("human", "user") and isinstance(value, str) and value.strip():
                return value  # the first human turn is the prompt, as in vLLM's ShareGPT loader
    return None


def load_dataset_prompts(path: Path) -> list[str]:
    """Every usable prompt of a JSONL file, in file order (a line without a prompt is skipped)."""
    if not path.is_file():
        raise UsageError(f"--dataset: {path} does not exist", fix="pass a JSONL file with one {\"prompt\": ...} per line")
    prompts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(
                    f"{path}:{line_no}: not valid JSON ({err.msg})",
                    fix='write one JSON object per line, e.g. {"prompt": "..."}',
                ) from None
            prompt = _prompt_of(record)
            if prompt is not None:
                prompts.append(prompt)
    if not prompts:
        raise UsageError(
            f"--dataset: {path} has no usable prompt",
            fix='each line needs "prompt" or ShareGPT "conversations" with a human turn',
        )
    return prompts


def dataset_workload(
    path: Path,
    n_requests: int,
    output_len: LengthDist,
    *,
    seed: int = 0,
    counter: TokenCounter | None = None,
) -> Workload:
    """`n_requests` prompts drawn from a JSONL file (shuffled with `seed`, cycled if the file is short)."""
    if n_requests < 1:
        raise UsageError(f"--requests must be at least 1, got {n_requests}")
    counter = counter or WordCounter()
    prompts = load_dataset_prompts(path)
    rng = random.Random(seed)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    requests = []
    for index in range(n_requests):
        prompt = prompts[order[index % len(order)]]
        requests.append(
            RequestSpec(
                index=index,
                prompt=prompt,
                input_tokens=counter.count(prompt),
                max_tokens=output_len.draw(rng),
            )
        )
    return Workload(
        source=str(path),
        seed=seed,
        input_len=None,
        output_len=output_len.describe(),
        token_counting=counter.kind,
        requests=requests,
    )


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|m)?\s*$")


def parse_duration_s(text: str, *, option: str) -> float:
    """Seconds from "500ms", "2s", "1.5", "250us" or "1m" (bare numbers are seconds)."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"{option}: cannot read {text!r} as a duration", fix="write it like 500ms, 2s or 1m")
    value = float(match.group(1))
    unit = match.group(2) or "s"
    return value * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]
