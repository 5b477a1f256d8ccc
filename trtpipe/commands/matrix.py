"""CLI commands for build matrices: `trtpipe matrix plan` and `trtpipe matrix build`. Thin: parse, call one function, print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from trtpipe.commands.output import JsonOption, StoreOption, open_workspace, print_table

if TYPE_CHECKING:
    from trtpipe.matrix.plan import CellPlan, MatrixPlan
    from trtpipe.matrix.report import MatrixReport

matrix_app = typer.Typer(
    name="matrix",
    help="Build matrices: models x targets x precisions fanned out as Ray tasks, one shared store, no key built twice.",
    no_args_is_help=True,
)

MatrixArgument = Annotated[Path, typer.Argument(help="Matrix YAML: a base spec, axes, exclude and include.")]


def _status(cell: CellPlan) -> str:
    if cell.status == "refused":
        return f"refused: {cell.reason}"
    if cell.status == "build" and cell.waits_for:
        return f"build (after {', '.join(cell.waits_for)}, whose stages it reuses)"
    return cell.status


def _print_plan(plan: MatrixPlan) -> None:
    rows = []
    for cell in plan.cells:
        target = f"{cell.gpu} x{cell.tp * cell.pp}" if cell.gpu and cell.tp * cell.pp > 1 else (cell.gpu or "-")
        engine = next((s for s in cell.stages if s.name == "engine"), None)
        fits = "-" if cell.fits is None else ("yes" if cell.fits else "NO")
        rows.append([cell.cell, target, cell.quantization or "-", fits, engine.key if engine else "-", cell.shared,
                     _status(cell)])
    counts = plan.counts
    where = plan.remote or plan.store
    print_table(f"matrix {plan.matrix} ({plan.file}); shared store: {where}",
                ["cell", "target", "quant", "fits", "engine key", "in shared store", "status"], rows,
                caption=", ".join(f"{n} {s}" for s, n in counts.items()))


def _print_report(report: MatrixReport) -> None:
    rows = []
    for cell in report.cells:
        node = f"{cell.host} {cell.node_id[:8]}" if cell.node_id else ("head" if cell.where == "head" else "-")
        seconds = f"{cell.seconds:.1f}" if cell.seconds is not None else "-"
        rows.append([cell.cell, cell.outcome, node, seconds, cell.repository or "-", cell.detail or ""])
    counts = report.counts
    caption = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("built", "hit", "failed", "refused"))
    print_table(f"matrix {report.matrix}: {report.status} in {report.seconds:.1f}s "
                f"({report.tasks} task{'s' if report.tasks != 1 else ''} on {report.ray or 'no cluster: none needed'})",
                ["cell", "result", "node", "seconds", "repository digest", "detail"], rows, caption=caption)


@matrix_app.command("plan")
def plan_command(
    matrix: MatrixArgument,
    json_out: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Expand a matrix, resolve and key every cell, and say which are refused, already shared, or to build."""
    from trtpipe.matrix.plan import plan_matrix
    from trtpipe.shipped import build_configs_dir

    workspace = open_workspace(store)
    try:
        plan, _ = plan_matrix(matrix, workspace.store, workspace.remote, configs=build_configs_dir(workspace.settings))
    finally:
        workspace.close()
    if json_out:
        typer.echo(plan.model_dump_json(indent=2))
    else:
        _print_plan(plan)
    if plan.counts["refused"]:
        raise typer.Exit(1)


@matrix_app.command("build")
def build_command(
    matrix: MatrixArgument,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Ray cluster address (auto, HOST:PORT, ray://HOST:10001); default: an embedded local Ray.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Send every cell to its node as a dry run: where it runs and the commands it would run.")] = False,
    retries: Annotated[int, typer.Option(
        "--retries", min=0, max=10, help="Times a cell whose worker or node was lost is retried elsewhere.")] = 2,
    pending_timeout: Annotated[float, typer.Option(
        "--pending-timeout", min=1.0, help="Seconds a cell may wait while no alive node can run it, then refused.")] = 600.0,
    wait_for_nodes: Annotated[bool, typer.Option(
        "--wait-for-nodes", help="Autoscaling clusters: submit cells no node can run yet and wait up to "
                                 "--pending-timeout for one, instead of refusing them at once.")] = False,
    json_out: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Build every cell of a matrix as Ray tasks on the nodes its target needs, with one shared store."""
    from trtpipe.matrix.build import MatrixInterrupted, build_matrix, interrupted_error

    workspace = open_workspace(store)
    try:
        report = build_matrix(matrix, store=workspace.store, remote=workspace.remote, ray_address=ray,
                              dry_run=dry_run, retries=retries, pending_timeout=pending_timeout,
                              wait_for_nodes=wait_for_nodes, progress=not json_out, settings=workspace.settings)
    except MatrixInterrupted as interrupt:
        if json_out:
            typer.echo(interrupt.report.model_dump_json(indent=2))
        else:
            _print_report(interrupt.report)
        raise interrupted_error(interrupt.report) from None
    finally:
        workspace.close()
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
    else:
        _print_report(report)
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the trtpipe app."""
    app.add_typer(matrix_app, name="matrix", rich_help_panel="Build")
