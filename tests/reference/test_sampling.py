"""Generation controls of the reference runtime: seeds, top-k, top-p, stop words, end id, bad words."""

from __future__ import annotations

import pytest
import torch

from trtpipe.errors import UsageError
from trtpipe.reference.runtime import ReferenceModel
from trtpipe.reference.sampling import filter_logits

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def model(converted) -> ReferenceModel:
    return ReferenceModel.load(converted("llama", "none"))


def _tokens(model: ReferenceModel, prompt: list[int], **kwargs) -> list[int]:
    return [t.token_id for t in model.generate(prompt, **kwargs)]


def test_same_seed_same_tokens_different_seeds_differ(model, prompts):
    kwargs = dict(max_new_tokens=16, temperature=1.5, top_k=0, top_p=1.0)
    first = _tokens(model, prompts[0], seed=7, **kwargs)
    assert len(first) == 16
    assert _tokens(model, prompts[0], seed=7, **kwargs) == first
    others = {tuple(_tokens(model, prompts[0], seed=seed, **kwargs)) for seed in (8, 9, 10)}
    assert any(o != tuple(first) for o in others)


def test_greedy_is_argmax_and_ignores_seed(model, prompts):
    prompt = prompts[1]
    greedy = _tokens(model, prompt, max_new_tokens=8, seed=1)
    assert greedy == _tokens(model, prompt, max_new_tokens=8, seed=2)
    assert greedy == _tokens(model, prompt, max_new_tokens=8, temperature=0.0, top_k=50, seed=3)
    assert greedy[0] == int(model.logits(prompt)[-1].argmax())


def _rank_of_choices(model, prompt, tokens):
    """For each generated token, its rank among the model's logits at that step (0 = most likely)."""
    ranks, context = [], list(prompt)
    for token in tokens:
        logits = model.logits(context)[-1]
        ranks.append(int((logits > logits[token]).sum()))
        context.append(token)
    return ranks


def test_top_k_is_honoured(model, prompts):
    tokens = []
    for seed in range(4):
        out = _tokens(model, prompts[2], max_new_tokens=6, temperature=2.0, top_k=3, seed=seed)
        assert max(_rank_of_choices(model, prompts[2], out)) < 3
        tokens.append(out)
    # With a hot temperature, top_k=3 really samples (not always the argmax).
    assert any(r > 0 for out in tokens for r in _rank_of_choices(model, prompts[2], out))


def test_top_p_is_honoured(model, prompts):
    prompt = prompts[3]
    for seed in range(4):
        out = _tokens(model, prompt, max_new_tokens=6, temperature=1.0, top_k=0, top_p=0.5, seed=seed)
        context = list(prompt)
        for token in out:
            probs = torch.softmax(model.logits(context)[-1], dim=-1)
            # The token must lie inside the nucleus: the mass of strictly more likely tokens is below top_p.
            assert float(probs[probs > probs[token]].sum()) < 0.5
            context.append(token)


def test_filter_logits_nucleus_and_top_k():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, 1.0, 0, 0.7))
    assert kept.tolist() == [True, True, False, False]
    kept = torch.isfinite(filter_logits(logits, 1.0, 1, 1.0))
    assert kept.tolist() == [True, False, False, False]
    kept = torch.isfinite(filter_logits(logits, 1.0, 0, 0.5))  # the top token alone reaches 0.5
    assert kept.tolist() == [True, False, False, False]


def test_stop_words_end_generation_and_are_included(model, prompts):
    prompt = prompts[0]
    greedy = _tokens(model, prompt, max_new_tokens=12)
    stop = greedy[3:5]
    out = _tokens(model, prompt, max_new_tokens=12, stop_words_ids=[[999_999], stop])
    first = next(i for i in range(len(greedy) - 1) if greedy[i : i + 2] == stop)
    assert out == greedy[: first + 2]
    assert out[-2:] == stop


def test_end_id_stops_without_emitting_it(model, prompts):
    prompt = prompts[4]
    greedy = _tokens(model, prompt, max_new_tokens=10)
    end = greedy[4]
    first = greedy.index(end)
    assert _tokens(model, prompt, max_new_tokens=10, end_id=end) == greedy[:first]


def test_bad_words_are_never_completed(model, prompts):
    prompt = prompts[5]
    greedy = _tokens(model, prompt, max_new_tokens=6)
    out = _tokens(model, prompt, max_new_tokens=6, bad_words_ids=[[greedy[0]]])
    assert out[0] != greedy[0]
    assert greedy[0] not in out
    # A two-token banned sequence: its last token is forbidden only right after its first.
    out2 = _tokens(model, prompt, max_new_tokens=6, bad_words_ids=[[prompt[-1], greedy[0]]])
    assert out2[0] != greedy[0]


def test_max_new_tokens_and_logprobs(model, prompts):
    out = list(model.generate(prompts[0], max_new_tokens=5))
    assert len(out) == 5
    assert all(t.logprob <= 0.0 for t in out)
    assert list(model.generate(prompts[0], max_new_tokens=0)) == []


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(max_new_tokens=-1)],
)
def test_bad_sampling_arguments_are_refused(model, prompts, kwargs):
    args = dict(max_new_tokens=2) | kwargs
    with pytest.raises(UsageError):
        list(model.generate(prompts[0], **args))


def test_out_of_vocab_token_is_refused(model):
    with pytest.raises(UsageError, match="token id"):
        model.logits([model.config.vocab_size])
