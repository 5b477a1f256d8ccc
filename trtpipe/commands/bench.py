"""CLI commands for the bench area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_json, print_table
from trtpipe.errors import UsageError

if TYPE_CHECKING:
    from trtpipe.bench.counting import ServedPreprocessing
    from trtpipe.bench.session import BenchRequest
    from trtpipe.bench.workload import TokenCounter


def _parse_rates(rate: Optional[float], rates: Optional[str]) -> list[float] | None:
    if rate is not None and rates:
        raise UsageError("give --rate or --rates, not both", fix="use --rates 1,2,4 for a sweep")
    if rate is not None:
        return [rate]
    if not rates:
        return None
    values = []
    for part in rates.split(","):
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"--rates: cannot read {part.strip()!r} as a rate", fix="write --rates 1,2,4") from None
        if value <= 0:
            raise UsageError(f"--rates: a rate must be positive, got {part.strip()!r}", fix="write --rates 1,2,4")
        values.append(value)
    return values


def token_counter(
    counting: str, tokenizer: Path | None, record: Path | None, url: str
) -> tuple[TokenCounter, ServedPreprocessing | None, str | None]:
    """The counter `--token-counting` asks for, and the served counting model's parameters (or why there are
    none). The tokenizer comes from --tokenizer, else --record; nothing is asked of the server before the
    options are known to be usable."""
    from trtpipe.bench import counting as counting_module

    if counting not in ("tokenizer", "words"):
        raise UsageError(f"--token-counting must be tokenizer or words, got {counting!r}", fix="pass --token-counting tokenizer")
    source, option = (tokenizer, "--tokenizer") if tokenizer is not None else (record, "--record")
    if counting == "tokenizer" and source is None:
        raise UsageError(
            "bench counts prompt lengths in tokens of the served model's tokenizer, and none was given",
            fix="pass --tokenizer REPO (the model repository the server serves, or its tokenizer directory) "
            "or --record REPO; or --token-counting words to count words instead of tokens",
        )
    return counting_module.token_counter(counting, source, option, url)


def bench_request(
    url: str, model: str, mode: str, rate: float | None, rates: str | None, concurrency: int | None, requests: int,
    duration: str, timeout: str, input_len: str, output_len: str, dataset: Path | None, ignore_eos: bool, seed: int,
    warmup: int, slo: str | None, metrics_url: str | None, output: Path | None, plot: Path | None,
    record: Path | None, gpu_class: str | None,
) -> BenchRequest:
    """The options, checked and parsed into the library's request; each refusal names its option."""
    from trtpipe.bench.metrics import Slo
    from trtpipe.bench.session import BenchRequest
    from trtpipe.bench.workload import LengthDist, parse_duration_s
    from trtpipe.serving.address import check_grpc_address

    if mode not in ("open", "closed"):
        raise UsageError(f"--mode must be open or closed, got {mode!r}")
    sweep = _parse_rates(rate, rates)
    if mode == "open" and not sweep:
        raise UsageError("--mode open needs --rate or --rates", fix="pass --rate 4, or --mode closed --concurrency 4")
    if mode == "closed" and sweep:
        raise UsageError("--rate/--rates apply to --mode open", fix="use --concurrency with --mode closed")
    if mode == "closed" and not concurrency:
        raise UsageError("--mode closed needs --concurrency", fix="pass --concurrency 4")
    if requests < 1:
        raise UsageError(f"--requests must be at least 1, got {requests}")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {warmup}", fix="pass --warmup 0 to send none")
    duration_s = parse_duration_s(duration, option="--duration")
    drain_s = parse_duration_s(timeout, option="--timeout")
    slo_limits = Slo.parse(slo, option="--slo")
    if dataset is not None and not dataset.is_file():
        raise UsageError(f"--dataset: {dataset} does not exist", fix="pass a JSONL file with one {\"prompt\": ...} per line")
    out_len = LengthDist.parse(output_len, option="--output-len")
    in_len = LengthDist.parse(input_len, option="--input-len") if dataset is None else None  # a dataset's own
    return BenchRequest(
        url=check_grpc_address(url),  # an http:// URL or Triton's HTTP port: one line naming the gRPC port
        model=model, mode=mode, rates=sweep, concurrency=concurrency, requests=requests, duration_s=duration_s,
        drain_s=drain_s, input_len=in_len, output_len=out_len, dataset=dataset, ignore_eos=ignore_eos, seed=seed,
        warmup=warmup, slo=slo_limits, metrics_url=metrics_url, output=output, plot=plot, record=record,
        gpu_class=gpu_class,
    )


def bench(
    url: str = typer.Argument(..., help="Triton gRPC address, e.g. localhost:8001"),
    model: str = typer.Option("ensemble", "--model", help="model to call: ensemble or tensorrt_llm_bls (the ensemble stands for tensorrt_llm on an llmapi repository)"),
    mode: str = typer.Option("open", "--mode", help="open (Poisson arrivals at --rate) or closed (fixed --concurrency)"),
    rate: Optional[float] = typer.Option(None, "--rate", help="open loop: requests per second"),
    rates: Optional[str] = typer.Option(None, "--rates", help="open loop sweep: comma-separated rates, e.g. 1,2,4"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="closed loop: requests kept in flight"),
    requests: int = typer.Option(100, "--requests", help="requests per load level (at most)"),
    duration: str = typer.Option("60s", "--duration", help="stop sending after this long per load level"),
    timeout: str = typer.Option("30s", "--timeout", help="after --duration, how long running requests may finish"),
    input_len: str = typer.Option("128", "--input-len", help="prompt tokens: 128, uniform:64,256 or normal:128,32"),
    output_len: str = typer.Option("64", "--output-len", help="max_tokens: 64, uniform:16,128 or normal:64,16"),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="JSONL prompts ({'prompt': ...} or ShareGPT)"),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer",
        help="the served model's repository (or its tokenizer dir): prompt lengths in its tokens (default: --record REPO)",
    ),
    token_counting: str = typer.Option(
        "tokenizer", "--token-counting",
        help="tokenizer (the served model's tokens, checked by the server) or words (one word counted as one token)",
    ),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", help="send end_id=-1 so every request generates exactly its max_tokens"
    ),
    seed: int = typer.Option(0, "--seed", help="seed for the workload and the arrivals"),
    warmup: int = typer.Option(
        1, "--warmup", help="requests sent one at a time before the runs, excluded from every figure and "
                            "reported apart (each its own prompt)"
    ),
    slo: Optional[str] = typer.Option(None, "--slo", help="goodput SLOs, e.g. ttft=500ms,tpot=50ms"),
    metrics_url: Optional[str] = typer.Option(
        None, "--metrics-url", help="Triton metrics endpoint (default: port 8002 when URL uses 8001)"
    ),
    output: Optional[Path] = typer.Option(None, "--output", help="write the whole result, raw request records included, "
                                          "as JSON to FILE"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write throughput-latency and TTFT plots to FILE.png"),
    record: Optional[Path] = typer.Option(
        None, "--record", help="store the result for this repository's artifact digest; refused unless the server "
                               "reports serving exactly that digest"
    ),
    gpu_class: Optional[str] = typer.Option(
        None, "--gpu-class", help="GPU class to file the recorded result under (default: the repository's target)"
    ),
    store: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    """Load a Triton LLM endpoint over streaming gRPC; report TTFT, TPOT, ITL, E2E, throughput and goodput.

    --json prints the summary (what --record stores) on stdout; --output FILE keeps every request.
    Exits 1 when any request failed (or missed an SLO given with --slo), else 0.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtpipe.bench.counting import TokenizerMismatch
    from trtpipe.bench.report import result_table
    from trtpipe.bench.session import NoEndIdInput, failure_notes, lag_notes, run_session

    request = bench_request(url, model, mode, rate, rates, concurrency, requests, duration, timeout, input_len,
                            output_len, dataset, ignore_eos, seed, warmup, slo, metrics_url, output, plot, record,
                            gpu_class)
    workspace = open_workspace(store)
    recorded_in = (workspace.store, workspace.results) if record is not None else (None, None)  # creates nothing else
    labels = request.level_labels()
    # With --json, stdout carries only JSON: the table, notes and progress go to stderr.
    with Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=Console(stderr=True), transient=True,
    ) as progress:
        tasks = [progress.add_task(label, total=requests) for label in labels]
        try:
            outcome = run_session(
                request, *recorded_in, lambda served_url: token_counter(token_counting, tokenizer, record, served_url),
                on_note=lambda note: typer.echo(note, err=json_out),
                on_progress=lambda level, _record: progress.advance(tasks[min(level, len(tasks) - 1)]),
            )
        except TokenizerMismatch as err:
            raise UsageError(err.message, fix="pass --tokenizer with the model repository the server serves "
                                              "(or --token-counting words)") from None
        except NoEndIdInput as err:
            raise UsageError(f"--ignore-eos: {err.message}",
                             fix="drop --ignore-eos for an llm-api deployment (requests then stop at the end token)") from None
    result = outcome.result
    table = result_table(result)
    print_table(table.title, table.columns, table.rows, caption=table.caption, err=json_out)
    failed = [r for run in result.runs for r in run.records if not r.ok]
    for line in [*lag_notes(result), *outcome.written, *failure_notes(result), *_dead_models(failed)]:
        typer.echo(line, err=json_out)
    if json_out:
        print_json(result.summary())
    if not result.passed:
        raise typer.Exit(1)


def _dead_models(failed: list) -> list[str]:
    """A line per model whose backend process died, named from the server's "Stub process ... is not healthy"."""
    from trtpipe.serving.client import dead_model

    dead: dict[str, int] = {}
    for record in failed:
        found = dead_model(record.error_message or "")
        if found is not None:
            dead[found[0]] = dead.get(found[0], 0) + 1
    return [f"the model {model}'s backend process died ({n} requests failed on it); the server must be restarted "
            "(`trtpipe serve REPO --restart on-failure` does so by itself)" for model, n in dead.items()]


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("bench", rich_help_panel="Serve")(bench)
