"""One `trtpipe bench` session as a library call: a `BenchRequest` in, a `BenchOutcome` out.

The CLI (trtpipe.commands.bench) turns its options into a request, calls `run_session` and renders the outcome;
tests, the matrix or a report can call it as the CLI does. In order, before any load is sent: when the result is
to be recorded, the server must say it serves exactly the repository named (trtpipe.serving.identity); the
workload is drawn (synthetic lengths or a dataset) and its prompt lengths are counted with the served tokenizer
and checked by the server where the layout lets it (trtpipe.bench.counting); the model's request contract is
looked up (trtpipe.serving.client). Then the load runs (trtpipe.bench.run_bench), the result is written, plotted
and recorded under the digest the server reported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from trtpipe.bench.metrics import RequestRecord, Slo
from trtpipe.bench.report import BenchResult
from trtpipe.bench.workload import LengthDist, TokenCounter
from trtpipe.errors import TrtpipeError, UsageError

if TYPE_CHECKING:
    from trtpipe.bench.counting import ServedPreprocessing
    from trtpipe.results import ResultsLog
    from trtpipe.serving.identity import RecordTarget, ServedIdentity
    from trtpipe.store.local import Store


class NoEndIdInput(UsageError):
    """Requests were to ignore the end token, and the served model's contract has no end_id input."""


class BenchRequest(BaseModel):
    """What to measure and how, every value already checked (the CLI's options, parsed)."""

    url: str = Field(description="The Triton gRPC address, checked (trtpipe.serving.address).")
    model: str = "ensemble"
    mode: Literal["open", "closed"]
    rates: list[float] | None = None
    concurrency: int | None = None
    requests: int = Field(ge=1)
    duration_s: float
    drain_s: float
    input_len: LengthDist | None = Field(description="Prompt lengths; None with a dataset (its own prompts).")
    output_len: LengthDist
    dataset: Path | None = None
    ignore_eos: bool = False
    seed: int = 0
    warmup: int = Field(default=1, ge=0)
    slo: Slo | None = None
    metrics_url: str | None = None
    output: Path | None = None
    plot: Path | None = None
    record: Path | None = Field(default=None, description="The repository whose digest the result is recorded for.")
    gpu_class: str | None = None

    def level_labels(self) -> list[str]:
        """One label per load level, in the order they run."""
        if self.rates:
            return [f"rate {rate:g}/s" for rate in self.rates]
        return [f"c={self.concurrency}"]


class BenchOutcome(BaseModel):
    """What a session did: the result, the notes said before the load ran, and what was written or recorded."""

    result: BenchResult
    notes: list[str] = Field(default_factory=list)
    written: list[str] = Field(default_factory=list, description="One line per file written or result recorded.")


CounterFor = Callable[[str], "tuple[TokenCounter, ServedPreprocessing | None, str | None]"]


def run_session(
    request: BenchRequest,
    store: Store | None,
    results: ResultsLog | None,
    counter_for: CounterFor,
    *,
    on_note: Callable[[str], None] | None = None,
    on_progress: Callable[[int, RequestRecord], None] | None = None,
) -> BenchOutcome:
    """Run one bench session (see the module doc).

    `store` holds the repository `request.record` names and `results` is where its result is recorded (the
    workspace's; both needed only when `request.record` is set). `counter_for(url)` gives the prompt-token counter,
    the served counting model's parameters and why the server cannot check the counts
    (trtpipe.bench.counting.token_counter with the caller's choice of tokenizer). `on_note` hears each note as it
    is found, before the load runs. Raises TokenizerMismatch when the server counts a prompt differently,
    NoEndIdInput when end tokens are to be ignored on a contract without end_id, UsageError when the server does
    not serve what `request.record` names."""
    from trtpipe.bench import default_metrics_url, run_bench
    from trtpipe.bench.counting import check_with_server, text_token_counter
    from trtpipe.bench.workload import dataset_workload, split_warmup, synthetic_workload
    from trtpipe.serving.client import resolve_model

    url = request.url
    recording: RecordTarget | None = None
    served_identity: ServedIdentity | None = None
    if request.record is not None:
        # Before any load is sent: what the server serves must be exactly what the request records for.
        from trtpipe.serving.identity import check_recording, read_served_identity, record_target

        assert store is not None and results is not None, "a recorded session names its store and results"
        recording = record_target(request.record, store)
        served_identity = read_served_identity(url, timeout=request.drain_s or 30)
        check_recording(served_identity, recording, url, request.record)
    counter, served, not_asked = counter_for(url)
    # One workload of warm-ups + requests, split: each warm-up has its own prompt, drawn the same way.
    count = request.warmup + request.requests
    if request.dataset is not None:
        workload = dataset_workload(request.dataset, count, request.output_len, seed=request.seed, counter=counter)
    else:
        assert request.input_len is not None, "a synthetic workload has prompt lengths"
        workload = synthetic_workload(count, request.input_len, request.output_len, seed=request.seed, counter=counter)
    warmup_requests, workload = split_warmup(workload, request.warmup)
    workload = check_with_server(url, workload, served, not_asked)

    notes: list[str] = []
    check = workload.server_check
    if check is not None and check.prompts_over_max_input_len:
        notes.append(f"note: {check.prompts_over_max_input_len} of {len(workload.requests)} prompts are longer than "
                     f"the served max_input_len {check.max_input_len}; the server will refuse them")
    for note in notes:  # said before the load runs
        if on_note is not None:
            on_note(note)
    model = request.model
    try:
        model, contract = resolve_model(url, model, timeout=request.drain_s or 30)
    except TrtpipeError:
        contract = None  # unreachable: every request fails and is reported
    if contract is not None and request.ignore_eos and not contract.takes_end_id:
        raise NoEndIdInput(f"{model} at {url} speaks the {contract.name} contract, which has no end_id input",
                           fix="let requests stop at the end token on an llm-api deployment")
    count_tokens = None
    if contract is not None and not contract.returns_token_ids:
        # Text only (the llmapi model): its output is counted in served tokens.
        count_tokens = text_token_counter(Path(workload.tokenizer)) if workload.tokenizer else counter.count
    result = run_bench(
        url, workload, request.mode, model=model, rates=request.rates, concurrency=request.concurrency,
        duration_s=request.duration_s, drain_s=request.drain_s, slo=request.slo,
        metrics_url=request.metrics_url or default_metrics_url(url), seed=request.seed,
        sampling={"end_id": -1} if request.ignore_eos else None, on_progress=on_progress,
        count_tokens=count_tokens, warmup=warmup_requests,
    )
    return BenchOutcome(result=result, notes=notes, written=_keep(request, result, results, recording,
                                                                   served_identity))


def _keep(request: BenchRequest, result: BenchResult, results: ResultsLog | None, recording: RecordTarget | None,
          served_identity: ServedIdentity | None) -> list[str]:
    """Write, plot and record the result as asked; one line each."""
    from trtpipe.bench.report import write_json

    lines: list[str] = []
    if request.output is not None:
        write_json(result, request.output)
        lines.append(f"result written to {request.output}")
    if request.plot is not None:
        from trtpipe.bench.plot import plot_result

        plot_result(result, request.plot)
        lines.append(f"plot written to {request.plot}")
    if recording is not None and served_identity is not None and results is not None:
        from trtpipe.results import run_evidence

        # Promotion gates compare bench results of one GPU class: default to the repository's target.
        filed_under = request.gpu_class or recording.target
        results.record(recording.digest, "bench", result.passed, result.summary(), filed_under,
                                 evidence=run_evidence("trtpipe bench", request.url,
                                                       served_identity.model_dump(mode="json")))
        lines.append(f"bench result recorded for {recording.digest} on {filed_under or 'no GPU class'} "
                     f"({'passed' if result.passed else 'failed'})")
    return lines


def lag_notes(result: BenchResult) -> list[str]:
    """A note per open-loop level whose generator sent requests late (the host was short of CPU)."""
    lines: list[str] = []
    for run in result.runs:
        lag = run.aggregates.schedule_lag_s
        # Latencies are measured from the actual send, so lateness does not inflate them, but the
        # offered load was lower than asked: say so when it is more than a rounding error.
        if run.mode == "open" and lag.p99 is not None and run.rate and lag.p99 > max(0.05, 0.5 / run.rate):
            lines.append(f"note: at {run.label} the generator sent requests up to {lag.p99 * 1e3:.0f} ms late "
                         "(P99); the host is short of CPU, so the offered load was below the asked rate")
    return lines


def failure_notes(result: BenchResult) -> list[str]:
    """A line for failed warm-ups, and one for failed requests with the first failure."""
    lines: list[str] = []
    if result.warmup is not None and result.warmup.aggregates.requests_failed:
        first = next(r for r in result.warmup.records if not r.ok)
        lines.append(f"{result.warmup.aggregates.requests_failed} of {len(result.warmup.records)} warm-up requests "
                     f"failed; first: {first.error_kind}: {first.error_message}")
    failed = [r for run in result.runs for r in run.records if not r.ok]
    if failed:
        sent = sum(run.aggregates.requests_sent for run in result.runs)
        first = failed[0]
        lines.append(f"{len(failed)} of {sent} requests failed; first: {first.error_kind}: {first.error_message}")
    return lines
