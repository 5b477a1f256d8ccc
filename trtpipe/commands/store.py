"""CLI commands for the store area: `trtpipe cache ...` and `trtpipe history`. Thin: parse, call, print.

`cache_app` is module level so the Release area can add `cache push | pull` to it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_table
from trtpipe.commands.trust_options import PolicyOption, load_policy_option
from trtpipe.errors import Conflict
from trtpipe.workspace import Workspace

cache_app = typer.Typer(name="cache", help="Inspect, verify, share and clean the artifact store.", no_args_is_help=True)

EntryArgument = Annotated[str, typer.Argument(help="kind/key, a key prefix or an artifact digest.")]


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "-"


def _entry_row(entry: Any, pinned: set[str]) -> dict[str, Any]:
    return {
        "kind": entry.kind,
        "key": entry.key,
        "digest": entry.digest,
        "model": entry.name,
        "target": entry.target,
        "size": entry.size,
        "files": len(entry.files),
        "current": entry.current,
        "damage": entry.damage,
        "last_used": entry.last_used,
        "pinned": entry.digest in pinned,
        "path": str(entry.path),
    }


def _pins(workspace: Workspace) -> dict[str, list[str]]:
    """Each artifact digest a channel pins (or can roll back to) -> the channels naming it (the release area's
    channels: the store itself reads none)."""
    from trtpipe.release.channels import ChannelStore

    return ChannelStore(workspace.root).pins()


@cache_app.command("ls")
def cache_ls(store: StoreOption = None, json_out: JsonOption = False) -> None:
    """List stored artifacts (full keys and digests: the table is never cut in a pipe or CI log)."""
    workspace = open_workspace(store)
    opened = workspace.store
    pinned = set(_pins(workspace))
    rows = [_entry_row(e, pinned) for e in opened.entries()]
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    print_table(
        f"artifacts in {opened.root}",
        ["kind", "key", "digest", "model", "target", "size", "files", "last used", "pinned", "state"],
        [[r["kind"], r["key"], r["digest"], str(r["model"] or "-"), str(r["target"] or "-"), _human(r["size"]),
          str(r["files"]), _when(r["last_used"]), "yes" if r["pinned"] else "",
          "DAMAGED" if r["damage"] else ("outdated" if not r["current"] else "")] for r in rows],
    )
    damaged = [r for r in rows if r["damage"]]
    for r in damaged:
        typer.echo(f"damaged {r['kind']}/{r['key']}: manifest.json: {r['damage']}", err=True)
    if damaged:
        typer.echo("set damaged artifacts aside and restore them with `trtpipe cache verify --repair`", err=True)


@cache_app.command("show")
def cache_show(
    key: Annotated[str, typer.Argument(help="kind/key, a key prefix, an artifact digest, or (with --provenance) "
                                            "a registry reference oci://HOST/REPO:TAG|@DIGEST.")],
    provenance: Annotated[bool, typer.Option("--provenance", help="Print the artifact's provenance (in-toto statement, "
                                                                  "SLSA provenance v1) and whose signature it carries.")] = False,
    policy: PolicyOption = None,
    store: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    """Show one artifact's manifest (or, with --provenance, its provenance)."""
    workspace = open_workspace(store)
    if provenance:
        from trtpipe.release.trust import show_provenance

        shown = show_provenance(workspace, key, load_policy_option(policy, workspace, command="cache show"))
        if json_out:
            typer.echo(json.dumps(shown, indent=2))
        else:
            typer.echo(f"provenance of {shown['subject']}: {shown['signature']}", err=True)
            typer.echo(json.dumps(shown["statement"], indent=2))
        return
    entry = workspace.store.find(key)
    data = {"path": str(entry.path), "digest": entry.digest, "manifest": entry.manifest,
            "pinned": entry.digest in _pins(workspace)}
    if json_out:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"{entry.kind}/{entry.key}\n  path:   {entry.path}\n  digest: {entry.digest}")
    typer.echo(json.dumps(entry.manifest, indent=2))


@cache_app.command("verify")
def cache_verify(
    key: Annotated[Optional[str], typer.Argument(help="One artifact (default: all, and every object).")] = None,
    repair: Annotated[bool, typer.Option("--repair", help="Restore every damaged artifact to exactly its digest: "
                                         "from the remote cache (--store oci://...) if there is one, else rebuilt from the "
                                         "spec its build record holds.")] = False,
    store: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    """Re-hash stored files; corrupt artifacts are moved aside with their manifest (restorable). A damaged
    artifact a channel pins is named with its channels. Exit 1 unless everything is (or was restored) intact."""
    from trtpipe.store.verify import verify_store

    workspace = open_workspace(store)
    opened = workspace.store
    result = verify_store(opened, pins=_pins(workspace), ref=key)
    outcomes = []
    if repair:
        from trtpipe.repair import Damaged
        from trtpipe.repair import repair as run_repair

        from trtpipe.store.verify import recorded_digests

        pinned = {p.digest: p for p in result.pinned}
        damaged = []
        for k, key_, d, problems in opened.quarantined:
            # An entry whose manifest.json was damaged is restored to the digest its build records name.
            wanted = (recorded_digests(opened, k, key_) or [d])[:1] if problems[0].file == "manifest.json" else [d]
            damaged += [Damaged(kind=k, key=key_, digest=w, channels=pinned[w].channels if w in pinned else [])
                        for w in wanted]
        damaged += [Damaged(kind=p.kind, key=p.key, digest=p.digest, channels=p.channels)
                    for p in result.pinned if p.digest not in {d.digest for d in damaged}]
        outcomes = run_repair(opened, damaged, remote=workspace.remote, settings=workspace.settings)
        for p in result.pinned:
            p.restored = any(o.restored and o.digest == p.digest for o in outcomes)
    unrepaired = [o for o in outcomes if not o.restored]
    failed = bool(result.problems) and (not repair or unrepaired) or any(not p.restored for p in result.pinned)
    if json_out:
        typer.echo(json.dumps({**json.loads(result.model_dump_json()), "ok": not failed,
                               "repairs": [o.model_dump() for o in outcomes]}, indent=2))
    else:
        moved = set(result.quarantined)
        for problem in result.problems:
            where = f"{problem.kind}/{problem.key}" if problem.key else problem.kind
            after = ("; moved aside, restore it with `trtpipe cache verify --repair` (or build its spec again)"
                     if where in moved and not repair else "")
            typer.echo(f"CORRUPT {where} {problem.file or ''}: {problem.reason}{after}", err=True)
        for p in result.pinned:
            state = "restored" if p.restored else "NOT restored"
            typer.echo(f"PINNED {p.kind}/{p.key} ({p.digest}) is damaged and pinned by channel "
                       f"{', '.join(p.channels)}; files: {', '.join(p.files)}; kept in {p.quarantine or 'quarantine'}; "
                       f"{state}" + ("" if p.restored or repair else "; restore it with `trtpipe cache verify --repair`"),
                       err=True)
        for o in outcomes:
            how = f"restored ({o.how})" if o.restored else f"NOT restored: {o.detail}"
            if not o.restored and workspace.remote_url is None:
                how += "; from a registry: `trtpipe cache verify --repair --store oci://HOST/REPO`"
            typer.echo(f"repair {o.kind}/{o.key} {o.digest}: {how}", err=not o.restored)
        for name in result.outdated:
            typer.echo(f"outdated {name}: written by an older trtpipe; the next build rebuilds it")
        typer.echo(f"verified {result.entries} artifacts and {result.objects} objects: "
                   f"{len(result.problems)} problem(s), {len(result.quarantined)} artifact(s) moved aside"
                   + (f", {sum(o.restored for o in outcomes)}/{len(outcomes)} restored" if repair else ""))
    if failed:
        raise typer.Exit(1)


@cache_app.command("gc")
def cache_gc(
    max_size: Annotated[Optional[str], typer.Option("--max-size", help="Keep the store under this size, e.g. 10GB.")] = None,
    max_age: Annotated[Optional[str], typer.Option("--max-age", help="Remove artifacts unused this long, e.g. 30d.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed.")] = False,
    store: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    """Remove leftovers, unreferenced objects and (LRU) artifacts beyond --max-size / --max-age.
    Never removes an artifact a channel pins or a running build uses."""
    from trtpipe.store.gc import collect, parse_age, parse_size

    size = parse_size(max_size) if max_size else None
    age = parse_age(max_age) if max_age else None
    workspace = open_workspace(store)
    report = collect(workspace.store, pins=_pins(workspace), max_size=size, max_age_s=age, dry_run=dry_run)
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    for action in report.removed:
        typer.echo(f"{verb} {action.what} {action.name} ({_human(action.bytes)}): {action.reason}")
    for name in report.quarantined:
        typer.echo(f"{'would move' if dry_run else 'moved'} to quarantine {name}")
    for name in report.kept_pinned:
        typer.echo(f"kept {name}: pinned by a channel")
    for name, pins in report.kept_maybe_pinned.items():
        typer.echo(f"kept {name}: its manifest is unreadable, so it may be what a channel pins that has no intact "
                   f"copy here: {', '.join(pins)}; restore that with `trtpipe cache verify --repair`")
    for name in report.kept_in_use:
        typer.echo(f"kept {name}: in use by a running build")
    typer.echo(f"{verb} {len(report.removed)} item(s), {_human(report.freed_bytes)}; "
               f"artifacts now {_human(report.entries_bytes_after)}")


@cache_app.command("rm")
def cache_rm(
    key: EntryArgument,
    store: StoreOption = None,
    json_out: JsonOption = False,
) -> None:
    """Remove one artifact (refused while a channel pins it or a build uses it)."""
    workspace = open_workspace(store)
    opened = workspace.store
    entry = opened.find(key)
    pins = _pins(workspace)
    if entry.digest in pins:
        raise Conflict(f"{entry.kind}/{entry.key} is pinned by channel {', '.join(pins[entry.digest])}",
                       resource=f"{entry.kind}/{entry.key}",
                       fix="promote another artifact into that channel (and past its rollback history) first")
    if not opened.remove(entry):
        raise Conflict(f"{entry.kind}/{entry.key} is in use by a running build", resource=f"{entry.kind}/{entry.key}",
                       fix="retry when it ends")
    if json_out:
        typer.echo(json.dumps({"removed": f"{entry.kind}/{entry.key}", "digest": entry.digest}))
    else:
        typer.echo(f"removed {entry.kind}/{entry.key}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.add_typer(cache_app, name="cache", rich_help_panel="Store")

    @app.command("history", rich_help_panel="Store")
    def history(
        model: Annotated[Optional[str], typer.Option("--model", help="Only builds of this model (artifact name).")] = None,
        target: Annotated[Optional[str], typer.Option("--target", help="Only builds for this target GPU.")] = None,
        channel: Annotated[Optional[str], typer.Option("--channel", help="Show this channel's promotion audit trail.")] = None,
        store: StoreOption = None,
        json_out: JsonOption = False,
    ) -> None:
        """Build records, newest first (or a channel's audit trail with --channel)."""
        workspace = open_workspace(store)
        if channel is not None:
            _channel_history(workspace.root, channel, json_out)
            return
        from trtpipe.build_record import read_records

        records = read_records(workspace.root, model=model, target=target)
        if json_out:
            typer.echo(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
            return
        def outcome(record: Any, stage: str) -> str:
            return next((s.outcome for s in record.stages if s.name == stage), "-")

        print_table(
            f"builds recorded in {workspace.root}",
            ["when (UTC)", "model", "target", "status", "checkpoint", "engine", "publish", "secs", "repository"],
            [[r.started_at[:19].replace("T", " "), str(r.model or "-"), str(r.target or "-"), r.status,
              outcome(r, "checkpoint"), outcome(r, "engine"), outcome(r, "publish"), f"{r.seconds:.2f}",
              r.artifacts.get("repository") or "-"] for r in records],
        )


def _channel_history(home: Path, channel: str, json_out: bool) -> None:
    from trtpipe.release.trail import channel_records

    rows = [{**r.model_dump(mode="json"), "trail": trail} for trail, r in channel_records(home, channel=channel)]
    rows.reverse()  # the audit trail is oldest first; history reads newest first
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no audit records for channel {channel}")
        return
    columns = ["at", "action", "who", "model", "target", "from_digest", "to_digest", "reason"]
    print_table(
        f"channel {channel}: promotions and rollbacks",
        columns,
        [[str(row.get(c) if row.get(c) is not None else "-") for c in columns] for row in rows],
    )
