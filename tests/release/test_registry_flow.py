"""The release flow against a real registry: cache push/pull, shared build cache, channel tags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtpipe.release.audit import read_audit
from trtpipe.release.channels import ChannelScope, ChannelStore
from trtpipe.release.trail import channel_records
from trtpipe.results import ResultsLog
from trtpipe.store import oci
from trtpipe.settings import Settings
from trtpipe.stages import weight_file_rule

pytestmark = pytest.mark.timeout(120)


def tag_digest(client: oci.OciClient, repository: str, tag: str) -> str | None:
    body = client.get_manifest(repository, tag)
    return oci.sha256_bytes(body) if body is not None else None


def test_cache_push_pull_roundtrip_keeps_the_artifact_digest(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    import os

    src_home = Path(os.environ["TRTPIPE_HOME"])
    entry = store_entry(src_home, "0123456789abcdef")
    url = registry_env.url("flow/engines")
    code, out, err = cli("cache", "push", "engine/" + entry.key, "--to", url, "--tag", "v1.0.0", "--json")
    assert code == 0, err
    pushed = json.loads(out)
    assert pushed["artifact_digest"] == entry.digest
    assert pushed["tags"] == [f"engine-{entry.key}", "v1.0.0"]
    # Pull into a fresh store on "another machine".
    other = tmp_path / "other-home"
    monkeypatch.setenv("TRTPIPE_HOME", str(other))
    code, out, err = cli("cache", "pull", url + ":v1.0.0", "--json")
    assert code == 0, err
    pulled = json.loads(out)
    assert pulled["artifact_digest"] == entry.digest and pulled["key"] == entry.key
    from trtpipe.store.local import Store

    local = Store.open(other).get("engine", entry.key, verify=True)
    assert local is not None and local.digest == entry.digest
    assert (local.path / "rank0.safetensors").read_bytes() == (entry.path / "rank0.safetensors").read_bytes()
    # Pulling again is a no-op that returns the same entry.
    code, out, _ = cli("cache", "pull", pushed["ref"], "--json")
    assert code == 0 and json.loads(out)["artifact_digest"] == entry.digest


def test_version_tag_refuses_overwrite_via_cli(registry_env, store_entry, cli) -> None:
    import os

    home = Path(os.environ["TRTPIPE_HOME"])
    first = store_entry(home, "aaaa1111bbbb2222", seed="x")
    second = store_entry(home, "cccc3333dddd4444", seed="y")
    url = registry_env.url("flow/immutable")
    assert cli("cache", "push", first.key, "--to", url, "--tag", "v2")[0] == 0
    code, _, err = cli("cache", "push", second.key, "--to", url, "--tag", "v2")
    assert code == 4 and "never moved" in err  # Conflict: the tag already names another artifact
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    remote = oci.resolve_remote(client, oci.parse_oci_ref(url + ":v2"), weight_file_rule())
    assert remote.artifact_digest == first.digest


def test_tampered_pull_installs_nothing(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    import os

    entry = store_entry(Path(os.environ["TRTPIPE_HOME"]), "7a3e7a3e7a3e7a3e", seed="z")
    url = registry_env.url("flow/tamper")
    code, out, _ = cli("cache", "push", entry.key, "--to", url, "--json")
    assert code == 0
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    remote = oci.resolve_remote(client, oci.parse_oci_ref(json.loads(out)["ref"]), weight_file_rule())
    layer = next(l for l in remote.manifest["layers"] if l["annotations"][oci.TITLE_ANNOTATION] == "config.json")
    data = registry_env.blob_data_path(layer["digest"])
    data.write_bytes(data.read_bytes() + b" ")  # extended by one byte
    other = tmp_path / "other-home"
    monkeypatch.setenv("TRTPIPE_HOME", str(other))
    code, _, err = cli("cache", "pull", json.loads(out)["ref"])
    assert code == 1 and "failed verification" in err
    from trtpipe.store.local import Store

    store = Store.open(other)
    assert store.peek("engine", entry.key) is None
    assert list((other / "tmp").iterdir()) == []


def test_remote_store_as_shared_build_cache(registry_env, store_entry, tmp_path) -> None:
    import os

    from trtpipe.store.local import Store

    entry = store_entry(Path(os.environ["TRTPIPE_HOME"]), "5eed5eed5eed5eed", seed="c")
    remote = oci.OciRemote(registry_env.url("flow/cache"), settings=Settings.from_env(), weights=weight_file_rule())
    runner_store = Store.open(tmp_path / "runner-store")
    assert remote.find("engine", entry.key) is None
    remote.push(entry)
    got = remote.pull(remote.find("engine", entry.key), runner_store)
    assert got is not None and got.digest == entry.digest
    assert runner_store.get("engine", entry.key, verify=True) is not None
    # Inside a build that already holds the key's lock (how the stage runner uses it).
    third = Store.open(tmp_path / "third-store")
    with third.building("engine", entry.key) as handle:
        assert handle.existing is None
        pulled = remote.pull_into(handle)
    assert pulled is not None and pulled.digest == entry.digest
    assert third.get("engine", entry.key, verify=True).digest == entry.digest
    with third.building("engine", "0" * 16) as handle:
        assert remote.pull_into(handle) is None
    assert third.peek("engine", "0" * 16) is None


def test_promote_registry_artifact_moves_channel_tag_and_rolls_back(registry_env, store_entry, cli) -> None:
    import os

    home = Path(os.environ["TRTPIPE_HOME"])
    url = registry_env.url("flow/channels")
    refs = []
    for key, seed in (("0a0a0a0a0a0a0a0a", "p"), ("0b0b0b0b0b0b0b0b", "q")):
        entry = store_entry(home, key, seed=seed)
        code, out, _ = cli("cache", "push", entry.key, "--to", url, "--json")
        assert code == 0
        refs.append(json.loads(out))
        ResultsLog(home).record(entry.digest, "smoke", True, {"checks": 6})
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    tag = "tiny-llama.cpu-reference.prod"
    for pushed in refs:
        code, out, err = cli("promote", pushed["ref"], "--to", "prod", "--json")
        assert code == 0, err
        assert json.loads(out)["tag"] == tag
        assert tag_digest(client, "flow/channels", tag) == pushed["oci_digest"]
    code, _, err = cli("rollback", "prod")
    assert code == 0, err
    assert tag_digest(client, "flow/channels", tag) == refs[0]["oci_digest"]
    # The channel is shared through the registry: its moves are in its trail there (and this workspace's copy).
    assert [(trail, r.action) for trail, r in channel_records(home, channel="prod")] == [
        ("trail.tiny-llama.cpu-reference.prod", a) for a in ("promote", "promote", "rollback")]
    assert read_audit(home, channel="prod") == []  # the workspace trail keeps what happened only here
    # Channels are addressable by tag too: promoting "the current prod" to another channel works.
    code, out, err = cli("promote", url + ":" + tag, "--to", "stable", "--json")
    assert code == 0, err
    assert json.loads(out)["to_digest"] == refs[0]["artifact_digest"]


def test_a_rewrite_of_the_adopted_trail_disagrees_with_the_registrys(registry_env, store_entry, cli, tmp_path) -> None:
    """Promoting a registry artifact keeps the channel's trail in the registry: this workspace's adopted copy,
    shortened or rewritten with its head to match, no longer agrees with the registry's."""
    import os

    from trtpipe.chained import record_hash
    from trtpipe.release.shared_trail import SharedChannel
    from trtpipe.release.trail import verify_trail

    home = Path(os.environ["TRTPIPE_HOME"])
    url = registry_env.url("flow/trailhead")
    refs = []
    for key, seed in (("0c0c0c0c0c0c0c0c", "m"), ("0d0d0d0d0d0d0d0d", "n")):
        entry = store_entry(home, key, seed=seed)
        code, out, _ = cli("cache", "push", entry.key, "--to", url, "--json")
        assert code == 0
        refs.append(json.loads(out)["ref"])
        ResultsLog(home).record(entry.digest, "smoke", True, {})
    for ref in refs:
        assert cli("promote", ref, "--to", "prod")[0] == 0
    copy = oci.OciRemote(url, settings=Settings.from_env(), weights=weight_file_rule()).get_channel_trail("trail.tiny-llama.cpu-reference.prod")
    log = SharedChannel(home, "tiny-llama", "cpu-reference", "prod").log
    assert copy is not None and copy.log == log.path.read_bytes() and copy.head == log.head_path.read_bytes()
    code, out, _ = cli("channels", "--verify")
    assert code == 0, out
    # Rewrite the adopted copy consistently (chain and its head): only the registry's copy shows it.
    saved = log.path.read_text(), log.head_path.read_text()
    records = [json.loads(line) for line in saved[0].splitlines()]
    records[0]["who"] = "someone-else"
    for i, record in enumerate(records):
        if i:
            record["prev_hash"] = records[i - 1]["hash"]
        record["hash"] = record_hash(record)
    log.path.write_text("".join(json.dumps(r) + "\n" for r in records))
    head = json.loads(saved[1])
    head["hash"] = records[-1]["hash"]
    log.head_path.write_text(json.dumps(head))
    # No key, no registry: only this workspace's high-water mark (outside audit/) remembers record 2 as it was...
    assert any("rewritten" in p and "high-water mark" in p for p in verify_trail(home))
    # ...and whoever can write the whole workspace removes it too; the channel is the adopted trail's projection
    # (it follows the rewrite: who set it is now someone-else), so no second copy here remembers the record either.
    shutil.rmtree(home / "marks")
    assert ChannelStore(home).get(ChannelScope(model="tiny-llama", target="cpu-reference"), "prod").history[0].set_by \
        == "someone-else"
    assert verify_trail(home) == []  # no key, no registry, no mark: undetectable
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "rewritten: record 1 differs" in out and "trail.tiny-llama.cpu-reference.prod" in out
    shutil.rmtree(home / "marks")  # the verifies above marked the rewritten copy: gone again, as the attacker has it
    # Longer than the registry's, with its head to match: the registry's trail holds fewer (shortened there).
    extra = {**records[-1], "seq": 3, "prev_hash": json.loads(saved[0].splitlines()[-1])["hash"]}
    extra["hash"] = record_hash(extra)
    log.path.write_text(saved[0] + json.dumps(extra) + "\n")
    head.update(records=3, hash=extra["hash"])
    log.head_path.write_text(json.dumps(head))
    code, out, _ = cli("channels", "--verify", "--json")
    assert code == 1 and any("shortened: the registry's trail holds 2 records, this workspace adopted 3" in p
                             for p in json.loads(out)["audit_problems"]), json.loads(out)["audit_problems"]
