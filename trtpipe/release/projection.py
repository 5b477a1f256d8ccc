"""Channels are a projection of the trail: one state file, `<home>/channels/state.json`, stamped with the trail heads.

What every channel holds (its digest, ref, who set it and its rollback history) is what replaying the trails
gives: the workspace trail (`audit/audit.jsonl`), and for a channel shared through a registry the workspace's
adopted copy of that channel's trail (`trtpipe.release.shared_trail`), which replaces the workspace trail's
word on that channel. Nothing else is read: promote and rollback append to a trail and never write a pointer.

The state file is that replay, written down. It records the head of every trail it was replayed from (`heads`:
the record count and the last record's hash of each, from the very records replayed) and a `stamp`, the sha256
of the heads and the channels together, so whoever reads the file alone can tell what it was replayed from and
that it is whole. trtpipe itself never believes the file over the trails: every read replays them (to know the
file is fresh it must read each trail to its last record anyway) and, when the file is not exactly that replay
(a trail moved on, the file missing, unreadable, of another format, or edited by hand, with or without its stamp
recomputed), rebuilds it: written atomically (temp file + rename) by whoever holds the release lock, or by a
reader that finds the lock free. A write that fails (a full disk, a read-only home) loses nothing: the trail
append before it is the move, and the next read rebuilds the file. Two writers cannot corrupt it: each writes a
whole file stamped with the heads it was replayed at, and one older than the trails is rebuilt on the next read.

Homes from before the projection hold one pointer file per channel (`channels/<model>/<target>/<channel>.json`).
The trail was already the truth then (every pointer was written after its record), so those files are ignored:
nothing reads them, and they may be removed by hand.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.chained import GENESIS
from trtpipe.release.audit import AuditRecord, read_audit
from trtpipe.release.channels import ChannelPointer, PointerTarget

ChannelId = tuple[str, str, str]  # model, target, channel
MOVES = ("promote", "force-promote", "rollback")
WORKSPACE_TRAIL = "workspace"  # the key of the workspace trail's head in `heads` (a shared channel's: model/target/channel)
STATE_FORMAT = "trtpipe-channel-state/1"


# --------------------------------------------------------------------------- replay


@dataclass
class Replayed:
    """What a trail says of every channel: its pointer, and for each its last move and the state before."""

    pointers: dict[ChannelId, ChannelPointer]
    last_move: dict[ChannelId, AuditRecord]
    before_last_move: dict[ChannelId, ChannelPointer | None]


def _id(record: AuditRecord) -> ChannelId:
    return (record.model, record.target, record.channel)


def replay(records: list[AuditRecord]) -> Replayed:
    """Every channel's pointer as one trail's records (oldest first) leave it: each move applied, an
    `aborted` record undoing the move it names."""
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


# --------------------------------------------------------------------------- the state file


class TrailHead(BaseModel):
    """Where a trail stood when the state was replayed from it: how many records, and the last one's hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    records: int
    hash: str


class ChannelState(BaseModel):
    """The state file: every channel as the trails replay, the heads they were replayed at, and the stamp."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["trtpipe-channel-state/1"] = STATE_FORMAT
    heads: dict[str, TrailHead]
    channels: list[ChannelPointer]
    stamp: str


@dataclass(frozen=True)
class Trails:
    """The records every channel is replayed from: the workspace trail's, and each shared channel's adopted copy."""

    workspace: list[AuditRecord]
    shared: dict[ChannelId, list[AuditRecord]]

    def heads(self) -> dict[str, TrailHead]:
        out = {WORKSPACE_TRAIL: _head(self.workspace)}
        out.update({"/".join(cid): _head(records) for cid, records in sorted(self.shared.items())})
        return out

    def channels(self) -> list[ChannelPointer]:
        pointers = dict(replay(self.workspace).pointers)
        for cid, records in self.shared.items():  # a shared channel is what its own trail says, nothing else
            state = replay(records).pointers.get(cid)
            if state is None:
                pointers.pop(cid, None)
            else:
                pointers[cid] = state
        return [pointers[cid] for cid in sorted(pointers)]


def _head(records: list[AuditRecord]) -> TrailHead:
    return TrailHead(records=len(records), hash=records[-1].hash if records else GENESIS)


def read_trails(home: Path) -> Trails:
    """The workspace trail and every shared channel's adopted trail, as records (an edited, unreadable trail
    is an IntegrityError naming it: never "no channels")."""
    from trtpipe.release.shared_trail import shared_channels

    return Trails(read_audit(home), {s.cid: s.local_records() for s in shared_channels(home)})


def state_path(home: Path) -> Path:
    return Path(home) / "channels" / "state.json"


def stamp_of(heads: dict[str, TrailHead], channels: list[ChannelPointer]) -> str:
    """sha256 over the heads and the channels, canonical JSON: what a state file is checked against."""
    doc = {"heads": {k: v.model_dump(mode="json") for k, v in sorted(heads.items())},
           "channels": [c.model_dump(mode="json") for c in channels]}
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build_state(trails: Trails) -> ChannelState:
    heads, channels = trails.heads(), trails.channels()
    return ChannelState(heads=heads, channels=channels, stamp=stamp_of(heads, channels))


def read_state(path: Path) -> ChannelState | None:
    """The state file, or None when it is missing, unreadable, not a state file, or its stamp does not match
    its content (each of which a read answers by rebuilding it)."""
    try:
        state = ChannelState.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError):
        return None
    return state if state.stamp == stamp_of(state.heads, state.channels) else None


def write_state(path: Path, state: ChannelState) -> None:
    write_text_atomically(path, state.model_dump_json(indent=2) + "\n", mode=0o644)


def current_state(home: Path, save: Callable[[ChannelState], None]) -> ChannelState:
    """The channels as the trails say now. When the state file is not exactly that (its heads behind the
    trails', its stamp or content edited, missing, unreadable), the replay is handed to `save` (which writes
    it, or not). The state file is never believed over the trails: telling it is fresh means reading every
    trail to its last record anyway, and replaying what was read costs next to nothing beside that."""
    built = build_state(read_trails(home))
    if read_state(state_path(home)) != built:
        save(built)
    return built
