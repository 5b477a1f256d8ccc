"""CLI commands for the serving area. Thin: parse, call one function, print."""

from __future__ import annotations

import json
import shlex
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, command_configs, json_option, open_workspace, print_table
from trtpipe.commands.stop_signals import stop_on_signals
from trtpipe.commands.trust_options import NoPolicyOption, PolicyOption, load_policy_option
from trtpipe.errors import NotFound, UsageError

if TYPE_CHECKING:
    from trtpipe.serve_session import ContentCheck, ServeRequest


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

    issues = validate_repository(_existing_dir(repo), configs=command_configs())
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


def serve_request(
    repo: Path, *, grpc_port: int | None, http_port: int | None, metrics_port: int | None, start_timeout: float,
    restart: str, max_restarts: int, probe_interval: float, probe_timeout: float, ready_file: Path | None,
    log_file: str | None, keep_log: bool, policy: Path | None, no_policy: bool, store: str | None,
) -> ServeRequest:
    """The options, checked and parsed into the library's request; each refusal names its option."""
    from trtpipe.serve_session import ServeRequest

    if restart not in ("no", "on-failure"):
        raise UsageError(f"--restart must be no or on-failure, got {restart!r}")
    return ServeRequest(repo=repo, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                        start_timeout=start_timeout, restart=restart, max_restarts=max_restarts,  # type: ignore[arg-type]
                        probe_interval=probe_interval, probe_timeout=probe_timeout, ready_file=ready_file,
                        log_file=log_file, keep_log=keep_log, policy=policy, no_policy=no_policy, store=store)


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
    ready_file: Optional[Path] = typer.Option(None, "--ready-file", help="Write FILE (JSON: grpc_url, http_url, "
                                              "metrics_url, pid, repository_digest, log, serve_pid ...) atomically once "
                                              "the server is ready and reports the repository's digest; rewritten "
                                              "after a restart, removed when serve stops (an old one first)."),
    detach: bool = typer.Option(False, "--detach", help="Run serve in the background (needs --ready-file) and "
                                "return once the server is ready (exit 0, the ready file written), or with serve's "
                                "own error line and exit code when it cannot start. Its output and the server's "
                                "log go to --log-file (default: READY_FILE.log); `trtpipe serve-stop READY_FILE` "
                                "stops it."),
    log_file: Optional[str] = typer.Option(None, "--log-file", help="Append tritonserver's own log to FILE "
                                           "(always kept; a --detach serve starts it empty and adds its own "
                                           "output), or '-' to stream it to stderr as it is written. Default: a "
                                           "temporary file, removed after a clean exit unless --keep-log; kept "
                                           "(and named) when anything failed."),
    keep_log: bool = typer.Option(False, "--keep-log", help="Keep the server's log after a clean exit too (the "
                                  "stopped event and line say where)."),
    as_json: Annotated[bool, json_option(
        "Print one JSON line per event on stdout: ready (the server's addresses, the first line), unhealthy, "
        "restarting, restarted, stopped; a refusal as a JSON object. The same events as text go to stderr.")] = False,
    trust_policy: PolicyOption = None,
    no_policy: NoPolicyOption = False,
    store: StoreOption = None,
) -> None:
    """Serve a repository: tritonserver on loopback (cpu-reference) or its Triton container (GPU targets).

    The server reads a serving directory outside the store (links for engine files, copies for the
    rest, the repository digest written into its configs), never the stored entry; it is ready once every
    model is and it reports that digest over gRPC. serve watches it: the server's (or the container
    client's) and every model's backend process, and a real probe request; when it cannot serve, serve
    says why in one line and exits 1, or restarts it (--restart on-failure). With a trust policy the
    repository must carry a signature by a key the policy trusts (its code runs in the server).
    In CI: `trtpipe serve REPO --detach --ready-file serve.json` returns once it can be used."""
    repo = _existing_dir(repo)
    if ready_file is not None:
        from trtpipe.serving.ready_file import remove_ready_file

        # An earlier run's, before anything else can fail (a refused option too): never taken for this one's.
        remove_ready_file(ready_file)
    request = serve_request(repo, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                            start_timeout=start_timeout, restart=restart, max_restarts=max_restarts,
                            probe_interval=probe_interval, probe_timeout=probe_timeout, ready_file=ready_file,
                            log_file=log_file, keep_log=keep_log, policy=trust_policy, no_policy=no_policy,
                            store=store)
    if detach:
        _serve_detached(request, as_json, print_only)
        return
    from trtpipe import serve_session

    workspace = open_workspace(store)
    trust = load_policy_option(trust_policy, workspace, no_policy=no_policy, command="serve")
    if print_only:
        try:
            printed = serve_session.print_command(workspace, request, trust=trust, on_checked=_print_judged)
        except serve_session.NotAContainerTarget:
            raise UsageError("--print is for GPU targets (a docker command)",
                             fix=f"run `trtpipe serve {repo}` without --print to start the CPU reference server") from None
        if printed.content.unverified is not None:
            typer.echo(_unverified_line(printed.content), err=True)
        typer.echo(shlex.join(printed.command))
        return
    checked: list[ContentCheck] = []  # the judgement, heard before the server starts; its warning follows the banner

    def judged(content: ContentCheck) -> None:
        checked.append(content)
        _print_judged(content)

    def heard(event: object) -> None:
        unverified = next((_unverified_line(c) for c in checked if c.unverified is not None), None)
        _print_serve_event(event, request.repo, as_json, unverified)

    stop = threading.Event()
    with stop_on_signals(stop):
        serve_session.serve(workspace, request, trust=trust, on_event=heard, stop=stop, on_checked=judged,
                            log_stream=sys.stderr)  # --log-file - streams to stderr


def _print_judged(content: ContentCheck) -> None:
    """The trust policy's judgement, on stderr, as soon as it is known (none without a policy)."""
    if content.judged is not None:
        typer.echo(f"verified: {content.repo}: {content.judged}", err=True)  # the verified signer, never a claimed one


def _unverified_line(content: ContentCheck) -> str:
    """The warning a serve of unverified content says (on stderr), naming the settings that would require a
    signature."""
    return (f"warning: serving unverified content: {content.unverified}, so nothing checked that {content.repo} is "
            "what was signed (set TRTPIPE_POLICY or --policy to require it)")


# Seconds a detached serve may take beyond its --start-timeout: validation, the serving directory, the identity
# check, and Python's own start, on a loaded machine.
DETACH_MARGIN_S = 120


def _serve_detached(request: ServeRequest, as_json: bool, print_only: bool) -> None:
    """`serve --detach`: the same serve in the background (trtpipe.serving.detach), and its ready file printed."""
    from trtpipe.serving.detach import default_log_file, start_detached

    if print_only:
        raise UsageError("--detach runs the server; --print only prints its command", fix="give one of them")
    if request.ready_file is None:
        raise UsageError("--detach needs --ready-file: the file that says where the server is and which serve to "
                         "stop", fix="add --ready-file serve.json")
    if request.log_file == "-":
        raise UsageError("--log-file - streams to serve's stderr, which a detached serve does not have",
                         fix="give --log-file a file, or leave it out (READY_FILE.log)")
    log_file = (Path(request.log_file) if request.log_file else default_log_file(request.ready_file)).resolve()
    ready = start_detached(request.foreground_argv(ready_file=request.ready_file, log_file=log_file),
                           ready_file=request.ready_file, log_file=log_file,
                           deadline_s=request.start_timeout + DETACH_MARGIN_S)
    if as_json:
        typer.echo(ready.model_dump_json())
        return
    typer.echo(f"serving {request.repo} in the background (serve pid {ready.serve_pid}, "
               f"{'container client' if ready.container else 'tritonserver'} pid {ready.pid})")
    typer.echo(f"  digest  {ready.repository_digest or 'none (not a stored artifact)'} (reported by the server)")
    typer.echo(f"  gRPC    {ready.grpc_url}\n  HTTP    {ready.http_url}\n  metrics {ready.metrics_url}")
    if ready.content == "unverified":
        typer.echo("  content unverified: no trust policy checked these files (the log says why)")
    typer.echo(f"  ready file {request.ready_file}; log {log_file}")
    typer.echo(f"`trtpipe serve-stop {request.ready_file}` stops it.")


def serve_stop_command(
    ready_file: Path = typer.Argument(..., help="The ready file a serve wrote (serve --ready-file)."),
    timeout: float = typer.Option(60, "--timeout", help="Seconds to wait for serve to stop its server and exit."),
    as_json: JsonOption = False,
) -> None:
    """Stop the serve a ready file names (SIGTERM) and wait until it has stopped its server and exited."""
    from trtpipe.serving.detach import stop_detached

    stopped = stop_detached(ready_file, timeout=timeout)
    if as_json:
        typer.echo(stopped.model_dump_json())
    elif stopped.was_running:
        typer.echo(f"stopped serve pid {stopped.serve_pid} in {stopped.seconds:.1f}s; server log: {stopped.log}")
    else:
        typer.echo(f"serve pid {stopped.serve_pid} was not running (its stale ready file was removed); server log: "
                   f"{stopped.log}")


def _print_serve_event(event: object, repo: Path, as_json: bool, unverified: str | None = None) -> None:
    """One JSON line per event on stdout with --json (and the text on stderr); else the text, the banner on
    stdout and the rest on stderr. `unverified`: the line said once, on stderr, when the server is first ready
    (its event's `content` says "unverified" too); a serve that fails before that prints only its error."""
    from trtpipe.serving.watch import ServerReady, ServerRestarted, ServerRestarting, ServerStopped, ServerUnhealthy

    if as_json:
        typer.echo(event.model_dump_json())  # type: ignore[attr-defined]
    text = not as_json  # the banner's stream: stdout without --json, stderr with it
    if isinstance(event, ServerRestarted):
        typer.echo(f"serving again after restart {event.restarts} of {event.watch['max_restarts']} "
                   f"({'container client' if event.container else 'tritonserver'} pid {event.pid}, gRPC {event.grpc_url}, "
                   f"log {event.log})", err=True)
    elif isinstance(event, ServerReady):
        watch = event.watch
        probes = (f"a one-token probe every {watch['probe_interval_s']:g}s" if watch["probe_interval_s"] else "no probes")
        on_failure = ("restart (at most {0})".format(watch["max_restarts"]) if watch["restart"] == "on-failure"
                      else "stop and exit 1")
        lines = [f"serving {repo} (models: {', '.join(event.models)})",
                 f"  digest  {event.repository_digest or 'none (not a stored artifact)'} (reported by the server)"]
        if event.container:
            lines.append(f"  container {event.container}")
        lines += [f"  gRPC    {event.grpc_url}\n  HTTP    {event.http_url}\n  metrics {event.metrics_url}",
                  f"  served from {event.serving_dir} (removed when the server stops)",
                  f"  log     {event.log}",
                  f"  watch   processes every {watch['liveness_interval_s']:g}s, {probes}; when it cannot serve: {on_failure}",
                  "Ctrl-C (SIGINT) or SIGTERM stops it."]
        typer.echo("\n".join(lines), err=not text)
        if unverified is not None:
            typer.echo(unverified, err=True)
    elif isinstance(event, ServerUnhealthy) and event.action == "restart":
        # With action "exit" the error line that follows says it (one line, not two).
        typer.echo(f"unhealthy: {event.detail}", err=True)
    elif isinstance(event, ServerRestarting):
        typer.echo(f"restarting the server ({event.restart} of {event.max_restarts}) in {event.delay_s:g}s", err=True)
    elif isinstance(event, ServerStopped):
        if event.log_kept:
            typer.echo(f"stopped; the server log is kept at {event.log} ({event.why_kept})", err=True)
        else:
            typer.echo("stopped; the server log was removed (a clean exit; --keep-log or --log-file FILE keeps it)",
                       err=True)


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
    from trtpipe.serving.address import check_grpc_address

    url = check_grpc_address(url)  # an http:// URL or Triton's HTTP port: one line naming the gRPC port
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
            from trtpipe.shipped import build_configs_dir

            reference = stack.enter_context(converted_afresh(parity, build_configs_dir(workspace.settings)))
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
    app.command("serve-stop", rich_help_panel="Serve")(serve_stop_command)
    app.command("smoke", rich_help_panel="Serve")(smoke_command)
