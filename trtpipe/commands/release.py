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

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_table
from trtpipe.commands.output import print_json as _print_json
from trtpipe.commands.trust_options import NoPolicyOption, PolicyOption, SignOption, load_policy_option, \
    signing_key_option
from trtpipe.errors import TrtpipeError, UsageError


# --------------------------------------------------------------------------- promote / rollback / channels


def promote_command(
    ref: str = typer.Argument(..., help="Artifact: oci://HOST/REPO:TAG|@DIGEST, a stored kind/key, key prefix or sha256 digest."),
    to: str = typer.Option(..., "--to", help="Channel to promote into (dev, staging, prod, ...)."),
    force: bool = typer.Option(False, "--force", help="Promote even if gates fail (needs --reason; recorded)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (required with --force; recorded in the audit)."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Build spec whose release.gates apply (default: the spec stored with the artifact)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: from the artifact's manifest)."),
    target: Optional[str] = typer.Option(None, "--target", help="Target GPU (default: from the artifact's manifest)."),
    expect_from: Optional[str] = typer.Option(None, "--expect-from", help="Refuse unless the channel is now at this digest ('none' = empty)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Judge the gates as a promotion would and show the verdicts; "
                                 "change and record nothing (exit 1 when it would be refused)."),
    store: StoreOption = None,
    policy: PolicyOption = None,
    no_policy: NoPolicyOption = False,
    as_json: JsonOption = False,
) -> None:
    """Point a channel at an artifact whose recorded results pass the channel's gates (and whose signature
    satisfies the trust policy, where it requires one for the channel)."""
    from trtpipe.release.promote import PromoteRequest, promote

    request = PromoteRequest(ref=ref, to=to, force=force, reason=reason, spec=spec, model=model, target=target,
                             expect_from=expect_from, dry_run=dry_run)
    workspace = open_workspace(store)
    trust = load_policy_option(policy, workspace, no_policy=no_policy, command="promote")
    if no_policy:  # promote reads TRTPIPE_POLICY for hand-recorded results when given no policy: none means none
        from dataclasses import replace

        workspace = workspace.with_settings(replace(workspace.settings, policy=None))
    outcome = promote(workspace, request, policy=trust)
    if as_json:
        _print_json(outcome.as_dict())
    else:
        verb = {"unchanged": "already at", "force-promote": "force-promoted to", "promote": "promoted to",
                "would-promote": "dry run: would be promoted to", "would-force-promote": "dry run: would be force-promoted to",
                "would-refuse": "dry run: would be refused by"}[outcome.action]
        typer.echo(f"{outcome.model}/{outcome.target} {outcome.channel}: {outcome.from_digest or '-'} -> {outcome.to_digest} ({verb} {outcome.channel})")
        for gate in outcome.gates:
            typer.echo(f"  {gate.gate:<28} {gate.status:<12} {gate.detail}")
        typer.echo(f"  gates from: {outcome.gates_source}" + (f"; registry tag: {outcome.tag}" if outcome.tag else "")
                   + (f"; trail: {outcome.trail}" if outcome.trail else ""))
    if outcome.action == "would-refuse":
        raise typer.Exit(1)


def rollback_command(
    channel: str = typer.Argument(..., help="Channel to roll back."),
    model: Optional[str] = typer.Option(None, "--model", help="The channel's model (needed when several models have it)."),
    target: Optional[str] = typer.Option(None, "--target", help="The channel's target GPU (needed when several targets have it)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (recorded)."),
    store: StoreOption = None,
    policy: PolicyOption = None,
    no_policy: NoPolicyOption = False,
    as_json: JsonOption = False,
) -> None:
    """Move a channel back to the digest it held before its latest promotion (which must satisfy the trust
    policy's rule for the channel, as a promotion into it would)."""
    from trtpipe.release.promote import rollback

    workspace = open_workspace(store)
    trust = load_policy_option(policy, workspace, no_policy=no_policy, command="rollback")
    record = rollback(workspace, channel, model=model, target=target, reason=reason, policy=trust)
    if as_json:
        _print_json(record.model_dump())
        return
    typer.echo(f"{record.model}/{record.target} {record.channel}: {record.from_digest} -> {record.to_digest} (rolled back, audit #{record.seq})")


def channels_command(
    verify: bool = typer.Option(False, "--verify", help="Check the audit trail's hash chain, its anchored head (signed, "
                                "with a key) and every shared channel's trail; non-zero exit on any problem."),
    public_key: Optional[Path] = typer.Option(None, "--public-key", help="Release public key (PEM) the trail's head must "
                                              "be signed by (default: the TRTPIPE_SIGNING_KEY setting's)."),
    registry: bool = typer.Option(True, "--registry/--no-registry", help="Read each shared channel's trail from its registry "
                                  "(catching up when this workspace is behind); with --verify also check it against this "
                                  "workspace's copy and each channel tag against its trail."),
    adopt_trail: bool = typer.Option(False, "--adopt-trail", help="Take the audit trail as it stands (kept without the "
                                     "release key until now) and sign its head with TRTPIPE_SIGNING_KEY, recorded; "
                                     "a keyed promote refuses an unsigned head until then."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show every channel: model, target, digest, who set it, and what it rolls back to."""
    from trtpipe.release.promote import catch_up, channel_states
    from trtpipe.release.trail import trail_verdict
    from trtpipe.signing_keys import release_key

    workspace = open_workspace(store)
    home = workspace.root
    if adopt_trail:
        from trtpipe.release.channels import ChannelStore
        from trtpipe.release.trail import adopt_trail as adopt
        from trtpipe.results import current_user

        with ChannelStore(home).lock():
            adopted = adopt(home, release_key(workspace.settings), who=current_user(workspace.settings))
        typer.echo(f"audit trail adopted: its head is signed by the release key (audit #{adopted.seq})" if adopted
                   else "audit trail: its head is already signed by the release key (nothing to adopt)", err=as_json)
    if registry:
        catch_up(workspace)  # a shared channel shows what its registry trail says now
    verdict = trail_verdict(home, release_key(workspace.settings, public_key), workspace.settings,
                            registry=registry) if verify else None
    problems = verdict.problems if verdict is not None else None
    try:
        states = channel_states(workspace)
    except TrtpipeError:
        if not problems:
            raise
        states = []
    if as_json:
        _print_json({"channels": states, "audit_problems": problems, "notes": verdict.notes if verdict else []})
    else:
        print_table(
            f"channels in {home}",
            ["channel", "model", "target", "digest", "previous", "set by", "set at (UTC)", "last action"],
            [[s["channel"], s["model"], s["target"], s["digest"] + ("" if s["agrees"] else f" (trail: {s['trail_digest'] or 'none'})"),
              s["previous"] or "-", s["set_by"],
              s["set_at"][:19].replace("T", " "),
              (s["last_action"] or "-") + (f": {s['last_reason']}" if s["last_reason"] else "")] for s in states],
        )
        if verdict is not None:
            for note in verdict.notes:
                typer.echo(f"note: {note}")
            typer.echo("audit chain: intact" if not problems else "audit chain BROKEN:\n  " + "\n  ".join(problems))
    if problems:
        raise typer.Exit(1)


# --------------------------------------------------------------------------- policy


policy_app = typer.Typer(help="The workspace's own trust policy: once set, promote, rollback, serve, cache pull and "
                              "build run under it (TRTPIPE_POLICY or not); --no-policy is recorded.",
                         no_args_is_help=True)


@policy_app.command("set")
def policy_set_command(
    file: Path = typer.Argument(..., help="The trust policy YAML to make this workspace's (checked first)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check FILE, copy it and its public keys (pinned by key id) into the workspace, and record the copy's
    digest in the audit trail."""
    from trtpipe.release.workspace_policy import set_policy

    workspace = open_workspace(store)
    done = set_policy(workspace, file)
    if as_json:
        _print_json({"policy": str(done.path), "digest": done.digest, "source": done.source, "keys": done.keys,
                     "audit_seq": done.audit_seq})
        return
    keys = ", ".join(f"{name} ({key_id[:16]})" for name, key_id in done.keys.items()) or "none"
    typer.echo(f"workspace policy {done.path} set from {done.source} ({done.digest}; keys: {keys}; audit #{done.audit_seq})")


@policy_app.command("show")
def policy_show_command(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Show the workspace's trust policy (checked against the digest the audit trail records)."""
    from trtpipe.release.workspace_policy import canonical, policy_file, workspace_policy

    workspace = open_workspace(store)
    found = workspace_policy(workspace.root)
    body = canonical(found) if found is not None else None
    if as_json:
        _print_json({"policy": str(policy_file(workspace.root)) if found is not None else None, "rules": body})
        return
    if found is None:
        typer.echo(f"no workspace policy in {workspace.root} (commands use --policy or TRTPIPE_POLICY)")
        return
    typer.echo(f"workspace policy {found.source}:")
    typer.echo(json.dumps(body, indent=2))


# --------------------------------------------------------------------------- results


results_app = typer.Typer(help="Recorded smoke / parity / bench results per artifact digest (what gates read).", no_args_is_help=True)


@results_app.command("record")
def results_record_command(
    digest: str = typer.Argument(..., help="Artifact digest (sha256:...)."),
    kind: str = typer.Option(..., "--kind", help="smoke, parity or bench."),
    passed: bool = typer.Option(..., "--passed/--failed", help="Outcome."),
    data: Optional[str] = typer.Option(None, "--data", help="JSON object, or @FILE with one (e.g. bench --json output)."),
    gpu_class: Optional[str] = typer.Option(None, "--gpu-class", help="GPU class the result was measured on (bench)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Record a result by hand (a step that ran outside trtpipe): marked hand-recorded; it counts only for
    channels whose trust policy allows hand-recorded results, and a promotion on it is recorded as forced."""
    payload: dict[str, Any] = {}
    if data:
        text = _read_data_file(data[1:]) if data.startswith("@") else data
        try:
            payload = json.loads(text)
        except ValueError:
            raise UsageError(f"--data {data[:40]!r} is not JSON", fix="give a JSON object or @FILE") from None
        if not isinstance(payload, dict):
            raise UsageError("--data must be a JSON object", fix='e.g. --data \'{"ttft_p99_ms": 120}\'')
    record = open_workspace(store).results.record(digest, kind, passed, payload, gpu_class=gpu_class, origin="hand")
    if as_json:
        _print_json(record.model_dump())
    else:
        typer.echo(f"recorded {record.kind} {'passed' if record.passed else 'failed'} for {record.artifact_digest} "
                   "(hand-recorded: counts only where the trust policy allows it)")


@results_app.command("show")
def results_show_command(
    digest: str = typer.Argument(..., help="Artifact digest (sha256:...)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the results recorded for one artifact digest."""
    from trtpipe.results import dump_records

    records = open_workspace(store).results.for_digest(digest)
    if as_json:
        _print_json(dump_records(records))
        return
    print_table(f"results for {digest}", ["recorded at", "kind", "outcome", "GPU class", "recorded by", "origin"],
                [[r.recorded_at, r.kind, "passed" if r.passed else "FAILED", r.gpu_class or "-", r.recorded_by or "-",
                  "hand-recorded" if r.origin == "hand" else f"run ({(r.evidence or {}).get('server_url') or '-'})"]
                 for r in records])


@results_app.command("export")
def results_export_command(
    digests: list[str] = typer.Argument(..., help="Artifact digest(s) (sha256:...) whose results to carry."),
    out: Path = typer.Option(..., "--out", help="The bundle file to write (JSON; written whole or not at all)."),
    sign: SignOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the results recorded for these digests, with their hash chains and evidence, into one bundle for
    another workspace to import (a CI job's artifact); signed with the release key when one is set."""
    from trtpipe.release.evidence import ExportRequest, export_results
    from trtpipe.release.trust import KEYLESS
    from trtpipe.results import current_user

    workspace = open_workspace(store)
    key = signing_key_option(sign, workspace.settings)
    if key == KEYLESS:
        raise UsageError("a results bundle is signed with a release key file, not keyless",
                         fix="pass --sign KEY (a PEM EC P-256 private key) or set TRTPIPE_SIGNING_KEY")
    outcome = export_results(workspace.results, ExportRequest(digests=digests, out=out), key,
                             who=current_user(workspace.settings))
    if as_json:
        _print_json(outcome.model_dump(mode="json"))
        return
    signed = f"signed by key {outcome.signed_by[:16]}" if outcome.signed_by else "unsigned (no release key)"
    typer.echo(f"exported {sum(outcome.records.values())} results of {len(outcome.records)} digest(s) -> "
               f"{outcome.bundle} ({signed}; {outcome.bundle_digest})")


@results_app.command("import")
def results_import_command(
    bundles: list[Path] = typer.Argument(..., help="Bundle file(s) `trtpipe results export` wrote."),
    public_key: Optional[Path] = typer.Option(None, "--public-key", help="The only key (PEM public key) a bundle may be "
                                              "signed by (default: the TRTPIPE_SIGNING_KEY setting's and the trust "
                                              "policy's keys; with none of them, signatures are not required)."),
    policy: PolicyOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check bundles (chains, heads, signature) and merge their results into this workspace's own chained logs,
    each record once: importing a bundle again, or another runner's bundle of the same digest, adds only what
    is new. A tampered or untrusted bundle is refused and nothing is imported."""
    from trtpipe.release.evidence import ImportRequest, import_results

    workspace = open_workspace(store)
    outcome = import_results(workspace.results, ImportRequest(bundles=bundles, public_key=public_key),
                             settings=workspace.settings,
                             policy=load_policy_option(policy, workspace, command="results import"))
    if as_json:
        _print_json(outcome.as_dict())
        return
    for bundle in outcome.bundles:
        typer.echo(f"{bundle.bundle}: {bundle.trust}; exported by {bundle.exported_by} on {bundle.host}")
    print_table(f"imported into {workspace.root / 'results'}", ["digest", "new", "already here", "new results"],
                [[log.artifact_digest, len(log.new), log.already_present,
                  ", ".join(f"{r.kind} {'passed' if r.passed else 'FAILED'} {r.recorded_at}" for r in log.new) or "-"]
                 for log in outcome.logs])
    typer.echo(f"{outcome.new} new, {outcome.already_present} already here")


def _read_data_file(name: str) -> str:
    try:
        return Path(name).read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"--data @{name}: {err.strerror}", fix="give @FILE of an existing JSON file") from None


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
    ref: str = typer.Argument(..., help="Stored artifact: kind/key, key prefix or sha256 digest."),
    to: Optional[str] = typer.Option(None, "--to", help="Remote cache oci://HOST/REPOSITORY (default: the remote --store or $TRTPIPE_STORE names)."),
    tag: list[str] = typer.Option([], "--tag", help="Extra version tag(s); a pushed tag never moves to another digest."),
    sign: SignOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Push a stored artifact to a remote cache (files individually, verified on pull); with a release key,
    sign it and attach its provenance (OCI referrers of the pushed manifest)."""
    workspace = open_workspace(store)
    remote = workspace.cache_at(to) if to else workspace.remote
    if remote is None:
        raise UsageError("no remote to push to", fix="pass --to oci://HOST/REPOSITORY or set TRTPIPE_STORE=oci://HOST/REPOSITORY")
    key = signing_key_option(sign, workspace.settings)  # a bad key fails before anything is pushed
    entry = workspace.store.find(ref)
    bundle = None
    if key is not None:
        from trtpipe.release.trust import sign_entry

        bundle = sign_entry(entry, key, workspace.root / "tmp")  # keyless fails here, before the push
    with _byte_progress(f"push {entry.kind}/{entry.key[:12]}", entry.size, quiet=as_json) as advance:
        result = remote.push(entry, tags=tuple(tag), progress=advance)
    signed = None
    if key is not None:
        from trtpipe.release.provenance import statement
        from trtpipe.release.trust import sign_pushed

        signed = sign_pushed(workspace, remote, result, entry, key, provenance=statement(workspace, entry), bundle=bundle)
    if as_json:
        _print_json({"ref": str(result.ref), "oci_digest": getattr(result, "oci_digest", None),
                     "artifact_digest": result.artifact_digest, "tags": list(result.tags), "files": result.files,
                     "bytes": result.bytes,
                     "signature": None if signed is None else {
                         "key_id": signed.key_id, "ref": signed.signature_ref, "provenance_ref": signed.provenance_ref,
                         "referrers": "tag-schema" if signed.fallback else "api"}})
    else:
        typer.echo(f"pushed {entry.kind}/{entry.key} ({result.files} files, {result.bytes} bytes) -> {result.ref}")
        typer.echo(f"  artifact digest {result.artifact_digest}; tags: {', '.join(result.tags)}")
        if signed is not None:
            how = "referrers tag schema (the registry has no referrers API)" if signed.fallback else "referrers API"
            typer.echo(f"  signed by key {signed.key_id or 'sigstore (keyless)'} -> {signed.signature_ref}")
            if signed.provenance_ref:
                typer.echo(f"  provenance -> {signed.provenance_ref}")
            typer.echo(f"  attached via the {how}")
        else:
            typer.echo("  unsigned (no --sign and no TRTPIPE_SIGNING_KEY)")


def cache_pull_command(
    ref: str = typer.Argument(..., help="oci://HOST/REPOSITORY:TAG or @sha256:DIGEST."),
    policy: PolicyOption = None,
    no_policy: NoPolicyOption = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Pull an artifact into the store; every blob and the manifest are verified before use, and its
    signatures against the trust policy (when one is set) before it enters the store."""
    from trtpipe.release.trust import PullGate, open_gated

    workspace = open_workspace(store)
    trust = load_policy_option(policy, workspace, no_policy=no_policy, command="cache pull")
    remote = open_gated(workspace, ref, PullGate(workspace, trust, note=lambda text: typer.echo(text, err=True)))
    found = remote.resolve(ref)
    with _byte_progress(f"pull {found.kind}/{found.key[:12]}", found.size, quiet=as_json) as advance:
        entry = remote.pull(found, workspace.store, progress=advance)
    if as_json:
        _print_json({"kind": entry.kind, "key": entry.key, "path": str(entry.path), "artifact_digest": entry.digest,
                     "oci_ref": str(found.ref), "policy": trust.source if trust is not None else None})
    else:
        typer.echo(f"pulled {found.ref} -> {entry.kind}/{entry.key} (artifact digest {entry.digest})")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("promote", rich_help_panel="Release")(promote_command)
    app.command("rollback", rich_help_panel="Release")(rollback_command)
    app.command("channels", rich_help_panel="Release")(channels_command)
    app.add_typer(results_app, name="results", rich_help_panel="Release")
    app.add_typer(policy_app, name="policy", rich_help_panel="Release")
    from trtpipe.commands.store import cache_app

    cache_app.command("push")(cache_push_command)
    cache_app.command("pull")(cache_pull_command)
