"""A trail that cannot be laundered or rewound (issue 28, attacks 2 and 3), with the real CLI flows.

Laundering: without the key, a forged chained `promote prod` record is appended, `prod.json` moved to
it, and the head left unsigned (or left signed, or deleted); a keyed promote must refuse to extend that
trail (never "mend a lagging head" and sign the forgery in), and `channels --verify` must keep failing.
Rewinding: an older, genuinely signed trail and head put back (with the pointers) must be caught by the
high-water mark, with the private key and with the public key only. And what keeps working: an append
interrupted under the key (its signed pending head covers the record), a torn line under a head whose
signature covers the intact prefix, heads written before heads carried a sequence, and a trail kept
without a key until the key is set (adopted once, explicitly, with `channels --adopt-trail`).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from trtpipe.chained import canonical, chained_line
from trtpipe.release.audit import append_audit, audit_path, read_audit, trail_log
from trtpipe.release.channels import ChannelScope, ChannelStore, now_iso
from trtpipe.signing_keys import generate_key, sign_bytes, write_key_pair
from trtpipe.release.trail import verify_trail
from trtpipe.signing_keys import release_key
from trtpipe.results import ResultsLog
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)

SCOPE = ChannelScope(model="tiny-llama", target="cpu-reference")


@pytest.fixture
def keys(tmp_path, monkeypatch) -> dict[str, Path]:
    """The release key pair; TRTPIPE_SIGNING_KEY set to its private half."""
    key = generate_key()
    write_key_pair(key, tmp_path / "release.key", tmp_path / "release.pub")
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))
    return {"private": tmp_path / "release.key", "public": tmp_path / "release.pub"}


def smoked(home: Path, store_entry, name: str):
    entry = store_entry(home, name * 8, seed=name[0])
    ResultsLog(home, release_key(Settings.from_env())).record(entry.digest, "smoke", True, {"checks": 6})
    return entry


def prod(home: Path) -> str | None:
    found = ChannelStore(home).get(SCOPE, "prod")
    return found.digest if found else None


def head_path(home: Path) -> Path:
    return audit_path(home).with_name("audit.head.json")


def forge_promote(home: Path, digest: str, how: str) -> None:
    """What anyone who can write the workspace (not the key) does: a chained promote of `digest` to prod,
    the head left unsigned, left as it was, or deleted. (The channel follows by itself: it is the trail's projection.)"""
    fields = dict(at=now_iso(), who="mallory", action="promote", channel="prod", model=SCOPE.model, target=SCOPE.target,
                  from_digest=prod(home), to_digest=digest, gates=[{"gate": "smoke", "passed": True}])
    if how == "unsigned-head":
        append_audit(home, key=None, **fields)  # the library itself, as ten lines of an attacker's script would
    else:
        log = trail_log(home)
        records = log.scan().records
        body = {"ref": None, "gates_source": None, "reason": None, "detail": None, "undoes": None, **fields}
        _, line = chained_line(records, body)
        with log.path.open("ab") as handle:
            handle.write(line)
        if how == "head-deleted":
            log.head_path.unlink()


@pytest.mark.parametrize("how", ["unsigned-head", "head-left-signed", "head-deleted"])
def test_a_forged_promote_is_not_laundered_by_the_next_keyed_promote(isolated_home, store_entry, cli, keys,
                                                                     how) -> None:
    a, b = smoked(isolated_home, store_entry, "a1"), smoked(isolated_home, store_entry, "b2")
    untested = store_entry(isolated_home, "c3" * 8, seed="c")  # no gate ever passed for it
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    assert cli("channels", "--verify")[0] == 0
    forge_promote(isolated_home, untested.digest, how)
    assert prod(isolated_home) == untested.digest
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "BROKEN" in out, out
    records_before = audit_path(isolated_home).read_bytes()
    # The routine keyed promote refuses to extend the trail, in one line, saying what to do.
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "nothing was appended" in err and "channels --verify" in err and "trusted copy" in err, err
    assert audit_path(isolated_home).read_bytes() == records_before  # no `repair`, no new head: nothing signed in
    assert prod(isolated_home) == untested.digest
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "BROKEN" in out
    code, out, _ = cli("channels", "--verify", "--public-key", str(keys["public"]))
    assert code == 1 and "BROKEN" in out
    # Adopting is for a trail kept without a key, never a way past a head that anchors less than the log.
    if how == "head-left-signed":
        code, _, err = cli("channels", "--adopt-trail")
        assert code == 1 and "nothing was appended" in err, err
        assert audit_path(isolated_home).read_bytes() == records_before


def test_an_older_signed_trail_put_back_is_caught_with_the_key_and_the_public_key(isolated_home, store_entry, cli, keys,
                                                                                 tmp_path) -> None:
    a, b = smoked(isolated_home, store_entry, "a1"), smoked(isolated_home, store_entry, "b2")
    assert cli("promote", a.digest, "--to", "dev")[0] == 0
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    old = tmp_path / "old"
    for folder in ("audit", "channels"):
        shutil.copytree(isolated_home / folder, old / folder)
    assert cli("promote", b.digest, "--to", "prod")[0] == 0
    assert json.loads(head_path(isolated_home).read_text())["sequence"] == 3
    # Cut the trail back: the older trail, its genuinely signed head and the pointers, all put back.
    for folder in ("audit", "channels"):
        shutil.rmtree(isolated_home / folder)
        shutil.copytree(old / folder, isolated_home / folder)
    assert prod(isolated_home) == a.digest
    # The head verifies on its own (it is genuine): only the high-water mark shows it is not the newest.
    assert trail_log(isolated_home).read_head()["sequence"] == 2
    problems = verify_trail(isolated_home, release_key(Settings.from_env()))
    assert any("rewound" in p for p in problems) and any("cut back" in p for p in problems), problems
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "rewound" in out
    code, out, _ = cli("channels", "--verify", "--public-key", str(keys["public"]))
    assert code == 1 and "rewound" in out
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 1 and "nothing was appended" in err and len(err.strip().splitlines()) == 1, err
    # The documented limit: whoever can write the whole workspace removes the mark too.
    shutil.rmtree(isolated_home / "marks")
    assert verify_trail(isolated_home, release_key(Settings.from_env())) == []


def test_an_append_interrupted_under_the_key_is_mended_lines_without_the_key_are_not(
        isolated_home, store_entry, cli, keys, monkeypatch) -> None:
    import trtpipe.chained as chained

    a, b = smoked(isolated_home, store_entry, "a1"), smoked(isolated_home, store_entry, "b2")
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    real = chained.write_text_atomically
    head = head_path(isolated_home)

    def crash_at_the_head(path, text, **kwargs):
        if Path(path) == head:
            raise OSError("killed before the head was written")
        return real(path, text, **kwargs)

    monkeypatch.setattr(chained, "write_text_atomically", crash_at_the_head)
    with pytest.raises(OSError):
        append_audit(isolated_home, key=release_key(Settings.from_env()), at=now_iso(), who="release-tester",
                     action="refused", channel="prod", model=SCOPE.model, target=SCOPE.target, from_digest=None,
                     to_digest=b.digest, detail="interrupted")
    monkeypatch.setattr(chained, "write_text_atomically", real)
    pending = head.with_name("audit.pending.json")
    assert pending.exists()
    problems = verify_trail(isolated_home, release_key(Settings.from_env()))
    assert len(problems) == 1 and "signed pending head covers them" in problems[0], problems
    # Without the pending head (as lines appended without the key leave it), the same record is refused...
    saved = pending.read_bytes()
    pending.unlink()
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 1 and "no head signed by it covers them" in err, err
    # ...with it, the keyed promote mends it (recorded) and the trail verifies.
    pending.write_bytes(saved)
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 0, err
    assert [r.detail.split(":")[0] for r in read_audit(isolated_home) if r.action == "repair"] == ["trail anchored"]
    assert not pending.exists() and prod(isolated_home) == b.digest
    assert cli("channels", "--verify")[0] == 0


@pytest.mark.parametrize("torn", ["half-line", "forged-whole-record"])
def test_a_torn_line_is_mended_under_the_key_only_when_the_signed_head_covers_the_rest(
        isolated_home, store_entry, cli, keys, torn) -> None:
    a, b = smoked(isolated_home, store_entry, "a1"), smoked(isolated_home, store_entry, "b2")
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    path = audit_path(isolated_home)
    if torn == "half-line":
        last = path.read_text().splitlines()[-1]
        tail = last[: len(last) // 2]
    else:  # a whole chained record lacking only its newline, written without the key
        records = trail_log(isolated_home).scan().records
        body = {k: v for k, v in records[-1].items() if k not in ("seq", "prev_hash", "hash")}
        tail = chained_line(records, {**body, "who": "mallory", "to_digest": b.digest})[1].decode().rstrip("\n")
    with path.open("a") as handle:
        handle.write(tail)
    code, _, err = cli("promote", b.digest, "--to", "prod")
    if torn == "half-line":
        assert code == 0, err
        assert [r.detail.split(":")[0] for r in read_audit(isolated_home) if r.action == "repair"] == ["trail dropped"]
        assert cli("channels", "--verify")[0] == 0
    else:
        assert code == 1 and "no head signed by it covers them" in err and len(err.strip().splitlines()) == 1, err
        assert path.read_text().endswith(tail)  # not even the newline was added


def test_heads_written_before_sequences_still_verify_and_the_sequence_is_signed(isolated_home, store_entry, cli,
                                                                                keys) -> None:
    a, b = smoked(isolated_home, store_entry, "a1"), smoked(isolated_home, store_entry, "b2")
    assert cli("promote", a.digest, "--to", "dev")[0] == 0
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    path = head_path(isolated_home)
    head = json.loads(path.read_text())
    assert head["sequence"] == 2
    # Stripping the sequence from a signed head (to make an old head out of a new one) breaks its signature.
    path.write_text(json.dumps({k: v for k, v in head.items() if k != "sequence"}))
    assert any("signature does not verify" in p for p in verify_trail(isolated_home, release_key(Settings.from_env())))
    # A head exactly as an earlier version wrote it (no sequence, signed over log, records, hash), in a
    # workspace without a high-water mark yet: intact, and extended with the sequence after its record count.
    from trtpipe.signing_keys import load_signing_key

    private = load_signing_key(str(keys["private"]))
    old = {"log": head["log"], "records": head["records"], "hash": head["hash"], "key_id": private.key_id,
           "signature": base64.b64encode(sign_bytes(private, canonical(
               {"log": head["log"], "records": head["records"], "hash": head["hash"]}))).decode()}
    path.write_text(json.dumps(old, indent=2))
    shutil.rmtree(isolated_home / "marks")
    assert verify_trail(isolated_home, release_key(Settings.from_env())) == []
    assert cli("promote", b.digest, "--to", "prod")[0] == 0
    assert json.loads(path.read_text())["sequence"] == 3
    assert json.loads((isolated_home / "marks" / "audit.head.json").read_text())["sequence"] == 3
    assert cli("channels", "--verify", "--public-key", str(keys["public"]))[0] == 0


def test_a_trail_kept_without_a_key_is_adopted_once_explicitly(isolated_home, store_entry, cli, tmp_path,
                                                               monkeypatch) -> None:
    a = smoked(isolated_home, store_entry, "a1")
    assert cli("promote", a.digest, "--to", "prod")[0] == 0  # no key yet: an unsigned head
    code, _, err = cli("channels", "--adopt-trail")  # adopting signs: not without the key
    assert code != 0 and "release key is needed" in err and len(err.strip().splitlines()) == 1, err
    key = generate_key()
    write_key_pair(key, tmp_path / "release.key", tmp_path / "release.pub")
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))
    b = smoked(isolated_home, store_entry, "b2")  # its result log is signed from its first record
    code, _, err = cli("promote", b.digest, "--to", "prod")
    assert code == 1 and "is not signed" in err and "--adopt-trail" in err and len(err.strip().splitlines()) == 1, err
    assert cli("channels", "--verify")[0] == 1
    code, out, err = cli("channels", "--adopt-trail")
    assert code == 0 and "audit trail adopted" in out, (out, err)
    last = read_audit(isolated_home)[-1]
    assert last.action == "repair" and "adopted" in (last.detail or "")
    code, out, _ = cli("channels", "--adopt-trail", "--verify")
    assert code == 0 and "nothing to adopt" in out
    # (dev: prod's current artifact has only the unsigned results recorded before the key, which are not evidence now)
    code, _, err = cli("promote", b.digest, "--to", "dev")
    assert code == 0, err
    assert cli("channels", "--verify", "--public-key", str(tmp_path / "release.pub"))[0] == 0


def test_a_brand_new_workspace_with_the_key_signs_from_its_first_record(isolated_home, store_entry, cli, keys) -> None:
    a = smoked(isolated_home, store_entry, "a1")
    assert cli("promote", a.digest, "--to", "prod")[0] == 0
    head = json.loads(head_path(isolated_home).read_text())
    assert head["signature"] and head["sequence"] == 1 and head["records"] == 1
    assert cli("channels", "--verify", "--public-key", str(keys["public"]))[0] == 0


def test_an_older_signed_result_log_put_back_is_caught(isolated_home, store_entry, cli, keys, tmp_path) -> None:
    entry = store_entry(isolated_home, "d4" * 8, seed="d")
    results = ResultsLog(isolated_home, release_key(Settings.from_env()))
    results.record(entry.digest, "smoke", True, {"checks": 6})
    path = isolated_home / "results" / (entry.digest.removeprefix("sha256:") + ".jsonl")
    head = path.with_name(path.name.removesuffix(".jsonl") + ".head.json")
    passed = (path.read_bytes(), head.read_bytes())
    results.record(entry.digest, "smoke", False, {"error": "model not ready"})
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "smoke failed" in err and prod(isolated_home) is None, err
    # Put back the log and its genuinely signed head from before the failure: the earlier pass is the latest again.
    path.write_bytes(passed[0])
    head.write_bytes(passed[1])
    code, _, err = cli("promote", entry.digest, "--to", "prod")
    assert code == 1 and "rewound" in err and path.name in err and len(err.strip().splitlines()) == 1, err
    assert prod(isolated_home) is None


def test_a_trust_refusal_in_a_keyed_workspace_keeps_the_trail_signed(isolated_home, store_entry, cli, keys,
                                                                      tmp_path, monkeypatch) -> None:
    """A refusal (here: serve of an unsigned folder under a policy) is appended with the release key: written
    without it, its unsigned head would be tamper to the next keyed promote, which would then refuse."""
    a = smoked(isolated_home, store_entry, "a1")
    assert cli("promote", a.digest, "--to", "dev")[0] == 0
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys: {{release: {keys['public']}}}\ndefault: {{require_signature: true}}\n"
                      "channels:\n  prod: {require_signature: false}\n")
    monkeypatch.setenv("TRTPIPE_POLICY", str(policy))
    loose = tmp_path / "loose-repo"
    loose.mkdir()
    code, _, err = cli("serve", str(loose))
    assert code != 0 and "serve refused" in err, err
    (refused,) = [r for r in read_audit(isolated_home) if r.action == "refused"]
    assert refused.reason.startswith("serve refused")
    head = trail_log(isolated_home).read_head()
    assert head["key_id"] == release_key(Settings.from_env()).key_id and head["signature"]
    assert verify_trail(isolated_home, release_key(Settings.from_env())) == []
    code, _, err = cli("promote", a.digest, "--to", "prod")
    assert code == 0, err
    assert prod(isolated_home) == a.digest
