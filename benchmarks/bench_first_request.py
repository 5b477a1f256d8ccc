"""Benchmark: is the first measured request of `trtpipe bench` an outlier? Prints one JSON object.

Serves benchmarks/models/stream_tokens (a decoupled Python model that streams one-token responses and does
no work) on a real CPU Triton server, then runs `trtpipe bench` (closed loop, concurrency 1) in fresh child
processes, each importing everything anew as a user's run does, and compares request 0's TTFT with the
median TTFT of the other requests of the same run (the baseline, in the same run). Variants:
- `as_shipped`: the checkout's default (for this branch: imports and streams up front, `--warmup 1`);
- `no_warmup`: `--warmup 0`, only where the checkout has the option: what the up-front imports and
  streams alone do for request 0.
`--source` runs another checkout (e.g. main) for a before/after table.

Usage: python benchmarks/bench_first_request.py [--runs 5] [--requests 20] [--source TRTPIPE_ROOT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from trtpipe.settings import Settings

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODELS = Path(__file__).resolve().parent / "models"


def one_run(source: Path, url: str, work: Path, requests: int, extra: list[str]) -> dict:
    out = work / f"run-{len(list(work.iterdir()))}.json"
    command = [sys.executable, "-m", "trtpipe.cli", "bench", url, "--model", "stream_tokens", "--mode", "closed",
               "--concurrency", "1", "--requests", str(requests), "--output-len", "8", "--input-len", "4",
               "--token-counting", "words", "--output", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(source), "TRTPIPE_HOME": str(work / "home")}
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=work, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"bench failed: {result.stderr[-2000:]}")
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    ttft = {r["index"]: r["ttft_s"] for r in run["records"]}
    rest = statistics.median(ttft[i] for i in ttft if i != 0)
    warm = data.get("warmup")
    return {"first_ms": ttft[0] * 1e3, "others_median_ms": rest * 1e3, "ratio": ttft[0] / rest,
            "warmup_first_ms": warm["records"][0]["ttft_s"] * 1e3 if warm and warm["records"] else None}


def summarize(runs: list[dict]) -> dict:
    out = {key: round(statistics.median(r[key] for r in runs), 3) for key in ("first_ms", "others_median_ms", "ratio")}
    warm = [r["warmup_first_ms"] for r in runs if r["warmup_first_ms"] is not None]
    out["warmup_request_ttft_ms"] = round(statistics.median(warm), 3) if warm else None
    out["runs"] = len(runs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--source", type=Path, default=REPO, help="the trtpipe checkout the children run")
    args = parser.parse_args()
    source = args.source.resolve()
    help_text = subprocess.run([sys.executable, "-m", "trtpipe.cli", "bench", "--help"], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(source), "COLUMNS": "200"}, cwd="/").stdout
    variants = {"as_shipped": []}
    if "--warmup" in help_text:
        variants["no_warmup"] = ["--warmup", "0"]
    from trtpipe.serving.server import start_server

    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="trtpipe-bench-first-") as tmp, \
            start_server(MODELS, validate=False, start_timeout=120, settings=Settings.from_env()) as server:
        work = Path(tmp)
        for _ in range(args.runs):  # interleaved: load on the host hits every variant alike
            for name, extra in variants.items():
                results[name].append(one_run(source, server.grpc_url, work, args.requests, extra))
    print(json.dumps({"benchmark": "bench_first_request", "source": str(source), "cpus": os.cpu_count(),
                      "requests_per_run": args.requests,
                      **{name: summarize(runs) for name, runs in results.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
