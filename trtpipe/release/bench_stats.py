"""The noise model bench gates judge by, and its distribution-free intervals.

The model. One recorded bench run of a digest on one GPU class gives, per figure, one number X (the
run's P99 TTFT, say). Runs are noisy: the P99 of a few dozen requests is nearly their maximum, and a
loaded machine stalls some runs (on a shared 2-core host, one run's P99 TTFT swung 6x). The model:

    log X = log theta + e,   the e independent draws from ONE continuous distribution F

theta is the digest's true figure; F is the machine's noise, unknown, any shape and tails (stalls
included), the same for every digest benched on that machine class. The ratio of two digests'
figures is then a shift on the log scale: delta = log theta_candidate - log theta_incumbent.

The interval. For m candidate runs and n incumbent runs, the m*n differences D_ij = log x_i - log y_j,
sorted, bound delta (Mann-Whitney / Hodges-Lehmann): with k the largest integer such that
P(U <= k-1) <= alpha for the Mann-Whitney statistic U of sizes (m, n) under no difference,
    P(delta < D_(k)) <= alpha   and   P(delta > D_(mn+1-k)) <= alpha
exactly, for every F (the ranks of x_i - delta among the y_j are exchangeable). The estimate is the
median of the D_ij. With alpha = 0.05 the smallest sizes with a bound are m = n = 3 (P(U = 0) = 1/20):
that is why a gate wants at least 3 runs of each.

A run that failed (some request failed) counts as the worst figure there is (+inf for a latency, 0 for
a throughput): it never helps, it cannot be left out, and one of several does not decide alone.

Nothing here knows what a gate is (`trtpipe.release.gates` decides with these numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

ALPHA = 0.05  # each one-sided bound's error rate


@lru_cache(maxsize=256)
def mann_whitney_counts(m: int, n: int) -> tuple[int, ...]:
    """c[u] = the number of the C(m+n, m) equally likely orderings (no difference) whose Mann-Whitney
    statistic is u (0..m*n): the coefficients of the Gaussian binomial [m+n choose m](q)."""
    poly = [1]
    for i in range(1, m + 1):
        # times (1 - q^(n+i)), then divided by (1 - q^i): [n+i choose i] from [n+i-1 choose i-1]
        grown = poly + [0] * (n + i)
        for k in range(len(grown) - 1, n + i - 1, -1):
            grown[k] -= grown[k - n - i]
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[: i * n + 1]
    return tuple(poly)


def bound_rank(m: int, n: int, alpha: float = ALPHA) -> int:
    """k: the largest integer with P(U <= k-1) <= alpha (0: no bound at this level for these sizes)."""
    if m == 0 or n == 0:
        return 0
    if m * n > 40000:  # the normal approximation, where the exact table would be slow (>200 runs each)
        mean, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
        return max(0, int(math.floor(mean - 1.6448536269514722 * sd)))
    counts = mann_whitney_counts(m, n)
    total = sum(counts)
    k, below = 0, 0
    while k < len(counts) and (below + counts[k]) <= alpha * total:
        below += counts[k]
        k += 1
    return k


def _difference(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b) and (a > 0) == (b > 0):
        return 0.0  # both failed: no information about their ratio
    return a - b


@dataclass(frozen=True)
class Shift:
    """The log ratio (candidate over incumbent, "worse" direction positive) of two sets of runs."""

    estimate: float  # the Hodges-Lehmann estimate: median of the pairwise differences
    low: float  # one-sided (1 - alpha) lower bound (-inf: none at these sizes)
    high: float  # one-sided (1 - alpha) upper bound (+inf: none)
    m: int
    n: int


def shift(worse_candidate: list[float], worse_incumbent: list[float], alpha: float = ALPHA) -> Shift:
    """The shift between two samples of log figures oriented so that larger is worse."""
    m, n = len(worse_candidate), len(worse_incumbent)
    diffs = sorted(_difference(x, y) for x in worse_candidate for y in worse_incumbent)
    mid = len(diffs) // 2
    estimate = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    if math.isnan(estimate):  # -inf and +inf in the middle: no information
        estimate = 0.0
    k = bound_rank(m, n, alpha)
    low = diffs[k - 1] if k else -math.inf
    high = diffs[len(diffs) - k] if k else math.inf
    return Shift(estimate, low, high, m, n)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2  # oriented values are finite or +inf: never inf - inf


PROJECTED_STEPS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100)


def runs_to_decide(worse_candidate: list[float], worse_incumbent: list[float], threshold: float,
                   alpha: float = ALPHA) -> int | None:
    """About how many more runs of EACH digest would decide (one bound on the far side of `threshold`), if the
    new runs look like the old: each sample is extended by runs at its own empirical quantiles (its spread,
    its stalls and failures in the same proportion) and judged again; the fewest added that decide, from
    `PROJECTED_STEPS`. None: not even 100 more would (the estimate sits at the threshold). An estimate, not a
    promise: every run counts, whatever it shows."""
    for added in PROJECTED_STEPS:
        found = shift(_extended(worse_candidate, added), _extended(worse_incumbent, added), alpha)
        if found.high <= threshold or found.low > threshold:
            return added
    return None


def _extended(sample: list[float], added: int) -> list[float]:
    ordered = sorted(sample)
    out = list(sample)
    for j in range(added):
        position = (j + 0.5) / added * (len(ordered) - 1)
        low = int(math.floor(position))
        high = min(low + 1, len(ordered) - 1)
        a, b = ordered[low], ordered[high]
        out.append(a if a == b or math.isinf(b) else a + (b - a) * (position - low))
    return out
