"""One trail per channel, many writers: two workspaces (a laptop and a CI runner) promote into one channel of
a real registry (Debian's docker-registry), alternately, and both see one consistent trail; the release page
and `channels --verify` agree in both; a hand rewrite of the registry's trail is caught by both (and, with the
release key, by a workspace that never saw the trail); lost compare-and-swap races are retried or refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from trtpipe.chained import head_bytes_of, head_document, record_hash
from trtpipe.release.channels import ChannelScope, ChannelStore
from trtpipe.release.shared_trail import SharedChannel
from trtpipe.signing_keys import release_key
from trtpipe.results import ResultsLog
from trtpipe.settings import Settings
from trtpipe.store import oci
from trtpipe.stages import weight_file_rule

pytestmark = pytest.mark.timeout(600)

MODEL, TARGET, CHANNEL = "tiny-llama", "cpu-reference", "prod"
TRAIL_TAG = f"trail.{MODEL}.{TARGET}.{CHANNEL}"
CHANNEL_TAG = f"{MODEL}.{TARGET}.{CHANNEL}"


class Workspace:
    """One workspace (its own TRTPIPE_HOME) driving the real CLI in-process as its own user."""

    def __init__(self, home: Path, user: str, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.home, self.user, self._cli, self._env = home, user, cli, monkeypatch
        home.mkdir(parents=True, exist_ok=True)

    def enter(self) -> None:
        """Make this workspace the one the environment names."""
        self._env.setenv("TRTPIPE_HOME", str(self.home))
        self._env.setenv("TRTPIPE_USER", self.user)

    def run(self, *args: str) -> tuple[int, str, str]:
        self.enter()
        return self._cli(*args)

    def verify(self) -> tuple[int, list[str]]:
        code, out, err = self.run("channels", "--verify", "--json")
        return code, json.loads(out)["audit_problems"]

    def page(self, out: Path) -> dict[str, Any]:
        code, text, err = self.run("report", "--out", str(out), "--json")
        assert code == 0, err
        return json.loads(text)

    def pointer(self) -> str | None:
        """What the channel names here: the replay of this workspace's adopted copy of its trail."""
        found = ChannelStore(self.home).get(ChannelScope(model=MODEL, target=TARGET), CHANNEL)
        return found.digest if found else None


@pytest.fixture
def two_workspaces(registry_env, store_entry, cli, tmp_path, monkeypatch):
    """A laptop and a CI runner, four artifacts pushed to the registry, each smoke-tested in both (results are
    per workspace: each records what it ran)."""
    laptop = Workspace(tmp_path / "laptop", "alice", cli, monkeypatch)
    runner = Workspace(tmp_path / "runner", "ci-runner", cli, monkeypatch)
    url = registry_env.url(f"shared/c{uuid.uuid4().hex[:12]}")  # a repository of its own: the registry is the session's
    refs: list[dict[str, Any]] = []
    for n, seed in enumerate("wxyz"):
        entry = store_entry(laptop.home, f"{n:x}e" * 8, seed=seed)
        code, out, err = laptop.run("cache", "push", entry.key, "--to", url, "--json")
        assert code == 0, err
        refs.append(json.loads(out))
        for workspace in (laptop, runner):  # signed with the release key when one is set, as a smoke run records
            ResultsLog(workspace.home, release_key(Settings.from_env())).record(entry.digest, "smoke", True, {"checks": 6})
    return laptop, runner, url, refs


@pytest.fixture
def signing_key(tmp_path, monkeypatch) -> Path:
    """The release key set for every workspace (before they record anything)."""
    import subprocess

    key = tmp_path / "release.key"
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True)
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(key))
    return key


def registry_trail(url: str) -> tuple[oci.TrailCopy, list[dict[str, Any]]]:
    copy = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule()).get_channel_trail(TRAIL_TAG)
    assert copy is not None and copy.log is not None
    return copy, [json.loads(line) for line in copy.log.decode().splitlines()]


def channel_tag_digest(url: str) -> str:
    return oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule()).describe(f"{url}:{CHANNEL_TAG}").artifact_digest


def rewrite_record(url: str, number: int, **changes: Any) -> None:
    """Edit record `number` of the registry's trail, re-hash the chain from there and write a head to match
    (unsigned, as whoever does this has no release key), then move the tag: a rewrite done with care."""
    remote = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule())
    copy, records = registry_trail(url)
    records[number - 1].update(changes)
    for i in range(number - 1, len(records)):
        if i:
            records[i]["prev_hash"] = records[i - 1]["hash"]
        records[i]["hash"] = record_hash(records[i])
    log = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
    head = head_bytes_of(head_document(f"channel-trail:{MODEL}/{TARGET}/{CHANNEL}", records, None))
    remote.put_channel_trail(TRAIL_TAG, head, log, expect=copy.digest)


def test_two_workspaces_promote_alternately_into_one_channel(two_workspaces, tmp_path) -> None:
    laptop, runner, url, refs = two_workspaces
    moves: list[tuple[str, str, str]] = []  # (who, action, to digest) as each round made them
    for round_ in range(10):
        actor, other = (laptop, runner) if round_ % 2 == 0 else (runner, laptop)
        if round_ == 5:  # the runner rolls back what the laptop promoted
            code, out, err = actor.run("rollback", CHANNEL, "--reason", "canary", "--json")
            assert code == 0, err
            moves.append((actor.user, "rollback", json.loads(out)["to_digest"]))
        else:
            pushed = refs[round_ % len(refs)]
            code, out, err = actor.run("promote", pushed["ref"], "--to", CHANNEL, "--json")
            assert code == 0, (round_, err)
            outcome = json.loads(out)
            assert outcome["action"] == "promote" and outcome["trail"] == f"{url}:{TRAIL_TAG}"
            moves.append((actor.user, "promote", pushed["artifact_digest"]))
        # One trail: the registry's holds every move so far, in order, each chained to the one before.
        copy, records = registry_trail(url)
        assert [(r["who"], r["action"], r["to_digest"]) for r in records] == moves, round_
        assert channel_tag_digest(url) == moves[-1][2]
        # The other workspace is behind by one record and catches up (never cries tamper); both verify clean.
        # (Before its first promote the runner does not share the channel yet: nothing of it is there.)
        for workspace in (actor, other):
            code, problems = workspace.verify()
            assert (code, problems) == (0, []), (round_, workspace.user, problems)
            if round_ == 0 and workspace is runner:
                assert workspace.pointer() is None
                continue
            assert workspace.pointer() == moves[-1][2]
            log = SharedChannel(workspace.home, MODEL, TARGET, CHANNEL).log
            assert log.path.read_bytes() == copy.log and log.verify() == []
    # The page and verify agree in both workspaces: intact, the same moves, the same channel state.
    for workspace in (laptop, runner):
        page = workspace.page(tmp_path / f"page-{workspace.user}")
        assert page["audit_chain_problems"] == [] == workspace.verify()[1]
        assert [(c["channel"], c["digest"]) for c in page["channels"]] == [(CHANNEL, moves[-1][2])]
        assert page["audit_records"] == len(moves)
    # History reads the shared trail in either workspace.
    code, out, _ = runner.run("history", "--channel", CHANNEL, "--json")
    assert code == 0 and [(r["who"], r["action"]) for r in json.loads(out)][::-1] == [(w, a) for w, a, _ in moves]

    # A hand rewrite of the registry's trail (record 3, chain re-hashed, head to match): caught in both.
    rewrite_record(url, 3, who="mallory")
    for workspace in (laptop, runner):
        code, problems = workspace.verify()
        assert code == 1 and any("rewritten: record 3 differs" in p for p in problems), problems
        page = workspace.page(tmp_path / f"page-rewritten-{workspace.user}")
        assert page["audit_chain_problems"] == problems  # the page says exactly what verify says
        code, _, err = workspace.run("promote", refs[0]["ref"], "--to", CHANNEL)
        assert code == 1 and "rewritten: record 3 differs" in err and "nothing was changed" in err
        assert workspace.pointer() == moves[-1][2]  # nothing adopted from the rewritten copy


def test_a_shortened_registry_trail_is_caught_and_nothing_is_adopted(two_workspaces, tmp_path) -> None:
    laptop, runner, url, refs = two_workspaces
    for ref, workspace in ((refs[0], laptop), (refs[1], runner), (refs[2], laptop)):
        assert workspace.run("promote", ref["ref"], "--to", CHANNEL)[0] == 0
    assert runner.verify() == (0, [])
    remote = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule())
    copy, records = registry_trail(url)
    kept = records[:2]
    log = "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept).encode()
    remote.put_channel_trail(TRAIL_TAG, head_bytes_of(head_document(f"channel-trail:{MODEL}/{TARGET}/{CHANNEL}", kept, None)),
                             log, expect=copy.digest)
    for workspace in (laptop, runner):
        code, problems = workspace.verify()
        assert code == 1 and any("shortened: the registry's trail holds 2 records, this workspace adopted 3" in p
                                 for p in problems), problems
        assert workspace.pointer() == refs[2]["artifact_digest"]


def test_with_the_release_key_even_a_workspace_that_never_saw_the_trail_catches_a_rewrite(
        signing_key, two_workspaces, tmp_path, monkeypatch) -> None:
    laptop, runner, url, refs = two_workspaces
    for ref, workspace in ((refs[0], laptop), (refs[1], runner)):
        code, _, err = workspace.run("promote", ref["ref"], "--to", CHANNEL)
        assert code == 0, err
    fresh = Workspace(tmp_path / "fresh", "bob", laptop._cli, monkeypatch)
    ResultsLog(fresh.home, release_key(Settings.from_env())).record(refs[1]["artifact_digest"], "smoke", True, {})
    assert fresh.run("promote", refs[1]["ref"], "--to", CHANNEL)[0] == 0  # adopts the signed trail: already there
    assert [w.verify() for w in (laptop, runner, fresh)] == [(0, [])] * 3
    rewrite_record(url, 1, who="mallory")  # re-hashed with care, but the head cannot be signed without the key
    for workspace in (laptop, runner):
        code, problems = workspace.verify()
        assert code == 1 and any("not signed by the release key" in p for p in problems), problems
    newcomer = Workspace(tmp_path / "newcomer", "carol", laptop._cli, monkeypatch)
    code, _, err = newcomer.run("promote", refs[2]["ref"], "--to", CHANNEL)
    assert code == 1 and "not signed by the release key" in err
    # Without the key, a workspace that never adopted the trail cannot tell (the documented limit).
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    stranger = Workspace(tmp_path / "stranger", "dave", laptop._cli, monkeypatch)
    ResultsLog(stranger.home).record(refs[2]["artifact_digest"], "smoke", True, {})
    code, _, err = stranger.run("promote", refs[2]["ref"], "--to", CHANNEL)
    assert code == 0, err


def test_a_lost_race_is_retried_when_the_channel_did_not_move_and_refused_when_it_did(
        two_workspaces, monkeypatch) -> None:
    """Races made to happen at the exact moment: another workspace writes the trail between this one's read
    of the tag and its compare-and-swap."""
    laptop, runner, url, refs = two_workspaces
    assert laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)[0] == 0
    real = oci.OciRemote.put_channel_trail
    injected: list[str] = []

    def racing(self, tag, head, log, *, expect):  # the laptop's first write meets the runner's
        if not injected:
            injected.append("runner")
            assert runner.run("promote", refs[1]["ref"], "--to", CHANNEL)[0] == 0
            assert runner.run("rollback", CHANNEL)[0] == 0  # back where it was: the channel did not move
            laptop.enter()
        return real(self, tag, head, log, expect=expect)

    monkeypatch.setattr(oci.OciRemote, "put_channel_trail", racing)
    code, out, err = laptop.run("promote", refs[2]["ref"], "--to", CHANNEL, "--json")
    assert code == 0, err  # lost the race once, read the trail again, still from refs[0]: retried and won
    _, records = registry_trail(url)
    assert [(r["who"], r["action"]) for r in records] == [
        ("alice", "promote"), ("ci-runner", "promote"), ("ci-runner", "rollback"), ("alice", "promote")]

    injected.clear()

    def moving(self, tag, head, log, *, expect):  # this time the runner's write moves the channel
        if not injected:
            injected.append("runner")
            assert runner.run("promote", refs[3]["ref"], "--to", CHANNEL)[0] == 0
            laptop.enter()
        return real(self, tag, head, log, expect=expect)

    monkeypatch.setattr(oci.OciRemote, "put_channel_trail", moving)
    code, _, err = laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)
    assert code == 4 and "moved to " + refs[3]["artifact_digest"] in err  # a conflict: gates were judged on refs[2]
    _, records = registry_trail(url)
    assert records[-1]["to_digest"] == refs[3]["artifact_digest"] and len(records) == 5
    assert [w.verify() for w in (laptop, runner)] == [(0, [])] * 2


def test_a_write_overwritten_after_its_read_back_is_reported_as_such(two_workspaces, monkeypatch) -> None:
    """The one race a registry without a conditional tag update leaves open: another writer that read the tag
    before this one's write overwrites it after this one's read-back. Its trace is certain: the next read finds
    the record this workspace wrote gone, and says so (nothing adopts the other copy silently)."""
    laptop, runner, url, refs = two_workspaces
    assert laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)[0] == 0
    assert runner.run("channels")[0] == 0
    before, _ = registry_trail(url)
    assert laptop.run("promote", refs[1]["ref"], "--to", CHANNEL)[0] == 0
    # The runner's write, decided on the copy from before the laptop's: put over it without the check.
    remote = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule())
    records = [json.loads(line) for line in before.log.decode().splitlines()]
    fields = {**records[-1], "who": "ci-runner", "at": "2099-01-01T00:00:00.000+00:00", "from_digest": records[-1]["to_digest"],
              "to_digest": refs[2]["artifact_digest"], "ref": refs[2]["ref"]}
    for name in ("seq", "prev_hash", "hash"):
        fields.pop(name)
    from trtpipe.chained import chained_line

    body, line = chained_line(records, fields)
    theirs = [*records, body]
    remote.put_channel_trail(TRAIL_TAG, head_bytes_of(head_document(f"channel-trail:{MODEL}/{TARGET}/{CHANNEL}", theirs, None)),
                             before.log + line, expect=registry_trail(url)[0].digest)
    code, problems = laptop.verify()
    assert code == 1 and any("record 2, which this workspace wrote and read back" in p and "another writer's copy replaced it" in p
                             for p in problems), problems


def test_a_channel_tag_that_cannot_be_moved_leaves_an_aborted_record_and_the_channel_where_it_was(
        two_workspaces, monkeypatch) -> None:
    from trtpipe.errors import RemoteError

    laptop, runner, url, refs = two_workspaces
    assert laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)[0] == 0

    def refuse(self, pinned, tag):
        raise RemoteError(f"registry: put manifest {tag}: HTTP 503 Service Unavailable", remote=url)

    with monkeypatch.context() as patched:
        patched.setattr(oci.OciRemote, "point_tag", refuse)
        code, _, err = runner.run("promote", refs[1]["ref"], "--to", CHANNEL)
    assert code == 1 and "503" in err
    _, records = registry_trail(url)
    assert [(r["action"], r.get("undoes")) for r in records] == [("promote", None), ("promote", None), ("aborted", 2)]
    assert channel_tag_digest(url) == refs[0]["artifact_digest"]
    for workspace in (laptop, runner):
        assert workspace.verify() == (0, [])
        assert workspace.pointer() == refs[0]["artifact_digest"]


def test_an_older_signed_trail_put_back_in_the_registry_and_the_workspace_is_caught(
        signing_key, two_workspaces, tmp_path, monkeypatch) -> None:
    import shutil

    laptop, runner, url, refs = two_workspaces
    assert laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)[0] == 0
    old_copy, _ = registry_trail(url)
    saved = tmp_path / "laptop-then"
    for folder in ("audit", "channels"):
        shutil.copytree(laptop.home / folder, saved / folder)
    for ref, workspace in ((refs[1], runner), (refs[2], laptop)):
        code, _, err = workspace.run("promote", ref["ref"], "--to", CHANNEL)
        assert code == 0, err
    head = json.loads(registry_trail(url)[0].head)
    assert head["sequence"] == 3 and head["signature"]  # each registry head one after the head it extends
    # Rewind both: the registry's trail tag back to its first (genuinely signed) copy, the laptop's trail and
    # pointer folders back to what they held then.
    remote = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule())
    remote.put_channel_trail(TRAIL_TAG, old_copy.head, old_copy.log, expect=registry_trail(url)[0].digest)
    for folder in ("audit", "channels"):
        shutil.rmtree(laptop.home / folder)
        shutil.copytree(saved / folder, laptop.home / folder)
    assert laptop.pointer() == refs[0]["artifact_digest"]
    # The laptop's copy and the registry's agree, and the head verifies: the high-water mark shows the rewind.
    code, problems = laptop.verify()
    assert code == 1 and any("rewound" in p for p in problems), problems
    import subprocess

    public = tmp_path / "release.pub"
    subprocess.run(["openssl", "ec", "-in", str(signing_key), "-pubout", "-out", str(public)],
                   check=True, capture_output=True)
    code, out, _ = laptop.run("channels", "--verify", "--public-key", str(public))
    assert code == 1 and "rewound" in out, out
    code, _, err = laptop.run("promote", refs[3]["ref"], "--to", CHANNEL)
    assert code == 1 and "rewound" in err, err
    # The runner adopted more than the registry holds now: shortened.
    code, problems = runner.verify()
    assert code == 1 and any("shortened" in p for p in problems), problems


def test_a_signed_registry_trail_is_extended_only_with_the_key(signing_key, two_workspaces, tmp_path,
                                                                monkeypatch) -> None:
    laptop, runner, url, refs = two_workspaces
    code, _, err = laptop.run("promote", refs[0]["ref"], "--to", CHANNEL)
    assert code == 0, err
    before, _ = registry_trail(url)
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    keyless = Workspace(tmp_path / "keyless", "eve", laptop._cli, monkeypatch)
    ResultsLog(keyless.home).record(refs[1]["artifact_digest"], "smoke", True, {})
    code, _, err = keyless.run("promote", refs[1]["ref"], "--to", CHANNEL)
    assert code == 1 and "without the release key would leave it unsigned" in err and "TRTPIPE_SIGNING_KEY" in err, err
    assert len(err.strip().splitlines()) == 1
    assert registry_trail(url)[0].digest == before.digest  # the registry's copy stays signed
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(signing_key))
    assert laptop.verify() == (0, [])
