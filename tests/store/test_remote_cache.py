"""`trtpipe build --store oci://...`: a second machine (a fresh store) pulls every stage instead of building it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)


def test_shared_cache_through_a_registry(registry, tiny_spec: Path, tmp_path: Path, tools, monkeypatch) -> None:
    host, user, password = registry.host, registry.username, registry.password
    monkeypatch.setenv("HOME", str(tmp_path))  # no user Docker config may leak credentials in
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", user)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", password)
    remote = f"oci://{host}/trtpipe/cache"

    first_home = tmp_path / "machine-a"
    first = tools.run_cli(first_home, "build", str(tiny_spec), "--store", remote, "--json")
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout)
    assert [s["outcome"] for s in built["stages"][2:]] == ["built"] * 3
    assert all(s["detail"].startswith("pushed to ") for s in built["stages"][2:]), built["stages"]

    second_home = tmp_path / "machine-b"
    dry = json.loads(tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--dry-run",
                                   "--json").stdout)
    assert [s["outcome"] for s in dry["stages"][2:]] == ["would-pull"] * 3
    second = tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--json")
    assert second.returncode == 0, second.stderr
    pulled = json.loads(second.stdout)
    assert [s["outcome"] for s in pulled["stages"][2:]] == ["pulled"] * 3
    assert pulled["artifacts"] == built["artifacts"]  # the same artifacts, by digest
    assert tools.built_lines(second_home) == []  # machine B built nothing
    assert tools.run_cli(second_home, "cache", "verify").returncode == 0
    again = json.loads(tools.run_cli(second_home, "build", str(tiny_spec), "--store", remote, "--json").stdout)
    assert [s["outcome"] for s in again["stages"][2:]] == ["hit"] * 3


class FolderRemote:
    """A remote cache in a plain folder (another trtpipe store): the RemoteCache protocol, nothing else.

    What an S3 or GCS remote would be: find / pull_into / push against its own storage, registered by
    URL scheme in trtpipe.store.remote.SCHEMES. Nothing in the build knows it is not OCI."""

    def __init__(self, url: str, _settings: object, _weights: object, _gate: object) -> None:
        # It keeps no signatures: its pulls call no gate (its kind says so, and a trust policy refuses it).
        from trtpipe.store.local import Store

        self.url = url
        self.shared = Store.open(Path(url.removeprefix("folder://")))
        self.pushed: list[str] = []

    def __str__(self) -> str:
        return self.url

    def probe(self) -> None:
        """A folder is there or not; nothing to log in to."""
        from trtpipe.errors import RemoteError

        if not self.shared.root.is_dir():
            raise RemoteError(f"{self.url}: no such folder", remote=self.url)

    def find(self, kind: str, key: str):
        entry = self.shared.peek(kind, key)
        if entry is None:
            return None
        return type("Found", (), {"kind": kind, "key": key, "artifact_digest": entry.digest, "ref": self.url,
                                  "size": entry.size})()

    def pull_into(self, handle, *, progress=None):
        import hashlib
        import shutil

        entry = self.shared.peek(handle.kind, handle.key)
        if entry is None:
            return None
        verified = {}
        for item in entry.files:
            target = Path(handle.dir) / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(entry.path / item["path"], target)
            verified[item["path"]] = hashlib.sha256(target.read_bytes()).hexdigest()
        return handle.store.install_verified(handle, (entry.path / "manifest.json").read_bytes(), verified)

    def push(self, entry, *, tags=(), progress=None):
        import shutil

        with self.shared.building(entry.kind, entry.key) as handle:
            if handle.existing is None:
                for item in entry.files:
                    target = Path(handle.dir) / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(entry.path / item["path"], target)
                handle.commit(inputs=entry.inputs)
        self.pushed.append(entry.digest)


def test_any_remote_of_the_protocol_serves_as_the_shared_cache(tiny_spec: Path, tmp_path: Path, tools,
                                                               monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A new kind of remote is one class and one SCHEMES line: build, dry run and pull go through the protocol."""
    from trtpipe.cli import main
    from trtpipe.store import remote as remotes

    monkeypatch.setitem(remotes.SCHEMES, "folder", remotes.RemoteKind(open=FolderRemote, base_of=lambda ref: ref,
                                                                           judges_pulls=False))
    url = f"folder://{tmp_path / 'shared'}"

    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "machine-a"))
    assert main(["build", str(tiny_spec), "--store", url, "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert [s["outcome"] for s in built["stages"][2:]] == ["built"] * 3
    assert all(s["detail"] == f"pushed to {url}" for s in built["stages"][2:]), built["stages"]

    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "machine-b"))
    monkeypatch.setenv("TRTPIPE_STORE", url)  # the same remote, named by the environment this time
    assert main(["build", str(tiny_spec), "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert [s["outcome"] for s in dry["stages"][2:]] == ["would-pull"] * 3
    assert main(["build", str(tiny_spec), "--json"]) == 0
    pulled = json.loads(capsys.readouterr().out)
    assert [s["outcome"] for s in pulled["stages"][2:]] == ["pulled"] * 3
    assert pulled["artifacts"] == built["artifacts"] and pulled["remote"] == url
    assert tools.built_lines(tmp_path / "machine-b") == []
    assert tools.run_cli(tmp_path / "machine-b", "cache", "verify").returncode == 0


# --------------------------------------------------------------------------- under a trust policy (issue 28)


def _signing_setup(tmp_path: Path, registry, monkeypatch: pytest.MonkeyPatch, repository: str) -> str:
    """A release key pair, a policy requiring its signature (TRTPIPE_POLICY), the registry's credentials, and
    the cache's URL; the key is the workspace's (TRTPIPE_SIGNING_KEY), as a CI job that fills the cache has it."""
    from trtpipe import signing_keys as K

    K.write_key_pair(K.generate_key(), tmp_path / "release.key", tmp_path / "release.pub")
    (tmp_path / "policy.yaml").write_text(f"keys:\n  release: {tmp_path / 'release.pub'}\n"
                                          "default:\n  require_signature: true\n")
    monkeypatch.setenv("HOME", str(tmp_path))  # no user Docker config may leak credentials in
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", registry.password)
    monkeypatch.setenv("TRTPIPE_POLICY", str(tmp_path / "policy.yaml"))
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))
    return f"oci://{registry.host}/{repository}"


def test_under_a_policy_a_second_fresh_workspace_hits_every_stage(registry, tiny_spec: Path, tmp_path: Path, tools,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack 9: a build that pushes signs what it pushes with the workspace's key, so the cache is not
    write-only under a policy that requires that key's signature."""
    remote = _signing_setup(tmp_path, registry, monkeypatch, "trtpipe/signed-cache")
    first = tools.run_cli(tmp_path / "machine-a", "build", str(tiny_spec), "--store", remote, "--json")
    assert first.returncode == 0, first.stderr
    built = json.loads(first.stdout)
    assert [s["outcome"] for s in built["stages"][2:]] == ["built"] * 3
    signed = [s["detail"].startswith(f"pushed to {remote} (signed by key ") for s in built["stages"][2:]]
    assert signed == [True] * 3, built["stages"]

    # A fresh workspace under the same policy, without the key: every stage is a verified remote hit.
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    second = tools.run_cli(tmp_path / "machine-b", "build", str(tiny_spec), "--store", remote, "--json")
    assert second.returncode == 0, second.stderr
    pulled = json.loads(second.stdout)
    assert [s["outcome"] for s in pulled["stages"][2:]] == ["pulled"] * 3, pulled["stages"]
    assert pulled["artifacts"] == built["artifacts"]
    assert tools.built_lines(tmp_path / "machine-b") == []
    assert second.stderr.count("signed by trusted key release") == 3, second.stderr


def test_a_squatted_key_tag_does_not_block_the_genuine_push(registry, tiny_spec: Path, tmp_path: Path, tools,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can push plants `engine-<key>` first (an unsigned engine of their own), and `checkpoint-<key>`
    naming an entry of another key: the genuine build ignores both (a miss, with a note), pushes its signed entries
    over the key tags, and the next workspace hits them."""
    from trtpipe.settings import Settings
    from trtpipe.store.local import Store
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.oci import OciRemote, key_tag

    remote = _signing_setup(tmp_path, registry, monkeypatch, "trtpipe/squatted-cache")
    dry = tools.run_cli(tmp_path / "scout", "build", str(tiny_spec), "--dry-run", "--json")
    keys = {s["name"]: s["key"] for s in json.loads(dry.stdout)["stages"] if s.get("key")}
    engine_key = keys["engine"]
    attacker = Store.open(tmp_path / "attacker")
    with attacker.building("engine", engine_key) as handle:
        (handle.dir / "rank0.safetensors").write_bytes(b"not the engine" * 1000)
        planted = handle.commit(inputs={"planted": True})
    squatter = OciRemote(remote, settings=Settings.from_env(), weights=weight_file_rule())
    planted_oci = squatter.push(planted).oci_digest  # unsigned: the policy trusts nothing of it
    assert squatter.find("engine", engine_key).artifact_digest == planted.digest
    with attacker.building("checkpoint", "0" * 64) as handle:
        (handle.dir / "rank0.safetensors").write_bytes(b"not the checkpoint" * 1000)
        other = handle.commit(inputs={"planted": True})
    body = squatter.client.get_manifest(squatter.base.repository, squatter.push(other).oci_digest)
    squatter.client.put_manifest(squatter.base.repository, key_tag("checkpoint", keys["checkpoint"]), body)
    dry = tools.run_cli(tmp_path / "machine-a", "build", str(tiny_spec), "--store", remote, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr  # the planted checkpoint tag is a miss, not a failed dry run
    assert [s["outcome"] for s in json.loads(dry.stdout)["stages"][2:]] == ["would-build", "would-pull", "would-build"]

    first = tools.run_cli(tmp_path / "machine-a", "build", str(tiny_spec), "--store", remote, "--json")
    assert first.returncode == 0, first.stderr
    stages = {s["name"]: s for s in json.loads(first.stdout)["stages"]}
    assert stages["engine"]["outcome"] == "built" and stages["engine"]["digest"] != planted.digest
    # The planted tags: each a miss, said in the stage's detail.
    assert stages["engine"]["detail"].startswith("remote entry refused (pull refused: ")
    assert "unsigned" in stages["engine"]["detail"]
    assert f"key tag named {planted_oci}" in stages["engine"]["detail"], stages["engine"]
    assert "which did not verify here; key tag moved to this entry" in stages["engine"]["detail"], stages["engine"]
    assert stages["checkpoint"]["outcome"] == "built", stages["checkpoint"]
    checkpoint = stages["checkpoint"]["detail"]
    assert checkpoint.startswith("remote entry refused (") and "holds checkpoint/000" in checkpoint
    assert "key tag moved to this entry" in stages["checkpoint"]["detail"]
    assert squatter.find("engine", engine_key).artifact_digest == stages["engine"]["digest"]

    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    second = tools.run_cli(tmp_path / "machine-b", "build", str(tiny_spec), "--store", remote, "--json")
    assert second.returncode == 0, second.stderr
    pulled = {s["name"]: s for s in json.loads(second.stdout)["stages"]}
    assert [pulled[n]["outcome"] for n in ("checkpoint", "engine", "publish")] == ["pulled"] * 3, pulled
    assert pulled["engine"]["digest"] == stages["engine"]["digest"]
