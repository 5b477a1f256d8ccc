"""What the release report shows, gathered from a workspace (read only): channels with their gates,
signature and provenance; the audit trail; build history; every recorded version's bench results; and
regressions between consecutive versions of a channel.

Everything here is read through the release area's public functions (channels, audit, gates, promote's
resolving helpers), the results log and the build records; nothing is written. `trtpipe.release.report`
turns it into the page.

A version is an artifact digest of the model: one a build record names (its repository), one a channel
holds or held, or one the audit trail names. Its bench runs are every result `trtpipe bench --record`
filed under that exact digest (all of them count, and the page lists all of them). A regression is a
promotion whose new version's bench runs are worse than those of the version it replaced in that channel
by more than the channel's `max_regression_pct` (the same judgement the promotion gate makes, with its
interval, `trtpipe.release.gates.evaluate_gates`); where the channel's gates set no tolerance, the
report's own (`--tolerance`, default 10 %) is used and the page says so.

The trails are judged by `trtpipe.release.trail.trail_verdict`, the function `channels --verify` renders:
the page says "intact" exactly when it does. A shared channel (promoted through a registry) is shown as
the registry's copy of its trail says, when that copy is consistent with this workspace's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.build_record import BuildRecord, read_records
from trtpipe.errors import TrtpipeError
from trtpipe.release.audit import AuditRecord, read_audit
from trtpipe.release.channels import ChannelPointer, ChannelStore
from trtpipe.release.gate_models import ChannelGates
from trtpipe.release.gates import DEFAULT_MIN_RUNS, LATENCY_METRICS, THROUGHPUT_METRIC, GateResult, bench_metric, evaluate_gates
from trtpipe.release.trail import TrailVerdict, replay, trail_verdict
from trtpipe.release.promote import load_gates, results_for
from trtpipe.release.report_trust import ArtifactTrust, artifact_trust
from trtpipe.results import ResultRecord, ResultsLog
from trtpipe.signing_keys import release_key
from trtpipe.workspace import Workspace

DEFAULT_TOLERANCE_PCT = 10.0
MOVES = ("promote", "force-promote", "rollback")
HIGHLIGHTED_ACTIONS = ("refused", "conflict", "force-promote")
FIGURES = (*LATENCY_METRICS, THROUGHPUT_METRIC)
UNSCOPED = "-"  # the model/target/channel of an audit record about no channel


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelRow(_Model):
    model: str
    target: str
    channel: str
    digest: str
    version: str | None = None  # v1, v2 ... (order of first appearance of the digest)
    ref: str | None
    set_at: str
    set_by: str
    previous: str | None
    history_depth: int
    last_action: str | None
    last_reason: str | None
    gates: list[GateResult]
    gates_source: str
    trust: ArtifactTrust


class AuditRow(_Model):
    trail: str  # "workspace", or the registry tag of a shared channel's trail
    seq: int
    at: str
    who: str
    action: str
    model: str
    target: str
    channel: str
    from_digest: str | None
    to_digest: str | None
    reason: str | None
    detail: str | None
    failed_gates: list[str]
    highlighted: bool


class AuditSection(_Model):
    rows: list[AuditRow] = Field(default_factory=list)
    chain_problems: list[str] = Field(default_factory=list)  # trail_verdict's problems: what `channels --verify` says
    notes: list[str] = Field(default_factory=list)  # trail_verdict's notes (a shared channel this workspace is behind on)
    unreadable: str | None = None  # why the trail could not be read at all


class BuildRow(_Model):
    id: str
    started_at: str
    status: str
    model: str | None
    target: str | None
    toolchain: str | None
    host: str
    seconds: float
    repository_digest: str | None
    stages: str  # "checkpoint built, engine hit, ..."
    error: str | None


class BenchRow(_Model):
    recorded_at: str
    recorded_by: str | None
    gpu_class: str | None
    passed: bool
    figures: dict[str, float | None]  # FIGURES -> value (ms for latencies, tokens/s for throughput)
    summary: dict[str, Any]  # the recorded data, to redraw the plot


class Version(_Model):
    digest: str
    label: str
    model: str
    target: str | None
    first_seen: str
    built_by: str | None  # the build record id that produced it
    channels: list[str]  # channels holding it now
    bench: list[BenchRow]


class Regression(_Model):
    model: str
    target: str
    channel: str
    audit_seq: int
    at: str
    from_digest: str
    to_digest: str
    from_version: str | None
    to_version: str | None
    tolerance_pct: float
    tolerance_source: str
    checks: list[GateResult]

    @property
    def regressed(self) -> bool:
        return any(c.status == "failed" for c in self.checks)


class ReportData(_Model):
    generated_at: str
    home: str
    model: str | None
    min_runs: int = DEFAULT_MIN_RUNS  # the fewest bench runs a bench gate judges
    channels: list[ChannelRow]
    audit: AuditSection
    builds: list[BuildRow]
    versions: list[Version]
    regressions: list[Regression]


# --------------------------------------------------------------------------- gathering


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _StoreIndex:
    """The workspace's stored artifacts by digest, read once, checked by nothing (a report only reads)."""

    def __init__(self, workspace: Workspace) -> None:
        self.by_digest: dict[str, Any] = {}
        home = workspace.root
        if not (home / "repository").is_dir() and not (home / "engine").is_dir():
            return  # no store here: nothing to open (opening would create one)
        for entry in workspace.store.entries():
            if entry.damage is None:
                self.by_digest.setdefault(entry.digest, entry)

    def manifest(self, digest: str) -> dict[str, Any]:
        entry = self.by_digest.get(digest)
        return entry.manifest if entry is not None else {}

    def entry(self, digest: str) -> Any | None:
        return self.by_digest.get(digest)


def _gates_for(index: _StoreIndex, digest: str, channel: str) -> tuple[ChannelGates, str]:
    if digest not in index.by_digest:
        return ChannelGates(), "default (the artifact is not in this store, so its recorded gates cannot be read)"
    try:
        return load_gates(None, index.manifest(digest), channel)
    except TrtpipeError as err:
        return ChannelGates(), f"default ({err.one_line()})"


def _audit(home: Path, model: str | None, verdict: TrailVerdict) -> tuple[AuditSection, list[AuditRecord]]:
    section = AuditSection(chain_problems=list(verdict.problems), notes=list(verdict.notes))
    try:
        trails = [("workspace", r) for r in read_audit(home)]
        for found in verdict.standings:
            trails.extend((found.shared.tag, r) for r in found.records())
    except TrtpipeError as err:
        section.unreadable = err.one_line()
        return section, []
    trails.sort(key=lambda item: item[1].at)
    # A refusal the trail could not scope to a model (model "-": a pull or serve of an untrusted artifact)
    # is shown in every model's report rather than in none.
    chosen = [(t, r) for t, r in trails if model is None or r.model in (model, UNSCOPED)]
    for trail, r in chosen:
        failed = [str(g.get("gate")) for g in r.gates if isinstance(g, dict) and g.get("status") != "passed"]
        section.rows.append(AuditRow(
            trail=trail, seq=r.seq, at=r.at, who=r.who, action=r.action, model=r.model, target=r.target, channel=r.channel,
            from_digest=r.from_digest, to_digest=r.to_digest, reason=r.reason, detail=r.detail,
            failed_gates=failed, highlighted=r.action in HIGHLIGHTED_ACTIONS,
        ))
    return section, [r for _, r in chosen]


def _pointers(home: Path, model: str | None, verdict: TrailVerdict) -> list[ChannelPointer]:
    """Every channel's pointer: the trail's projection, or for a shared channel what the registry's trail says (when
    it is consistent with this workspace's copy)."""
    by_cid = {(p.model, p.target, p.channel): p for p in ChannelStore(home).all()}
    for found in verdict.standings:
        if found.consistent:
            state = replay(found.records()).pointers.get(found.shared.cid)
            if state is None:
                by_cid.pop(found.shared.cid, None)
            else:
                by_cid[found.shared.cid] = state
    return [p for cid, p in sorted(by_cid.items()) if model is None or p.model == model]


def _stages(record: BuildRecord) -> str:
    return ", ".join(f"{s.name} {s.outcome}" for s in record.stages)


def _builds(records: list[BuildRecord]) -> list[BuildRow]:
    return [BuildRow(
        id=r.id, started_at=r.started_at, status=r.status, model=r.model, target=r.target,
        toolchain=(r.toolchain or {}).get("name") if isinstance(r.toolchain, dict) else None,
        host=r.host, seconds=r.seconds, repository_digest=r.artifacts.get("repository"), stages=_stages(r), error=r.error,
    ) for r in records]


def _bench_rows(results: list[ResultRecord]) -> list[BenchRow]:
    return [BenchRow(
        recorded_at=r.recorded_at, recorded_by=r.recorded_by, gpu_class=r.gpu_class, passed=r.passed,
        figures={name: bench_metric(r.data, name) for name in FIGURES}, summary=r.data,
    ) for r in results if r.kind == "bench"]


def _versions(home: Path, model: str | None, builds: list[BuildRecord], audit: list[AuditRecord],
              pointers: list[ChannelPointer], cache: dict[str, list[ResultRecord]]) -> list[Version]:
    """Every digest of each model, labelled v1, v2 ... per model in order of first appearance."""
    seen: dict[str, dict[str, Any]] = {}

    def note(digest: str | None, model_name: str, target: str | None, at: str, built_by: str | None = None) -> None:
        if not digest:
            return
        known = seen.setdefault(digest, {"model": model_name, "target": target, "first_seen": at, "built_by": built_by})
        if at < known["first_seen"]:
            known["first_seen"] = at
        known["built_by"] = known["built_by"] or built_by
        known["target"] = known["target"] or target

    for record in builds:
        if record.status == "ok" and record.artifacts.get("repository") and record.model:
            note(record.artifacts["repository"], record.model, record.target, record.started_at, record.id)
    for r in audit:
        if r.model == UNSCOPED:
            continue
        for digest in (r.from_digest, r.to_digest):
            note(digest, r.model, r.target, r.at)
    for p in pointers:
        for digest, at in ((p.digest, p.set_at), *((h.digest, h.set_at) for h in p.history)):
            note(digest, p.model, p.target, at)
    out: list[Version] = []
    numbers: dict[str, int] = {}
    for digest, facts in sorted(seen.items(), key=lambda item: (item[1]["first_seen"], item[0])):
        if model is not None and facts["model"] != model:
            continue
        number = numbers[facts["model"]] = numbers.get(facts["model"], 0) + 1
        holding = sorted(p.channel for p in pointers if p.digest == digest)
        out.append(Version(
            digest=digest, label=f"v{number}", model=facts["model"], target=facts["target"],
            first_seen=facts["first_seen"], built_by=facts["built_by"], channels=holding,
            bench=_bench_rows(_results(home, digest, cache)),
        ))
    return out


def _results(home: Path, digest: str, cache: dict[str, list[ResultRecord]]) -> list[ResultRecord]:
    if digest not in cache:
        # Read without the release key: the page shows what is recorded, and the trail verdict (with the key)
        # says whether the heads are signed; a keyed read would refuse the page over an unsigned head.
        cache[digest] = results_for(ResultsLog(home), digest)
    return cache[digest]


def _regressions(audit: list[AuditRecord], index: _StoreIndex, home: Path, cache: dict[str, list[ResultRecord]],
                 labels: dict[str, str], tolerance_pct: float, min_runs: int) -> list[Regression]:
    out: list[Regression] = []
    for r in audit:
        if r.action not in ("promote", "force-promote") or not r.from_digest or not r.to_digest:
            continue
        gates, _ = _gates_for(index, r.to_digest, r.channel)
        if gates.max_regression_pct is not None:
            tolerance, source = gates.max_regression_pct, f"the {r.channel} gate's max_regression_pct"
        else:
            tolerance, source = tolerance_pct, f"the report's tolerance (the {r.channel} gates set no max_regression_pct)"
        checks = evaluate_gates(
            ChannelGates(smoke=False, max_regression_pct=tolerance), _results(home, r.to_digest, cache),
            target=r.target, current_results=_results(home, r.from_digest, cache), current_digest=r.from_digest,
            min_runs=min_runs,
        )
        out.append(Regression(
            model=r.model, target=r.target, channel=r.channel, audit_seq=r.seq, at=r.at,
            from_digest=r.from_digest, to_digest=r.to_digest, from_version=labels.get(r.from_digest),
            to_version=labels.get(r.to_digest), tolerance_pct=tolerance, tolerance_source=source, checks=checks,
        ))
    return out


def gather(workspace: Workspace, *, model: str | None = None, tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> ReportData:
    """Everything the report shows for the workspace (one model's, with `model`); its settings reach the trail
    verdict and the signature adapter (`trtpipe.release.report_trust`)."""
    home, settings = workspace.root, workspace.settings
    index = _StoreIndex(workspace)
    min_runs = settings.min_bench_runs()
    # The same judgement `channels --verify` renders (its default key, the registry's copies).
    verdict = trail_verdict(home, release_key(settings), settings, registry=True)
    pointers = _pointers(home, model, verdict)
    audit_section, audit_records = _audit(home, model, verdict)
    all_builds = read_records(home)
    builds = [b for b in all_builds if model is None or b.model == model]
    cache: dict[str, list[ResultRecord]] = {}  # digest -> its results, each file read once
    versions = _versions(home, model, all_builds, audit_records, pointers, cache)
    labels = {v.digest: v.label for v in versions}

    last_moves: dict[tuple[str, str, str], AuditRecord] = {}
    for record in audit_records:
        if record.action in MOVES:
            last_moves[(record.model, record.target, record.channel)] = record
    channels: list[ChannelRow] = []
    for p in pointers:
        gates, source = _gates_for(index, p.digest, p.channel)
        previous = p.previous.digest if p.previous else None
        evaluated = evaluate_gates(gates, _results(home, p.digest, cache), target=p.target,
                                   current_results=_results(home, previous, cache) if previous else None,
                                   current_digest=previous, min_runs=min_runs)
        last = last_moves.get((p.model, p.target, p.channel))
        channels.append(ChannelRow(
            model=p.model, target=p.target, channel=p.channel, digest=p.digest, version=labels.get(p.digest), ref=p.ref,
            set_at=p.set_at, set_by=p.set_by, previous=previous, history_depth=len(p.history),
            last_action=last.action if last else None, last_reason=last.reason if last else None,
            gates=evaluated, gates_source=source, trust=artifact_trust(workspace, p.digest, index.entry(p.digest), p.channel),
        ))
    return ReportData(
        generated_at=_now(), home=str(home), model=model, min_runs=min_runs, channels=channels, audit=audit_section,
        builds=_builds(builds), versions=versions,
        regressions=_regressions(audit_records, index, home, cache, labels, tolerance_pct, min_runs),
    )

