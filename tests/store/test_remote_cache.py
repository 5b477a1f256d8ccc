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

    def __init__(self, url: str, _settings: object) -> None:
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

    monkeypatch.setitem(remotes.SCHEMES, "folder", remotes.RemoteKind(open=FolderRemote, base_of=lambda ref: ref))
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
