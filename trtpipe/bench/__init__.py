"""Benchmark a Triton LLM endpoint over streaming gRPC: `run_bench(url, workload, mode, ...) -> BenchResult`.

Modules: `workload` (what is sent), `loadgen` (when it is sent), `metrics` (per-request records
and genai-perf-compatible aggregates), `prometheus` (the server's own counters), `report`
(the JSON schema and the table), `plot` (the PNG).
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Callable, Literal
from urllib.parse import urlsplit

from trtpipe.bench.loadgen import LoadSettings, RequestSender, TritonSender, run_load
from trtpipe.bench.metrics import RequestRecord, Slo, aggregate
from trtpipe.bench.prometheus import ServerSide, delta, scrape
from trtpipe.bench.report import BenchResult, RunResult, WarmupResult
from trtpipe.bench.workload import RequestSpec, Workload
from trtpipe.errors import UsageError

__all__ = ["run_bench", "BenchResult", "RunResult", "default_metrics_url"]

ProgressHook = Callable[[int, RequestRecord], None]
# Streams opened before an open-loop run starts (a closed loop opens one per request in flight).
OPEN_LOOP_STREAMS = 8


def default_metrics_url(grpc_url: str) -> str | None:
    """Triton's default metrics port (8002) when the gRPC URL uses its default port (8001), else None."""
    parts = urlsplit(grpc_url if "://" in grpc_url else f"grpc://{grpc_url}")
    if parts.port == 8001 and parts.hostname:
        return f"http://{parts.hostname}:8002/metrics"
    return None


def _scrape_or_error(metrics_url: str | None) -> tuple[dict | None, str | None]:
    if not metrics_url:
        return None, "no metrics URL given (--metrics-url)"
    try:
        return scrape(metrics_url), None
    except Exception as exc:  # noqa: BLE001 - server metrics are optional; the reason is reported
        return None, f"cannot scrape {metrics_url}: {' '.join(str(exc).split())[:200]}"


def _scrape_after(
    metrics_url: str | None, model: str, before: dict | None, finished: int, settle_s: float = 3.0
) -> tuple[dict | None, str | None]:
    """Scrape after a run, waiting (up to `settle_s`) until Triton counts the requests the client saw finish.

    Triton updates a decoupled model's counters when it releases the request, a moment after the
    final response reached the client, so an immediate scrape can miss the last requests.
    """
    deadline = time.monotonic() + settle_s
    while True:
        after, error = _scrape_or_error(metrics_url)
        if after is None or before is None:
            return after, error
        counters = after.get(model)
        old = before.get(model)
        seen = 0.0
        if counters is not None:
            seen = counters.request_success + counters.request_failure
            if old is not None:
                seen -= old.request_success + old.request_failure
        if seen >= finished or time.monotonic() >= deadline:
            return after, None
        time.sleep(0.1)


def run_bench(
    url: str,
    workload: Workload,
    mode: Literal["open", "closed"],
    *,
    model: str = "ensemble",
    rates: list[float] | None = None,
    concurrency: int | None = None,
    duration_s: float = 60.0,
    drain_s: float = 30.0,
    slo: Slo | None = None,
    metrics_url: str | None = None,
    seed: int | None = None,
    sender: RequestSender | None = None,
    sampling: dict | None = None,
    on_progress: ProgressHook | None = None,
    count_tokens: Callable[[str], int] | None = None,
    warmup: list[RequestSpec] | None = None,
) -> BenchResult:
    """Send `workload` once per load level and measure it.

    Open loop: one run per rate in `rates` (Poisson arrivals seeded with the workload's seed).
    Closed loop: one run at `concurrency`. Each run sends at most every request of the workload and
    stops sending after `duration_s`; a request still running `drain_s` later is abandoned as a
    timeout. Server counters are scraped from `metrics_url` before and after each run.
    `sender` replaces the Triton gRPC sender (the load generator takes any `RequestSender`);
    `sampling` goes with every request to the serving client (e.g. `{"end_id": -1}` so generation
    never stops at the end token and every request returns exactly `max_tokens`).
    The model speaks the inflight_batcher_llm or the llmapi contract (its metadata says which; the default
    model, the ensemble, stands for the llmapi model on a server that serves an llmapi repository). An
    llmapi model returns text only: `count_tokens` (text -> tokens, no special tokens) counts its output.

    Before the first level's clock starts, everything a request needs is imported and the gRPC streams
    are open (the Triton sender does both when it is made); then the `warmup` requests are sent one at a
    time and recorded apart (`BenchResult.warmup`): no figure of any run includes them.
    """
    if mode == "open":
        if not rates or any(r <= 0 for r in rates):
            raise UsageError("an open loop needs one or more positive rates")
        levels: list[tuple[float | None, int | None]] = [(float(r), None) for r in rates]
    elif mode == "closed":
        if not concurrency or concurrency < 1:
            raise UsageError("a closed loop needs a concurrency of at least 1")
        levels = [(None, concurrency)]
    else:
        raise UsageError(f"the mode must be open or closed, got {mode!r}")
    if duration_s <= 0 or drain_s < 0:
        raise UsageError("the duration must be positive and the drain time not negative")
    slo = slo or Slo()
    seed = workload.seed if seed is None else seed
    own_sender = sender is None
    contract = None  # the served model's request contract (trtpipe.serving.client.RequestContract)
    if sender is None:
        from trtpipe.errors import TrtpipeError
        from trtpipe.serving.client import DEFAULT_CONTRACT, resolve_model

        contract = DEFAULT_CONTRACT
        try:
            model, contract = resolve_model(url, model, timeout=max(drain_s, 1.0))
        except TrtpipeError:
            pass  # an unreachable server: every request fails and is reported, as without the question
        if not contract.returns_token_ids and count_tokens is None:
            raise UsageError(f"{model} at {url} speaks the {contract.name} contract, which returns text only, and no "
                             "tokenizer was given to count its output tokens",
                             fix="give the served model's tokenizer (the repository the server serves)")
    active_sender: RequestSender = sender if sender is not None else TritonSender(
        url, model, timeout=max(drain_s, 1.0), sampling=sampling, contract=contract, count_tokens=count_tokens
    )
    started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    runs: list[RunResult] = []
    warmed: WarmupResult | None = None
    try:
        open_streams = getattr(active_sender, "open_streams", None)
        if callable(open_streams):
            # As many as the run keeps in flight (an open loop: a few; more open as the load asks).
            open_streams(concurrency if mode == "closed" else min(len(workload.requests), OPEN_LOOP_STREAMS))
        if warmup:
            settings = LoadSettings(mode="closed", duration_s=duration_s, drain_s=drain_s, concurrency=1, seed=seed)
            before_warmup, _ = _scrape_or_error(metrics_url)
            records = run_load(list(warmup), active_sender, settings)
            warmed = WarmupResult(aggregates=aggregate(records, Slo()), records=records)
            # Triton counts a decoupled request a moment after its final response: wait until it has
            # counted the warm-ups, so the first level's "before" scrape does not leave them in its delta.
            _scrape_after(metrics_url, model, before_warmup, len(records))
        for level_index, (rate, conc) in enumerate(levels):
            before, before_error = _scrape_or_error(metrics_url)
            settings = LoadSettings(
                mode=mode, duration_s=duration_s, drain_s=drain_s, rate=rate, concurrency=conc, seed=seed
            )
            hook = (lambda record, i=level_index: on_progress(i, record)) if on_progress else None
            records = run_load(workload.requests, active_sender, settings, on_complete=hook)
            finished = sum(1 for r in records if r.ok)
            after, after_error = _scrape_after(metrics_url, model, before, finished)
            if before is not None and after is not None:
                server = delta(before, after, metrics_url)
            else:
                server = ServerSide(metrics_url=metrics_url, error=before_error or after_error)
            aggregates = aggregate(records, slo)
            server_model = server.for_model(model)
            overhead = None
            if server_model and server_model.mean_request_s is not None and aggregates.e2e_s.mean is not None:
                overhead = aggregates.e2e_s.mean - server_model.mean_request_s
            runs.append(
                RunResult(
                    mode=mode,
                    rate=rate,
                    concurrency=conc,
                    aggregates=aggregates,
                    server=server,
                    client_overhead_s=overhead,
                    records=records,
                )
            )
    finally:
        if own_sender:
            active_sender.close()  # type: ignore[union-attr]
    return BenchResult(
        url=url,
        model=model,
        mode=mode,
        duration_limit_s=duration_s,
        drain_s=drain_s,
        slo=slo,
        sampling=dict(sampling or {}),
        workload=workload,
        runs=runs,
        warmup=warmed,
        started_at=started_at,
        output_token_counting="text" if contract is not None and not contract.returns_token_ids else "server",
    )
