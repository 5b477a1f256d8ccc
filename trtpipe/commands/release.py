"""CLI commands for the release area. Thin: parse, call one function, print.

promote / rollback / channels, `results record | show`, and `cache push | pull` (added to the
store area's `cache` group).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer

from trtpipe.errors import UsageError


def _home() -> Path:
    from trtpipe.store.local import default_root

    return default_root()


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _short(digest: str | None) -> str:
    return digest[:19] if digest else "-"


def _hex12(digest: str | None) -> str:
    return digest.removeprefix("sha256:")[:12] if digest else "-"


# --------------------------------------------------------------------------- promote / rollback / channels


def promote_command(
    ref: str = typer.Argument(..., help="Artifact: oci://HOST/REPO:TAG|@DIGEST, a local kind/key, key prefix or sha256 digest."),
    to: str = typer.Option(..., "--to", help="Channel to promote into (dev, staging, prod, ...)."),
    force: bool = typer.Option(False, "--force", help="Promote even if gates fail (needs --reason; recorded)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (required with --force; recorded in the audit)."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Build spec whose release.gates apply (default: the spec stored with the artifact)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: from the artifact's manifest)."),
    target: Optional[str] = typer.Option(None, "--target", help="Target GPU (default: from the artifact's manifest)."),
    expect_from: Optional[str] = typer.Option(None, "--expect-from", help="Refuse unless the channel is now at this digest ('none' = empty)."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
) -> None:
    """Point a channel at an artifact whose recorded results pass the channel's gates."""
    from trtpipe.release.promote import UNSET, promote

    outcome = promote(
        _home(), ref, to, force=force, reason=reason, spec_path=spec, model=model, target=target,
        expect_from=UNSET if expect_from is None else expect_from,
    )
    if as_json:
        _print_json(outcome.as_dict())
        return
    verb = {"unchanged": "already at", "force-promote": "force-promoted to", "promote": "promoted to"}[outcome.action]
    typer.echo(f"{outcome.model}/{outcome.target} {outcome.channel}: {_short(outcome.from_digest)} -> {outcome.to_digest} ({verb} {outcome.channel})")
    for gate in outcome.gates:
        typer.echo(f"  {gate.gate:<28} {gate.status:<8} {gate.detail}")
    typer.echo(f"  gates from: {outcome.gates_source}" + (f"; registry tag: {outcome.tag}" if outcome.tag else ""))


def rollback_command(
    channel: str = typer.Argument(..., help="Channel to roll back."),
    model: Optional[str] = typer.Option(None, "--model"),
    target: Optional[str] = typer.Option(None, "--target"),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (recorded)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Move a channel back to the digest it held before its latest promotion."""
    from trtpipe.release.promote import rollback

    record = rollback(_home(), channel, model=model, target=target, reason=reason)
    if as_json:
        _print_json(record.model_dump())
        return
    typer.echo(f"{record.model}/{record.target} {record.channel}: {record.from_digest} -> {record.to_digest} (rolled back, audit #{record.seq})")


def channels_command(
    verify: bool = typer.Option(False, "--verify", help="Check the audit trail's hash chain; non-zero exit if broken."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show every channel: model, target, digest, who set it, and what it rolls back to."""
    from trtpipe.release.audit import verify_audit
    from trtpipe.release.promote import channel_states

    home = _home()
    states = channel_states(home)
    problems = verify_audit(home) if verify else None
    if as_json:
        _print_json({"channels": states, "audit_problems": problems})
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"channels in {home}")
        for column in ("channel", "model / target", "digest", "previous", "set by", "set at (UTC)", "last action"):
            table.add_column(column, no_wrap=column != "last action")
        for s in states:
            table.add_row(s["channel"], f"{s['model']} / {s['target']}", _hex12(s["digest"]), _hex12(s["previous"]), s["set_by"],
                          s["set_at"][:19].replace("T", " "), (s["last_action"] or "-") + (f": {s['last_reason']}" if s["last_reason"] else ""))
        import shutil

        # Digests and names do not fit 80 columns; pipes and CI logs get a wide table, not a truncated one.
        Console(width=max(shutil.get_terminal_size((160, 24)).columns, 140)).print(table)
        if problems is not None:
            typer.echo("audit chain: intact" if not problems else "audit chain BROKEN:\n  " + "\n  ".join(problems))
    if problems:
        raise typer.Exit(1)


# --------------------------------------------------------------------------- results


results_app = typer.Typer(help="Recorded smoke / parity / bench results per artifact digest (what gates read).", no_args_is_help=True)


@results_app.command("record")
def results_record_command(
    digest: str = typer.Argument(..., help="Artifact digest (sha256:...)."),
    kind: str = typer.Option(..., "--kind", help="smoke, parity or bench."),
    passed: bool = typer.Option(..., "--passed/--failed", help="Outcome."),
    data: Optional[str] = typer.Option(None, "--data", help="JSON object, or @FILE with one (e.g. bench --json output)."),
    gpu_class: Optional[str] = typer.Option(None, "--gpu-class", help="GPU class the result was measured on (bench)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Record a result for an artifact digest (CI uses this when a step ran outside trtpipe)."""
    from trtpipe.results import ResultsLog

    payload: dict[str, Any] = {}
    if data:
        text = Path(data[1:]).read_text(encoding="utf-8") if data.startswith("@") else data
        try:
            payload = json.loads(text)
        except ValueError:
            raise UsageError(f"--data {data[:40]!r} is not JSON", fix="give a JSON object or @FILE") from None
        if not isinstance(payload, dict):
            raise UsageError("--data must be a JSON object", fix='e.g. --data \'{"ttft_p99_ms": 120}\'')
    record = ResultsLog(_home()).record(digest, kind, passed, payload, gpu_class=gpu_class)
    if as_json:
        _print_json(record.model_dump())
    else:
        typer.echo(f"recorded {record.kind} {'passed' if record.passed else 'failed'} for {record.artifact_digest}")


@results_app.command("show")
def results_show_command(digest: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """Show the results recorded for one artifact digest."""
    from trtpipe.results import ResultsLog, dump_records

    records = ResultsLog(_home()).for_digest(digest)
    if as_json:
        _print_json(dump_records(records))
        return
    for r in records:
        typer.echo(f"{r.recorded_at}  {r.kind:<7} {'passed' if r.passed else 'FAILED':<7} {r.gpu_class or '-':<14} {r.recorded_by or '-'}")


# --------------------------------------------------------------------------- cache push / pull


@contextmanager
def _byte_progress(label: str, total: int, *, quiet: bool) -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar over bytes (on stderr, so --json output stays clean)."""
    if quiet:
        yield lambda _name, _size: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total or None)
        yield lambda _name, size: bar.advance(task, size)


def cache_push_command(
    ref: str = typer.Argument(..., help="Local artifact: kind/key, key prefix or sha256 digest."),
    to: Optional[str] = typer.Option(None, "--to", help="oci://HOST/REPOSITORY (default: $TRTPIPE_STORE if it is oci://)."),
    tag: list[str] = typer.Option([], "--tag", help="Extra version tag(s); a pushed tag never moves to another digest."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Push a local artifact to an OCI registry (files individually, verified on pull)."""
    import os

    from trtpipe.store import oci
    from trtpipe.store.local import Store

    url = to or os.environ.get("TRTPIPE_STORE", "")
    if not oci.is_oci_url(url):
        raise UsageError("no registry to push to", fix="pass --to oci://HOST/REPOSITORY or set TRTPIPE_STORE=oci://HOST/REPOSITORY")
    entry = Store.open(_home()).find(ref)
    with _byte_progress(f"push {entry.kind}/{entry.key[:12]}", entry.size, quiet=as_json) as advance:
        result = oci.RemoteStore(url).push(entry, tags=tuple(tag), progress=advance)
    if as_json:
        _print_json({"ref": str(result.ref), "oci_digest": result.oci_digest, "artifact_digest": result.artifact_digest,
                     "tags": list(result.tags), "files": result.files, "bytes": result.bytes})
    else:
        typer.echo(f"pushed {entry.kind}/{entry.key} ({result.files} files, {result.bytes} bytes) -> {result.ref}")
        typer.echo(f"  artifact digest {result.artifact_digest}; tags: {', '.join(result.tags)}")


def cache_pull_command(
    ref: str = typer.Argument(..., help="oci://HOST/REPOSITORY:TAG or @sha256:DIGEST."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Pull an artifact into the local store; every blob and the manifest are verified before use."""
    from trtpipe.store import oci
    from trtpipe.store.local import Store

    parsed = oci.parse_oci_ref(ref)
    client = oci.OciClient(parsed.host)
    remote = oci.resolve_remote(client, parsed)
    total = sum(int(layer.get("size", 0)) for layer in remote.manifest.get("layers") or [])
    with _byte_progress(f"pull {remote.kind}/{remote.key[:12]}", total, quiet=as_json) as advance:
        entry = oci.install_pulled(client, remote, Store.open(_home()), progress=advance)
    if as_json:
        _print_json({"kind": entry.kind, "key": entry.key, "path": str(entry.path), "artifact_digest": entry.digest, "oci_ref": str(remote.ref)})
    else:
        typer.echo(f"pulled {remote.ref} -> {entry.kind}/{entry.key} (artifact digest {entry.digest})")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("promote")(promote_command)
    app.command("rollback")(rollback_command)
    app.command("channels")(channels_command)
    app.add_typer(results_app, name="results")
    from trtpipe.commands import store as store_commands

    cache_app = getattr(store_commands, "cache_app", None)
    if cache_app is None:  # the store area has not added its `cache` group yet
        cache_app = typer.Typer(help="The artifact cache.", no_args_is_help=True)
        app.add_typer(cache_app, name="cache")
    cache_app.command("push")(cache_push_command)
    cache_app.command("pull")(cache_pull_command)
