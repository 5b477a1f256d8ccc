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

The trail is the truth (`trtpipe.release.trail`): a move appends its audit record (fsynced, the
head re-anchored) BEFORE it moves the registry tag and then the pointer, so a crash leaves the pointer
behind the trail, never ahead; the next promote or rollback of that channel completes the
interrupted move (recorded `repair`), and refuses (recorded `refused`) when the pointer disagrees
with the trail otherwise. A registry tag that cannot be moved leaves an `aborted` record.

Evidence: a result log that fails its chain or head check is refused (recorded `refused`); a
hand-recorded result counts only where the trust policy allows it (`allow_hand_recorded`), and a
promotion whose gates pass only thanks to one is recorded as `force-promote`.

Concurrency: the channel's digest is read before the gates are checked (the regression gate compares
against it) and is the expected "from" of a compare-and-swap done under the release lock. If another
promotion moved the channel in between, this one fails with a `conflict` audit record and changes
nothing. `expect_from` makes the expected digest explicit (CI passes what it tested against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trtpipe.errors import Conflict, GateRefused, IntegrityError, NotFound, UsageError
from trtpipe.release.audit import AuditRecord, append_audit, read_audit
from trtpipe.release.channels import ChannelPointer, ChannelScope, ChannelStore, check_name, now_iso
from trtpipe.release.trail import ReleaseKey, apply, disagreements, publish_channel, reconcile, release_key
from trtpipe.release.gates import GateResult, evaluate_gates
from trtpipe.release.policy import TrustPolicy
from trtpipe.release.trust import require_trusted_digest
from trtpipe.results import ResultRecord, ResultsLog, current_user, normalize_digest
from trtpipe.settings import Settings
from trtpipe.spec import ChannelGates
from trtpipe.store.remote import RemoteCache, is_remote_url, open_remote_for_ref

UNSET = "__unset__"


@dataclass
class ResolvedArtifact:
    """The artifact a REF names: its digest (what results and channels key on) and where it lives."""

    digest: str
    model: str
    target: str
    ref: str | None  # "kind/key" in the local store, or a remote reference pinned by digest
    manifest: dict[str, Any] = field(default_factory=dict)
    remote: RemoteCache | None = None  # the remote `ref` lives in (its channel tags move with the channel)


@dataclass
class PromotionOutcome:
    channel: str
    model: str
    target: str
    from_digest: str | None
    to_digest: str
    action: str  # promote | force-promote | unchanged
    gates: list[GateResult]
    gates_source: str
    audit: AuditRecord | None
    tag: str | None = None

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


def resolve_artifact(home: Path, ref: str, *, model: str | None = None, target: str | None = None,
                     settings: Settings | None = None) -> ResolvedArtifact:
    """REF: a remote reference (`oci://host/repo:tag|@digest`), a local `kind/key`, key prefix, or artifact digest."""
    if is_remote_url(ref):
        remote = open_remote_for_ref(ref, settings)
        described = remote.describe(ref)
        m, t = _scope_from(described.manifest, model, target, ref)
        return ResolvedArtifact(digest=described.artifact_digest, model=m, target=t, ref=described.pinned,
                                manifest=described.manifest, remote=remote)
    from trtpipe.store.local import Store

    store = Store.open(home)
    try:
        entry = store.find(ref)
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


def results_for(home: Path, digest: str, key: ReleaseKey | None = None) -> list[ResultRecord]:
    """Results recorded for exactly this artifact digest, ordered by recording time.

    For a served repository that is the digest the server reported (`trtpipe smoke/bench --record`);
    nothing recorded under another digest (its engine's, say) counts. A log that fails its chain or
    head check raises an IntegrityError naming it (none of its results count).
    """
    return sorted(ResultsLog(home, key).for_digest(digest), key=lambda r: r.recorded_at)


def _hand_allowed(policy: TrustPolicy | None, settings: Settings | None, channel: str) -> tuple[bool, str]:
    """Whether the trust policy (the one given, else the TRTPIPE_POLICY setting's) lets hand-recorded
    results count for `channel`, and which policy said."""
    from trtpipe.release.policy import allows_hand_recorded, policy_from

    if policy is None and settings is not None:
        policy = policy_from(None, settings.policy)
    return allows_hand_recorded(policy, channel), (policy.source if policy is not None else "no trust policy")


# --------------------------------------------------------------------------- promote


def channel_tag(model: str, target: str, channel: str) -> str:
    """The remote tag that follows a channel: `<model>.<target>.<channel>`, at most 128 characters (the
    names are plain, `check_name`, so it is a valid OCI tag as it is)."""
    return f"{model}.{target}.{channel}"[:128]


def _gate_summary(gates: list[GateResult]) -> str:
    return ", ".join(f"{g.gate} {g.status} ({g.detail})" for g in gates)


def _refusal_fix(failed: list[GateResult], missing: list[str]) -> str:
    """What to change for a refused promotion, said once: results to record where they are missing; where
    recorded results did not pass (a failed smoke, a regression), recording more is not the fix."""
    not_passed = [g.gate for g in failed if g.gate not in missing]
    if not not_passed:
        return f"record {', '.join(missing)} results for exactly this digest"
    fix = (f"the results recorded for {', '.join(not_passed)} did not pass: fix the candidate and build a new one, "
           "or promote another digest")
    return fix + (f"; {', '.join(missing)} still need results" if missing else "")


def promote(
    home: Path,
    ref: str,
    channel: str,
    *,
    force: bool = False,
    reason: str | None = None,
    spec_path: Path | None = None,
    model: str | None = None,
    target: str | None = None,
    expect_from: str | None = UNSET,
    settings: Settings | None = None,
    policy: TrustPolicy | None = None,
) -> PromotionOutcome:
    """Point `channel` (of the artifact's model and target) at REF's digest if its gates pass (and, when
    the trust policy requires it for `channel`, its signature: not even a forced promotion skips that)."""
    check_name("channel", channel)
    if force and not (reason and reason.strip()):
        raise UsageError("a forced promotion needs a reason", fix='say why, e.g. "hotfix for incident 123, smoke run by hand"')
    art = resolve_artifact(home, ref, model=model, target=target, settings=settings)
    if policy is not None:
        require_trusted_digest(home, art.digest, policy, channel, model=art.model, target=art.target)
    gates, gates_source = load_gates(spec_path, art.manifest, channel)
    channels = ChannelStore(home)
    scope = ChannelScope(model=art.model, target=art.target)
    key = release_key(settings)
    who = current_user()
    with channels.lock():  # the trail is the truth: complete an interrupted move, refuse a disagreeing pointer
        reconcile(home, scope, channel, who=who, key=key, settings=settings)
    before = channels.get(scope, channel)
    seen_from = before.digest if before else None
    expected = seen_from if expect_from == UNSET else (None if expect_from in (None, "", "none") else normalize_digest(expect_from))
    hand_allowed, policy_source = _hand_allowed(policy, settings, channel)
    try:
        candidate, current = results_for(home, art.digest, key), (results_for(home, seen_from, key) if seen_from else None)
    except IntegrityError as err:
        with channels.lock():
            append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=art.model,
                         target=art.target, from_digest=seen_from, to_digest=art.digest, ref=art.ref,
                         detail="results are not evidence: " + err.message)
        raise
    run_only = [r for r in candidate if r.origin != "hand"]
    current_run_only = [r for r in current if r.origin != "hand"] if current is not None else None
    gate_results = evaluate_gates(gates, run_only, target=art.target, current_results=current_run_only, current_digest=seen_from)
    hand_used: list[str] = []
    if any(r.origin == "hand" for r in candidate):
        if hand_allowed:
            with_hand = evaluate_gates(gates, candidate, target=art.target, current_results=current, current_digest=seen_from)
            passed_on_runs = {g.gate for g in gate_results if g.passed}
            hand_used = [h.gate for h in with_hand if h.passed and h.gate not in passed_on_runs]
            gate_results = with_hand
        else:
            gate_results = [g if g.passed else g.model_copy(update={"detail": g.detail + " (hand-recorded results do not count "
                                                                                        f"for {channel}: {policy_source})"})
                            for g in gate_results]
    failed = [g for g in gate_results if not g.passed]
    common = dict(channel=channel, model=art.model, target=art.target, ref=art.ref,
                  gates=[g.model_dump() for g in gate_results], gates_source=gates_source)
    with channels.lock():
        now = channels.get(scope, channel)
        now_digest = now.digest if now else None
        if now_digest != expected:
            append_audit(home, key=key, at=now_iso(), who=who, action="conflict", from_digest=now_digest, to_digest=art.digest,
                         reason=reason, detail=f"expected {channel} at {expected or 'empty'}, found {now_digest or 'empty'}", **common)
            raise Conflict(
                f"channel {channel} of {scope} moved to {now_digest or 'empty'} while this promotion expected {expected or 'empty'}; nothing changed",
                resource=f"channel {scope}/{channel}",
                fix="look at the channel's audit trail and promote again if still wanted",
            )
        if failed and not force:
            append_audit(home, key=key, at=now_iso(), who=who, action="refused", from_digest=now_digest, to_digest=art.digest,
                         reason=None, detail="gates not met: " + ", ".join(f"{g.gate} {g.status}" for g in failed), **common)
            missing = [g.gate for g in failed if g.status == "missing"]
            raise GateRefused(
                f"refused to promote {art.digest} to {channel} of {scope}: gates not met: {_gate_summary(failed)}",
                channel=channel, digest=art.digest, failed=[g.gate for g in failed], missing=missing,
                verdicts=[g.model_dump() for g in gate_results], fix=_refusal_fix(failed, missing),
            )
        if now_digest == art.digest:
            return PromotionOutcome(channel, art.model, art.target, now_digest, art.digest, "unchanged", gate_results, gates_source, None)
        tag = channel_tag(art.model, art.target, channel) if art.remote is not None and art.ref is not None else None
        forced = force or bool(hand_used)
        action = "force-promote" if forced else "promote"
        if hand_used and not force:
            reason = f"gates {', '.join(hand_used)} passed only on hand-recorded results ({policy_source} allows them for {channel})"
        details = [d for d in (f"channel tag {tag}" if tag else None,
                               f"hand-recorded results satisfied {', '.join(hand_used)}" if hand_used else None) if d]
        # The trail first (fsynced): a crash from here on leaves the pointer behind the trail, which the
        # next promote or rollback of this channel completes; never a moved pointer without its record.
        record = append_audit(home, key=key, at=now_iso(), who=who, action=action, from_digest=now_digest, to_digest=art.digest,
                              reason=reason, detail="; ".join(details) or None, **common)
        if tag is not None:
            _move_tag_or_abort(home, key, record, lambda: publish_channel(home, art.remote, art.ref, art.model,  # type: ignore[arg-type]
                                                                          art.target, channel))
        channels.write(apply(now, record))
    return PromotionOutcome(channel, art.model, art.target, now_digest, art.digest, action, gate_results, gates_source, record, tag)


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


def rollback(home: Path, channel: str, *, model: str | None = None, target: str | None = None, reason: str | None = None,
             settings: Settings | None = None) -> AuditRecord:
    """Move `channel` back to the digest it held before its latest promotion (recorded)."""
    channels = ChannelStore(home)
    chosen = pick_channel(channels, channel, model, target)
    key = release_key(settings)
    who = current_user()
    with channels.lock():
        reconcile(home, chosen.scope, channel, who=who, key=key, settings=settings)
        now = channels.get(chosen.scope, channel)
        if now is None or not now.history:
            raise NotFound(f"channel {channel} of {chosen.scope} has no earlier digest to roll back to",
                           what="earlier digest", ref=channel, fix="promote the wanted artifact instead")
        previous = now.history[-1]
        tag = channel_tag(now.model, now.target, channel) if previous.ref and is_remote_url(previous.ref) else None
        record = append_audit(home, key=key, at=now_iso(), who=who, action="rollback", channel=channel, model=now.model,
                              target=now.target, from_digest=now.digest, to_digest=previous.digest, ref=previous.ref,
                              reason=reason, detail=f"channel tag {tag}" if tag else None)
        if tag is not None:
            _move_tag_or_abort(home, key, record, lambda: publish_channel(  # type: ignore[arg-type]
                home, open_remote_for_ref(previous.ref, settings), previous.ref, now.model, now.target, channel))
        channels.write(apply(now, record))
        return record


def channel_states(home: Path) -> list[dict[str, Any]]:
    """Each channel with its digest, where it lives, who set it, the depth of its rollback history,
    and what the trail says it should hold (`trail_digest`; `agrees` False when they differ)."""
    audit = read_audit(home)
    disagreeing = {d.cid: d for d in disagreements(home, audit)}
    out = []
    for pointer in ChannelStore(home).all():
        last = next((r for r in reversed(audit) if r.channel == pointer.channel and r.model == pointer.model and r.target == pointer.target
                     and r.action in ("promote", "force-promote", "rollback")), None)
        out.append({
            "channel": pointer.channel, "model": pointer.model, "target": pointer.target, "digest": pointer.digest,
            "ref": pointer.ref, "set_at": pointer.set_at, "set_by": pointer.set_by,
            "previous": pointer.previous.digest if pointer.previous else None, "history_depth": len(pointer.history),
            "last_action": last.action if last else None, "last_reason": last.reason if last else None,
            "agrees": (pointer.model, pointer.target, pointer.channel) not in disagreeing,
            "trail_digest": (lambda d: d.trail.digest if d and d.trail else (None if d else pointer.digest))(
                disagreeing.get((pointer.model, pointer.target, pointer.channel))),
        })
    return out
