"""Gates that noise cannot flip: the regression gate under injected noise, following its own advice.

The noise model (stated; docs/release.md "Gates that noise cannot flip"): one bench run's P99 TTFT is its digest's
true figure times exp(e), e = 0.35 * Z + (with probability 0.2) log U, Z standard normal, U uniform on [1, 6]:
a log-normal spread plus stalls of a loaded machine of up to 6x. Calibrated on what was seen: the issue saw one
24-request run's P99 swing 6x on a loaded 2-core host (this model: a median max/min of 6.9x over 10 runs) and 4 of
10 interleaved pairs past 2x; 30 interleaved pairs measured here (tiny Llama on cpu-reference, closed loop,
concurrency 2, 24 requests) gave a log-spread of 0.33-0.39 and 4 of 30 pairs past 2x (this model: 19 %).

The gate's error rates under it (bench_stats' Mann-Whitney bounds, 95 % each side, tolerance 2x), following the
gate's advice on how many runs to add: an equal candidate ends passed 99.9 % of the time, a 3x slower one ends
refused 99.3 % of the time (docs/release.md's table, `scripts/gate_noise_model.py`: simulated from this model, not from
these seeds).
So 20 seeded reruns: >= 19 passes expected of the equal one, 20 refusals of the 3x one.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from trtpipe.errors import GateRefused
from trtpipe.release.audit import read_audit
from trtpipe.release.bench_stats import bound_rank, mann_whitney_counts, shift
from trtpipe.release.promote import PromoteRequest, promote
from trtpipe.results import ResultsLog
from trtpipe.settings import Settings
from trtpipe.workspace import Workspace

pytestmark = pytest.mark.timeout(900)

SIGMA, STALL_P, STALL_MAX = 0.35, 0.2, 6.0
TRUE_TTFT_MS = 30.0
GATES = {"prod": {"smoke": True, "max_regression_pct": 100}}  # the walk-through's prod tolerance: 2x
CAP = 40  # runs of each digest a rerun may record before it counts as undecided (not passed)


def noisy_p99(rng: random.Random, true_ms: float) -> float:
    e = rng.gauss(0.0, SIGMA)
    if rng.random() < STALL_P:
        e += math.log(rng.uniform(1.0, STALL_MAX))
    return true_ms * math.exp(e)


def record_runs(home: Path, digest: str, rng: random.Random, true_ms: float, count: int) -> None:
    log = ResultsLog(home)
    for _ in range(count):
        log.record(digest, "bench", True, {"ttft_p99_ms": noisy_p99(rng, true_ms)}, gpu_class="cpu-reference")


def rerun(home: Path, store_entry: Any, seed: int, slowdown: float) -> tuple[str, int, dict[str, str], random.Random]:
    """One seeded rerun: the incumbent in prod with 3 runs, the candidate with 3, then as the gate advises."""
    rng = random.Random(seed)
    incumbent = store_entry(home, "1c" * 8, seed=f"i{seed}", gates=GATES).digest
    candidate = store_entry(home, "2c" * 8, seed=f"c{seed}", gates=GATES).digest
    for digest in (incumbent, candidate):
        ResultsLog(home).record(digest, "smoke", True, {})
    record_runs(home, incumbent, rng, TRUE_TTFT_MS, 3)
    assert promote(Workspace(home, settings=Settings.from_env()), PromoteRequest(ref=incumbent, to="prod")).action == "promote"
    record_runs(home, candidate, rng, TRUE_TTFT_MS * slowdown, 3)
    runs = 3
    while True:
        outcome = promote(Workspace(home, settings=Settings.from_env()), PromoteRequest(ref=candidate, to="prod", dry_run=True))
        gate = next(g for g in outcome.gates if g.gate == "regression.ttft_p99_ms")
        if outcome.action == "would-promote" or gate.status == "failed" or runs >= CAP:
            break
        more = min(outcome.as_dict()["more_runs"] or 3, CAP - runs)
        record_runs(home, candidate, rng, TRUE_TTFT_MS * slowdown, more)  # "of each digest compared"
        record_runs(home, incumbent, rng, TRUE_TTFT_MS, more)
        runs += more
    return outcome.action, runs, {"incumbent": incumbent, "candidate": candidate}, rng


def test_an_equal_candidate_passes_at_least_19_of_20_seeded_reruns(isolated_home, store_entry, tmp_path) -> None:
    verdicts = []
    for seed in range(20):
        home = tmp_path / f"equal-{seed}"
        action, runs, digests, _ = rerun(home, store_entry, seed, 1.0)
        verdicts.append(action)
        if action == "would-promote":  # the real promotion agrees with its dry run
            assert promote(Workspace(home, settings=Settings.from_env()), PromoteRequest(ref=digests["candidate"], to="prod")).action == "promote"
    assert verdicts.count("would-promote") >= 19, verdicts


def test_a_3x_slower_candidate_is_refused_in_20_of_20_and_benching_again_cannot_flip_it(
        isolated_home, store_entry, tmp_path) -> None:
    for seed in range(20):
        home = tmp_path / f"slow-{seed}"
        action, runs, digests, rng = rerun(home, store_entry, 100 + seed, 3.0)
        assert action == "would-refuse", (seed, runs)
        refusals = len([r for r in read_audit(home) if r.action == "refused"])
        assert refusals == 0  # dry runs record nothing
        with pytest.raises(GateRefused):
            promote(Workspace(home, settings=Settings.from_env()), PromoteRequest(ref=digests["candidate"], to="prod"))
        assert len([r for r in read_audit(home) if r.action == "refused"]) == 1
        # Bench again after the refusal: 3 more runs as noisy as ever, and one lucky run as fast as the incumbent's
        # best. Every run counts, so the new ones join the old; none of them is "the" result.
        record_runs(home, digests["candidate"], rng, TRUE_TTFT_MS * 3.0, 3)
        ResultsLog(home).record(digests["candidate"], "bench", True, {"ttft_p99_ms": TRUE_TTFT_MS * math.exp(-SIGMA)},
                                gpu_class="cpu-reference")
        with pytest.raises(GateRefused):
            promote(Workspace(home, settings=Settings.from_env()), PromoteRequest(ref=digests["candidate"], to="prod"))


def test_too_few_runs_is_a_refusal_that_says_how_many_more(isolated_home, store_entry, cli) -> None:
    rng = random.Random(7)
    incumbent = store_entry(isolated_home, "3c" * 8, seed="i", gates=GATES).digest
    candidate = store_entry(isolated_home, "4c" * 8, seed="c", gates=GATES).digest
    for digest in (incumbent, candidate):
        ResultsLog(isolated_home).record(digest, "smoke", True, {})
    record_runs(isolated_home, incumbent, rng, TRUE_TTFT_MS, 3)
    assert cli("promote", incumbent, "--to", "prod")[0] == 0
    record_runs(isolated_home, candidate, rng, TRUE_TTFT_MS, 1)
    before = read_audit(isolated_home)
    code, out, err = cli("promote", candidate, "--to", "prod", "--dry-run", "--json")
    assert code == 1 and read_audit(isolated_home) == before  # a dry run records no refusal
    verdict = json.loads(out)
    assert verdict["action"] == "would-refuse" and verdict["dry_run"] is True and verdict["more_runs"] == 2
    gate = next(g for g in verdict["gates"] if g["gate"] == "regression.ttft_p99_ms")
    assert gate["status"] == "missing" and "1 bench run(s) of this digest on cpu-reference, 3 of each needed" in gate["detail"]
    code, out, _ = cli("promote", candidate, "--to", "prod", "--dry-run")
    assert code == 1 and "dry run: would be refused by prod" in out and "regression.ttft_p99_ms" in out
    code, _, err = cli("promote", candidate, "--to", "prod")
    assert code == 1 and "record 2 more bench run(s)" in err
    assert [r.action for r in read_audit(isolated_home)][len(before):] == ["refused"]


def test_the_setting_raises_the_fewest_runs(isolated_home, store_entry, cli, monkeypatch) -> None:
    digest = store_entry(isolated_home, "5c" * 8, seed="s", gates={"prod": {"smoke": True, "bench": {"ttft_p99_ms": 100}}}).digest
    ResultsLog(isolated_home).record(digest, "smoke", True, {})
    record_runs(isolated_home, digest, random.Random(1), TRUE_TTFT_MS, 3)
    monkeypatch.setenv("TRTPIPE_MIN_BENCH_RUNS", "5")
    code, out, _ = cli("promote", digest, "--to", "prod", "--dry-run", "--json")
    assert code == 1 and json.loads(out)["more_runs"] == 2
    monkeypatch.setenv("TRTPIPE_MIN_BENCH_RUNS", "three")
    code, _, err = cli("promote", digest, "--to", "prod", "--dry-run")
    assert code == 2 and "TRTPIPE_MIN_BENCH_RUNS='three' is not a whole number" in err
    monkeypatch.delenv("TRTPIPE_MIN_BENCH_RUNS")
    code, out, _ = cli("promote", digest, "--to", "prod", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["action"] == "would-promote"


# --------------------------------------------------------------------------- the statistics


def test_the_mann_whitney_table_is_the_exact_distribution() -> None:
    """Counted by brute force over every ordering of small samples; 3 runs each is the fewest with a 95 % bound."""
    import itertools
    from math import comb

    for m, n in ((1, 1), (2, 3), (3, 3), (3, 5), (4, 4)):
        counted = [0] * (m * n + 1)
        for xs in itertools.combinations(range(m + n), m):
            counted[sum(1 for x in xs for y in range(x) if y not in xs)] += 1
        assert tuple(counted) == mann_whitney_counts(m, n) and sum(counted) == comb(m + n, m)
    assert bound_rank(2, 2) == 0 and bound_rank(2, 3) == 0 and bound_rank(3, 3) == 1  # 1/20 = 5 %


def test_the_bounds_cover_the_true_ratio_as_stated_under_the_noise_model() -> None:
    """Each one-sided bound misses the true log ratio at most 5 % of the time, whatever the noise (here the
    stated model): checked on 3000 draws, where 5 % +- 3 standard errors allows up to 6.2 %."""
    rng = random.Random(2024)
    truth = math.log(1.7)
    below = above = 0
    trials = 3000
    for _ in range(trials):
        found = shift([math.log(noisy_p99(rng, 1.7)) for _ in range(4)], [math.log(noisy_p99(rng, 1.0)) for _ in range(5)])
        below += found.low > truth
        above += found.high < truth
    limit = 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)
    assert below / trials <= limit and above / trials <= limit, (below, above)
