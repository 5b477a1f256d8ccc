"""The regression gate's operating characteristic under a stated noise model (docs/release.md: "Gates that noise cannot flip").

    .venv/bin/python scripts/gate_noise_model.py [--sigma 0.35 --stall-p 0.2 --stall-max 6 --trials 3000]

One bench run's figure is its digest's true figure times exp(e), e = sigma * Z + (with probability stall_p)
log U, U uniform on [1, stall_max]. Each trial records 3 runs of the incumbent and of the candidate, then, while
the gate (trtpipe.release.bench_stats, tolerance 2x as in the walk-through) is inconclusive, as many more runs
of each as it advises, up to 40 each. Printed per true ratio: how often the first judgement (3 runs each) and the
final one pass, fail, or stay undecided, and how many runs of each it took. Seeded: the same table every time.
"""

from __future__ import annotations

import argparse
import math
import random

from trtpipe.release.bench_stats import runs_to_decide, shift

CAP = 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, default=0.35)
    parser.add_argument("--stall-p", type=float, default=0.2)
    parser.add_argument("--stall-max", type=float, default=6.0)
    parser.add_argument("--tolerance-pct", type=float, default=100.0)
    parser.add_argument("--trials", type=int, default=3000)
    args = parser.parse_args()
    rng = random.Random(20261202)
    tau = math.log(1 + args.tolerance_pct / 100)

    def draw(theta: float) -> float:
        e = rng.gauss(0.0, args.sigma)
        if rng.random() < args.stall_p:
            e += math.log(rng.uniform(1.0, args.stall_max))
        return math.log(theta) + e

    spans = sorted(math.exp(max(r) - min(r)) for r in ([draw(1.0) for _ in range(10)] for _ in range(args.trials)))
    pairs = sum(draw(1.0) - draw(1.0) > math.log(2) for _ in range(args.trials)) / args.trials
    print(f"noise: sigma {args.sigma}, stalls p={args.stall_p} up to {args.stall_max}x; max/min of 10 runs: median "
          f"{spans[len(spans) // 2]:.1f}x; pairs of single runs past 2x: {pairs:.0%}")
    print("true ratio | first look (3+3): pass fail open | following the gate: pass fail undecided | runs each: median p90")
    for ratio in (1.0, 1.5, 2.0, 2.5, 3.0):
        first = {"pass": 0, "fail": 0, "open": 0}
        final = {"pass": 0, "fail": 0, "open": 0}
        used = []
        for _ in range(args.trials):
            new, old = [draw(ratio) for _ in range(3)], [draw(1.0) for _ in range(3)]
            look = 0
            while True:
                found = shift(new, old)
                verdict = "pass" if found.high <= tau else "fail" if found.low > tau else "open"
                if look == 0:
                    first[verdict] += 1
                look += 1
                if verdict != "open" or len(new) >= CAP:
                    break
                more = min(runs_to_decide(new, old, tau) or CAP, CAP - len(new))
                new += [draw(ratio) for _ in range(more)]
                old += [draw(1.0) for _ in range(more)]
            final[verdict] += 1
            used.append(len(new))
        used.sort()
        n = args.trials
        print(f"{ratio:>10} | {first['pass'] / n:>23.1%} {first['fail'] / n:5.1%} {first['open'] / n:5.1%} |"
              f" {final['pass'] / n:>19.1%} {final['fail'] / n:5.1%} {final['open'] / n:9.1%} |"
              f" {used[n // 2]:>17} {used[int(n * 0.9)]:4}")


if __name__ == "__main__":
    main()
