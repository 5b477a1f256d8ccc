"""The load generator: sends a workload's requests in open loop (Poisson arrivals) or closed loop.

It talks to the server only through a `RequestSender`: a callable that sends one request and
yields its responses as `TokenChunk`s (receive time on `time.monotonic()`, tokens in the response,
final flag). `TritonSender` is the real one (streaming gRPC on pooled persistent streams, requests
built by the serving client's `build_inputs`); tests and the overhead benchmark use the same path.

Threads, not asyncio: tritonclient's gRPC streaming runs one stream per client object on its own
thread, so every in-flight request gets its own thread and a client taken from a pool.

Bounds: no request is sent after `duration_s` or after the last request of the workload; a
request still running `drain_s` after that is abandoned and recorded as a `timeout` error. The
run therefore always ends within `duration_s + drain_s` (plus thread start-up jitter), even when
the server hangs or dies, and abandoned threads are daemons that cannot keep the process alive.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Protocol

from trtpipe.bench.metrics import RequestRecord, record_from_chunks
from trtpipe.bench.workload import RequestSpec

Mode = Literal["open", "closed"]


@dataclass(frozen=True)
class TokenChunk:
    """One response of a streamed request."""

    t_received: float  # time.monotonic() when the response arrived
    n_tokens: int
    is_final: bool


class RequestSender(Protocol):
    """Sends one request and yields its responses until the final one.

    `deadline` is a `time.monotonic()` instant after which the sender should give up (raise
    `TimeoutError`); the load generator abandons it at that instant anyway.
    """

    def __call__(self, request: RequestSpec, deadline: float) -> Iterator[TokenChunk]: ...


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after start at which each of `n` requests is sent: exponential gaps of mean 1/rate.

    The first request goes at 0. `rate=inf` sends everything at once.
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def classify_error(exc: BaseException) -> str:
    """A short, stable kind for an error: a gRPC status (`unavailable`, `cancelled` ...) or the exception type."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    status = getattr(exc, "status", None)
    if callable(status):
        try:
            status = status()
        except Exception:  # noqa: BLE001 - a broken status() must not hide the error itself
            status = None
    if status:
        text = str(status)
        return text.split(".")[-1].lower()  # "StatusCode.UNAVAILABLE" -> "unavailable"
    if str(exc).startswith("no response from"):
        # The serving client's per-response wait ran out (TritonConnectionError "no response ... within").
        return "timeout"
    name = type(exc).__name__
    kind = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return kind.removesuffix("_error") or kind  # TritonConnectionError -> "triton_connection"


@dataclass
class _InFlight:
    spec: RequestSpec
    t_scheduled: float
    t_sent: float
    chunks: list[tuple[float, int]] = field(default_factory=list)

    def record(
        self, t_end: float, *, final_seen: bool, error_kind: str | None, error_message: str | None
    ) -> RequestRecord:
        """This request's record as of `t_end` (seconds since the run started)."""
        return record_from_chunks(
            index=self.spec.index,
            t_scheduled=self.t_scheduled,
            t_sent=self.t_sent,
            t_end=t_end,
            input_tokens=self.spec.input_tokens,
            requested_output_tokens=self.spec.max_tokens,
            chunks=list(self.chunks),
            final_seen=final_seen,
            error_kind=error_kind,
            error_message=error_message,
        )


@dataclass
class LoadSettings:
    """How to send: `rate` (requests/s) for open loop, `concurrency` for closed loop."""

    mode: Mode
    duration_s: float
    drain_s: float
    rate: float | None = None
    concurrency: int | None = None
    seed: int = 0
    max_in_flight: int = 1024  # open loop only: a safety cap on threads; lag shows in t_sent - t_scheduled


def run_load(
    requests: list[RequestSpec],
    sender: RequestSender,
    settings: LoadSettings,
    *,
    on_complete: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send `requests` as `settings` says and return one record per request sent, in index order."""
    if settings.mode == "open":
        if not settings.rate or settings.rate <= 0:
            raise ValueError("open loop needs a positive rate")
        slots = threading.BoundedSemaphore(settings.max_in_flight)
        arrivals = poisson_arrivals(len(requests), settings.rate, settings.seed)
    else:
        if not settings.concurrency or settings.concurrency < 1:
            raise ValueError("closed loop needs a concurrency of at least 1")
        slots = threading.BoundedSemaphore(settings.concurrency)
        arrivals = [0.0] * len(requests)

    t0 = time.monotonic()
    stop_sending = t0 + settings.duration_s
    hard_deadline = stop_sending + settings.drain_s
    lock = threading.Condition()
    in_flight: dict[int, _InFlight] = {}
    done: dict[int, RequestRecord] = {}

    def finish(state: _InFlight, final_seen: bool, error: BaseException | None) -> None:
        with lock:
            if state.spec.index in done:  # already abandoned by the main thread
                return
            record = state.record(
                time.monotonic() - t0,
                final_seen=final_seen,
                error_kind=None if error is None else classify_error(error),
                error_message=None if error is None else " ".join(str(error).split())[:500],
            )
            done[state.spec.index] = record
            lock.notify_all()
        if on_complete is not None:
            on_complete(record)

    def execute(state: _InFlight) -> None:
        final_seen = False
        error: BaseException | None = None
        chunks: Iterator[TokenChunk] | None = None
        try:
            chunks = sender(state.spec, hard_deadline)
            for chunk in chunks:
                with lock:
                    state.chunks.append((chunk.t_received - t0, chunk.n_tokens))
                if chunk.is_final:
                    final_seen = True
                    break
                if time.monotonic() > hard_deadline:
                    raise TimeoutError("the run's time bound passed before the final response")
            else:
                error = RuntimeError("the stream ended without a final response")
        except BaseException as exc:  # noqa: BLE001 - every failure is a measured outcome
            error = exc
        finally:
            # Close a generator sender now (not at garbage collection) so it can pool its stream.
            close = getattr(chunks, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - a sender failing to clean up does not change the outcome
                    pass
            slots.release()
        finish(state, final_seen, error)

    for spec, offset in zip(requests, arrivals, strict=True):
        now = time.monotonic()
        if settings.mode == "open":
            wait = t0 + offset - now
            if t0 + offset >= stop_sending:
                break
            if wait > 0:
                time.sleep(wait)
        if not slots.acquire(timeout=max(0.0, stop_sending - time.monotonic())):
            break
        if time.monotonic() >= stop_sending:
            slots.release()
            break
        scheduled = offset if settings.mode == "open" else time.monotonic() - t0
        state = _InFlight(spec=spec, t_scheduled=scheduled, t_sent=time.monotonic() - t0)
        with lock:
            in_flight[spec.index] = state
        threading.Thread(target=execute, args=(state,), name=f"bench-req-{spec.index}", daemon=True).start()

    with lock:
        while len(done) < len(in_flight):
            remaining = hard_deadline - time.monotonic()
            if remaining <= 0:
                break
            lock.wait(timeout=remaining)
        abandoned = [state for index, state in in_flight.items() if index not in done]
        for state in abandoned:
            done[state.spec.index] = state.record(
                time.monotonic() - t0,
                final_seen=False,
                error_kind="timeout",
                error_message="no final response within the run's time bound; abandoned",
            )
        records = [done[index] for index in sorted(done)]
    if on_complete is not None:
        for state in abandoned:
            on_complete(done[state.spec.index])
    return records


def tokens_in_response(result: Any) -> int:
    """Tokens in one streamed response: `sequence_length` (TRT-LLM's count), else the `output_ids` size."""
    lengths = result.as_numpy("sequence_length")
    if lengths is not None and lengths.size:
        return int(lengths.reshape(-1)[0])
    ids = result.as_numpy("output_ids")
    return int(ids.size) if ids is not None else 0


class _Stream:
    """One tritonclient gRPC client with one open stream, carrying one request at a time."""

    def __init__(self, url: str, grpcclient: Any) -> None:
        self.responses: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: Any) -> None:
        # The receive time is taken here, on the stream's own thread, as the response arrives.
        self.responses.put((result, error, time.monotonic()))

    def close(self, *, cancel: bool, wait_s: float) -> None:
        """Stop the stream (bounded: stop_stream joins a thread that a dead server can hold up)."""

        def stop() -> None:
            try:
                self.client.stop_stream(cancel_requests=cancel)
            except Exception:  # noqa: BLE001 - a broken stream may fail to stop; it is dropped either way
                pass
            _close_quietly(self.client)

        closer = threading.Thread(target=stop, name="bench-stream-close", daemon=True)
        closer.start()
        closer.join(timeout=wait_s)


def _stream_error(stream: _Stream, timeout: float) -> BaseException | None:
    """The error a broken stream delivered to its callback, if one arrives within `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            _, error, _ = stream.responses.get(timeout=left)
        except queue.Empty:
            return None
        if error is not None:
            return error
    return None


class TritonSender:
    """Streams requests to a Triton LLM model (ensemble or BLS) over gRPC, on persistent streams.

    Requests are built by the serving client's request contract for the model (`contract`, a
    trtpipe.serving.client.RequestContract: the ensemble/BLS one by default); responses are read the same
    way the serving client reads them (final flag from `triton_final_response`, empty final responses
    accepted). An llmapi model returns text only, and streams the whole text so far: its responses are
    counted with `count_tokens` (the served tokenizer, no special tokens) on the text each one adds. Unlike `TritonLLMClient.stream`,
    which opens a new gRPC client and stream for every call, streams are pooled here and reused:
    one open stream per request in flight (tritonclient allows one stream per client object). A
    fresh channel per request costs milliseconds of TTFT and E2E on a busy host, which would be
    charged to the server (benchmarks/bench_overhead.py measures both). A stream whose request did
    not end cleanly (error, timeout, abandoned) is closed and never reused.
    """

    def __init__(self, url: str, model: str = "ensemble", *, timeout: float = 30.0, sampling: dict | None = None,
                 contract: Any = None, count_tokens: Callable[[str], int] | None = None) -> None:
        # Everything a request needs is imported here, before any send time is taken: importing
        # tritonclient.grpc inside the first request charged its 150-200 ms to that request's TTFT.
        import tritonclient.grpc as grpcclient

        # the serving area's request contracts and its reading of the final flag
        from trtpipe.serving.client import DEFAULT_CONTRACT, is_final_response, text_delta

        contract = contract if contract is not None else DEFAULT_CONTRACT
        if not contract.returns_token_ids and count_tokens is None:
            raise ValueError(f"a {contract.name} model returns text only: give count_tokens to count its output tokens")
        self._grpc = grpcclient
        self._build_inputs = contract.build_inputs
        self._outputs = contract.outputs()
        self._is_final = is_final_response
        self._text_delta = text_delta
        self.url = url
        self.model = model
        self.timeout = timeout
        self.sampling = dict(sampling or {})
        self.contract = contract
        self.count_tokens = count_tokens
        self._idle: list[_Stream] = []
        self._lock = threading.Lock()

    def _inputs(self, request: RequestSpec) -> tuple[list, tuple[str, ...]]:
        return self._build_inputs(request.prompt, request.max_tokens, stream=True, **self.sampling), self._outputs

    def open_streams(self, count: int) -> None:
        """Open `count` streams now (before the run's clock starts), so no measured request pays for
        opening its channel and stream. gRPC connects a channel lazily: one liveness call on each makes
        the connection now (a server that is not there is then the run's first request's error, as before)."""
        opened = [_Stream(self.url, self._grpc) for _ in range(max(0, count - len(self._idle)))]
        for stream in opened:
            try:
                stream.client.is_server_live(client_timeout=min(5.0, self.timeout))
            except Exception:  # noqa: BLE001 - no server yet: the requests will say so, each in its record
                break
        with self._lock:
            self._idle.extend(opened)

    def _take(self) -> _Stream:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Stream(self.url, self._grpc)

    def __call__(self, request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
        grpcclient, is_final_response, text_delta = self._grpc, self._is_final, self._text_delta
        inputs, outputs = self._inputs(request)
        seen = ""  # a text-only contract: the text so far
        stream = self._take()
        clean = False
        try:
            try:
                stream.client.async_stream_infer(
                    self.model,
                    inputs,
                    outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
                    request_id=f"bench-{request.index}-{uuid.uuid4().hex[:8]}",
                    enable_empty_final_response=True,
                )
            except Exception as exc:
                # The stream broke before the request went out (e.g. no server); tritonclient then
                # says only "no longer in valid state" and hands the cause to the callback.
                raise _stream_error(stream, timeout=1.0) or exc from None
            while True:
                wait = min(self.timeout, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError("the run's time bound passed before the final response")
                try:
                    result, error, t_received = stream.responses.get(timeout=wait)
                except queue.Empty:
                    raise TimeoutError(f"no response from {self.model} within {wait:.1f}s") from None
                if error is not None:
                    raise error
                final = is_final_response(result)
                if self.count_tokens is not None and not self.contract.returns_token_ids:
                    texts = result.as_numpy("text_output")
                    text = "" if texts is None else texts.reshape(-1)[0]
                    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
                    n_tokens = self.count_tokens(seen + text_delta(seen, text)) - self.count_tokens(seen) \
                        if texts is not None else 0
                    seen = text if texts is not None else seen
                else:
                    n_tokens = tokens_in_response(result)
                # Mark the stream reusable before yielding: the caller stops iterating at the final chunk.
                clean = final
                yield TokenChunk(t_received=t_received, n_tokens=max(0, n_tokens), is_final=final)
                if final:
                    return
        finally:
            if clean:
                with self._lock:
                    self._idle.append(stream)
            else:
                stream.close(cancel=True, wait_s=2.0)

    def close(self) -> None:
        """Close every idle stream (an open stream keeps Triton from exiting on SIGTERM)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for stream in idle:
            stream.close(cancel=False, wait_s=5.0)


class ServingClientSender:
    """Streams through `trtpipe.serving.client.TritonLLMClient.stream` (a new gRPC client per request).

    Kept to measure what a per-request channel costs (benchmarks/bench_overhead.py); `TritonSender`
    is what `trtpipe bench` uses. `TritonLLMClient` objects are pooled so each keeps its cached
    model config; one whose request failed is dropped.
    """

    def __init__(self, url: str, model: str = "ensemble", *, timeout: float = 30.0, sampling: dict | None = None) -> None:
        from trtpipe.serving.client import TritonLLMClient

        self._client_type = TritonLLMClient
        self.url = url
        self.model = model
        self.timeout = timeout
        self.sampling = dict(sampling or {})
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, request: RequestSpec, deadline: float) -> Iterator[TokenChunk]:
        with self._lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = self._client_type(self.url, model=self.model, timeout=self.timeout)
        client.timeout = max(0.1, min(self.timeout, deadline - time.monotonic()))
        clean = False
        try:
            for chunk in client.stream(request.prompt, request.max_tokens, **self.sampling):
                clean = chunk.is_final  # set before yielding: the caller stops at the final chunk
                yield TokenChunk(t_received=chunk.t_received, n_tokens=len(chunk.token_ids), is_final=chunk.is_final)
                if chunk.is_final:
                    break
        finally:
            if clean:
                with self._lock:
                    self._idle.append(client)

    def close(self) -> None:
        with self._lock:
            self._idle = []


def _close_quietly(client: object) -> None:
    close = getattr(client, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing a dead channel may fail; nothing to do about it
            pass
