"""CLI commands for the engine area. Thin: parse, call one function, print."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from trtpipe.commands.output import JsonOption, command_configs, print_table
from trtpipe.errors import NotFound


def doctor(
    logfile: Path = typer.Argument(..., help="A build or server log to diagnose."),
    as_json: JsonOption = False,
) -> None:
    """Recognize known TensorRT / TensorRT-LLM / Triton failures in a log and print cause and fix."""
    from trtpipe.engine.doctor import diagnose

    if not logfile.is_file():
        raise NotFound(f"{logfile}: no such file", what="log", ref=str(logfile), fix="give the path of a build or server log")
    diagnoses = diagnose(logfile.read_text(encoding="utf-8", errors="replace"))
    if as_json:
        typer.echo(json.dumps({"log": str(logfile), "diagnoses": [d.model_dump() for d in diagnoses]}, indent=2))
    elif not diagnoses:
        typer.echo(f"{logfile}: no known failure recognized")
    else:
        from rich.console import Console

        console = Console()
        for d in diagnoses:
            console.print(f"[bold red]{d.pattern_id}[/]: {d.matched_line}", markup=True, highlight=False)
            console.print(f"  cause: {d.cause}", markup=False, highlight=False)
            console.print(f"  fix:   {d.fix}", markup=False, highlight=False)


def engine_plan(
    spec: Path = typer.Argument(..., help="A build spec YAML."),
    checkpoint_dir: str = typer.Option("<checkpoint>", "--checkpoint-dir", help="Checkpoint path to render."),
    output_dir: str = typer.Option("<engine>", "--output-dir", help="Engine output path to render."),
    docker: bool = typer.Option(False, "--docker", help="Also print the docker container spec."),
    as_json: JsonOption = False,
) -> None:
    """Print the engine build plan, each setting's reason, and the exact trtllm-build command."""
    from trtpipe.engine.plan import make_build_plan
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    resolved = resolve(load_spec(spec), need_weights=False, configs=command_configs())
    plan = make_build_plan(resolved)
    command = plan.render_command(checkpoint_dir, output_dir)
    container = None
    if docker and not plan.is_reference:
        from trtpipe.engine.executors.docker import container_spec

        if resolved.toolchain.triton_container:
            container = container_spec(plan, resolved.toolchain, Path(checkpoint_dir), Path(output_dir))
    if as_json:
        payload = {"plan": plan.model_dump(mode="json"), "command": command}
        if container is not None:
            payload["container"] = container.model_dump(mode="json") | {"docker_cli": container.docker_cli()}
        typer.echo(json.dumps(payload, indent=2))
        return
    rows = [[key, "(not passed)" if value is None else str(value), plan.why.get(key, "")] for key, value in plan.limits.items()]
    rows += [[key, str(value), plan.why.get(key, "")] for key, value in plan.plugin_config.items()]
    print_table(f"{spec.name}: {plan.profile} profile, {plan.family} ({plan.target_gpu}), {plan.toolchain}",
                ["setting", "value", "why"], rows)
    typer.echo(" ".join(command))
    if container is not None:
        typer.echo(" ".join(container.docker_cli()))
    elif docker and not plan.is_reference:
        typer.echo(f"(no container pinned for {plan.toolchain} in build_configs/toolchains.yaml)")


def migrate(
    spec: Path = typer.Argument(..., help="A build spec YAML (backend trtllm-build, or none named)."),
    as_json: JsonOption = False,
) -> None:
    """Show what changes when SPEC moves from trtllm-build to backend llm-api: settings that map, settings with
    no equivalent (and why), the LLM() arguments. Exit 0 ready, 1 the spec needs changes first or is refused."""
    from trtpipe.migrate import migration_plan

    report = migration_plan(spec, command_configs())
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        typer.echo(f"{spec}: {report.name} on {report.target} ({report.toolchain}): {report.from_backend} -> llm-api: "
                   f"{report.verdict}")
        if report.maps:
            print_table("settings that map", ["spec field", "value", "trtllm-build", "llm-api (LLM() argument)", "why"],
                        [[m.spec_field or "(set by trtpipe)", m.value, m.trtllm_build or "-", m.llm_api, m.reason]
                         for m in report.maps])
        print_table("settings with no llm-api equivalent", ["spec field", "value", "action", "why"],
                    [[u.spec_field, u.value, "REMOVE" if u.blocking else "none", u.reason] for u in report.no_equivalent])
        if report.shape:
            print_table("the spec's earlier shape: where each field lives now", ["written as", "today"],
                        [[move.earlier, move.today] for move in report.shape])
        if report.refused:
            typer.echo(f"refused with backend llm-api: {report.refused}")
        if report.serving:
            typer.echo(f"served by: {report.serving}")
        for note in report.notes:
            typer.echo(f"note: {note}")
        if report.verdict == "ready":
            typer.echo("to migrate: set `kind: llm-api` in the spec's backend section (and remove what has no "
                       "equivalent)")
    if report.verdict != "ready":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("doctor", rich_help_panel="Build")(doctor)
    app.command("engine-plan", rich_help_panel="Plan")(engine_plan)
    app.command("migrate", rich_help_panel="Plan")(migrate)
