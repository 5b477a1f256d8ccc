"""Promote an artifact into a channel, or roll a channel back, with gates, CAS and an audit record.

What is promoted is exactly what was built: the channel's model and target and the gates come from
the artifact itself. A repository artifact records its name, target and `release` gates in its key
document (`inputs.name`, `inputs.target.gpu`, `inputs.release.gates`; its trtpipe.json says the
same), so two specs differing only in name or gates are two artifacts. `--spec SPEC` is a check:
refused unless its name and gates are the artifact's. `--model/--target` only name what an artifact
does not record (a bare digest, an engine), and are refused when they contradict it. An artifact
that records no gates gets the default `ChannelGates()` (smoke required). The source is audited.

Results: a gate reads only results recorded for exactly the artifact's digest (smoke, parity and
bench record under the repository digest the server reports serving, `trtpipe.serving.identity`).

The trail is the truth (`trtpipe.release.trail`): a move is its audit record (fsynced, the head
re-anchored), appended BEFORE the registry tag moves. A channel is what the trail replays to
(`trtpipe.release.projection`, its state file written when the release lock is let go), so there is no
pointer to move and none a crash can leave behind. A registry tag that cannot be moved leaves an
`aborted` record (the replay undoes the move); a crash before the tag moved leaves the tag behind its
record, which the next promote or rollback of a shared channel moves back (recorded `repair`).

Evidence: a result log that fails its chain or head check is refused (recorded `refused`); a
hand-recorded result counts only where the trust policy allows it (`allow_hand_recorded`), and a
promotion whose gates pass only thanks to one is recorded as `force-promote`.

Concurrency: the channel's digest is read before the gates are checked (the regression gate compares
against it) and is the expected "from" of a compare-and-swap done under the release lock. If another
promotion moved the channel in between, this one fails with a `conflict` audit record and changes
nothing. `expect_from` makes the expected digest explicit (CI passes what it tested against).

Shared channels: promoting a registry artifact makes the channel shared through that registry
(`trtpipe.release.shared_trail`): the channel's state is what the registry's trail of it says (caught up
first), the move is appended there by compare-and-swap on the trail's tag (a lost race retried while the
channel still holds the expected digest, a `conflict` when it does not), then the channel tag moves; the
channel is what the adopted trail replays to. Refusals and conflicts stay in the workspace trail.

`dry_run`: everything up to the verdicts (catching up read only), nothing written or recorded.

The command is request -> function -> outcome, as `trtpipe.build_session` is: the CLI parses its options into a
`PromoteRequest` (each refusal names its option: `--to: ...`), loads the trust policy, calls
`promote(workspace, request, policy=...)` once and renders the `PromotionOutcome`; tests call it as the CLI does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from trtpipe.chained import GENESIS
from trtpipe.errors import Conflict, GateRefused, IntegrityError, NotFound, TrtpipeError, UsageError
from trtpipe.names import name_fix, name_problem
from trtpipe.release.audit import AuditRecord, append_audit, read_audit
from trtpipe.release.channels import ChannelPointer, ChannelScope, ChannelStore, check_name, now_iso
from trtpipe.release.gate_models import ChannelGates
from trtpipe.release.gates import GateResult, evaluate_gates
from trtpipe.release.shared_trail import SharedChannel, Standing, channel_tag, require_consistent, shared_channel, \
    shared_channels, standing
from trtpipe.release.shared_trail import append as append_shared
from trtpipe.release.trail import MOVES, move_channel_tag, open_shared_remote, replay, same_pointer, settle_shared, \
    shared_standing
from trtpipe.release.policy import TrustPolicy
from trtpipe.results import ResultRecord, ResultsLog, current_user, normalize_digest
from trtpipe.settings import Settings
from trtpipe.signing_keys import ReleaseKey, release_key
from trtpipe.store.remote import RemoteCache, is_remote_url
from trtpipe.workspace import Workspace

EMPTY = "none"  # --expect-from none: the channel must be empty


def _plain(option: str, what: str, value: str) -> str:
    """`value`, or a UsageError naming `option` when it is not a plain name (trtpipe.names' one rule)."""
    problem = name_problem(what, value)
    if problem:
        raise UsageError(f"{option}: {problem}", fix=name_fix(what))
    return value


class PromoteRequest(BaseModel):
    """`trtpipe promote REF --to CHANNEL [--force --reason WHY] [--spec SPEC] [--model M] [--target T]
    [--expect-from DIGEST|none] [--dry-run]`, every value checked; a refusal is a UsageError naming its option
    (raised as is through pydantic, which wraps only ValueError)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ref: str  # oci://HOST/REPO:TAG|@DIGEST, a stored kind/key, key prefix or sha256 digest
    to: str  # the channel
    force: bool = False
    reason: str | None = None  # why (required with force; recorded)
    spec: Path | None = None  # a build spec whose name and release.gates must be the artifact's
    model: str | None = None  # only what the artifact does not record; refused when it contradicts it
    target: str | None = None
    expect_from: str | None = None  # the digest the channel must be at (EMPTY: empty); None: what it is at now
    dry_run: bool = False  # judge the gates; change and record nothing

    @field_validator("to")
    @classmethod
    def _channel(cls, value: str) -> str:
        return _plain("--to", "channel", value)

    @field_validator("model", "target")
    @classmethod
    def _scope(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _plain(f"--{info.field_name}", info.field_name, value)

    @field_validator("expect_from")
    @classmethod
    def _expected(cls, value: str | None) -> str | None:
        if value is None or value in ("", EMPTY):
            return None if value is None else EMPTY
        try:
            return normalize_digest(value)
        except UsageError as err:
            raise UsageError(f"--expect-from: {err.message}", fix=f"{err.fix}, or {EMPTY} for an empty channel") from None

    @model_validator(mode="after")
    def _reasoned(self) -> PromoteRequest:
        if self.force and not (self.reason and self.reason.strip()):
            raise UsageError("--force needs --reason", fix='say why, e.g. "hotfix for incident 123, smoke run by hand"')
        return self

    def expected(self, seen_from: str | None) -> str | None:
        """The digest the channel must hold when the move is made: `expect_from`'s, else the one seen now."""
        if self.expect_from is None:
            return seen_from
        return None if self.expect_from == EMPTY else self.expect_from


@dataclass
class ResolvedArtifact:
    """The artifact a REF names: its digest (what results and channels key on) and where it lives."""

    digest: str
    model: str
    target: str
    ref: str | None  # "kind/key" in the local store, or a remote reference pinned by digest
    manifest: dict[str, Any] = field(default_factory=dict)
    remote: RemoteCache | None = None  # the remote `ref` lives in (its channel tags move with the channel)


class PromotionOutcome(BaseModel):
    """What `promote` did (or, with dry_run, would do); `as_dict` is `trtpipe promote --json`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: str
    model: str
    target: str
    from_digest: str | None
    to_digest: str
    action: str  # promote | force-promote | unchanged; with dry_run: would-promote | would-force-promote | would-refuse
    gates: list[GateResult]
    gates_source: str
    audit: AuditRecord | None
    tag: str | None = None
    trail: str | None = None  # the registry copy of the channel's trail the record is in (None: the workspace trail)
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "model": self.model,
            "target": self.target,
            "from_digest": self.from_digest,
            "to_digest": self.to_digest,
            "action": self.action,
            "gates": [g.model_dump() for g in self.gates],
            "gates_source": self.gates_source,
            "tag": self.tag,
            "audit_seq": self.audit.seq if self.audit else None,
            "trail": self.trail,
            "dry_run": self.dry_run,
            "more_runs": max((g.more_runs for g in self.gates if g.more_runs and not g.passed), default=None),
        }


# --------------------------------------------------------------------------- resolving


def recorded_release(manifest: dict[str, Any]) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(name, target GPU, release section) an artifact's key document records (None where it does not)."""
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), dict) else {}
    name = inputs.get("name") if isinstance(inputs.get("name"), str) else None
    target_doc = inputs.get("target")
    target = target_doc.get("gpu") if isinstance(target_doc, dict) and isinstance(target_doc.get("gpu"), str) else None
    release = inputs.get("release") if isinstance(inputs.get("release"), dict) else None
    return name, target, release


def _scope_from(manifest: dict[str, Any], model: str | None, target: str | None, ref: str) -> tuple[str, str]:
    recorded_name, recorded_target, _ = recorded_release(manifest)
    for what, given, recorded in (("model", model, recorded_name), ("target", target, recorded_target)):
        if given is not None and recorded is not None and given != recorded:
            raise UsageError(
                f"the {what} {given} contradicts {ref}, which was built as {recorded}",
                fix=f"leave the {what} out: an artifact is promoted under the name and target it was built with",
            )
    model = recorded_name or model
    target = recorded_target or target
    if not model or not target:
        raise UsageError(
            f"cannot tell which model and target {ref} is for (its manifest does not say)",
            fix="promote the repository artifact the build published, or name the model and target",
        )
    return check_name("model", model), check_name("target", target)


def resolve_artifact(workspace: Workspace, ref: str, *, model: str | None = None,
                     target: str | None = None) -> ResolvedArtifact:
    """REF: a remote reference (`oci://host/repo:tag|@digest`), a local `kind/key` in the workspace's store, key
    prefix, or artifact digest."""
    if is_remote_url(ref):
        remote = workspace.remote_for(ref)
        described = remote.describe(ref)
        m, t = _scope_from(described.manifest, model, target, ref)
        return ResolvedArtifact(digest=described.artifact_digest, model=m, target=t, ref=described.pinned,
                                manifest=described.manifest, remote=remote)
    try:
        entry = workspace.store.find(ref)
    except NotFound:
        full = ref.removeprefix("sha256:")
        if len(full) == 64 and model and target:
            # Not in this store (results were recorded for it elsewhere): promote the bare digest.
            return ResolvedArtifact(digest=normalize_digest(full), model=check_name("model", model), target=check_name("target", target), ref=None)
        raise
    m, t = _scope_from(entry.manifest, model, target, ref)
    return ResolvedArtifact(digest=entry.digest, model=m, target=t, ref=f"{entry.kind}/{entry.key}", manifest=entry.manifest)


def load_gates(spec_path: Path | None, manifest: dict[str, Any], channel: str) -> tuple[ChannelGates, str]:
    """The gates of `channel` for the artifact `manifest` describes, and where they came from."""
    name, _, release = recorded_release(manifest)
    if spec_path is not None:
        from trtpipe.spec_loader import load_spec

        spec = load_spec(spec_path).spec
        if release is None:
            raise UsageError(
                f"{spec_path}: the artifact records no release gates (it is not a repository artifact), so "
                "the spec's gates cannot be checked against it",
                fix="promote the repository artifact the build of this spec published",
            )
        if spec.artifact_name != name or spec.release.model_dump(mode="json") != release:
            differs = "name" if spec.artifact_name != name else "release.gates"
            raise UsageError(
                f"{spec_path} differs from the artifact in {differs} ({spec.artifact_name!r} vs {name!r} "
                "or other gates): an artifact is promoted only under the name and gates it was built with",
                fix="promote the artifact built from this spec, or check against no spec",
            )
    if release is None:
        return ChannelGates(), "default (the artifact records no release gates: smoke required)"
    gates = release.get("gates") if isinstance(release.get("gates"), dict) else {}
    if channel not in gates:
        return ChannelGates(), "artifact (no gates for this channel: default, smoke required)"
    try:
        return ChannelGates.model_validate(gates[channel]), "artifact"
    except ValidationError as exc:
        raise IntegrityError(f"the gates the artifact records for {channel} are invalid: {exc.errors()[0]['msg']}",
                             fix="rebuild the artifact from a valid spec") from None


# --------------------------------------------------------------------------- results


def results_for(results: ResultsLog, digest: str) -> list[ResultRecord]:
    """Results recorded for exactly this artifact digest in `results` (its heads checked with its key, where it
    has one), ordered by recording time.

    For a served repository that is the digest the server reported (`trtpipe smoke/bench --record`);
    nothing recorded under another digest (its engine's, say) counts. A log that fails its chain or
    head check raises an IntegrityError naming it (none of its results count).
    """
    return sorted(results.for_digest(digest), key=lambda r: r.recorded_at)


def signed_results(results: ResultsLog, digest: str, records: list[ResultRecord], policy: TrustPolicy | None,
                   channel: str) -> tuple[list[ResultRecord], int]:
    """The results that may count for `channel` under `policy`, and how many were left out.

    Where the policy says unsigned results may not count (`unsigned_results`, by default wherever the channel
    requires signatures), a result counts only when a head signature verifying against the policy's keys for
    `channel` covers it: without that, anyone who can write to the workspace appends an `origin: run` result
    through the chained log, rewrites the unsigned head, and the gate passes (issue 28, attack 6)."""
    if policy is None or policy.allows_unsigned_results(channel) or not records:
        return records, 0
    keys = [ReleaseKey(public) for public in policy.trusted_keys(channel).values()]
    covered, _ = results.signed_prefix(digest, keys)
    kept = [r for r in records if r.seq is not None and r.seq <= covered]
    return kept, len(records) - len(kept)


def _policy_of(policy: TrustPolicy | None, settings: Settings | None) -> TrustPolicy | None:
    """The policy given, else the TRTPIPE_POLICY setting's, else none."""
    from trtpipe.release.policy import policy_from

    if policy is None and settings is not None:
        return policy_from(None, settings.policy)
    return policy


def _hand_allowed(policy: TrustPolicy | None, settings: Settings | None, channel: str) -> tuple[bool, str]:
    """Whether the trust policy (the one given, else the TRTPIPE_POLICY setting's) lets hand-recorded
    results count for `channel`, and which policy said."""
    from trtpipe.release.policy import allows_hand_recorded, policy_from

    if policy is None and settings is not None:
        policy = policy_from(None, settings.policy)
    return allows_hand_recorded(policy, channel), (policy.source if policy is not None else "no trust policy")


# --------------------------------------------------------------------------- promote


def _gate_summary(gates: list[GateResult]) -> str:
    return ", ".join(f"{g.gate} {g.status} ({g.detail})" for g in gates)


def _refusal_fix(failed: list[GateResult]) -> str:
    """What to do about the gates that did not pass, each said once."""
    wants: list[str] = []
    if any(g.status == "missing" and not g.gate.startswith(("bench", "regression")) for g in failed):
        wants.append("record the missing smoke or parity results for exactly this digest")
    more = max((g.more_runs or 0 for g in failed if g.gate.startswith(("bench", "regression"))), default=0)
    if more:
        which = "of each digest compared" if any(g.gate.startswith("regression") and g.more_runs for g in failed) else "of it"
        wants.append(f"record {'about ' if any(g.status == 'inconclusive' for g in failed) else ''}{more} more bench run(s) "
                     f"{which} (every run counts; the gates judge all of them)")
    if any(g.status == "failed" for g in failed):
        wants.append("fix what failed or regressed (benching again cannot flip a verdict on all runs), "
                     "or override with a recorded reason")
    return "; ".join(wants) or "record passing results for exactly this digest"


class _ChannelMoved(Exception):
    """The channel's trail no longer says what the move was decided on (another writer moved it)."""

    def __init__(self, now: ChannelPointer | None) -> None:
        super().__init__()
        self.now = now


def _shared_target(home: Path, art: ResolvedArtifact, scope: ChannelScope, channel: str,
                   settings: Settings) -> tuple[SharedChannel | None, RemoteCache | None]:
    """The channel's shared trail and its registry, when the channel is (or, promoting a registry artifact,
    becomes) shared; (None, None) for a channel of this workspace alone."""
    found = shared_channel(home, scope.model, scope.target, channel)
    if found is None:
        if art.remote is None or art.ref is None:
            return None, None
        return SharedChannel(Path(home), scope.model, scope.target, channel), art.remote
    remote = open_shared_remote(found, settings)
    if art.remote is None or art.remote.url != remote.url:
        raise UsageError(
            f"channel {channel} of {scope} is shared through {remote.url}; {art.ref or art.digest} is not an artifact there",
            fix=f"push the artifact to {remote.url} and promote that reference",
        )
    return found, remote


def _seed(home: Path, shared: SharedChannel, found: Standing) -> list[dict[str, Any]]:
    """The first write of a channel's shared trail starts with this workspace's earlier moves of it (kept in
    the workspace trail before trails were shared), so its rollback history is not lost; a head-only copy
    the registry kept must first agree with the workspace trail."""
    if found.state not in ("new", "legacy") or shared.log.path.exists():
        return []
    moves = [r for r in read_audit(home) if (r.model, r.target, r.channel) == shared.cid and r.action in (*MOVES, "aborted")]
    if not moves:
        return []
    if found.registry is not None and found.registry.legacy:
        from trtpipe.release.audit import trail_log

        try:
            head = json.loads(found.registry.head)
        except ValueError:
            head = {}
        problems = trail_log(home).check_copy(head if isinstance(head, dict) else {}, f"in the registry ({found.registry.where})")
        if problems:
            raise IntegrityError(f"{problems[0]}; nothing changed", path=found.registry.where,
                                 fix="promote from the workspace whose trail the registry's copy anchors: it starts the "
                                     "channel's shared trail")
    renumbered: dict[int, int] = {}
    out = []
    for number, record in enumerate(moves, start=1):
        renumbered[record.seq] = number
        fields = record.model_dump(mode="json", exclude={"seq", "prev_hash", "hash"})
        if record.undoes is not None:
            fields["undoes"] = renumbered.get(record.undoes)
        fields["detail"] = "; ".join(d for d in (record.detail, f"from workspace trail record {record.seq}") if d)
        out.append(fields)
    return out


def _move_shared(home: Path, shared: SharedChannel, remote: RemoteCache, key: ReleaseKey | None, *, fields: dict[str, Any],
                 still: Callable[[ChannelPointer | None], bool], tag_ref: str | None,
                 seed: list[dict[str, Any]] = ()) -> AuditRecord:
    """Record one move of a shared channel in its registry trail (compare-and-swap, retried while `still` holds
    for what the trail says the channel is at; `_ChannelMoved` when it does not), then move the channel tag to
    `tag_ref`. A tag that cannot be moved leaves an `aborted` record (best effort: if
    that cannot be written either, the trail's last word stands and the next promote or rollback moves the tag)."""
    def fields_for(records: list[AuditRecord]) -> list[dict[str, Any]]:
        start = list(seed) if not records else []  # an empty shared trail starts with this workspace's history
        seen = records or [AuditRecord.model_validate({**f, "seq": n, "prev_hash": GENESIS, "hash": GENESIS})
                           for n, f in enumerate(start, start=1)]
        now = replay(seen).pointers.get(shared.cid)
        if not still(now):
            raise _ChannelMoved(now)
        return [*start, fields]

    written, _ = append_shared(shared, remote, key, fields_for)
    record = written[-1]
    if tag_ref is not None and is_remote_url(tag_ref):
        try:
            move_channel_tag(remote, tag_ref, shared.model, shared.target, shared.channel)
        except Exception as err:
            aborted = _record_fields({
                **{k: v for k, v in fields.items() if k in ("who", "channel", "model", "target", "ref")},
                "at": now_iso(), "action": "aborted", "from_digest": record.to_digest, "to_digest": record.from_digest,
                "undoes": record.seq, "detail": f"record {record.seq} did not complete: the registry tag could not be "
                                                f"moved ({err.one_line() if hasattr(err, 'one_line') else err})"})

            def abort_if_last(records: list[AuditRecord]) -> list[dict[str, Any]]:
                if not records or records[-1].hash != record.hash:  # another move came after: it stands
                    raise _ChannelMoved(None)
                return [aborted]

            try:
                append_shared(shared, remote, key, abort_if_last)
            except (TrtpipeError, _ChannelMoved):  # the trail's last word stands; the next move puts the tag right
                pass
            raise
    return record


def promote(workspace: Workspace, request: PromoteRequest, *, policy: TrustPolicy | None = None) -> PromotionOutcome:
    """Point the request's channel (of the artifact's model and target) at its REF's digest if its gates pass
    (and, when the trust policy requires it for the channel, its signature: not even a forced promotion skips
    that). The workspace's settings sign, attribute and bound the move (its release key, user, TRTPIPE_POLICY
    when no `policy` is given, the bench-run minimum). `dry_run`: judge the gates as a promotion would, and
    change and record nothing."""
    channel, force, reason, dry_run = request.to, request.force, request.reason, request.dry_run
    home, settings = workspace.root, workspace.settings
    art = resolve_artifact(workspace, request.ref, model=request.model, target=request.target)
    if policy is not None:  # trust (model signing, the OCI referrers) loads only when a policy is set
        from trtpipe.release.trust import require_trusted_digest

        require_trusted_digest(workspace, art.digest, policy, channel, model=art.model, target=art.target)
    gates, gates_source = load_gates(request.spec, art.manifest, channel)
    min_runs = settings.min_bench_runs()
    channels = ChannelStore(home)
    scope = ChannelScope(model=art.model, target=art.target)
    cid = (art.model, art.target, channel)
    key = release_key(settings)
    who = current_user(settings)
    shared, remote = _shared_target(home, art, scope, channel, settings)
    found: Standing | None = None
    with channels.lock():  # the trail is the truth: the channel is what it replays to (a shared one's caught up first)
        if shared is None:
            before = channels.get(scope, channel)
        else:
            found = standing(shared, remote, key)
            if found.problems and not dry_run:
                append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=art.model,
                             target=art.target, from_digest=None, to_digest=art.digest, ref=art.ref,
                             detail="the channel's shared trail is not consistent: " + found.problems[0])
            require_consistent(found)
            if dry_run:
                before = replay(found.records()).pointers.get(cid) if found.registry is not None and not found.registry.legacy \
                    else channels.get(scope, channel)
            else:
                before = settle_shared(home, shared, found, remote, who=who, key=key, settings=settings)  # type: ignore[arg-type]
    seen_from = before.digest if before else None
    expected = request.expected(seen_from)
    hand_allowed, policy_source = _hand_allowed(policy, settings, channel)
    try:
        results = workspace.results
        candidate, current = results_for(results, art.digest), (results_for(results, seen_from) if seen_from else None)
    except IntegrityError as err:
        if not dry_run:
            with channels.lock():
                append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=art.model,
                             target=art.target, from_digest=seen_from, to_digest=art.digest, ref=art.ref,
                             detail="results are not evidence: " + err.message)
        raise
    judged_by = _policy_of(policy, settings)
    candidate, unsigned_left = signed_results(results, art.digest, candidate, judged_by, channel)
    if current is not None and seen_from is not None:
        current, _ = signed_results(results, seen_from, current, judged_by, channel)
    run_only = [r for r in candidate if r.origin != "hand"]
    current_run_only = [r for r in current if r.origin != "hand"] if current is not None else None
    judge = dict(target=art.target, current_digest=seen_from, min_runs=min_runs)
    gate_results = evaluate_gates(gates, run_only, current_results=current_run_only, **judge)
    hand_used: list[str] = []
    if any(r.origin == "hand" for r in candidate):
        if hand_allowed:
            with_hand = evaluate_gates(gates, candidate, current_results=current, **judge)
            passed_on_runs = {g.gate for g in gate_results if g.passed}
            hand_used = [h.gate for h in with_hand if h.passed and h.gate not in passed_on_runs]
            gate_results = with_hand
        else:
            gate_results = [g if g.passed else g.model_copy(update={"detail": g.detail + " (hand-recorded results do not count "
                                                                                        f"for {channel}: {policy_source})"})
                            for g in gate_results]
    if unsigned_left:
        assert judged_by is not None
        gate_results = [g if g.passed else g.model_copy(update={"detail": g.detail + (
            f" ({unsigned_left} result(s) not covered by a results-log head signed by a key {judged_by.source} trusts "
            f"for {channel} do not count: unsigned_results; record or import results with TRTPIPE_SIGNING_KEY set)")})
            for g in gate_results]
    failed = [g for g in gate_results if not g.passed]

    def outcome(action: str, from_digest: str | None, audit: AuditRecord | None = None, *, tag: str | None = None,
                trail: str | None = None) -> PromotionOutcome:
        return PromotionOutcome(channel=channel, model=art.model, target=art.target, from_digest=from_digest,
                                to_digest=art.digest, action=action, gates=gate_results, gates_source=gates_source,
                                audit=audit, tag=tag, trail=trail, dry_run=dry_run)

    trail_where = f"{remote.url}:{shared.tag}" if shared is not None and remote is not None else None
    tag = channel_tag(art.model, art.target, channel) if art.remote is not None and art.ref is not None else None
    if dry_run:
        if seen_from == art.digest:
            action = "unchanged"
        elif failed and not force:
            action = "would-refuse"
        else:
            action = "would-force-promote" if force or hand_used else "would-promote"
        return outcome(action, seen_from, tag=tag, trail=trail_where)
    common = dict(channel=channel, model=art.model, target=art.target, ref=art.ref,
                  gates=[g.model_dump() for g in gate_results], gates_source=gates_source)

    def conflict(now_digest: str | None) -> Conflict:
        append_audit(home, key=key, at=now_iso(), who=who, action="conflict", from_digest=now_digest, to_digest=art.digest,
                     reason=reason, detail=f"expected {channel} at {expected or 'empty'}, found {now_digest or 'empty'}", **common)
        return Conflict(
            f"channel {channel} of {scope} moved to {now_digest or 'empty'} while this promotion expected {expected or 'empty'}; nothing changed",
            resource=f"channel {scope}/{channel}",
            fix="look at the channel's audit trail and promote again if still wanted",
        )

    with channels.lock():
        now = channels.get(scope, channel) if shared is None else before
        now_digest = now.digest if now else None
        if now_digest != expected:
            raise conflict(now_digest)
        if failed and not force:
            append_audit(home, key=key, at=now_iso(), who=who, action="refused", from_digest=now_digest, to_digest=art.digest,
                         reason=None, detail="gates not met: " + ", ".join(f"{g.gate} {g.status}" for g in failed), **common)
            missing = [g.gate for g in failed if g.status == "missing"]
            raise GateRefused(
                f"refused to promote {art.digest} to {channel} of {scope}: gates not met: {_gate_summary(failed)}",
                channel=channel, digest=art.digest, failed=[g.gate for g in failed], missing=missing,
                verdicts=[g.model_dump() for g in gate_results], fix=_refusal_fix(failed),
            )
        if now_digest == art.digest:
            return outcome("unchanged", now_digest, trail=trail_where)
        forced = force or bool(hand_used)
        action = "force-promote" if forced else "promote"
        if hand_used and not force:
            reason = f"gates {', '.join(hand_used)} passed only on hand-recorded results ({policy_source} allows them for {channel})"
        details = [d for d in (f"channel tag {tag}" if tag else None,
                               f"hand-recorded results satisfied {', '.join(hand_used)}" if hand_used else None) if d]
        fields = dict(at=now_iso(), who=who, action=action, from_digest=now_digest, to_digest=art.digest, reason=reason,
                      detail="; ".join(details) or None, **common)
        if shared is not None:
            try:
                record = _move_shared(home, shared, remote, key, fields=_record_fields(fields),  # type: ignore[arg-type]
                                      still=lambda at: (at.digest if at else None) == expected, tag_ref=art.ref,
                                      seed=_seed(home, shared, found))  # type: ignore[arg-type]
            except _ChannelMoved as moved:
                raise conflict(moved.now.digest if moved.now else None) from None
            return outcome(action, now_digest, record, tag=tag, trail=trail_where)
        # The record is the move (fsynced): the channel is what the trail replays to, so there is no pointer
        # to write and none to leave behind; the state file follows when the lock is let go.
        record = append_audit(home, key=key, **fields)
        if tag is not None:
            _move_tag_or_abort(home, key, record, lambda: move_channel_tag(art.remote, art.ref, art.model,  # type: ignore[arg-type]
                                                                           art.target, channel))
    return outcome(action, now_digest, record, tag=tag)


def _record_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """An audit record's fields as the chain stores them (validated; without seq and hashes)."""
    body = AuditRecord.model_validate({**fields, "seq": 0, "prev_hash": GENESIS, "hash": GENESIS}).model_dump(mode="json")
    for name in ("seq", "prev_hash", "hash"):
        body.pop(name)
    return body


def _move_tag_or_abort(home: Path, key: ReleaseKey | None, record: AuditRecord, move: Any) -> None:
    """Move the registry's channel tag after the record; if that fails, record that the move was aborted
    (the pointer stays) and re-raise."""
    try:
        move()
    except Exception as err:
        append_audit(home, key=key, at=now_iso(), who=record.who, action="aborted", channel=record.channel,
                     model=record.model, target=record.target, from_digest=record.to_digest, to_digest=record.from_digest,
                     ref=record.ref, undoes=record.seq,
                     detail=f"record {record.seq} did not complete: the registry tag could not be moved "
                            f"({err if not hasattr(err, 'one_line') else err.one_line()}); the pointer did not move")
        raise


# --------------------------------------------------------------------------- rollback


def pick_channel(channels: ChannelStore, channel: str, model: str | None, target: str | None) -> ChannelPointer:
    check_name("channel", channel)
    found = channels.find(channel, model=model, target=target)
    if not found:
        raise NotFound(f"no channel {channel!r}" + (f" for {model or '*'}/{target or '*'}" if model or target else ""),
                       what="channel", ref=channel, fix="name a channel that exists")
    if len(found) > 1:
        names = ", ".join(f"{p.model}/{p.target}" for p in found)
        raise UsageError(f"channel {channel!r} exists for several models/targets ({names})",
                         fix="name the model and the target too")
    return found[0]


def catch_up(workspace: Workspace, *, channel: str | None = None) -> list[Standing]:
    """Adopt the registry's trail of every shared channel (named `channel`, or all) whose copy there is
    consistent with this workspace's (the channels then replay from it); an inconsistent or unreachable one is left
    as it is (its standing says why). Under the release lock."""
    home, settings = workspace.root, workspace.settings
    key = release_key(settings)
    who = current_user(settings)
    out = []
    with ChannelStore(home).lock():
        for shared in shared_channels(home):
            if channel is not None and shared.channel != channel:
                continue
            found = shared_standing(shared, settings, key)
            if found.consistent and found.registry is not None and not found.registry.legacy:
                settle_shared(home, shared, found, open_shared_remote(shared, settings), who=who, key=key, settings=settings,
                              strict=False)
            out.append(found)
    return out


def rollback(workspace: Workspace, channel: str, *, model: str | None = None, target: str | None = None,
             reason: str | None = None, policy: TrustPolicy | None = None) -> AuditRecord:
    """Move `channel` back to the digest it held before its latest promotion (recorded). Under a trust policy
    the earlier digest must satisfy the channel's rule as a promotion into it would: a rollback is a move
    into the channel, and the digest it returns to may predate the policy (an unsigned artifact back in prod)."""
    check_name("channel", channel)
    home, settings = workspace.root, workspace.settings
    channels = ChannelStore(home)
    catch_up(workspace, channel=channel)
    chosen = pick_channel(channels, channel, model, target)
    key = release_key(settings)
    who = current_user(settings)
    shared = shared_channel(home, chosen.model, chosen.target, channel)
    with channels.lock():
        if shared is None:
            now = channels.get(chosen.scope, channel)
        else:
            remote = open_shared_remote(shared, settings)
            found = standing(shared, remote, key)
            if found.problems:
                append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=chosen.model,
                             target=chosen.target, from_digest=chosen.digest, to_digest=None,
                             detail="the channel's shared trail is not consistent: " + found.problems[0])
            require_consistent(found)
            now = settle_shared(home, shared, found, remote, who=who, key=key, settings=settings)
        if now is None or not now.history:
            raise NotFound(f"channel {channel} of {chosen.scope} has no earlier digest to roll back to",
                           what="earlier digest", ref=channel, fix="promote the wanted artifact instead")
        previous = now.history[-1]
        if policy is not None:
            from trtpipe.release.trust import require_trusted_digest

            require_trusted_digest(workspace, previous.digest, policy, channel, model=now.model, target=now.target,
                                   action="rollback")
        tag = channel_tag(now.model, now.target, channel) if previous.ref and is_remote_url(previous.ref) else None
        fields = dict(at=now_iso(), who=who, action="rollback", channel=channel, model=now.model, target=now.target,
                      from_digest=now.digest, to_digest=previous.digest, ref=previous.ref, reason=reason,
                      detail=f"channel tag {tag}" if tag else None)
        if shared is not None:
            try:
                return _move_shared(home, shared, remote, key, fields=_record_fields(fields),
                                    still=lambda at: same_pointer(at, now), tag_ref=previous.ref)
            except _ChannelMoved as moved:
                raise Conflict(f"channel {channel} of {chosen.scope} moved to {moved.now.digest if moved.now else 'empty'} "
                               f"while this rollback was from {now.digest}; nothing changed",
                               resource=f"channel {chosen.scope}/{channel}",
                               fix="look at the channel's audit trail and roll back again if still wanted") from None
        record = append_audit(home, key=key, **fields)
        if tag is not None:
            _move_tag_or_abort(home, key, record, lambda: move_channel_tag(  # type: ignore[arg-type]
                workspace.remote_for(previous.ref), previous.ref, now.model, now.target, channel))
        return record


def channel_states(workspace: Workspace) -> list[dict[str, Any]]:
    """Each channel of the workspace with its digest, where it lives, who set it, the depth of its rollback
    history, and what the trail says it should hold (`trail_digest`, `agrees`: kept for readers of the JSON;
    the channel is the trail's projection, so it always agrees)."""
    from trtpipe.release.trail import channel_records

    home = workspace.root
    moves = [r for _, r in channel_records(home) if r.action in ("promote", "force-promote", "rollback")]
    out = []
    for pointer in ChannelStore(home).all():
        last = next((r for r in reversed(moves) if r.channel == pointer.channel and r.model == pointer.model
                     and r.target == pointer.target), None)
        out.append({
            "channel": pointer.channel, "model": pointer.model, "target": pointer.target, "digest": pointer.digest,
            "ref": pointer.ref, "set_at": pointer.set_at, "set_by": pointer.set_by,
            "previous": pointer.previous.digest if pointer.previous else None, "history_depth": len(pointer.history),
            "last_action": last.action if last else None, "last_reason": last.reason if last else None,
            "agrees": True, "trail_digest": pointer.digest,
        })
    return out
