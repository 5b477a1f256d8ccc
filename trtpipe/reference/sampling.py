"""Token selection for the reference runtime: greedy, temperature / top-k / top-p sampling, bad and stop words,
repetition / presence / frequency penalties and min_tokens.

Conventions follow TensorRT-LLM's sampling config: top_k == 1 (or temperature == 0) is greedy, top_k == 0
means "no top-k limit", top_p == 1.0 means "no nucleus limit". A seed drives a private `torch.Generator`, so
one seed always gives the same tokens and no global random state is touched.

Penalties are TensorRT-LLM's, as its engine path applies them (cpp/tensorrt_llm/kernels/penaltyKernels.cu,
`batchApplyPenalty`, line 40 on, read at NVIDIA/TensorRT-LLM 249d93d551e8):
- occurrences are counted over the prompt AND the generated tokens (the context phase counts the input ids, each
  generation step adds the last token);
- per token, in this order: temperature (logit * 1/(T + 1e-6), only when T != 1), then for a token seen at least
  once: repetition (logit * p if logit < 0 else logit / p), presence (logit - p), frequency (logit - p * count);
- min_tokens: while fewer than min_tokens tokens were generated, end_id's logit is the lowest value (never chosen).
Limits, as SamplingConfig checks them (cpp/tensorrt_llm/executor/samplingConfig.cpp, checkRepetitionPenalty,
checkMinTokens, checkBeamWidth): repetition_penalty > 0, min_tokens >= 0, beam_width >= 1; presence and frequency
penalties take any value.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtpipe.errors import UsageError


def is_greedy(temperature: float, top_k: int) -> bool:
    return top_k == 1 or temperature == 0.0


def check_sampling_args(temperature: float, top_k: int, top_p: float) -> None:
    """Refuse settings that have no meaning, with the field named."""
    if temperature < 0.0:
        raise UsageError(f"temperature {temperature} is negative", fix="use 0 (greedy) or a positive value")
    if top_k < 0:
        raise UsageError(f"top_k {top_k} is negative", fix="use 0 (no limit), 1 (greedy) or a positive count")
    if not 0.0 < top_p <= 1.0:
        raise UsageError(f"top_p {top_p} is outside (0, 1]", fix="use a value in (0, 1]; 1.0 disables nucleus sampling")


@dataclass(frozen=True)
class Penalties:
    """TensorRT-LLM's repetition, presence and frequency penalties (1.0, 0.0, 0.0: off)."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0


def check_penalty_args(penalties: Penalties, min_tokens: int) -> None:
    """Refuse what TensorRT-LLM's SamplingConfig refuses, with the field named."""
    for name, value in (("repetition_penalty", penalties.repetition), ("presence_penalty", penalties.presence),
                        ("frequency_penalty", penalties.frequency)):
        if not math.isfinite(value):
            raise UsageError(f"{name} {value} is not a finite number", fix="send a finite value")
    if penalties.repetition <= 0.0:
        raise UsageError(f"repetition_penalty {penalties.repetition} must be greater than 0",
                         fix="use 1.0 (off) or a positive value; above 1 discourages repeats")
    if min_tokens < 0:
        raise UsageError(f"min_tokens {min_tokens} is negative", fix="use 0 (off) or a positive count")


def apply_temperature_and_penalties(
    logits: torch.Tensor, counts: Counter[int], temperature: float, penalties: Penalties
) -> torch.Tensor:
    """A new float32 [vocab] tensor: `logits` scaled by temperature, then penalised as TensorRT-LLM does.

    `counts` maps a token id to how often it occurs in the prompt plus the generated tokens.
    """
    out = logits.clone()
    if temperature != 1.0:
        out = out * (1.0 / (temperature + 1e-6))
    if penalties.active and counts:
        ids = torch.tensor([t for t in counts if 0 <= t < out.shape[-1]], dtype=torch.long)
        if ids.numel():
            seen = out[ids]
            if penalties.repetition != 1.0:
                seen = torch.where(seen < 0, seen * penalties.repetition, seen / penalties.repetition)
            seen = seen - penalties.presence
            seen = seen - penalties.frequency * torch.tensor([counts[int(t)] for t in ids], dtype=out.dtype)
            out[ids] = seen
    return out


def ban_end_before_min_tokens(logits: torch.Tensor, end_id: int | None, generated: int, min_tokens: int) -> None:
    """In place: the end token cannot be chosen while fewer than `min_tokens` tokens were generated."""
    if end_id is not None and generated < min_tokens and 0 <= end_id < logits.shape[-1]:
        logits[end_id] = float("-inf")


def ban_bad_words(logits: torch.Tensor, context: Sequence[int], bad_words_ids: Sequence[Sequence[int]]) -> None:
    """In place: forbid the token that would complete any banned sequence given the current context."""
    for banned in bad_words_ids:
        if not banned:
            continue
        prefix = list(banned[:-1])
        if not prefix or list(context[len(context) - len(prefix) :]) == prefix:
            if 0 <= banned[-1] < logits.shape[-1]:
                logits[banned[-1]] = float("-inf")


def ends_with_stop(context: Sequence[int], stop_words_ids: Sequence[Sequence[int]]) -> bool:
    """True when the context ends with one of the stop sequences."""
    for stop in stop_words_ids:
        if stop and len(context) >= len(stop) and list(context[-len(stop) :]) == list(stop):
            return True
    return False


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature-scaled logits with everything outside top-k and the top-p nucleus set to -inf."""
    scaled = logits / temperature
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = torch.where(scaled < kth, torch.full_like(scaled, float("-inf")), scaled)
    if top_p < 1.0:
        order = torch.argsort(scaled, descending=True)
        probs = torch.softmax(scaled[order], dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it
        # already reaches top_p. The most likely token is always kept.
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= top_p
        drop[0] = False
        scaled = scaled.clone()
        scaled[order[drop]] = float("-inf")
    return scaled


def choose_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator,
    counts: Counter[int] | None = None,
    penalties: Penalties = Penalties(),
) -> tuple[int, float]:
    """Pick the next token from float32 [vocab] logits; returns (token id, its log-probability).

    `logits` already carry the bad-word and min_tokens masks. The choice is made on the logits scaled by
    temperature and then penalised (TensorRT-LLM's order); greedy takes their argmax. The log-probability is
    taken under the penalised distribution at temperature 1 (log-softmax over the whole vocabulary), not the
    truncated top-k / top-p sampling distribution. With temperature 0 (greedy) the penalties act on the
    unscaled logits (TensorRT-LLM would scale by 1/1e-6 first, which makes additive penalties negligible).
    """
    counts = counts if counts is not None else Counter()
    scored = apply_temperature_and_penalties(logits, counts, 1.0, penalties)
    log_probs = torch.log_softmax(scored, dim=-1)
    if temperature in (0.0, 1.0):
        decision = scored
    else:
        decision = apply_temperature_and_penalties(logits, counts, temperature, penalties)
    if is_greedy(temperature, top_k):
        token = int(torch.argmax(decision))
    else:
        probs = torch.softmax(filter_logits(decision, 1.0, top_k, top_p), dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(log_probs[token])
