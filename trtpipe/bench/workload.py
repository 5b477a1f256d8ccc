"""Workloads: the exact list of requests a benchmark sends.

A workload is built up front from a seed, so two runs with the same arguments send identical
requests in the same order (prompts, input lengths and `max_tokens`).

Prompt lengths are counted the way the served model counts them: with its tokenizer (the
`tokenizer.json` its preprocessing model loads) and its `add_special_tokens` setting, so a
BOS token the server prepends is counted too; that count is what the engine compares with
`max_input_len`. Synthetic prompts of N tokens are built from whole words whose token costs
are known, so they come out at exactly N for every tokenizer whose merges stop at spaces
(byte-level BPE as in GPT-2, Llama 3 and Qwen; SentencePiece with Metaspace as in Llama 2 and
Mistral); each prompt is recounted whole, and `input_tokens` is always that recount.
Counting words instead (one word, one token: real BPE tokenizers count 10-30% more on English
text, and far more on other text) happens only when asked for; `token_counting` then says
"words".
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
    def parse(cls, text: str, *, option: str = "length") -> "LengthDist":
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


TokenCounting = Literal["tokenizer", "words"]


class ServerCountCheck(BaseModel):
    """The served preprocessing model's own count of some prompts, compared with the workload's."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="preprocessing", description="the served model that tokenized the prompts")
    prompts_checked: int = Field(description="prompts the server counted; each count equalled the workload's")
    max_input_len: int | None = Field(default=None, description="the served preprocessing model's max_input_len")
    prompts_over_max_input_len: int = Field(default=0, description="workload prompts longer than max_input_len")


class Workload(BaseModel):
    """The requests of a benchmark, in sending order, and how they were made."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="'synthetic' or the dataset path")
    seed: int
    input_len: str | None = None
    output_len: str
    token_counting: TokenCounting = Field(
        description="'tokenizer': prompt lengths in tokens of the served model's tokenizer; 'words': in words"
    )
    tokenizer: str | None = Field(default=None, description="the tokenizer.json that counted the prompts")
    add_special_tokens: bool | None = Field(
        default=None, description="whether the count includes the special tokens (BOS) the server adds"
    )
    server_check: ServerCountCheck | None = Field(
        default=None, description="the served model's own count of the first prompts (None: not checked)"
    )
    server_check_skipped: str | None = Field(default=None, description="why the counts were not checked by the server")
    requests: list[RequestSpec]


class TokenCounter(Protocol):
    """Counts tokens of text as the server will; the `tokenizers` adapter and the word counter follow it."""

    kind: TokenCounting

    def count(self, text: str) -> int:
        """Tokens the server counts for `text` as a whole prompt (special tokens included)."""
        ...

    def special_tokens(self) -> int:
        """Tokens the server adds to every prompt (a BOS token, say)."""
        ...

    def word_tokens(self, word: str, *, first: bool) -> int:
        """Tokens `word` adds to a prompt: as its first word, or after a space."""
        ...


class WordCounter:
    """One whitespace-separated word stands for one token (only when asked for: --token-counting words)."""

    kind: TokenCounting = "words"

    def count(self, text: str) -> int:
        return len(text.split())

    def special_tokens(self) -> int:
        return 0

    def word_tokens(self, word: str, *, first: bool) -> int:
        return 1


# A word every word-pool tokenizer cost is measured after: the cost of " w" depends on what precedes
# it for Metaspace (SentencePiece) tokenizers, which prefix only the first word.
_ANCHOR = "the"


class HfTokenizerCounter:
    """Counts with a Hugging Face `tokenizer.json` (the `tokenizers` library; no torch import), adding
    special tokens exactly when the served preprocessing model does (`add_special_tokens`)."""

    kind: TokenCounting = "tokenizer"

    def __init__(self, tokenizer_json: Path, *, add_special_tokens: bool = True) -> None:
        from tokenizers import Tokenizer

        self.path = tokenizer_json
        self.add_special_tokens = add_special_tokens
        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._costs: dict[tuple[str, bool], int] = {}
        self._anchor = self._bare(_ANCHOR)

    def _bare(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids)

    def special_tokens(self) -> int:
        return self.count("") if self.add_special_tokens else 0

    def word_tokens(self, word: str, *, first: bool) -> int:
        key = (word, first)
        if key not in self._costs:
            self._costs[key] = self._bare(word) if first else self._bare(f"{_ANCHOR} {word}") - self._anchor
        return self._costs[key]


def _sums_reachable(costs: set[int], limit: int) -> list[bool]:
    """reachable[r]: some sequence of words with these token costs adds up to exactly r tokens."""
    reachable = [True] + [False] * limit
    for total in range(1, limit + 1):
        reachable[total] = any(cost <= total and reachable[total - cost] for cost in costs)
    return reachable


def synthetic_prompt(n_tokens: int, rng: random.Random, counter: TokenCounter) -> tuple[str, int]:
    """A prompt of random pool words that `counter` counts as `n_tokens` (returns it and its recount).

    Each word is drawn among those whose token cost still lets the rest add up exactly (a small
    subset-sum table over the pool's costs), so the prompt meets the target whenever any sequence of
    pool words can; otherwise it takes the longest length below the target that can be met. At least
    one word is always sent, so a target below the special tokens' count comes out longer.
    """
    budget = max(1, n_tokens - counter.special_tokens())
    next_costs = {counter.word_tokens(word, first=False) for word in _WORDS} - {0}
    reachable = _sums_reachable(next_costs, budget)
    first_costs = {counter.word_tokens(word, first=True) for word in _WORDS} - {0}
    target = next((t for t in range(budget, 0, -1) if any(c <= t and reachable[t - c] for c in first_costs)), None)
    if target is None:  # even the cheapest first word is longer than asked
        target = min(first_costs)
        reachable = _sums_reachable(next_costs, target)
    words: list[str] = []
    left = target
    while left > 0:
        first = not words
        fitting = [
            word for word in _WORDS
            if 0 < (cost := counter.word_tokens(word, first=first)) <= left and reachable[left - cost]
        ]
        if not fitting:
            break
        word = rng.choice(fitting)
        words.append(word)
        left -= counter.word_tokens(word, first=first)
    text = " ".join(words)
    return text, counter.count(text)


def synthetic_workload(
    n_requests: int,
    input_len: LengthDist,
    output_len: LengthDist,
    *,
    seed: int = 0,
    counter: TokenCounter,
) -> Workload:
    """`n_requests` synthetic requests counted by `counter`; identical for identical arguments."""
    if n_requests < 1:
        raise UsageError(f"the number of requests must be at least 1, got {n_requests}")
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
        requests=requests,
        **counting_fields(counter),
    )


def counting_fields(counter: TokenCounter) -> dict:
    """What a workload records about how its prompts were counted."""
    if isinstance(counter, HfTokenizerCounter):
        return {"token_counting": "tokenizer", "tokenizer": str(counter.path), "add_special_tokens": counter.add_special_tokens}
    return {"token_counting": counter.kind}


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
        raise UsageError(f"dataset {path} does not exist", fix="give a JSONL file with one {\"prompt\": ...} per line")
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
            f"dataset {path} has no usable prompt",
            fix='each line needs "prompt" or ShareGPT "conversations" with a human turn',
        )
    return prompts


def dataset_workload(
    path: Path,
    n_requests: int,
    output_len: LengthDist,
    *,
    seed: int = 0,
    counter: TokenCounter,
) -> Workload:
    """`n_requests` prompts drawn from a JSONL file (shuffled with `seed`, cycled if the file is short),
    each counted by `counter`."""
    if n_requests < 1:
        raise UsageError(f"the number of requests must be at least 1, got {n_requests}")
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
        requests=requests,
        **counting_fields(counter),
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


def split_warmup(workload: Workload, count: int) -> tuple[list[RequestSpec], Workload]:
    """(the first `count` requests, as warm-up; the workload of the rest, numbered from 0). Made from one
    workload of requests + warm-ups, so every warm-up prompt is its own (a repeated prompt could be
    served from a prefix cache and flatter the measured request)."""
    if count < 0 or count >= len(workload.requests):
        raise UsageError(f"cannot take {count} warm-up request(s) from a workload of {len(workload.requests)}")
    warm = workload.requests[:count]
    rest = [spec.model_copy(update={"index": i}) for i, spec in enumerate(workload.requests[count:])]
    return warm, workload.model_copy(update={"requests": rest})
