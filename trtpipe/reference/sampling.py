"""Token selection for the reference runtime: greedy, temperature / top-k / top-p sampling, bad and stop words.

Conventions follow TensorRT-LLM's sampling config: top_k == 1 (or temperature == 0) is greedy, top_k == 0
means "no top-k limit", top_p == 1.0 means "no nucleus limit". A seed drives a private `torch.Generator`, so
one seed always gives the same tokens and no global random state is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

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
) -> tuple[int, float]:
    """Pick the next token from float32 [vocab] logits; returns (token id, its log-probability).

    The log-probability is taken under the model's full distribution (log-softmax of the raw logits,
    after bad-word masking), not the truncated sampling distribution.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    if is_greedy(temperature, top_k):
        token = int(torch.argmax(logits))
    else:
        probs = torch.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(log_probs[token])
