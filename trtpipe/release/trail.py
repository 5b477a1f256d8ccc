"""The trail is the truth: channels are what replaying the audit trail gives, and nothing else.

Promotion and rollback append their record (fsynced) and write no pointer: every read of the channels
replays the trails (`trtpipe.release.projection`, whose state file `channels/state.json` is rebuilt
whenever it is not that replay), so no pointer can stand anywhere the trail did not put it. A crash
after the record leaves at most a registry tag behind its record: the next promote or rollback of a
shared channel moves it back (recorded `repair`), and `channels --verify` reports it meanwhile.

A channel promoted through a registry is shared: its trail is the registry's copy
(`trtpipe.release.shared_trail`), this workspace's adopted copy of it is what the channel is replayed
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
from trtpipe.release.channels import ChannelPointer, ChannelStore, now_iso
from trtpipe.release.projection import MOVES, ChannelId, Replayed, apply, replay
from trtpipe.release.shared_trail import SharedChannel, Standing, channel_tag, shared_channels, standing, trail_tag
from trtpipe.settings import Settings
from trtpipe.signing_keys import ReleaseKey
from trtpipe.store.remote import ChannelMirror, RemoteCache

__all__ = ["MOVES", "ChannelId", "Replayed", "TrailVerdict", "adopt_trail", "apply", "channel_records", "move_channel_tag",
           "replay", "same_pointer", "settle_shared", "trail_verdict", "verify_trail"]


def same_pointer(a: ChannelPointer | None, b: ChannelPointer | None) -> bool:
    """Whether two pointers name the same digest with the same rollback history."""
    if a is None or b is None:
        return a is b
    return a.digest == b.digest and [h.digest for h in a.history] == [h.digest for h in b.history]


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


def settle_shared(home: Path, shared: SharedChannel, found: Standing, remote: RemoteCache, *, who: str,
                  key: ReleaseKey | None, settings: Settings, strict: bool = True) -> ChannelPointer | None:
    """Catch up with the registry (the caller holds the release lock; `found` is consistent): adopt its copy
    (the channel is then what it replays to) and move the channel tag back where the trail says if it is
    elsewhere (recorded `repair` in the workspace trail; with `strict` False, a listing, the tag is left for
    `trail_verdict` to report). Returns the channel's pointer."""
    from trtpipe.release.shared_trail import adopt
    from trtpipe.store.remote import is_remote_url

    adopt(shared, found, remote.url)
    state = next((p for p in ChannelStore(home).all() if (p.model, p.target, p.channel) == shared.cid), None)
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
    anchored head (signed, with a key), the adopted copy of every shared channel's trail, and (`registry`) every
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
