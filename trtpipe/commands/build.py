"""CLI commands for the build area. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace
from trtpipe.commands.trust_options import NoPolicyOption, PolicyOption, load_policy_option
from trtpipe.errors import Interrupted


def _push_signer(workspace: Any, remote: Any) -> Any:
    """What signs each entry the build pushes: the workspace's signing key (TRTPIPE_SIGNING_KEY), or None.

    A build that pushes unsigned entries fills a cache that no workspace under a trust policy can hit (issue 28,
    attack 9): so where a key is configured, a build signs what it pushes, as `cache push --sign` does. A bad
    key fails here, before anything is built."""
    from trtpipe.commands.trust_options import signing_key_option

    key = signing_key_option(None, workspace.settings)
    if key is None or not hasattr(remote, "client"):  # a remote without referrers has nowhere to keep a signature
        return None
    from trtpipe.release.trust import push_signer

    return push_signer(key, store_root=workspace.root)


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
        from trtpipe.store.remote import remote_use

        workspace = open_workspace(store)
        use = remote_use(workspace.settings, mode=remote_mode, required=require_remote)
        trust = load_policy_option(policy, workspace, no_policy=no_policy, command="build")
        try:
            report = None
            pulled_check = None
            remote = None
            if trust is not None or workspace.remote_url is not None:
                from trtpipe.release.trust import PullGate, open_gated, pulled_checker

                if workspace.remote_url is not None:  # every pull from it judged by the trust gate it is opened with
                    remote = open_gated(workspace.remote_url, PullGate(
                        trust, store_root=workspace.root, home=workspace.root,
                        note=lambda text: typer.echo(text, err=True), settings=workspace.settings),
                        settings=workspace.settings)
                if trust is not None:
                    pulled_check = pulled_checker(trust, store_root=workspace.root, home=workspace.root,
                                                  settings=workspace.settings)
            sign_push = _push_signer(workspace, remote) if remote is not None and use.pushes else None
            # The warm path reuses a resolution and its entries as they were; a trust policy judges them again.
            if not (dry_run or force or verify) and workspace.remote_url is None and trust is None:
                # Every input as at the spec's last build: reuse its resolution (trtpipe.warm), else resolve.
                from trtpipe.warm import warm_build

                report = warm_build(spec, workspace.store, progress=not json_out)
            if report is None:
                from trtpipe.pipeline import run_build

                report = run_build(spec, dry_run=dry_run, force=tuple(force or ()), verify=verify,
                                   store=workspace.store, remote=remote, progress=not json_out,
                                   pulled_check=pulled_check, remote_use=use, sign_push=sign_push,
                                   settings=workspace.settings)
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
