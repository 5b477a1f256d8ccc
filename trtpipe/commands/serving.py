"""CLI commands for the serving area. Thin: parse, call one function, print."""

from __future__ import annotations

import json
import shlex
import signal
import threading
from pathlib import Path
from typing import Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_table
from trtpipe.commands.trust_options import PolicyOption, load_policy_option
from trtpipe.errors import NotFound, UsageError


def _existing_dir(path: Path) -> Path:
    if not path.is_dir():
        raise NotFound(f"{path} is not a directory", what="repository", ref=str(path),
                       fix="give the model repository folder a build published")
    return path


def validate_command(
    repo: Path = typer.Argument(..., help="A published Triton model repository."),
    as_json: JsonOption = False,
) -> None:
    """Check a model repository: configs, ensemble wiring, engine limits, tokenizer, container."""
    from trtpipe.serving.validate import errors_only, validate_repository

    issues = validate_repository(_existing_dir(repo))
    errors = errors_only(issues)
    if as_json:
        typer.echo(json.dumps({"repo": str(repo), "valid": not errors, "issues": [i.model_dump() for i in issues]}, indent=2))
    elif not issues:
        typer.echo(f"{repo}: valid")
    else:
        print_table(None, ["severity", "model", "field", "problem", "fix"],
                    [[i.severity, i.model, i.field, i.message, i.fix] for i in issues])
    if errors:
        raise typer.Exit(1)


def serve_command(
    repo: Path = typer.Argument(..., help="A published Triton model repository."),
    print_only: bool = typer.Option(False, "--print", help="Print the server command instead of running it."),
    grpc_port: Optional[int] = typer.Option(None, "--grpc-port", help="gRPC port (default: a free port; 8001 in a container)."),
    http_port: Optional[int] = typer.Option(None, "--http-port", help="HTTP port (default: a free port; 8000 in a container)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Prometheus metrics port (default: a free port; 8002 in a container)."),
    start_timeout: float = typer.Option(120, "--start-timeout", help="Seconds to wait for every model to be ready."),
    restart: str = typer.Option("no", "--restart", help="When a model's backend process or the server dies, or "
                                "probes keep failing: no = stop and exit 1 (for an orchestrator to see); "
                                "on-failure = restart tritonserver on the same ports, at most --max-restarts times."),
    max_restarts: int = typer.Option(3, "--max-restarts", help="Restarts allowed with --restart on-failure "
                                     "(waiting 1 s, then twice as long each time, at most 30 s)."),
    probe_interval: float = typer.Option(10, "--probe-interval", help="Seconds between real one-token probes of "
                                         "each text model (0: none); two failed in a row make the server "
                                         "unhealthy. Processes are checked every 0.5 s."),
    probe_timeout: float = typer.Option(30, "--probe-timeout", help="Seconds a probe's requests may take, together."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line per event on stdout: the server's "
                                 "addresses once ready (the first line), then unhealthy / restarting / ready."),
    trust_policy: PolicyOption = None,
    store: StoreOption = None,
) -> None:
    """Serve a repository: tritonserver on loopback (cpu-reference) or its Triton container (GPU targets).

    The server reads a serving directory outside the store (links for engine files, copies for the
    rest, the repository digest written into its configs), never the stored entry; it is ready once every
    model is and it reports that digest over gRPC. serve watches it: the server's (or the container
    client's) and every model's backend process, and a real probe request; when it cannot serve, serve
    says why in one line and exits 1, or restarts it (--restart on-failure). With a trust policy the
    repository must carry a signature by a key the policy trusts (its code runs in the server)."""
    from trtpipe.serving.publish import read_manifest
    from trtpipe.serving.server import container_name, docker_command
    from trtpipe.serving.serving_dir import prepare
    from trtpipe.serving.watch import WatchPolicy, serve_watched

    repo = _existing_dir(repo)
    workspace = open_workspace(store)
    trust = load_policy_option(trust_policy, workspace.settings)
    if trust is not None:
        from trtpipe.release.trust import require_trusted_folder

        require_trusted_folder(repo, trust, home=workspace.root, action="serve")
    manifest = read_manifest(repo)
    launcher = None
    if not manifest.get("reference"):
        # The container's ports default to upstream's (8001 gRPC, 8000 HTTP, 8002 metrics).
        grpc_port, http_port, metrics_port = grpc_port or 8001, http_port or 8000, metrics_port or 8002
        if print_only:
            # For someone else to run: a kept serving directory, one per digest (trtpipe does not own that server).
            serving = prepare(repo, kept=True)
            typer.echo(shlex.join(docker_command(serving.path, manifest, grpc_port=grpc_port, http_port=http_port,
                                                 metrics_port=metrics_port,
                                                 name=container_name(serving.repository_digest, grpc_port))))
            return
        from trtpipe.serving.container import ContainerTriton

        launcher = ContainerTriton.from_settings(manifest, workspace.settings)
    elif print_only:
        raise UsageError("--print is for GPU targets (a docker command)",
                         fix=f"run `trtpipe serve {repo}` without --print to start the CPU reference server")
    if restart not in ("no", "on-failure"):
        raise UsageError(f"--restart must be no or on-failure, got {restart!r}")
    policy = WatchPolicy(probe_interval_s=probe_interval, probe_timeout_s=probe_timeout, restart=restart,  # type: ignore[arg-type]
                         max_restarts=max_restarts)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve_watched(repo, on_event=lambda event: _print_serve_event(event, repo, as_json), stop=stop, policy=policy,
                      grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port, start_timeout=start_timeout,
                      launcher=launcher)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_serve_event(event: object, repo: Path, as_json: bool) -> None:
    from trtpipe.serving.watch import ServerReady, ServerRestarting, ServerUnhealthy

    if as_json:
        typer.echo(event.model_dump_json())  # type: ignore[attr-defined]
        return
    if isinstance(event, ServerReady) and event.restarts == 0:
        watch = event.watch
        probes = (f"a one-token probe every {watch['probe_interval_s']:g}s" if watch["probe_interval_s"] else "no probes")
        on_failure = ("restart (at most {0})".format(watch["max_restarts"]) if watch["restart"] == "on-failure"
                      else "stop and exit 1")
        typer.echo(f"serving {repo} (models: {', '.join(event.models)})")
        typer.echo(f"  digest  {event.repository_digest or 'none (not a stored artifact)'} (reported by the server)")
        if event.container:
            typer.echo(f"  container {event.container}")
        typer.echo(f"  gRPC    {event.grpc_url}\n  HTTP    {event.http_url}\n  metrics {event.metrics_url}")
        typer.echo(f"  served from {event.serving_dir} (removed when the server stops)")
        typer.echo(f"  log     {event.log}")
        typer.echo(f"  watch   processes every {watch['liveness_interval_s']:g}s, {probes}; when it cannot serve: {on_failure}")
        typer.echo("Ctrl-C stops it.")
    elif isinstance(event, ServerReady):
        typer.echo(f"serving again after restart {event.restarts} of {event.watch['max_restarts']} "
                   f"({'container client' if event.container else 'tritonserver'} pid {event.pid}, gRPC {event.grpc_url}, log {event.log})")
    elif isinstance(event, ServerUnhealthy) and event.action == "restart":
        # With action "exit" the error line that follows says it (one line, not two).
        typer.echo(f"unhealthy: {event.detail}", err=True)
    elif isinstance(event, ServerRestarting):
        typer.echo(f"restarting the server ({event.restart} of {event.max_restarts}) in {event.delay_s:g}s", err=True)


def smoke_command(
    url: str = typer.Argument(..., help="gRPC address of a running server, host:port."),
    model: str = typer.Option("ensemble", "--model", help="ensemble or tensorrt_llm_bls."),
    parity: Optional[Path] = typer.Option(None, "--parity", help="A build spec: check greedy parity with the reference runtime "
                                          "on the spec's model converted afresh (never the stored bytes the server loads)."),
    record: Optional[Path] = typer.Option(None, "--record", help="Record the result for this repository's artifact digest; "
                                          "refused unless the server reports serving exactly that digest."),
    max_tokens: int = typer.Option(16, "--max-tokens", help="Tokens to generate per request."),
    timeout: float = typer.Option(60, "--timeout", help="Seconds per request."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Smoke-test a running server: health, models, metadata, generate, stream [, parity]."""
    import contextlib

    from trtpipe.serving.smoke import record_smoke, run_smoke

    if model not in ("ensemble", "tensorrt_llm_bls"):
        raise UsageError(f"--model {model!r} is not a text model", fix="use ensemble or tensorrt_llm_bls")
    if parity is not None and not parity.is_file():
        raise UsageError(f"--parity {parity}: no such spec file", fix="pass the build spec YAML")
    target = None
    workspace = open_workspace(store)
    if record is not None:
        # Before any check runs: what the server serves must be exactly what --record names.
        from trtpipe.serving.identity import check_recording, read_served_identity, record_target

        target = record_target(record, workspace.store)
        check_recording(read_served_identity(url, timeout=timeout), target, url, record)
    with contextlib.ExitStack() as stack:
        reference = None
        if parity is not None:
            from trtpipe.checkpoint.afresh import converted_afresh

            reference = stack.enter_context(converted_afresh(parity))
        result = run_smoke(url, model=model, parity_engine=reference, max_tokens=max_tokens, timeout=timeout)
    if target is not None:
        result.recorded_for = record_smoke(result, target, workspace.results)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        for check in result.checks:
            typer.echo(f"{'ok  ' if check.passed else 'FAIL'} {check.name:<13} {check.detail}")
        typer.echo(f"smoke {'passed' if result.passed else 'FAILED'} ({url}, {result.model})")
    if not result.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("validate", rich_help_panel="Serve")(validate_command)
    app.command("serve", rich_help_panel="Serve")(serve_command)
    app.command("smoke", rich_help_panel="Serve")(smoke_command)
