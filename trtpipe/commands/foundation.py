"""CLI commands for the foundation area: `check`, `plan`, `spec-check`. Thin: parse, call one function, print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trtpipe.atomic import write_text_atomically
from trtpipe.commands.output import JsonOption, command_configs, print_table
from trtpipe.errors import UsageError

CHECK_HELP = (
    "Can this host build what the spec asks for? Probes the GPUs (NVML), the installed packages and the "
    "Docker daemon, and compares them with the spec's toolchain and target (without --spec: with the newest "
    "pinned toolchain). Prints OK / WARN / FAIL rows, each with its fix."
    "\n\n"
    "Exit codes: 0 = no FAIL row; 1 = a FAIL row; 2 = invalid spec; 3 = no NVIDIA GPU on this host and the "
    "spec targets a GPU (or no spec was given): GPU targets can be checked and planned here but not built, "
    "cpu-reference works."
)

PLAN_HELP = (
    "Memory plan of a spec on its target: weights per GPU, KV cache bytes per token, tokens and sequences "
    "that fit, a decode TPOT floor, a verdict and, when it does not fit, changes that would (each with its "
    "new figures). Needs only the model's config.json (model.config is enough)."
    "\n\n"
    "Exit codes: 0 = fits; 1 = does not fit (suggestions printed); 2 = invalid spec."
)


def _fmt_count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _fmt_bytes(n: int | float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{int(n):,} B"


def check_command(
    spec: Path | None = typer.Option(None, "--spec", "-s", help="Build spec to compare this host with."),
    as_json: JsonOption = False,
    recorded_probe: Path | None = typer.Option(
        None, "--recorded-probe", help="Replay a recorded NVML answer (JSON) of another host instead of probing."
    ),
    record_probe: Path | None = typer.Option(
        None, "--record-probe", help="Also write this host's raw NVML answer to FILE (for --recorded-probe)."
    ),
) -> None:
    from trtpipe.gpu import NvmlProbe, RecordedProbe, probe_host
    from trtpipe.hostcheck import docker_status, installed_versions, run_checks
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    configs = command_configs()
    resolved = resolve(load_spec(spec), need_weights=False, configs=configs) if spec is not None else None
    probe = RecordedProbe(recorded_probe) if recorded_probe is not None else NvmlProbe()
    if record_probe is not None:
        if recorded_probe is not None:
            raise UsageError("--record-probe records this host; it cannot be combined with --recorded-probe")
        write_text_atomically(record_probe, json.dumps(NvmlProbe().record(), indent=2) + "\n")
    report = run_checks(probe_host(probe), installed_versions(), docker_status(), resolved, configs=configs)
    if as_json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        print_table(f"trtpipe check: {report.spec or 'this host'} (toolchain {report.toolchain})",
                    ["status", "item", "found", "expected", "fix"],
                    [[row.status, row.item, row.found, row.expected or "", row.fix or ""] for row in report.rows])
        for line in report.possible_here:
            typer.echo(f"possible here: {line}")
        for line in report.not_possible_here:
            typer.echo(f"not possible here: {line}")
        typer.echo(f"exit {report.exit_code}: {report.exit_meaning}")
    raise typer.Exit(report.exit_code)


def plan_command(
    spec: Path = typer.Argument(..., help="Build spec (YAML)."),
    as_json: JsonOption = False,
) -> None:
    from trtpipe.plan import memory_plan
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    plan = memory_plan(resolve(load_spec(spec), need_weights=False, configs=command_configs()))
    if as_json:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
    else:
        m = plan.model
        rows = [
            ("model", f"{m.architecture}: {_fmt_count(m.total_params)} params, {m.layers} layers, "
             f"{m.attention_heads} heads / {m.kv_heads} KV heads x {m.head_dim}"),
            ("target", f"{plan.gpu_product or 'host CPU'} (SM{plan.sm})" if plan.sm else plan.memory_source),
            ("tp x pp", f"{plan.tp} x {plan.pp}"),
            ("weights", f"{plan.weight_precision}: {_fmt_bytes(plan.weight_bytes_total)} total, "
             f"{_fmt_bytes(plan.weight_bytes_per_gpu)} per GPU"),
            ("KV cache per token", f"{plan.kv_bytes_per_token:,} bytes ({plan.kv_cache_dtype}); "
             f"{plan.kv_bytes_per_token_per_gpu:,} per GPU"),
            ("memory per GPU", plan.memory_source),
            ("overhead (assumed)", f"{_fmt_bytes(plan.overhead_bytes)}: {plan.overhead_assumption}"),
            ("KV cache per GPU", f"{_fmt_bytes(plan.kv_cache_bytes_per_gpu)} "
             f"(x kv_cache_free_gpu_mem_fraction {plan.kv_cache_free_gpu_mem_fraction})"),
            ("tokens that fit", f"{plan.kv_tokens:,}"),
            *([("attention window", f"{plan.attention_window} (max_attention_window_size; a sequence keeps at most "
                "that many tokens of K and V per layer)")] if plan.attention_window else []),
            ("sequences at max_seq_len", f"{plan.sequences_at_max_seq_len} x {plan.max_seq_len} tokens "
             f"(max_batch_size {plan.max_batch_size} needs {plan.tokens_needed:,} tokens)"),
            ("decode TPOT floor", f"{plan.tpot_floor_ms:.2f} ms (weights per GPU / {plan.memory_bandwidth_gbs:g} GB/s)"
             if plan.tpot_floor_ms is not None else "n/a"),
        ]
        print_table(f"memory plan: {plan.spec_name} on {plan.gpu_count} x {plan.target}", ["what", "value"], rows)
        typer.echo(f"verdict: {plan.verdict}: {plan.reason}")
        for note in plan.notes:
            typer.echo(f"note: {note}")
        if plan.suggestions:
            print_table(
                "changes that would help",
                ["change", "weights/GPU", "KV tokens", "seqs @ max_seq_len", "GPUs", "fits"],
                [[s.change, _fmt_bytes(s.weight_bytes_per_gpu), f"{s.kv_tokens:,}",
                  f"{s.sequences_at_max_seq_len} x {s.max_seq_len}", str(s.gpu_count), "yes" if s.fits else "no"]
                 for s in plan.suggestions],
            )
    raise typer.Exit(0 if plan.fits else 1)


def spec_check_command(
    spec: Path = typer.Argument(..., help="Build spec (YAML)."),
    weights: bool = typer.Option(False, "--weights", help="Also require the model's weights (as a build does)."),
    as_json: JsonOption = False,
) -> None:
    """Validate a spec (shape and every cross-field rule). Exit 0 valid, 2 invalid (one line: file:line:col)."""
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    resolved = resolve(load_spec(spec), need_weights=weights, configs=command_configs())
    facts = {
        "spec": str(resolved.spec_path),
        "name": resolved.spec.artifact_name,
        "target": resolved.gpu.name if resolved.gpu else "cpu-reference",
        "sm": resolved.sm,
        "toolchain": resolved.toolchain.name,
        "weight_dtype": resolved.weight_dtype,
        "kv_cache_dtype": resolved.kv_cache_dtype,
        "model_config": str(resolved.config_path),
        "backend": resolved.backend_kind,
    }
    notes = resolved.notes
    if as_json:
        print(json.dumps({"valid": True, **facts, "notes": notes}, indent=2))
    else:
        print(f"ok: {spec}: " + ", ".join(f"{k}={v}" for k, v in facts.items() if k != "spec"))
        for note in notes:
            print(f"note: {note}")


def spec_schema_command(
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the schema to FILE (default: stdout)."),
) -> None:
    """Print the build spec's JSON Schema, for editors: point yaml-language-server at it
    (`# yaml-language-server: $schema=FILE` on a spec's first line) to complete and check specs as they are typed."""
    from trtpipe.gpu import load_catalog
    from trtpipe.spec_schema import spec_schema
    from trtpipe.toolchain import load_toolchains

    if output is not None and output.is_dir():
        raise UsageError(f"--output {output} is a directory", fix="give the schema file's path, e.g. "
                         f"{output / 'trtpipe-spec.schema.json'}")
    configs = command_configs()
    schema = spec_schema(gpus=list(load_catalog(configs=configs)),
                         toolchains=list(load_toolchains(include_preview=True, configs=configs)))
    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        write_text_atomically(output, text, mode=0o644)
        typer.echo(f"spec schema written to {output}", err=True)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("check", help=CHECK_HELP, rich_help_panel="Plan")(check_command)
    app.command("spec-check", rich_help_panel="Plan")(spec_check_command)
    app.command("spec-schema", rich_help_panel="Plan")(spec_schema_command)
    app.command("plan", help=PLAN_HELP, rich_help_panel="Plan")(plan_command)
