"""Benchmark of the benchmark: how much does `trtpipe bench` itself cost?

Serves benchmarks/models/stream_tokens (a decoupled Python model that streams N one-token
responses and does no work) on a real CPU Triton server, then drives it with trtpipe's own load
generator and serving client in closed loop at rising concurrency. It reports, per level and
overall:

- responses/s sustained (one response per token): the highest is the ceiling of generator plus
  server together on this host; a real model far below it is measured faithfully;
- per-request overhead: mean client E2E minus Triton's mean request duration for the model
  (`nv_inference_request_duration_us` / successes), i.e. gRPC channel set-up, the network hop,
  response decoding and the generator's threads;
- the same at concurrency 1 through `TritonLLMClient.stream` (a new gRPC channel per request),
  to show why `trtpipe bench` keeps streams open;
- `generator_alone`: the load generator with a sender that answers at once (no gRPC, no server),
  the ceiling of the scheduling and bookkeeping alone.

Prints one JSON object (also written to --out). Run: .venv/bin/python benchmarks/bench_overhead.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from trtpipe.settings import Settings

MODELS = Path(__file__).resolve().parent / "models"


def generator_alone(workload, concurrency: int) -> dict:
    """The load generator with a sender that answers at once: its own ceiling, without gRPC or a server."""
    from trtpipe.bench.loadgen import LoadSettings, TokenChunk, run_load
    from trtpipe.bench.metrics import aggregate

    def instant(request, deadline):
        for i in range(request.max_tokens):
            yield TokenChunk(time.monotonic(), 1, i == request.max_tokens - 1)

    records = run_load(workload.requests, instant, LoadSettings(mode="closed", concurrency=concurrency,
                                                                duration_s=60, drain_s=10))
    agg = aggregate(records)
    return {
        "concurrency": concurrency,
        "responses_per_s": round(agg.output_token_throughput, 1),
        "requests_per_s": round(agg.request_throughput, 1),
        "e2e_mean_ms": round(agg.e2e_s.mean * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16, help="tokens (responses) per request")
    parser.add_argument("--requests", type=int, default=150, help="requests per concurrency level")
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="closed-loop levels")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    from trtpipe.bench import run_bench
    from trtpipe.bench.loadgen import ServingClientSender
    from trtpipe.bench.workload import LengthDist, WordCounter, synthetic_workload
    from trtpipe.serving.server import start_server

    levels = [int(c) for c in args.concurrency.split(",")]
    workload = synthetic_workload(args.requests, LengthDist.parse("16"), LengthDist.parse(str(args.tokens)), seed=0,
                                  counter=WordCounter())  # the no-work model never reads the prompt
    rows = []
    with start_server(MODELS, validate=False, start_timeout=60, settings=Settings.from_env()) as server:
        # One warm-up run so the first level does not pay for connection and stub start-up.
        run_bench(server.grpc_url, workload.model_copy(update={"requests": workload.requests[:10]}), "closed",
                  model="stream_tokens", concurrency=2, duration_s=30, drain_s=10, metrics_url=None)
        plan = [(c, "persistent_streams") for c in levels] + [(1, "serving_client_per_request_channel")]
        for concurrency, transport in plan:
            sender = ServingClientSender(server.grpc_url, "stream_tokens") if transport.startswith("serving") else None
            started = time.monotonic()
            result = run_bench(
                server.grpc_url, workload, "closed", model="stream_tokens", concurrency=concurrency,
                duration_s=60, drain_s=15, metrics_url=server.metrics_url, sender=sender,
            )
            (run,) = result.runs
            agg = run.aggregates
            server_model = run.server.for_model("stream_tokens")
            rows.append({
                "transport": transport,
                "concurrency": concurrency,
                "requests_ok": agg.requests_ok,
                "requests_failed": agg.requests_failed,
                "wall_s": round(time.monotonic() - started, 3),
                "responses_per_s": round(agg.output_token_throughput, 1),
                "requests_per_s": round(agg.request_throughput, 2),
                "client_e2e_mean_ms": round(agg.e2e_s.mean * 1e3, 3) if agg.e2e_s.mean is not None else None,
                "client_e2e_p50_ms": round(agg.e2e_s.p50 * 1e3, 3) if agg.e2e_s.p50 is not None else None,
                "client_e2e_p99_ms": round(agg.e2e_s.p99 * 1e3, 3) if agg.e2e_s.p99 is not None else None,
                "client_ttft_mean_ms": round(agg.ttft_s.mean * 1e3, 3) if agg.ttft_s.mean is not None else None,
                "server_request_mean_ms": (
                    round(server_model.mean_request_s * 1e3, 3)
                    if server_model and server_model.mean_request_s is not None else None
                ),
                "overhead_per_request_ms": (
                    round(run.client_overhead_s * 1e3, 3) if run.client_overhead_s is not None else None
                ),
            })
    alone = generator_alone(workload, max(levels))
    ours = [r for r in rows if r["transport"] == "persistent_streams"]
    best = max(ours, key=lambda r: r["responses_per_s"])
    low_load = ours[0]
    per_call = rows[-1]
    report = {
        "benchmark": "bench_overhead",
        "model": "stream_tokens (decoupled Python, no work)",
        "tokens_per_request": args.tokens,
        "requests_per_level": args.requests,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "max_responses_per_s": best["responses_per_s"],
        "max_at_concurrency": best["concurrency"],
        "overhead_per_request_ms_at_concurrency_1": low_load["overhead_per_request_ms"],
        "overhead_per_request_ms_with_serving_client_channel_per_request": per_call["overhead_per_request_ms"],
        "levels": rows,
        "generator_alone": alone,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if all(r["requests_failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
