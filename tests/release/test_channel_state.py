"""Channels are a projection of the trail (issue 24): one state file stamped with the trail heads, rebuilt
whenever it is not what the trail says, so a pointer cannot disagree with the trail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.release.audit import append_audit, read_audit
from trtpipe.release.channels import now_iso
from trtpipe.release.projection import (ChannelState, TrailHead, build_state, current_state, read_state, read_trails,
                                        stamp_of, state_path, write_state)
from trtpipe.release.shared_trail import SharedChannel, TrailSource

MODEL, TARGET = "tiny-llama", "cpu-reference"
A, B, C = ("sha256:" + c * 64 for c in "abc")


def move(home: Path, action: str, to: str | None, **extra) -> None:
    append_audit(home, at=now_iso(), who="tester", action=action, channel=extra.pop("channel", "prod"), model=MODEL,
                 target=TARGET, from_digest=None, to_digest=to, **extra)


def saved(home: Path) -> list[ChannelState]:
    """current_state with a save that writes the file, returning what it was handed."""
    out: list[ChannelState] = []

    def save(state: ChannelState) -> None:
        out.append(state)
        write_state(state_path(home), state)

    current_state(home, save)
    return out


def digests(state: ChannelState) -> dict[str, tuple[str, list[str]]]:
    return {p.channel: (p.digest, [h.digest for h in p.history]) for p in state.channels}


def test_the_state_is_the_replay_stamped_with_the_trail_head(tmp_path: Path) -> None:
    move(tmp_path, "promote", A)
    move(tmp_path, "promote", B)
    move(tmp_path, "promote", C, channel="dev")
    (written,) = saved(tmp_path)
    assert digests(written) == {"prod": (B, [A]), "dev": (C, [])}
    last = read_audit(tmp_path)[-1]
    assert written.heads == {"workspace": TrailHead(records=3, hash=last.hash)}
    on_disk = json.loads(state_path(tmp_path).read_text())
    assert on_disk["stamp"] == stamp_of(written.heads, written.channels) and on_disk["heads"]["workspace"]["hash"] == last.hash
    assert saved(tmp_path) == []  # fresh: nothing to rebuild


def test_a_state_stamped_with_an_older_head_is_rebuilt_on_read(tmp_path: Path) -> None:
    move(tmp_path, "promote", A)
    saved(tmp_path)
    old = read_state(state_path(tmp_path))
    move(tmp_path, "promote", B)  # the trail moves on; nothing writes the state file
    assert read_state(state_path(tmp_path)) == old
    (rebuilt,) = saved(tmp_path)
    assert digests(rebuilt) == {"prod": (B, [A])}
    assert rebuilt.heads["workspace"].records == 2 and read_state(state_path(tmp_path)) == rebuilt
    move(tmp_path, "rollback", A)
    (rolled,) = saved(tmp_path)
    assert digests(rolled) == {"prod": (A, [])}


@pytest.mark.parametrize("recompute_stamp", [False, True])
def test_a_state_file_edited_by_hand_is_rebuilt_even_with_its_stamp_recomputed(tmp_path: Path, recompute_stamp: bool) -> None:
    move(tmp_path, "promote", A)
    saved(tmp_path)
    path = state_path(tmp_path)
    doc = json.loads(path.read_text())
    doc["channels"][0]["digest"] = C
    if recompute_stamp:
        edited = ChannelState.model_validate(doc)
        doc["stamp"] = stamp_of(edited.heads, edited.channels)
    path.write_text(json.dumps(doc))
    # Without the recomputed stamp the file does not even read as a state file; with it, it reads, but a read
    # never believes it over the trail.
    assert (read_state(path) is not None) == recompute_stamp
    (rebuilt,) = saved(tmp_path)
    assert digests(rebuilt) == {"prod": (A, [])} and digests(read_state(path)) == {"prod": (A, [])}


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "other-format", "a-folder"])
def test_a_missing_or_unreadable_state_file_is_rebuilt(tmp_path: Path, damage: str) -> None:
    move(tmp_path, "promote", A)
    move(tmp_path, "promote", B)
    saved(tmp_path)
    path = state_path(tmp_path)
    text = path.read_text()
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"\x8b\x00garbage{")
    elif damage == "truncated":
        path.write_text(text[:40])
    elif damage == "other-format":
        path.write_text(text.replace("trtpipe-channel-state/1", "trtpipe-channel-state/0"))
    else:
        path.unlink()
        path.mkdir()
    assert read_state(path) is None
    states: list[ChannelState] = []
    state = current_state(tmp_path, states.append)
    assert digests(state) == {"prod": (B, [A])} and states == [state]


def test_an_aborted_move_is_undone_in_the_projection(tmp_path: Path) -> None:
    move(tmp_path, "promote", A)
    move(tmp_path, "promote", B)
    seq = read_audit(tmp_path)[-1].seq
    move(tmp_path, "aborted", A, undoes=seq)
    assert digests(build_state(read_trails(tmp_path))) == {"prod": (A, [])}


def test_a_state_that_cannot_be_written_is_still_the_trails_and_the_next_read_writes_it(tmp_path: Path) -> None:
    move(tmp_path, "promote", A)
    saved(tmp_path)

    def full_disk(_state: ChannelState) -> None:
        raise OSError(28, "No space left on device")

    move(tmp_path, "promote", B)
    with pytest.raises(OSError):
        current_state(tmp_path, full_disk)
    assert digests(read_state(state_path(tmp_path))) == {"prod": (A, [])}  # the file stayed behind the trail
    (rebuilt,) = saved(tmp_path)
    assert digests(rebuilt) == {"prod": (B, [A])}


def test_an_empty_trail_projects_no_channels(tmp_path: Path) -> None:
    state = build_state(read_trails(tmp_path))
    assert state.channels == [] and state.heads["workspace"].records == 0


def test_a_shared_channel_is_what_its_adopted_trail_says_and_its_head_stamps_the_state(tmp_path: Path) -> None:
    move(tmp_path, "promote", A)  # the workspace trail's word on prod, from before prod was shared
    move(tmp_path, "promote", C, channel="dev")
    shared = SharedChannel(tmp_path, MODEL, TARGET, "prod")
    shared.log.path.parent.mkdir(parents=True)
    fields = dict(at=now_iso(), who="other-host", action="promote", channel="prod", model=MODEL, target=TARGET,
                  from_digest=None, to_digest=B, ref=None, gates=[], gates_source=None, reason=None, detail=None, undoes=None)
    shared.log.append(fields)
    shared.write_source(TrailSource(remote="oci://registry.example/models", tag=shared.tag))
    (state,) = saved(tmp_path)
    assert digests(state) == {"prod": (B, []), "dev": (C, [])}
    assert set(state.heads) == {"workspace", f"{MODEL}/{TARGET}/prod"}
    shared.log.append({**fields, "to_digest": C})  # adopting more of the shared trail moves the projection
    (rebuilt,) = saved(tmp_path)
    assert digests(rebuilt)["prod"] == (C, [B]) and rebuilt.heads[f"{MODEL}/{TARGET}/prod"].records == 2


def test_promote_and_rollback_on_a_full_disk_move_the_channel_and_the_next_read_rebuilds_the_state(
        isolated_home: Path, store_entry, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.release import projection
    from trtpipe.release.channels import ChannelScope, ChannelStore
    from trtpipe.results import ResultsLog

    entries = [store_entry(isolated_home, c * 16, seed=c) for c in "ab"]
    for entry in entries:
        ResultsLog(isolated_home).record(entry.digest, "smoke", True, {})
    a, b = (e.digest for e in entries)
    assert cli("promote", a, "--to", "prod")[0] == 0
    path = state_path(isolated_home)
    assert digests(read_state(path)) == {"prod": (a, [])}
    real_write = projection.write_text_atomically

    def full_disk(*_args, **_kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(projection, "write_text_atomically", full_disk)
    code, out, err = cli("promote", b, "--to", "prod", "--json")
    assert code == 0 and json.loads(out)["action"] == "promote", err
    assert digests(read_state(path)) == {"prod": (a, [])}  # the state write failed after the append
    scope = ChannelScope(model=MODEL, target=TARGET)
    assert ChannelStore(isolated_home).get(scope, "prod").digest == b  # still the trail's word
    monkeypatch.setattr(projection, "write_text_atomically", real_write)
    assert ChannelStore(isolated_home).get(scope, "prod").digest == b
    assert digests(read_state(path)) == {"prod": (b, [a])}  # rebuilt by the read
    monkeypatch.setattr(projection, "write_text_atomically", full_disk)
    code, _, err = cli("rollback", "prod")
    assert code == 0, err
    assert digests(read_state(path)) == {"prod": (b, [a])}
    monkeypatch.setattr(projection, "write_text_atomically", real_write)
    code, out, _ = cli("channels", "--json")
    assert code == 0 and [(c["channel"], c["digest"]) for c in json.loads(out)["channels"]] == [("prod", a)]
    assert digests(read_state(path)) == {"prod": (a, [])}


def test_a_legacy_pointer_file_is_ignored_the_trail_is_the_truth(tmp_path: Path) -> None:
    from trtpipe.release.channels import ChannelScope, ChannelStore

    move(tmp_path, "promote", A)
    legacy = tmp_path / "channels" / MODEL / TARGET / "prod.json"  # from before channels were the trail's projection
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"channel": "prod", "model": MODEL, "target": TARGET, "digest": C, "set_at": "t",
                                  "set_by": "old", "history": []}))
    store = ChannelStore(tmp_path)
    assert store.get(ChannelScope(model=MODEL, target=TARGET), "prod").digest == A
    assert store.pins() == {A: [f"{MODEL}/{TARGET}/prod"]}
    assert digests(read_state(state_path(tmp_path))) == {"prod": (A, [])}


def test_a_reader_writes_the_state_only_when_the_release_lock_is_free_and_the_holder_writes_it_when_done(
        tmp_path: Path) -> None:
    from trtpipe.release.channels import ChannelScope, ChannelStore

    scope = ChannelScope(model=MODEL, target=TARGET)
    move(tmp_path, "promote", A)
    writer, reader = ChannelStore(tmp_path), ChannelStore(tmp_path)
    with writer.lock():
        move(tmp_path, "promote", B)  # what a promotion appends under the lock
        assert reader.get(scope, "prod").digest == B  # the trail's word ...
        assert not state_path(tmp_path).exists()  # ... but the reader did not write while the lock was held
    assert digests(read_state(state_path(tmp_path))) == {"prod": (B, [A])}  # the holder wrote it, letting go
    move(tmp_path, "rollback", A)
    assert reader.get(scope, "prod").digest == A
    assert digests(read_state(state_path(tmp_path))) == {"prod": (A, [])}  # the lock was free: the reader wrote it
