"""CLI commands for the build area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""

    @app.command("build")
    def build(
        spec: Annotated[Path, typer.Argument(help="Build spec YAML.")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print each stage's key and whether it would run.")] = False,
        force: Annotated[
            Optional[list[str]],
            typer.Option("--force", help="Rebuild this stage even if cached: checkpoint, engine, publish or all."),
        ] = None,
        verify: Annotated[bool, typer.Option("--verify", help="Check every reused file's sha256, not only sizes.")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")] = False,
        store: Annotated[Optional[str], typer.Option("--store", help="Store root (default $TRTPIPE_HOME), or oci://HOST/REPO to share a build cache through a registry (default $TRTPIPE_STORE).")] = None,
    ) -> None:
        """Run resolve -> plan -> checkpoint -> engine -> publish, reusing every stage already built."""
        from trtpipe.pipeline import run_build

        report = run_build(spec, dry_run=dry_run, force=tuple(force or ()), verify=verify, store=store,
                           progress=not json_out)
        if json_out:
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
