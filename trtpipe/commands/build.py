"""CLI commands for the build area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace
from trtpipe.commands.trust_options import NoPolicyOption, PolicyOption, load_policy_option
from trtpipe.errors import Interrupted


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""

    @app.command("build", rich_help_panel="Build")
    def build(
        spec: Annotated[Path, typer.Argument(help="Build spec YAML.")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print each stage's key and whether it would run.")] = False,
        force: Annotated[
            Optional[list[str]],
            typer.Option("--force", help="Rebuild this stage even if cached: one of the spec's backend's stages (trtllm-build and reference: checkpoint, engine, publish; llm-api: export, publish) or all."),
        ] = None,
        verify: Annotated[bool, typer.Option("--verify", help="Check every reused file's sha256, not only sizes.")] = False,
        json_out: JsonOption = False,
        store: StoreOption = None,
        policy: PolicyOption = None,
        no_policy: NoPolicyOption = False,
        remote_mode: Annotated[Optional[str], typer.Option(
            "--remote-mode", help="How the remote cache (--store oci://...) is used: read-write (pull hits, push what "
                                  "was built) or read-only (pull hits, never push: pull requests, forks); default: "
                                  "$TRTPIPE_REMOTE_MODE, else read-write.")] = None,
        require_remote: Annotated[bool, typer.Option(
            "--require-remote", help="Fail when the remote cache is down or refuses the credentials (default: a "
                                     "warning, and the build goes on with the local store; $TRTPIPE_REQUIRE_REMOTE=1 "
                                     "sets it too).")] = False,
    ) -> None:
        """Run resolve -> plan -> checkpoint -> engine -> publish, reusing every stage already built."""
        from trtpipe.build_session import BuildRequest, build as run

        workspace = open_workspace(store)
        request = BuildRequest(spec=spec, dry_run=dry_run, force=tuple(force or ()), verify=verify,
                               remote_mode=remote_mode, require_remote=require_remote)
        trust = load_policy_option(policy, workspace, no_policy=no_policy, command="build")
        try:
            report = run(workspace, request, trust=trust, note=lambda text: typer.echo(text, err=True),
                         progress=not json_out)
        except KeyboardInterrupt as interrupt:
            # The runner hands over its report (what it stored or reused so far, the store asked about the stage
            # it was storing); an interrupt before the runner started stored nothing.
            report = getattr(interrupt, "report", None)
            artifacts = getattr(report, "artifacts", None) or {}
            kept = [f"{kind} {digest}" for kind, digest in artifacts.items()]
            raise Interrupted(
                "interrupted: nothing half-written (a stage is published by one rename or not at all); "
                + (f"stages stored: {', '.join(kept)}; the next build reuses them" if kept
                   else "no stage was stored by this run; stages stored earlier are kept"),
                kept=kept,
            ) from None
        finally:
            workspace.close()
        if json_out:
            if report.remote_unavailable:  # the stage lines said it without --json; a CI log must see it too
                typer.echo(f"warning: {report.remote_unavailable}", err=True)
            typer.echo(report.model_dump_json(indent=2))
            return
        if report.status == "incomplete":
            typer.echo(f"build incomplete: {report.message}", err=True)
        elif report.status == "dry-run":
            typer.echo("dry run: nothing was built", err=True)
        else:
            typer.echo(f"build ok in {report.seconds:.2f}s", err=True)
        if report.repository_path:
            typer.echo(f"repository: {report.repository_path}")
        for kind, digest in report.artifacts.items():
            typer.echo(f"{kind}: {digest}")
