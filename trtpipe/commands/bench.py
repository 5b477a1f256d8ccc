"""CLI commands for the bench area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_json, print_table
from trtpipe.errors import TrtpipeError, UsageError

if TYPE_CHECKING:
    from trtpipe.bench.counting import ServedPreprocessing
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
    """The counter `--token-counting` asks for, and the served preprocessing parameters (or why there
    are none). The tokenizer comes from --tokenizer, else --record; nothing is asked of the server
    before the options are known to be usable."""
    from trtpipe.bench.counting import ask_server, served_tokenizer
    from trtpipe.bench.workload import HfTokenizerCounter, WordCounter

    if counting == "words":
        return WordCounter(), None, None
    if counting != "tokenizer":
        raise UsageError(f"--token-counting must be tokenizer or words, got {counting!r}", fix="pass --token-counting tokenizer")
    source, option = (tokenizer, "--tokenizer") if tokenizer is not None else (record, "--record")
    if source is None:
        raise UsageError(
            "bench counts prompt lengths in tokens of the served model's tokenizer, and none was given",
            fix="pass --tokenizer REPO (the model repository the server serves, or its tokenizer directory) "
            "or --record REPO; or --token-counting words to count words instead of tokens",
        )
    tokenizer_json, add_special, layout = served_tokenizer(source, option)
    served, reason = ask_server(url, layout)
    if add_special is None:  # a bare tokenizer: add special tokens as the server does (model.py's default: true)
        add_special = served.add_special_tokens if served is not None else True
    try:
        counter = HfTokenizerCounter(tokenizer_json, add_special_tokens=add_special)
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for a bad file
        raise UsageError(
            f"{option}: cannot load {tokenizer_json}: {' '.join(str(err).split())[:160]}",
            fix="pass the model repository the server serves (its tokenizer.json is what the server loads)",
        ) from None
    return counter, served, reason


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

    from trtpipe.bench import default_metrics_url, run_bench
    from trtpipe.bench.counting import TokenizerMismatch, check_with_server
    from trtpipe.bench.metrics import Slo
    from trtpipe.bench.report import result_table, write_json
    from trtpipe.bench.workload import (
        LengthDist,
        dataset_workload,
        parse_duration_s,
        split_warmup,
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
    if requests < 1:
        raise UsageError(f"--requests must be at least 1, got {requests}")
    if warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {warmup}", fix="pass --warmup 0 to send none")
    duration_s = parse_duration_s(duration, option="--duration")
    drain_s = parse_duration_s(timeout, option="--timeout")
    slo_limits = Slo.parse(slo, option="--slo")
    if dataset is not None and not dataset.is_file():
        raise UsageError(f"--dataset: {dataset} does not exist", fix="pass a JSONL file with one {\"prompt\": ...} per line")
    from trtpipe.serving.address import check_grpc_address

    url = check_grpc_address(url)  # an http:// URL or Triton's HTTP port: one line naming the gRPC port
    workspace = open_workspace(store)
    recording = None
    if record is not None:
        # Before any load is sent: what the server serves must be exactly what --record names.
        from trtpipe.serving.identity import check_recording, read_served_identity, record_target

        recording = record_target(record, workspace.store)
        served_identity = read_served_identity(url, timeout=drain_s or 30)
        check_recording(served_identity, recording, url, record)
    counter, served, not_asked = token_counter(token_counting, tokenizer, record, url)
    out_len = LengthDist.parse(output_len, option="--output-len")
    # One workload of warm-ups + requests, split: each warm-up has its own prompt, drawn the same way.
    if dataset is not None:
        workload = dataset_workload(dataset, warmup + requests, out_len, seed=seed, counter=counter)
    else:
        workload = synthetic_workload(
            warmup + requests, LengthDist.parse(input_len, option="--input-len"), out_len, seed=seed, counter=counter
        )
    warmup_requests, workload = split_warmup(workload, warmup)
    try:
        workload = check_with_server(url, workload, served, not_asked)
    except TokenizerMismatch as err:
        raise UsageError(err.message, fix="pass --tokenizer with the model repository the server serves "
                                          "(or --token-counting words)") from None

    # With --json, stdout carries only JSON: the table, notes and progress go to stderr.
    console = Console(stderr=True)
    check = workload.server_check
    notes: list[str] = []
    if check is not None and check.prompts_over_max_input_len:
        notes.append(
            f"note: {check.prompts_over_max_input_len} of {len(workload.requests)} prompts are longer than "
            f"the served max_input_len {check.max_input_len}; the server will refuse them"
        )
    for note in notes:
        typer.echo(note, err=json_out)
    count_tokens = None
    from trtpipe.serving.client import resolve_model

    try:
        model, contract = resolve_model(url, model, timeout=drain_s or 30)
    except TrtpipeError:
        contract = None  # unreachable: every request fails and is reported
    if contract is not None and ignore_eos and not contract.takes_end_id:
        raise UsageError(f"--ignore-eos: {model} at {url} speaks the {contract.name} contract, which has no end_id input",
                         fix="drop --ignore-eos for an llm-api deployment (requests then stop at the end token)")
    if contract is not None and not contract.returns_token_ids:
        # Text only (the llmapi model): its output is counted in served tokens.
        from trtpipe.bench.counting import text_token_counter

        count_tokens = text_token_counter(Path(workload.tokenizer)) if workload.tokenizer else counter.count
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
            count_tokens=count_tokens,
            warmup=warmup_requests,
        )

    table = result_table(result)
    print_table(table.title, table.columns, table.rows, caption=table.caption, err=json_out)
    lines: list[str] = []
    for run in result.runs:
        lag = run.aggregates.schedule_lag_s
        # Latencies are measured from the actual send, so lateness does not inflate them, but the
        # offered load was lower than asked: say so when it is more than a rounding error.
        if run.mode == "open" and lag.p99 is not None and run.rate and lag.p99 > max(0.05, 0.5 / run.rate):
            lines.append(
                f"note: at {run.label} the generator sent requests up to {lag.p99 * 1e3:.0f} ms late "
                "(P99); the host is short of CPU, so the offered load was below the asked rate"
            )
    if output is not None:
        write_json(result, output)
        lines.append(f"result written to {output}")
    if plot is not None:
        from trtpipe.bench.plot import plot_result

        plot_result(result, plot)
        lines.append(f"plot written to {plot}")
    if recording is not None:
        # Promotion gates compare bench results of one GPU class: default to the repository's target.
        filed_under = gpu_class or recording.target
        from trtpipe.results import run_evidence

        workspace.results.record(recording.digest, "bench", result.passed, result.summary(), filed_under,
                                 evidence=run_evidence("trtpipe bench", url, served_identity.model_dump(mode="json")))
        lines.append(
            f"bench result recorded for {recording.digest} on {filed_under or 'no GPU class'} "
            f"({'passed' if result.passed else 'failed'})"
        )
    if result.warmup is not None and result.warmup.aggregates.requests_failed:
        first = next(r for r in result.warmup.records if not r.ok)
        lines.append(f"{result.warmup.aggregates.requests_failed} of {len(result.warmup.records)} warm-up requests "
                     f"failed; first: {first.error_kind}: {first.error_message}")
    failed = [r for run in result.runs for r in run.records if not r.ok]
    if failed:
        sent = sum(run.aggregates.requests_sent for run in result.runs)
        first = failed[0]
        lines.append(f"{len(failed)} of {sent} requests failed; first: {first.error_kind}: {first.error_message}")
        lines += _dead_models(failed)
    for line in lines:
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
