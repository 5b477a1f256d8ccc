"""The result of `trtpipe bench` (pydantic: what `--output FILE` writes) and its table."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.atomic import write_text_atomically
from trtpipe.bench.metrics import Aggregates, RequestRecord, Slo, Stats
from trtpipe.bench.prometheus import ServerSide
from trtpipe.bench.workload import Workload

SCHEMA_VERSION = 1


class RunResult(BaseModel):
    """One load level of a benchmark: an open-loop rate or a closed-loop concurrency."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["open", "closed"]
    rate: float | None = Field(default=None, description="requests per second asked for (open loop)")
    concurrency: int | None = Field(default=None, description="requests kept in flight (closed loop)")
    aggregates: Aggregates
    server: ServerSide
    client_overhead_s: float | None = Field(
        default=None,
        description="mean client E2E minus the server's mean request duration for the served model",
    )
    records: list[RequestRecord]

    @property
    def label(self) -> str:
        if self.mode == "open":
            return f"{self.rate:g} req/s"
        return f"c={self.concurrency}"


class WarmupResult(BaseModel):
    """The warm-up requests sent before the first load level (one at a time): excluded from every figure of
    `runs`, reported apart so a slow first request is seen, not hidden."""

    model_config = ConfigDict(extra="forbid")

    aggregates: Aggregates
    records: list[RequestRecord]


class BenchResult(BaseModel):
    """Everything `trtpipe bench` measured, raw records included; `--output FILE` writes exactly this."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    url: str
    model: str
    mode: Literal["open", "closed"]
    duration_limit_s: float
    drain_s: float
    slo: Slo
    sampling: dict[str, Any] = Field(default_factory=dict, description="extra request inputs sent with every request")
    workload: Workload
    runs: list[RunResult]
    warmup: WarmupResult | None = Field(default=None, description="requests sent before the runs, excluded from them")
    started_at: str = Field(description="UTC ISO-8601 time the first run started")
    output_token_counting: Literal["server", "text"] = Field(
        default="server",
        description="'server': output tokens as the server reports them (sequence_length / output_ids); 'text': an "
                    "llmapi model returns text only, so each response's new text counted in the workload tokenizer's "
                    "tokens (words when counting words)",
    )

    @property
    def passed(self) -> bool:
        """Every request of every run succeeded (and met the SLOs when some were given)."""
        for run in self.runs:
            agg = run.aggregates
            if agg.requests_failed or agg.requests_sent == 0:
                return False
            if agg.requests_meeting_slo is not None and agg.requests_meeting_slo < agg.requests_ok:
                return False
        return True

    def summary(self) -> dict:
        """The aggregates without the raw records: what a results log keeps and `--json` prints."""
        return {
            "url": self.url,
            "model": self.model,
            "mode": self.mode,
            "slo": self.slo.model_dump(exclude_none=True),
            "workload": self.workload.model_dump(exclude={"requests"}),
            "output_token_counting": self.output_token_counting,
            "runs": [
                run.model_dump(exclude={"records"}) | {"label": run.label}
                for run in self.runs
            ],
            "warmup": self.warmup.model_dump(exclude={"records"}) if self.warmup is not None else None,
        }


def write_json(result: BenchResult, destination: Path) -> None:
    """Write the whole result (raw records too) as JSON to a file, atomically (temp file, then rename)."""
    # 0644: a report is meant to be read by others.
    write_text_atomically(Path(destination), result.model_dump_json(indent=2) + "\n", mode=0o644)


def load_json(path: Path) -> BenchResult:
    """Read and validate a result written by `write_json`."""
    return BenchResult.model_validate_json(path.read_text(encoding="utf-8"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def _stat_ms(stats: Stats) -> str:
    if stats.count == 0:
        return "-"
    return f"{_ms(stats.mean)} / {_ms(stats.p50)} / {_ms(stats.p90)} / {_ms(stats.p99)}"


def counting_note(workload: Workload) -> str:
    """How the prompt lengths were counted, in words a reader of the table cannot miss."""
    if workload.token_counting == "words":
        return "prompt lengths counted in WORDS, not tokens (--token-counting words)"
    parts = Path(workload.tokenizer or "?").parts
    short = "/".join(parts[-3:]) if len(parts) <= 3 else ".../" + "/".join(parts[-3:])  # the JSON has the full path
    special = ", special tokens included" if workload.add_special_tokens else ""
    note = f"prompt lengths in tokens of {short}{special}"
    check = workload.server_check
    if check is not None and check.prompts_checked:
        return f"{note}, equal to the served {check.model}'s count on {check.prompts_checked} prompts"
    if check is not None:
        return f"{note}, not checked by the server: every prompt is longer than its max_input_len {check.max_input_len}"
    return f"{note}, not checked by the server ({workload.server_check_skipped or 'not asked'})"


class Table(BaseModel):
    """A table as data (the CLI prints it: `trtpipe.commands.output.print_table`)."""

    title: str
    caption: str
    columns: list[str]
    rows: list[list[str]]


def result_table(result: BenchResult) -> Table:
    """One row per load level: throughput, latencies (mean / P50 / P90 / P99 in ms), errors, server time."""
    input_column = "in words" if result.workload.token_counting == "words" else "in tok"
    columns = ["load", "ok/sent", "req/s", input_column, "out tok/s"]
    if result.slo.is_set():
        columns.append("goodput req/s")
    columns += ["TTFT", "TPOT", "ITL", "E2E", "server ms", "errors"]
    rows: list[list[str]] = []
    levels: list[tuple[str, Aggregates, str]] = []
    for run in result.runs:
        server_model = run.server.for_model(result.model)
        levels.append((run.label, run.aggregates, _ms(server_model.mean_request_s) if server_model else "-"))
    if result.warmup is not None:
        levels.append(("warm-up (excluded)", result.warmup.aggregates, "-"))
    for label, agg, server_ms in levels:
        errors = ", ".join(f"{kind}={n}" for kind, n in agg.errors_by_kind.items()) or "-"
        row = [
            label,
            f"{agg.requests_ok}/{agg.requests_sent}",
            f"{agg.request_throughput:.2f}",
            "-" if agg.input_tokens.mean is None else f"{agg.input_tokens.mean:.0f}",
            f"{agg.output_token_throughput:.1f}",
        ]
        if result.slo.is_set():
            row.append("-" if agg.goodput is None else f"{agg.goodput:.2f}")
        row += [_stat_ms(agg.ttft_s), _stat_ms(agg.tpot_s), _stat_ms(agg.itl_s), _stat_ms(agg.e2e_s), server_ms, errors]
        rows.append(row)
    return Table(
        title=f"trtpipe bench  {result.model} @ {result.url}  ({result.mode} loop, {len(result.workload.requests)} requests max)",
        caption="latencies in ms: mean / P50 / P90 / P99;  server = Triton's mean request duration for the model;  "
        + (f"warm-up: {len(result.warmup.records)} request(s) sent one at a time before the runs, in no figure "
           "but its own row;  " if result.warmup is not None else "")
        + f"{input_column} = mean prompt length: {counting_note(result.workload)};  "
        + ("output tokens as the server reports them" if result.output_token_counting == "server"
           else "output tokens: the streamed text counted with the same tokenizer (the llmapi model returns text only)"),
        columns=columns,
        rows=rows,
    )
