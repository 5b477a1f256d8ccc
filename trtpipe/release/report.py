"""`trtpipe report`: the release page, one static folder readable offline (no server, no external JS or CSS).

`write_report(workspace, out)` gathers the workspace (`trtpipe.release.report_data`), redraws each version's
bench figure from its recorded result (`trtpipe.bench.plot`, the figure `bench --plot` draws), inlines the
PNGs as data URIs, renders `trtpipe/data/report/release.html.j2` (Jinja2, autoescaped) and writes
`index.html` and `report.json` (the gathered data) into a temporary folder beside OUT, then renames it
into place. An OUT that exists must be an earlier report (or empty): it is swapped out and removed,
under a lock beside it, so two reports at once never mix their files.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from trtpipe.errors import UsageError
from trtpipe.release.report_data import DEFAULT_TOLERANCE_PCT, BenchRow, ReportData, Version, gather
from trtpipe.workspace import Workspace
from trtpipe.shipped import data_file

TEMPLATE = data_file("report", "release.html.j2")
REPORT_FILES = ("index.html", "report.json")
MARKER = ".trtpipe-report"  # says the folder is a report trtpipe may replace


@dataclass
class ReportOutcome:
    out: Path
    data: ReportData
    plotted: list[str]  # version labels with a figure

    def summary(self) -> dict[str, Any]:
        data = self.data
        return {
            "out": str(self.out),
            "index": str(self.out / "index.html"),
            "model": data.model,
            "channels": [{"model": c.model, "target": c.target, "channel": c.channel, "digest": c.digest,
                          "version": c.version, "gates_passed": all(g.passed for g in c.gates),
                          "signature": c.trust.signature, "signer": c.trust.signer,
                          "provenance": c.trust.provenance} for c in data.channels],
            "audit_records": len(data.audit.rows),
            "audit_refusals": sum(1 for a in data.audit.rows if a.action in ("refused", "conflict")),
            "audit_chain_problems": data.audit.chain_problems,
            "builds": len(data.builds),
            "versions": [{"label": v.label, "digest": v.digest, "model": v.model, "bench_results": len(v.bench),
                          "plotted": f"{v.model}:{v.label}" in self.plotted} for v in data.versions],
            "regressions": [{"model": r.model, "target": r.target, "channel": r.channel, "audit_seq": r.audit_seq,
                             "from": r.from_version, "to": r.to_version, "tolerance_pct": r.tolerance_pct,
                             "regressed": [c.gate for c in r.checks if c.status == "failed"]} for r in data.regressions],
        }


def _latest_bench(version: Version) -> BenchRow | None:
    """The version's latest bench result on its own target (else its latest at all)."""
    same = [b for b in version.bench if version.target is None or b.gpu_class in (version.target, None)]
    rows = same or version.bench
    return rows[-1] if rows else None


def _figure(version: Version, row: BenchRow | None) -> str | None:
    """A data URI of the version's bench figure, or None when its record has no curve to draw."""
    if row is None:
        return None
    from trtpipe.bench.plot import plot_input_from_summary, png_bytes

    title = f"{version.model} {version.label} ({version.digest[:19]}), {row.gpu_class or 'no GPU class'}, recorded {row.recorded_at[:19]}"
    data = plot_input_from_summary(row.summary, title)
    if data is None:
        return None
    return "data:image/png;base64," + base64.b64encode(png_bytes(data)).decode("ascii")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def render(data: ReportData) -> tuple[str, list[str]]:
    """The page's HTML and the versions (`model:label`) it has a figure of."""
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = env.from_string(TEMPLATE.read_text(encoding="utf-8"))
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    plotted: list[str] = []
    for version in data.versions:
        row = _latest_bench(version)
        image = _figure(version, row)
        if image:
            plotted.append(f"{version.model}:{version.label}")
        groups.setdefault((version.model, version.target), []).append(
            {"label": version.label, "digest": version.digest, "channels": version.channels, "row": row, "image": image,
             "runs": version.bench})
    bench_groups = [{"title": f"{model} / {target or '?'}", "versions": versions} for (model, target), versions in groups.items()]
    labels = {v.digest: v.label for v in data.versions}
    html = template.render(data=data, bench_groups=bench_groups, versions=labels, fmt=_fmt)
    return html, plotted


def _check_out(out: Path) -> None:
    """OUT may be new, an empty folder, or an earlier report; never anything else (nothing of a user's is removed)."""
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise UsageError(f"the report folder {out} exists and is not a folder", fix="give a new folder for the report")
    names = {p.name for p in out.iterdir()}
    if names and not (MARKER in names and names <= {MARKER, *REPORT_FILES}):
        listed = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise UsageError(
            f"the report folder {out} holds files that are not a trtpipe report ({listed})",
            fix="give a new or empty folder, or the folder of an earlier report (it is replaced)",
        )


def write_report(workspace: Workspace, out: Path, *, model: str | None = None,
                 tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> ReportOutcome:
    """Write the release page of the workspace into the folder `out` (replaced whole, atomically)."""
    if tolerance_pct < 0:
        raise UsageError(f"the regression tolerance {tolerance_pct:g}% is negative", fix="give a percentage of 0 or more, e.g. 10")
    out = Path(out).absolute()
    data = gather(workspace, model=model, tolerance_pct=tolerance_pct)
    if model is not None and not (data.channels or data.audit.rows or data.builds or data.versions):
        raise UsageError(f"the workspace {workspace.root} has no channel, audit record, build or version of {model!r}",
                         fix="name a model this workspace built or promoted, or report on every model")
    html, plotted = render(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{out.name}.lock"), timeout=120):
        _check_out(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            for name, text in (("index.html", html), ("report.json", data.model_dump_json(indent=1) + "\n"), (MARKER, "")):
                path = staging / name
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.chmod(path, 0o644)
            os.chmod(staging, 0o755)
            _swap_in(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return ReportOutcome(out=out, data=data, plotted=plotted)


def _swap_in(staging: Path, out: Path) -> None:
    """Rename the finished folder into place; an earlier report is renamed aside first, then removed."""
    old: Path | None = None
    if os.path.lexists(out):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / "report")
    try:
        os.rename(staging, out)
    except BaseException:
        if old is not None:  # put the earlier report back
            with contextlib.suppress(OSError):
                os.rename(old / "report", out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
