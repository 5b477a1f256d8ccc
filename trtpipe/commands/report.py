"""CLI command `trtpipe report`: the release page. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_json


def report_command(
    out: Path = typer.Option(..., "--out", help="Folder to write the page into (index.html, report.json); "
                             "new, empty, or an earlier report (replaced whole)."),
    model: Optional[str] = typer.Option(None, "--model", help="Only this model's channels, audit records, builds and versions."),
    tolerance: float = typer.Option(10.0, "--tolerance", help="Percent a bench figure may worsen from the version it "
                                    "replaced before it is marked a regression, where the channel's gates set no "
                                    "max_regression_pct."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the release page: channels with gates, signature and provenance; audit trail; builds; bench curves."""
    from trtpipe.release.report import write_report

    workspace = open_workspace(store)
    try:
        outcome = write_report(workspace, out, model=model, tolerance_pct=tolerance)
    finally:
        workspace.close()
    summary = outcome.summary()
    if as_json:
        print_json(summary)
        return
    regressed = [r for r in summary["regressions"] if r["regressed"]]
    typer.echo(f"report written to {summary['index']}")
    typer.echo(f"  {len(summary['channels'])} channel(s), {summary['audit_records']} audit record(s) "
               f"({summary['audit_refusals']} refused or conflicting), {summary['builds']} build(s), "
               f"{len(summary['versions'])} version(s), {len(outcome.plotted)} with bench curves")
    if summary["audit_chain_problems"]:
        typer.echo(f"  audit chain BROKEN: {len(summary['audit_chain_problems'])} problem(s), shown on the page")
    for r in regressed:
        typer.echo(f"  regression: {r['model']}/{r['target']} {r['channel']} {r['from']} -> {r['to']}: {', '.join(r['regressed'])}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.command("report", rich_help_panel="Release")(report_command)
