"""The trail is the truth: kills at every step of promote, a damaged trail, a torn line, a channel state
file edited by hand, and results that are evidence (hand-recorded, appended or truncated result logs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.chained import record_hash
from trtpipe.release.audit import audit_path, read_audit
from trtpipe.release.channels import ChannelScope, ChannelStore
from trtpipe.release.projection import state_path
from trtpipe.release.trail import verify_trail
from trtpipe.signing_keys import release_key
from trtpipe.results import ResultsLog
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)

SCOPE = ChannelScope(model="tiny-llama", target="cpu-reference")

# Runs the CLI with os.write/fsync/replace/ftruncate counted; at call number N the process SIGKILLs
# itself just before the call (a write of more than one byte is first done by half: a torn line).
KILLER = r"""
import os, signal, sys
target = int(sys.argv[1]); seen = [0]
def wrap(name):
    real = getattr(os, name)
    def counted(*args, **kwargs):
        seen[0] += 1
        if seen[0] == target:
            if name == "write" and len(args[1]) > 1:
                real(args[0], bytes(args[1])[: len(args[1]) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(os, name, counted)
for name in ("write", "fsync", "replace", "ftruncate"):
    wrap(name)
from trtpipe.cli import main
sys.exit(main(sys.argv[2:]))
"""


def pointer(home: Path, channel: str = "prod") -> str | None:
    found = ChannelStore(home).get(SCOPE, channel)
    return found.digest if found else None


def two_tested(home: Path, store_entry) -> tuple:
    a = store_entry(home, "a1" * 8, seed="a")
    b = store_entry(home, "b2" * 8, seed="b")
    for entry in (a, b):  # signed with the release key when one is set, as a smoke run records
        ResultsLog(home, release_key(Settings.from_env())).record(entry.digest, "smoke", True, {"checks": 6})
    return a, b


def test_sigkill_at_every_step_of_promote_never_parts_a_channel_from_its_record(isolated_home, store_entry, cli, tmp_path) -> None:
    a, b = two_tested(isolated_home, store_entry)
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    base = tmp_path / "base"
    shutil.copytree(isolated_home, base, symlinks=True)
    outcomes = []
    for step in range(1, 80):
        home = tmp_path / f"kill-{step}"
        shutil.copytree(base, home, symlinks=True)
        env = {**os.environ, "TRTPIPE_HOME": str(home)}
        proc = subprocess.run([sys.executable, "-c", KILLER, str(step), "promote", b.digest, "--to", "prod"],
                              env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode != -9:
            assert proc.returncode == 0, proc.stderr
            break
        moved = pointer(home) == b.digest
        recorded = [r for r in read_audit(home) if r.action == "promote" and r.to_digest == b.digest]
        problems = verify_trail(home)
        # The record is the move: the channel has moved exactly when its record is in the trail.
        assert moved == bool(recorded), step
        outcomes.append((step, moved, bool(recorded), bool(problems)))
        # The next promote redoes the move if it has no record, else finds it done: one promote record.
        code, _, err = cli("promote", b.digest, "--to", "prod", "--store", str(home))
        assert code == 0, (step, err)
        assert pointer(home) == b.digest
        assert len([r for r in read_audit(home) if r.action == "promote" and r.to_digest == b.digest]) == 1, step
        # A record whose head the kill cut off stays unanchored until the trail's next append mends it (as any
        # interrupted append does; a promote finding the move done appends nothing) ...
        after = verify_trail(home)
        assert all("are not anchored by the head" in p for p in after) and (not after or recorded), (step, after)
        # ... which the next move does.
        assert cli("promote", a.digest, "--to", "dev", "--store", str(home))[0] == 0
        assert verify_trail(home) == [], (step, verify_trail(home))
    else:
        pytest.fail("promote never completed")
    print("kill steps:", outcomes)
    assert len(outcomes) >= 4  # the record's write and fsync, the head, the state file at least
    # Some kills land before the record (nothing happened), some after it (the channel has moved, whatever the
    # state file says: the next read rebuilds it).
    assert any(not rec for _, _, rec, _ in outcomes) and any(rec and moved for _, moved, rec, _ in outcomes)


def _rehash(lines: list[str], start: int, edit) -> list[str]:
    """Edit record `start` (0-based) and re-hash the chain from there on, as an attacker would."""
    records = [json.loads(line) for line in lines]
    edit(records[start])
    for i in range(start, len(records)):
        records[i]["prev_hash"] = records[i - 1]["hash"] if i else records[i]["prev_hash"]
        records[i]["hash"] = record_hash(records[i])
    return [json.dumps(r, sort_keys=True) for r in records]


def _history(home: Path, store_entry, cli) -> None:
    a, b = two_tested(home, store_entry)
    for ref, channel in ((a.digest, "dev"), (a.digest, "prod"), (b.digest, "prod")):
        assert cli("promote", ref, "--to", channel)[0] == 0


@pytest.mark.parametrize("damage", ["shorten", "empty", "delete", "rehash"])
def test_a_damaged_trail_is_detected_without_a_key(isolated_home, store_entry, cli, damage) -> None:
    _history(isolated_home, store_entry, cli)
    path = audit_path(isolated_home)
    lines = path.read_text().splitlines()
    if damage == "shorten":
        path.write_text("\n".join(lines[:-1]) + "\n")
    elif damage == "empty":
        path.write_text("")
    elif damage == "delete":
        path.unlink()
    else:
        path.write_text("\n".join(_rehash(lines, 1, lambda r: r.update(who="someone-else"))) + "\n")
    problems = verify_trail(isolated_home)
    expected = {"shorten": "shortened", "empty": "emptied or deleted", "delete": "emptied or deleted", "rehash": "rewritten"}[damage]
    assert any(expected in p for p in problems), problems
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "BROKEN" in out and expected in out
    # Nothing is appended onto a damaged trail: promotion refuses before any pointer moves.
    before = pointer(isolated_home)
    entry = store_entry(isolated_home, "c3" * 8, seed="c")
    ResultsLog(isolated_home).record(entry.digest, "smoke", True, {})
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "nothing" in err and len(err.strip().splitlines()) == 1
    assert pointer(isolated_home) == before


def test_without_a_key_a_consistent_rewrite_of_trail_and_head_passes_with_a_key_it_does_not(
        isolated_home, store_entry, cli, tmp_path, monkeypatch) -> None:
    from trtpipe.signing_keys import generate_key, write_key_pair

    key = generate_key()
    write_key_pair(key, tmp_path / "release.key", tmp_path / "release.pub")
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))
    _history(isolated_home, store_entry, cli)
    head_path = audit_path(isolated_home).with_name("audit.head.json")
    head = json.loads(head_path.read_text())
    assert head["key_id"] == key.key_id and head["signature"]
    signed = release_key(Settings.from_env())
    assert verify_trail(isolated_home, signed) == []
    # Rewrite who promoted to dev and re-hash the rest, then rewrite the head to match (no key needed).
    path = audit_path(isolated_home)
    lines = _rehash(path.read_text().splitlines(), 0, lambda r: r.update(who="someone-else"))
    path.write_text("\n".join(lines) + "\n")
    head.update(hash=json.loads(lines[-1])["hash"])
    head_path.write_text(json.dumps(head))
    # Without the key the workspace's high-water mark (outside audit/) still remembers the record rewritten...
    assert any("rewritten" in p and "high-water mark" in p for p in verify_trail(isolated_home))
    # ...and whoever can write the whole workspace removes it too. The channels are the trail's projection: they
    # follow the rewrite (dev now says someone-else set it), so nothing else here remembers the record.
    shutil.rmtree(isolated_home / "marks")
    assert ChannelStore(isolated_home).get(SCOPE, "dev").set_by == "someone-else"
    assert verify_trail(isolated_home) == []  # without the key: undetectable (the documented limit)
    assert any("signature does not verify" in p for p in verify_trail(isolated_home, signed))
    code, out, _ = cli("channels", "--verify", "--public-key", str(tmp_path / "release.pub"))
    assert code == 1 and "signature does not verify" in out
    # Dropping the signature instead is no way out either.
    head.update(signature=None, key_id=None)
    head_path.write_text(json.dumps(head))
    assert any("not signed" in p for p in verify_trail(isolated_home, signed))
    # Deleting trail and head leaves no log to check (a fresh workspace looks the same): the high-water mark
    # (kept again by the verify that found the trail intact) remembers what the trail held; the channels,
    # the trail's projection, are gone with it.
    path.unlink()
    head_path.unlink()
    problems = verify_trail(isolated_home, signed)
    assert len(problems) == 1 and "cut back: it holds 0 records" in problems[0], problems
    assert ChannelStore(isolated_home).all() == []
    shutil.rmtree(isolated_home / "marks")
    assert verify_trail(isolated_home, signed) == []  # trail, head and mark all gone: a fresh workspace


@pytest.mark.parametrize("whole", [False, True])
def test_a_torn_last_line_is_repaired_and_recorded(isolated_home, store_entry, cli, whole) -> None:
    a, b = two_tested(isolated_home, store_entry)
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    path = audit_path(isolated_home)
    last = path.read_text().splitlines()[-1]
    if whole:  # a whole record without its newline: as if the promote's write lacked only "\n"
        records = [json.loads(x) for x in path.read_text().splitlines()]
        extra = {**records[-1], "seq": records[-1]["seq"] + 1, "prev_hash": records[-1]["hash"], "action": "refused",
                 "to_digest": b.digest, "detail": "torn test"}
        extra["hash"] = record_hash(extra)
        torn = json.dumps(extra, sort_keys=True)
    else:
        torn = last[: len(last) // 2]
    with path.open("a") as handle:
        handle.write(torn)
    assert any("incomplete" in p for p in verify_trail(isolated_home))
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 0, err
    assert pointer(isolated_home) == b.digest
    repairs = [r for r in read_audit(isolated_home) if r.action == "repair"]
    # A whole record is kept (and then anchored, as the head did not cover it); a torn one is cut off.
    kinds = [(r.detail or "").split(":")[0] for r in repairs]
    assert kinds == (["trail completed", "trail anchored"] if whole else ["trail dropped"]), kinds
    assert verify_trail(isolated_home) == []


def test_a_state_file_naming_a_digest_the_trail_never_set_is_rebuilt_and_moves_go_on(isolated_home, store_entry,
                                                                                     cli) -> None:
    a, b = two_tested(isolated_home, store_entry)
    never = store_entry(isolated_home, "d4" * 8, seed="d")
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    path = state_path(isolated_home)
    doc = json.loads(path.read_text())
    doc["channels"][0]["digest"] = never.digest
    path.write_text(json.dumps(doc))
    code, out, _ = cli("channels", "--verify")
    assert code == 0 and never.digest not in out and a.digest in out and "audit chain: intact" in out
    assert never.digest not in path.read_text()  # rebuilt from the trail
    path.write_text(json.dumps(doc))
    code, out, err = cli("promote", b.digest, "--to", "prod", "--json")
    assert code == 0 and json.loads(out)["from_digest"] == a.digest, err
    assert pointer(isolated_home) == b.digest
    code, _, err = cli("rollback", "prod")
    assert code == 0, err
    assert pointer(isolated_home) == a.digest and [r.action for r in read_audit(isolated_home)] == ["promote", "promote",
                                                                                                    "rollback"]


def test_hand_recorded_results_count_only_where_the_policy_allows_and_then_as_forced(
        isolated_home, store_entry, cli, tmp_path, monkeypatch) -> None:
    entry = store_entry(isolated_home, "e5" * 8, seed="e")
    code, out, _ = cli("results", "record", entry.digest, "--kind", "smoke", "--passed")
    assert code == 0 and "hand-recorded" in out
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "smoke missing" in err and "hand-recorded results do not count" in err
    policy = tmp_path / "policy.yaml"
    policy.write_text("default:\n  require_signature: false\nchannels:\n  dev:\n    require_signature: false\n"
                      "    allow_hand_recorded: true\n")
    monkeypatch.setenv("TRTPIPE_POLICY", str(policy))
    assert cli("promote", entry.digest, "--to", "prod")[0] == 1  # prod does not allow it
    code, out, err = cli("promote", entry.digest, "--to", "dev", "--json")
    assert code == 0, err
    assert json.loads(out)["action"] == "force-promote"
    last = read_audit(isolated_home)[-1]
    assert last.action == "force-promote" and "hand-recorded" in (last.reason or "")
    # A hand-recorded bench turns one "bench missing" into per-SLO gates: each one it alone satisfied is named.
    gates = {"dev": {"smoke": True, "bench": {"ttft_p99_ms": 200}}}
    benched = store_entry(isolated_home, "e6" * 8, seed="g", gates=gates)
    ResultsLog(isolated_home).record(benched.digest, "smoke", True, {})
    for _ in range(3):  # the fewest runs a bench gate judges
        assert cli("results", "record", benched.digest, "--kind", "bench", "--passed", "--gpu-class", "cpu-reference",
                   "--data", '{"ttft_p99_ms": 150}')[0] == 0
    code, out, err = cli("promote", benched.digest, "--to", "dev", "--json")
    assert code == 0, err
    assert json.loads(out)["action"] == "force-promote"
    assert read_audit(isolated_home)[-1].reason.startswith("gates bench.ttft_p99_ms passed only on hand-recorded")


def test_result_logs_appended_or_truncated_by_hand_are_refused(isolated_home, store_entry, cli) -> None:
    entry = store_entry(isolated_home, "f6" * 8, seed="f")
    log = ResultsLog(isolated_home)
    log.record(entry.digest, "smoke", True, {})
    log.record(entry.digest, "smoke", False, {"error": "model not ready"})
    path = isolated_home / "results" / (entry.digest.removeprefix("sha256:") + ".jsonl")
    original = path.read_text()
    # A forged pass appended with a correct chain: the head does not anchor it.
    last = json.loads(original.splitlines()[-1])
    forged = {**last, "passed": True, "seq": last["seq"] + 1, "prev_hash": last["hash"]}
    forged["hash"] = record_hash(forged)
    path.write_text(original + json.dumps(forged) + "\n")
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and path.name in err and "not anchored" in err and len(err.strip().splitlines()) == 1
    assert read_audit(isolated_home)[-1].action == "refused"
    # Dropping the failed line (so the earlier pass would be the latest): shortened.
    path.write_text(original.splitlines()[0] + "\n")
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "shortened" in err and path.name in err
    path.write_text(original)
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "smoke failed" in err  # intact again: the recorded failure stands
