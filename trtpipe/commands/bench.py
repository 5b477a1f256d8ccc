"""CLI commands for the bench area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtpipe.errors import UsageError


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


def bench(
    url: str = typer.Argument(..., help="Triton gRPC address, e.g. localhost:8001"),
    model: str = typer.Option("ensemble", "--model", help="model to call: ensemble or tensorrt_llm_bls"),
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
    slo: Optional[str] = typer.Option(None, "--slo", help="goodput SLOs, e.g. ttft=500ms,tpot=50ms"),
    metrics_url: Optional[str] = typer.Option(
        None, "--metrics-url", help="Triton metrics endpoint (default: port 8002 when URL uses 8001)"
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="write the full result as JSON to FILE, or - for stdout"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write throughput-latency and TTFT plots to FILE.png"),
    record: Optional[Path] = typer.Option(
        None, "--record", help="store the result for this repository's artifact digest; refused unless the server "
                               "reports serving exactly that digest"
    ),
    gpu_class: Optional[str] = typer.Option(
        None, "--gpu-class", help="GPU class to file the recorded result under (default: the repository's target)"
    ),
) -> None:
    """Load a Triton LLM endpoint over streaming gRPC; report TTFT, TPOT, ITL, E2E, throughput and goodput.

    Exits 1 when any request failed (or missed an SLO given with --slo), else 0.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtpipe.bench import default_metrics_url, run_bench
    from trtpipe.bench.counting import check_with_server, counter_for
    from trtpipe.bench.metrics import Slo
    from trtpipe.bench.report import render_table, write_json
    from trtpipe.bench.workload import (
        LengthDist,
        dataset_workload,
        parse_duration_s,
        synthetic_workload,
    )

    if mode not in ("open", "closed"):
        raise UsageError(f"--mode must be open or closed, got {mode!r}")
    sweep = _parse_rates(rate, rates)
    if mode == "open" and not sweep:
        raise UsageError("--mode open needs --rate or --rates", fix="pass --rate 4, or --mode closed --concurrency 4")
    if mode == "closed" and sweep:
        raise UsageError("--rate/--rates apply to --mode open", fix="use --concurrency with --mode closed")
    if mode == "closed" and not concurrency:
        raise UsageError("--mode closed needs --concurrency", fix="pass --concurrency 4")
    duration_s = parse_duration_s(duration, option="--duration")
    drain_s = parse_duration_s(timeout, option="--timeout")
    slo_limits = Slo.parse(slo)
    recording = None
    if record is not None:
        # Before any load is sent: what the server serves must be exactly what --record names.
        from trtpipe.serving.identity import check_recording, read_served_identity, record_target

        recording = record_target(record)
        check_recording(read_served_identity(url, timeout=drain_s or 30), recording, url, record)
    counter, served, not_asked = counter_for(token_counting, tokenizer, record, url)
    out_len = LengthDist.parse(output_len, option="--output-len")
    if dataset is not None:
        workload = dataset_workload(dataset, requests, out_len, seed=seed, counter=counter)
    else:
        workload = synthetic_workload(
            requests, LengthDist.parse(input_len, option="--input-len"), out_len, seed=seed, counter=counter
        )
    workload = check_with_server(url, workload, served, not_asked)

    # With --json -, stdout carries only JSON: the table and progress go to stderr.
    console = Console(stderr=json_out == "-")
    check = workload.server_check
    if check is not None and check.prompts_over_max_input_len:
        console.print(
            f"[yellow]note: {check.prompts_over_max_input_len} of {len(workload.requests)} prompts are longer than "
            f"the served max_input_len {check.max_input_len}; the server will refuse them[/yellow]"
        )
    levels = len(sweep) if sweep else 1
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        tasks = [
            progress.add_task(f"{'rate ' + format(r, 'g') + '/s' if r else 'c=' + str(concurrency)}", total=requests)
            for r in (sweep or [None])
        ]
        result = run_bench(
            url,
            workload,
            mode,  # type: ignore[arg-type]
            model=model,
            rates=sweep,
            concurrency=concurrency,
            duration_s=duration_s,
            drain_s=drain_s,
            slo=slo_limits,
            metrics_url=metrics_url or default_metrics_url(url),
            seed=seed,
            sampling={"end_id": -1} if ignore_eos else None,
            on_progress=lambda level, _record: progress.advance(tasks[min(level, levels - 1)]),
        )

    render_table(result, console)
    for run in result.runs:
        lag = run.aggregates.schedule_lag_s
        # Latencies are measured from the actual send, so lateness does not inflate them, but the
        # offered load was lower than asked: say so when it is more than a rounding error.
        if run.mode == "open" and lag.p99 is not None and run.rate and lag.p99 > max(0.05, 0.5 / run.rate):
            console.print(
                f"[yellow]note: at {run.label} the generator sent requests up to {lag.p99 * 1e3:.0f} ms late "
                "(P99); the host is short of CPU, so the offered load was below the asked rate[/yellow]"
            )
    if json_out:
        write_json(result, json_out)
    if plot is not None:
        from trtpipe.bench.plot import plot_result

        plot_result(result, plot)
        console.print(f"plot written to {plot}")
    if recording is not None:
        from trtpipe.results import ResultsLog

        # Promotion gates compare bench results of one GPU class: default to the repository's target.
        filed_under = gpu_class or recording.target
        ResultsLog(recording.home).record(recording.digest, "bench", result.passed, result.summary(), filed_under)
        console.print(
            f"bench result recorded for {recording.digest} on {filed_under or 'no GPU class'} "
            f"({'passed' if result.passed else 'failed'})"
        )
    failed = [r for run in result.runs for r in run.records if not r.ok]
    if failed:
        sent = sum(run.aggregates.requests_sent for run in result.runs)
        first = failed[0]
        console.print(
            f"[red]{len(failed)} of {sent} requests failed; first: {first.error_kind}: {first.error_message}[/red]",
            soft_wrap=True,
        )
    if not result.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("bench")(bench)
