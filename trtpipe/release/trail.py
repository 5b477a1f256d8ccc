"""The trail is the truth: channel pointers are what replaying the audit trail gives, and nothing else.

Promotion and rollback append their record (fsynced) before they move a registry tag or a pointer,
so a crash can leave a pointer BEHIND the trail, never ahead of it. `replay` rebuilds every channel's
pointer (digest, ref, rollback history) from the trail; `disagreements` compares the pointer files
with it. A pointer that stands exactly where the trail stood before that channel's last move is an
interrupted move: `reconcile` completes it (registry tag, then pointer) and records a `repair`.
Any other disagreement (a pointer at a digest the trail never put there, a pointer file deleted
or written by hand) is reported by `channels --verify` and refuses promotion and rollback of that
channel, recorded as `refused`; nothing is trusted from the pointer file.

A channel promoted through a registry is shared: its trail is the registry's copy
(`trtpipe.release.shared_trail`), this workspace's adopted copy of it is what its pointer is replayed
from, and the workspace trail keeps only what happened here (refusals, conflicts, repairs).
`trail_verdict` is the one judgement of all of it: `channels --verify` and the release page render it.

The trail's and result logs' heads are signed and checked with the release key (`trtpipe.signing_keys.release_key`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtpipe.errors import IntegrityError, NotFound, TrtpipeError, UsageError
from trtpipe.release.audit import TRAIL_WIDE, AuditRecord, append_audit, read_audit, trail_log
from trtpipe.release.channels import ChannelPointer, ChannelScope, ChannelStore, PointerTarget, now_iso
from trtpipe.release.shared_trail import SharedChannel, Standing, channel_tag, shared_channels, standing, trail_tag
from trtpipe.settings import Settings
from trtpipe.signing_keys import ReleaseKey
from trtpipe.store.remote import ChannelMirror, RemoteCache

ChannelId = tuple[str, str, str]  # model, target, channel
MOVES = ("promote", "force-promote", "rollback")


# --------------------------------------------------------------------------- replay


@dataclass
class Replayed:
    """What the trail says of every channel: its pointer, and for each its last move and the state before."""

    pointers: dict[ChannelId, ChannelPointer]
    last_move: dict[ChannelId, AuditRecord]
    before_last_move: dict[ChannelId, ChannelPointer | None]


def _id(record: AuditRecord) -> ChannelId:
    return (record.model, record.target, record.channel)


def replay(records: list[AuditRecord]) -> Replayed:
    state: dict[ChannelId, ChannelPointer] = {}
    last_move: dict[ChannelId, AuditRecord] = {}
    before: dict[ChannelId, ChannelPointer | None] = {}
    snapshots: dict[int, tuple[ChannelId, ChannelPointer | None, AuditRecord | None, ChannelPointer | None]] = {}
    for record in records:
        cid = _id(record)
        if record.action in MOVES and record.to_digest:
            prior = state.get(cid)
            snapshots[record.seq] = (cid, prior, last_move.get(cid), before.get(cid))
            state[cid] = apply(prior, record)
            last_move[cid], before[cid] = record, prior
        elif record.action == "aborted" and record.undoes in snapshots:
            cid, prior, move, prior_before = snapshots[record.undoes]
            if prior is None:
                state.pop(cid, None)
            else:
                state[cid] = prior
            if move is None:
                last_move.pop(cid, None)
                before.pop(cid, None)
            else:
                last_move[cid], before[cid] = move, prior_before
    return Replayed(state, last_move, before)


def apply(prior: ChannelPointer | None, record: AuditRecord) -> ChannelPointer:
    """The pointer a promote or rollback record puts in place over `prior`."""
    if record.action == "rollback" and prior is not None and prior.history:
        back = prior.history[-1]
        return ChannelPointer(channel=record.channel, model=record.model, target=record.target, digest=back.digest,
                              ref=back.ref, set_at=record.at, set_by=record.who, history=prior.history[:-1])
    history = list(prior.history) if prior is not None else []
    if prior is not None and record.action != "rollback":
        history.append(PointerTarget(digest=prior.digest, ref=prior.ref, set_at=prior.set_at, set_by=prior.set_by))
    return ChannelPointer(channel=record.channel, model=record.model, target=record.target, digest=record.to_digest or "",
                          ref=record.ref, set_at=record.at, set_by=record.who, history=history)


def same_pointer(a: ChannelPointer | None, b: ChannelPointer | None) -> bool:
    """Whether two pointers name the same digest with the same rollback history."""
    if a is None or b is None:
        return a is b
    return a.digest == b.digest and [h.digest for h in a.history] == [h.digest for h in b.history]


def _stamps(p: ChannelPointer) -> list[tuple[str, str, str | None]]:
    return [(p.set_by, p.set_at, p.ref), *((h.set_by, h.set_at, h.ref) for h in p.history)]


def same_record(a: ChannelPointer | None, b: ChannelPointer | None) -> bool:
    """`same_pointer`, and who set it, when and from which ref (its history's too) as the trail records them:
    what `channels --verify` compares, so a hand edit of `set_by`/`set_at` is a disagreement. (Moves decide
    on `same_pointer`: what a channel serves is its digest and history.)"""
    return same_pointer(a, b) and (a is None or b is None or _stamps(a) == _stamps(b))


@dataclass(frozen=True)
class Disagreement:
    cid: ChannelId
    pointer: ChannelPointer | None
    trail: ChannelPointer | None
    interrupted: bool  # the pointer stands where the trail stood before the channel's last move
    trail_path: str | None = None  # a shared channel's adopted trail (None: the workspace trail)

    def line(self, home: Path) -> str:
        model, target, channel = self.cid
        path = ChannelStore(home).path(ChannelScope(model=model, target=target), channel)
        says = self.pointer.digest if self.pointer else "nothing (the file is missing)"
        last = self.trail.digest if self.trail else "nothing (no promotion of this channel)"
        why = ("a promotion or rollback was interrupted after its audit record and before the pointer moved"
               if self.interrupted else "the pointer was changed outside trtpipe, or the trail lost records")
        which = f"the channel's trail ({self.trail_path})" if self.trail_path else "the audit trail"
        if self.pointer is not None and self.trail is not None and same_pointer(self.pointer, self.trail):
            index, (by, at, ref), (trail_by, trail_at, trail_ref) = next(
                (i, p, t) for i, (p, t) in enumerate(zip(_stamps(self.pointer), _stamps(self.trail))) if p != t)
            what = says if index == 0 else f"{self.pointer.history[index - 1].digest} (its history entry {index})"
            return (f"{path}: the pointer says {what} was set by {by} at {at} (ref {ref}), but {which} records it set "
                    f"by {trail_by} at {trail_at} (ref {trail_ref}) (the pointer was changed outside trtpipe)")
        return f"{path}: the pointer names {says}, {which}'s last word is {last} ({why})"


def disagreements(home: Path, records: list[AuditRecord] | None = None) -> list[Disagreement]:
    """Every channel whose pointer file is not what its trail says: the workspace trail's replay, or for a
    shared channel the replay of its adopted trail (`interrupted`: the pointer stands where that trail
    stood before some of its last records, as a crash between adopting and writing the pointer leaves it)."""
    replayed = replay(read_audit(home) if records is None else records)
    shared = {s.cid: s for s in shared_channels(home)}
    pointers = {(p.model, p.target, p.channel): p for p in ChannelStore(home).all()}
    out = []
    for cid in sorted(set(pointers) | set(replayed.pointers) | set(shared)):
        pointer = pointers.get(cid)
        if cid in shared:
            states = replay_prefixes(shared[cid].local_records(), cid)
            if not same_record(pointer, states[-1]):
                out.append(Disagreement(cid, pointer, states[-1], any(same_record(pointer, s) for s in states[:-1]),
                                        trail_path=str(shared[cid].log.path)))
            continue
        trail = replayed.pointers.get(cid)
        if not same_record(pointer, trail):
            interrupted = cid in replayed.last_move and same_record(pointer, replayed.before_last_move.get(cid))
            out.append(Disagreement(cid, pointer, trail, interrupted))
    return out


def replay_prefixes(records: list[AuditRecord], cid: ChannelId) -> list[ChannelPointer | None]:
    """The channel's pointer before any record, after the first, ... after all of `records` (one trail)."""
    states: list[ChannelPointer | None] = [None]
    for end in range(1, len(records) + 1):
        if records[end - 1].action in (*MOVES, "aborted"):
            states.append(replay(records[:end]).pointers.get(cid))
    return states


def reconcile(home: Path, scope: ChannelScope, channel: str, *, who: str, key: ReleaseKey | None = None,
              settings: Settings) -> AuditRecord | None:
    """Bring one channel's pointer to the trail's last word if a move was interrupted (recorded as
    `repair`); refuse (recorded as `refused`) if the pointer disagrees otherwise. The caller holds
    the release lock. Returns the repair record, or None when the pointer agrees."""
    cid: ChannelId = (scope.model, scope.target, channel)
    replayed = replay(read_audit(home))
    pointer, trail = ChannelStore(home).get(scope, channel), replayed.pointers.get(cid)
    if same_pointer(pointer, trail):
        return None
    found = Disagreement(cid, pointer, trail, cid in replayed.last_move and same_pointer(pointer, replayed.before_last_move.get(cid)))
    if not found.interrupted or found.trail is None:
        append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=scope.model,
                     target=scope.target, from_digest=found.pointer.digest if found.pointer else None,
                     to_digest=None, detail="channel pointer disagrees with the trail: " + found.line(home))
        raise IntegrityError(
            f"{found.line(home)}; nothing changed",
            path=str(ChannelStore(home).path(scope, channel)),
            fix="put the pointer back where the audit trail says (its last promote or rollback record for this "
                "channel names the digest), or restore the trail from a backup",
        )
    _move_registry_tag(home, found.trail, settings)
    ChannelStore(home).write(found.trail)
    return append_audit(home, key=key, at=now_iso(), who=who, action="repair", channel=channel, model=scope.model,
                        target=scope.target, from_digest=found.pointer.digest if found.pointer else None,
                        to_digest=found.trail.digest, ref=found.trail.ref,
                        detail="completed an interrupted move: the pointer now names what the trail's last record says")


def adopt_trail(home: Path, key: ReleaseKey | None, *, who: str) -> AuditRecord | None:
    """Take the workspace trail as it stands and sign its head with the release key: the key holder's explicit
    decision for a trail kept without the key until now (or under another key), recorded as a `repair`. A
    keyed append never does this by itself: an unsigned head is what a trail extended without the key looks
    like. Refused on a broken chain, a shortened or rewritten trail, or one older than its high-water mark.
    Returns the record, or None when the head already verifies (nothing to adopt). The caller holds the release lock."""
    if key is None or not key.can_sign:
        raise UsageError("adopting the audit trail signs its head: the release key is needed",
                         fix="set TRTPIPE_SIGNING_KEY to the release key (its private half) and run it again")
    log = trail_log(home)
    if not log.path.exists() and log.read_head() is None:
        return None
    if not log.verify(key):
        return None
    return append_audit(home, key=key, adopt=True, at=now_iso(), who=who, action="repair", channel=TRAIL_WIDE,
                        model=TRAIL_WIDE, target=TRAIL_WIDE, from_digest=None, to_digest=None,
                        detail=f"the trail was adopted as it stood and its head signed by the release key {key.key_id[:16]} "
                               "(trtpipe channels --adopt-trail)")


def trail_head_tag(model: str, target: str, channel: str) -> str:
    """The registry tag a channel's trail (before trails were shared: the workspace trail's head) is kept under."""
    return trail_tag(model, target, channel)


def move_channel_tag(remote: ChannelMirror, pinned: str, model: str, target: str, channel: str) -> str:
    """Point the registry's channel tag `<model>.<target>.<channel>` at `pinned` (what deploy hosts pull)."""
    tag = channel_tag(model, target, channel)
    remote.point_tag(pinned, tag)
    return tag


def _move_registry_tag(home: Path, pointer: ChannelPointer, settings: Settings) -> None:
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.remote import is_remote_url, open_remote_for_ref

    if pointer.ref and is_remote_url(pointer.ref):
        move_channel_tag(open_remote_for_ref(pointer.ref, settings, weight_file_rule()), pointer.ref, pointer.model, pointer.target, pointer.channel)


# --------------------------------------------------------------------------- shared channels


def open_shared_remote(shared: SharedChannel, settings: Settings) -> RemoteCache:
    """The registry a shared channel's trail lives in (its `source.json` names it)."""
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.remote import open_remote

    source = shared.source()
    if source is None:
        raise IntegrityError(f"{shared.source_path}: missing; cannot tell which registry keeps the trail of {shared.label}",
                             path=str(shared.source_path), fix="restore it, or remove the channel's trail folder and promote again")
    return open_remote(source.remote, settings, weight_file_rule())


def shared_standing(shared: SharedChannel, settings: Settings, key: ReleaseKey | None) -> Standing:
    """`standing` against the registry the channel's source names (an unreachable registry is a problem)."""
    try:
        remote = open_shared_remote(shared, settings)
    except TrtpipeError as err:
        return standing(shared, None, key, fetch_error=err.one_line())
    return standing(shared, remote, key)


def channel_tag_names(remote: RemoteCache, cid: ChannelId) -> str | None:
    """The artifact digest the registry's channel tag names now (None: no such tag)."""
    try:
        return remote.describe(f"{remote.url}:{channel_tag(*cid)}").artifact_digest
    except NotFound:
        return None


def channel_tag_problem(remote: RemoteCache, cid: ChannelId, pointer: ChannelPointer | None) -> str | None:
    """Why the registry's channel tag does not name what the channel's trail says (None: it does)."""
    from trtpipe.store.remote import is_remote_url

    if pointer is None or not pointer.ref or not is_remote_url(pointer.ref):
        return None
    tag = channel_tag(*cid)
    try:
        named = channel_tag_names(remote, cid)
    except TrtpipeError as err:
        return f"{remote.url}:{tag}: the channel tag could not be read ({err.one_line()})"
    if named == pointer.digest:
        return None
    return (f"{remote.url}:{tag}: the channel tag names {named or 'nothing'}, the channel's trail says {pointer.digest} "
            "(a move interrupted before the tag moved, or the tag moved outside trtpipe; the next promote or rollback "
            "of the channel moves it back)")


def project_pointer(home: Path, shared: SharedChannel) -> ChannelPointer | None:
    """Write the channel's pointer file as its adopted trail replays (removed when the trail names nothing)."""
    state = replay(shared.local_records()).pointers.get(shared.cid)
    store = ChannelStore(home)
    if state is None:
        store.path(ChannelScope(model=shared.model, target=shared.target), shared.channel).unlink(missing_ok=True)
    else:
        store.write(state)
    return state


def settle_shared(home: Path, shared: SharedChannel, found: Standing, remote: RemoteCache, *, who: str,
                  key: ReleaseKey | None, settings: Settings, strict: bool = True) -> ChannelPointer | None:
    """Catch up with the registry (the caller holds the release lock; `found` is consistent): adopt its copy,
    write the pointer it replays to, and move the channel tag back where the trail says if it is elsewhere
    (recorded `repair` in the workspace trail). A pointer file that no prefix of the adopted trail explains
    was written by hand: refused (recorded `refused`); with `strict` False (a listing) left alone, unrecorded,
    for `trail_verdict` to report, and the channel tag is not moved. Returns the channel's pointer."""
    from trtpipe.release.shared_trail import adopt

    store = ChannelStore(home)
    scope = ChannelScope(model=shared.model, target=shared.target)
    if shared.source() is None:
        # First adoption: the pointer file (if any) is the workspace trail's; it must agree with that first.
        if not strict:
            return store.get(scope, shared.channel)
        reconcile(home, scope, shared.channel, who=who, key=key, settings=settings)
    else:
        pointer = store.get(scope, shared.channel)
        states = replay_prefixes(shared.local_records(), shared.cid)
        if not any(same_pointer(pointer, s) for s in states):
            if not strict:
                return pointer
            disagreement = Disagreement(shared.cid, pointer, states[-1], False, trail_path=str(shared.log.path))
            append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=shared.channel, model=shared.model,
                         target=shared.target, from_digest=pointer.digest if pointer else None, to_digest=None,
                         detail="channel pointer disagrees with the channel's trail: " + disagreement.line(home))
            raise IntegrityError(f"{disagreement.line(home)}; nothing changed", path=str(store.path(scope, shared.channel)),
                                 fix="remove the pointer file: it is written again from the channel's trail")
    adopt(shared, found, remote.url)
    state = project_pointer(home, shared) if found.registry is not None and not found.registry.legacy else store.get(scope, shared.channel)
    from trtpipe.store.remote import is_remote_url

    if strict and state is not None and state.ref and is_remote_url(state.ref) and found.state not in ("legacy", "new"):
        named = channel_tag_names(remote, shared.cid)
        if named != state.digest:
            move_channel_tag(remote, state.ref, *shared.cid)
            append_audit(home, key=key, at=now_iso(), who=who, action="repair", channel=shared.channel, model=shared.model,
                         target=shared.target, from_digest=named, to_digest=state.digest, ref=state.ref,
                         detail=f"moved the registry's channel tag {channel_tag(*shared.cid)} back to what the channel's "
                                "trail says (a move interrupted before the tag moved, or the tag moved outside trtpipe)")
    return state


# --------------------------------------------------------------------------- the verdict


@dataclass
class TrailVerdict:
    """Everything that is wrong with this workspace's trails (empty `problems`: intact), what is merely
    worth saying (`notes`: a shared channel this workspace is behind on), and each shared channel's standing."""

    problems: list[str]
    notes: list[str]
    standings: list[Standing]


def trail_verdict(home: Path, key: ReleaseKey | None = None, settings: Settings | None = None, *,
                  registry: bool = False) -> TrailVerdict:
    """The one judgement `channels --verify` and the release page render: the workspace trail's chain and
    anchored head (signed, with a key), every pointer against its trail's last word, and (`registry`) every
    shared channel's trail against the registry's copy and the channel tag against the trail, and the
    head-only copies of channels not shared yet (kept by trtpipe before trails were shared). `settings`: the
    caller's, which reach the registry (required with `registry`; unused without it)."""
    from trtpipe.release.audit import verify_audit

    if registry and settings is None:
        raise TypeError("trail_verdict(registry=True) needs the caller's settings (the registry's credentials)")

    problems = verify_audit(home, key)
    notes: list[str] = []
    standings: list[Standing] = []
    try:
        for shared in shared_channels(home):
            if registry:
                try:
                    remote: RemoteCache | None = open_shared_remote(shared, settings)  # type: ignore[arg-type]
                    found = standing(shared, remote, key)
                except TrtpipeError as err:
                    remote, found = None, standing(shared, None, key, fetch_error=err.one_line())
                if remote is not None and found.consistent and found.registry is not None and not found.registry.legacy:
                    state = replay(found.records()).pointers.get(shared.cid)
                    problem = channel_tag_problem(remote, shared.cid, state)
                    if problem:
                        found.problems.append(problem)
            else:
                found = Standing(shared, "unchecked", [p for p in shared.log.verify(key) if "are not anchored" not in p],
                                 shared.log.scan().records)
            standings.append(found)
            problems.extend(found.problems)
            if found.note:
                notes.append(found.note)
        problems.extend(d.line(home) for d in disagreements(home))
        if registry:
            problems.extend(_legacy_problems(home, key, settings, {s.shared.cid for s in standings}, notes))  # type: ignore[arg-type]
    except IntegrityError as err:
        problems.append(err.one_line())
    return TrailVerdict(problems, notes, standings)


def verify_trail(home: Path, key: ReleaseKey | None = None, settings: Settings | None = None, *,
                 registry: bool = False) -> list[str]:
    """The problems `trail_verdict` finds (empty: intact)."""
    return trail_verdict(home, key, settings, registry=registry).problems


def _legacy_problems(home: Path, key: ReleaseKey | None, settings: Settings, shared: set[ChannelId],
                     notes: list[str]) -> list[str]:
    """Channels promoted through a registry before trails were shared (no adopted trail here): the workspace
    trail against the head-only copy the registry keeps for each. A channel whose tag now holds a shared
    trail is adopted by this workspace's next promote (a note, not a problem)."""
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.remote import is_remote_url, open_remote_for_ref

    log = trail_log(home)
    seen: dict[tuple[str, str], ChannelPointer] = {}
    for pointer in [*ChannelStore(home).all(), *replay(read_audit(home)).pointers.values()]:
        if (pointer.model, pointer.target, pointer.channel) in shared:
            continue
        if pointer.ref and is_remote_url(pointer.ref):
            seen.setdefault((pointer.ref.split("@")[0], trail_tag(pointer.model, pointer.target, pointer.channel)), pointer)
    problems: list[str] = []
    for (base, tag), pointer in sorted(seen.items()):
        where = f"in the registry ({base}:{tag})"
        try:
            copy = open_remote_for_ref(pointer.ref or "", settings, weight_file_rule()).get_channel_trail(tag)
        except TrtpipeError as err:
            problems.append(f"{base}:{tag}: the registry's copy of the trail could not be read ({err.one_line()})")
            continue
        if copy is None:
            problems.append(f"{base}:{tag}: the registry holds no copy of the trail for a channel it tags")
            continue
        if copy.log is not None:
            notes.append(f"{base}:{tag}: the channel is shared through the registry now; this workspace adopts its "
                         "trail at its next promote of it")
            continue
        try:
            head = json.loads(copy.head)
        except ValueError:
            head = {}
        problems.extend(log.check_copy(head if isinstance(head, dict) else {}, where, key))
    return problems


def channel_records(home: Path, channel: str | None = None) -> list[tuple[str, AuditRecord]]:
    """Every record about channels, oldest first, with the trail it is in: the workspace trail's ("workspace")
    and each shared channel's adopted trail (its registry tag)."""
    out = [("workspace", r) for r in read_audit(home, channel=channel)]
    for shared in shared_channels(home):
        if channel is None or shared.channel == channel:
            out.extend((shared.tag, r) for r in shared.local_records())
    return sorted(out, key=lambda item: item[1].at)
