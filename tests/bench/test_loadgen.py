"""Load generator scheduling against an in-process RequestSender (no server): counts, concurrency, bounds."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from trtpipe.bench.loadgen import LoadSettings, TokenChunk, classify_error, poisson_arrivals, run_load
from trtpipe.bench.workload import LengthDist, RequestSpec, WordCounter, synthetic_workload


class StreamingSender:
    """Streams `max_tokens` one-token responses with a small gap; tracks the peak of requests in flight."""

    def __init__(self, gap_s: float = 0.002) -> None:
        self.gap_s = gap_s
        self.in_flight = 0
        self.peak = 0
        self.sent: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.sent.append(request.index)
        try:
            for i in range(request.max_tokens):
                time.sleep(self.gap_s)
                yield TokenChunk(time.monotonic(), 1, i == request.max_tokens - 1)
        finally:
            with self._lock:
                self.in_flight -= 1


def _workload(n: int = 30):
    return synthetic_workload(n, LengthDist.parse("8"), LengthDist.parse("uniform:2,6"), seed=5, counter=WordCounter())


def test_poisson_arrivals_are_seeded_and_have_the_rate() -> None:
    first = poisson_arrivals(2000, 50.0, seed=3)
    assert first == poisson_arrivals(2000, 50.0, seed=3)
    assert first != poisson_arrivals(2000, 50.0, seed=4)
    assert first[0] == 0.0 and all(b >= a for a, b in zip(first, first[1:], strict=False))
    assert 2000 / first[-1] == pytest.approx(50.0, rel=0.1)


@pytest.mark.timeout(30)
def test_open_loop_sends_every_request_once() -> None:
    sender = StreamingSender()
    workload = _workload()
    records = run_load(workload.requests, sender, LoadSettings(mode="open", rate=200.0, duration_s=20, drain_s=5))
    assert [r.index for r in records] == list(range(30))
    assert sorted(sender.sent) == list(range(30))
    assert all(r.ok and r.output_tokens == r.requested_output_tokens for r in records)
    assert all(r.ttft_s <= r.e2e_s for r in records)


@pytest.mark.timeout(30)
def test_closed_loop_keeps_concurrency() -> None:
    sender = StreamingSender(gap_s=0.005)
    records = run_load(_workload().requests, sender, LoadSettings(mode="closed", concurrency=3, duration_s=20, drain_s=5))
    assert len(records) == 30 and all(r.ok for r in records)
    assert sender.peak == 3


@pytest.mark.timeout(30)
def test_duration_bound_stops_sending_and_abandons_hung_requests() -> None:
    release = threading.Event()

    def hanging(request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
        yield TokenChunk(time.monotonic(), 1, False)
        release.wait(60)  # a server that never answers again
        yield TokenChunk(time.monotonic(), 1, True)

    started = time.monotonic()
    records = run_load(_workload(1000).requests, hanging, LoadSettings(mode="open", rate=50.0, duration_s=1.0, drain_s=1.0))
    elapsed = time.monotonic() - started
    release.set()
    assert elapsed < 10  # bounded by duration + drain, not by the hung requests
    assert 0 < len(records) < 1000
    assert all(not r.ok and r.error_kind == "timeout" for r in records)
    assert all(r.ttft_s is not None for r in records)  # the partial stream is kept


@pytest.mark.timeout(30)
def test_sender_errors_are_recorded_by_kind() -> None:
    class Unavailable(Exception):
        def status(self) -> str:
            return "StatusCode.UNAVAILABLE"

    def failing(request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
        if request.index % 2:
            raise Unavailable("connection refused")
        yield TokenChunk(time.monotonic(), request.max_tokens, True)

    records = run_load(_workload(10).requests, failing, LoadSettings(mode="closed", concurrency=2, duration_s=10, drain_s=2))
    kinds = [r.error_kind for r in records]
    assert kinds == [None, "unavailable"] * 5
    assert classify_error(TimeoutError()) == "timeout"
    assert classify_error(ValueError("x")) == "value"
