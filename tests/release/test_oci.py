"""Push, pull, verify and tag trtpipe artifacts against a real OCI registry (no mocks)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trtpipe.errors import TrtpipeError
from trtpipe.store import oci
from trtpipe.settings import Settings
from trtpipe.stages import weight_file_rule

pytestmark = pytest.mark.timeout(120)


def make_entry(root: Path, *, kind: str = "engine", key: str = "k" * 16, seed: str = "a") -> oci.LocalArtifact:
    """A store-entry directory: files plus the store's manifest.json listing them (a push reuses the digests
    it records, as a stored entry's manifest holds them: issue 15)."""
    from trtpipe.store.keys import canonical_json

    path = root / kind / key
    (path / "sub").mkdir(parents=True)
    files = {"config.json": json.dumps({"seed": seed}).encode(), "rank0.safetensors": (seed * 70000).encode(), "sub/tokenizer.json": b"{}"}
    listed = []
    for rel, body in files.items():
        (path / rel).write_bytes(body)
        listed.append({"path": rel, "mode": "0644", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()})
    manifest = {"manifest_version": 2, "kind": kind, "key": key, "files": sorted(listed, key=lambda f: f["path"]),
                "inputs": {"name": "tiny-llama", "target": {"gpu": "cpu-reference"}, "toolchain": "trtllm-1.2.1"}}
    body = canonical_json(manifest)
    (path / "manifest.json").write_bytes(body)
    return oci.LocalArtifact(path=path, kind=kind, key=key, digest="sha256:" + hashlib.sha256(body).hexdigest())


def test_parse_refs() -> None:
    ref = oci.parse_oci_ref("oci://127.0.0.1:5000/team/engines:prod")
    assert (ref.host, ref.repository, ref.tag, ref.digest) == ("127.0.0.1:5000", "team/engines", "prod", None)
    pinned = oci.parse_oci_ref("oci://reg.example.com/e@sha256:" + "a" * 64)
    assert pinned.digest == "sha256:" + "a" * 64 and pinned.tag is None
    for bad in ("oci://host", "oci://host/UPPER", "oci://host/r@sha256:zz", "http://host/r"):
        with pytest.raises(TrtpipeError):
            oci.parse_oci_ref(bad)


def test_push_pull_roundtrip_is_verified_and_deterministic(registry_env, tmp_path: Path) -> None:
    art = make_entry(tmp_path / "a")
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    base = oci.parse_oci_ref(registry_env.url("roundtrip/engines"))
    first = oci.push_artifact(client, base, art, tags=("v1",))
    # Same entry from another place: same OCI digest (no tar, no timestamps).
    again = oci.push_artifact(client, base, make_entry(tmp_path / "b"), tags=("v1",))
    assert again.oci_digest == first.oci_digest
    remote = oci.resolve_remote(client, base.with_tag("v1"), weight_file_rule())
    assert remote.oci_digest == first.oci_digest
    assert remote.artifact_digest == art.digest and remote.kind == "engine"
    assert remote.annotations["org.trtpipe.model"] == "tiny-llama"
    assert remote.annotations["org.trtpipe.target.gpu"] == "cpu-reference"
    titles = sorted(layer["annotations"][oci.TITLE_ANNOTATION] for layer in remote.manifest["layers"])
    assert titles == ["config.json", "rank0.safetensors", "sub/tokenizer.json"]
    dest = tmp_path / "pulled"
    dest.mkdir()
    oci.download_verified(client, remote, dest)
    for rel in ("config.json", "rank0.safetensors", "sub/tokenizer.json", "manifest.json"):
        assert (dest / rel).read_bytes() == (art.path / rel).read_bytes()


def test_version_tag_never_moves(registry_env, tmp_path: Path) -> None:
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    base = oci.parse_oci_ref(registry_env.url("immutable/engines"))
    first = oci.push_artifact(client, base, make_entry(tmp_path / "a", seed="a"), tags=("v1",))
    with pytest.raises(TrtpipeError, match="never moved"):
        oci.push_artifact(client, base, make_entry(tmp_path / "b", key="other" * 4, seed="b"), tags=("v1",))
    assert oci.resolve_remote(client, base.with_tag("v1"), weight_file_rule()).oci_digest == first.oci_digest


def test_tampered_blob_is_refused(registry_env, tmp_path: Path) -> None:
    art = make_entry(tmp_path / "a", key="tamper" * 3, seed="t")
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    base = oci.parse_oci_ref(registry_env.url("tamper/engines"))
    pushed = oci.push_artifact(client, base, art)
    remote = oci.resolve_remote(client, pushed.ref, weight_file_rule())
    layer = next(l for l in remote.manifest["layers"] if l["annotations"][oci.TITLE_ANNOTATION] == "rank0.safetensors")
    data = registry_env.blob_data_path(layer["digest"])
    body = bytearray(data.read_bytes())
    body[100] ^= 0xFF  # same size, different bytes: only a digest check can catch it
    data.write_bytes(bytes(body))
    dest = tmp_path / "pulled"
    dest.mkdir()
    with pytest.raises(TrtpipeError, match="failed verification"):
        oci.download_verified(client, remote, dest)
    assert not (dest / "rank0.safetensors").exists()


def test_wrong_password_is_one_clear_error_without_the_secret(registry, isolated_home, monkeypatch, capsys) -> None:
    from trtpipe.cli import main

    secret = "wrong-Pw-do-not-print-91c"
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", secret)
    code = main(["cache", "pull", registry.url("any/engines") + ":v1"])
    out = capsys.readouterr()
    assert code != 0
    text = out.out + out.err
    assert secret not in text
    import base64

    assert base64.b64encode(f"{registry.username}:{secret}".encode()).decode() not in text
    lines = [l for l in out.err.splitlines() if l.strip()]
    assert len(lines) == 1 and "rejected the credentials" in lines[0], text


def test_docker_config_credentials_are_used(registry, isolated_home) -> None:
    import base64
    import os

    config = Path(os.environ["HOME"]) / ".docker" / "config.json"
    config.parent.mkdir(parents=True)
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    creds = oci.resolve_credentials(registry.host, Settings.from_env())
    assert creds is not None and creds.username == registry.username
    assert registry.password not in repr(creds)
    oci.OciClient(registry.host, settings=Settings.from_env()).probe()


def test_unreachable_registry_fails_fast(isolated_home) -> None:
    with pytest.raises(TrtpipeError, match="unreachable"):
        oci.OciClient("127.0.0.1:9", settings=Settings.from_env()).probe()


def test_bearer_token_registry_push_pull(token_registry, isolated_home, monkeypatch, tmp_path: Path) -> None:
    """Registries with token auth (GHCR, ECR, Docker Hub): challenge, token exchange, scoped tokens."""
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", token_registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", token_registry.password)
    client = oci.OciClient(token_registry.host, settings=Settings.from_env())
    base = oci.parse_oci_ref(token_registry.url("tokens/engines"))
    art = make_entry(tmp_path / "a", seed="tok")
    pushed = oci.push_artifact(client, base, art, tags=("v1",))
    reader = oci.OciClient(token_registry.host, settings=Settings.from_env())
    remote = oci.resolve_remote(reader, base.with_tag("v1"), weight_file_rule())
    assert remote.oci_digest == pushed.oci_digest
    dest = tmp_path / "pulled"
    dest.mkdir()
    oci.download_verified(reader, remote, dest)
    assert (dest / "rank0.safetensors").read_bytes() == (art.path / "rank0.safetensors").read_bytes()
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", "not-the-password-4711")
    with pytest.raises(TrtpipeError, match="rejected the credentials") as err:
        oci.OciClient(token_registry.host, settings=Settings.from_env()).probe()
    assert "not-the-password-4711" not in str(err.value)


def test_docker_credential_helper_is_used(registry, isolated_home, monkeypatch, tmp_path: Path) -> None:
    """`docker login` with a credsStore/credHelpers keeps secrets in a helper: trtpipe asks it, like docker does."""
    import os
    import stat

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-trtpipetest"
    helper.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 2\n'
        "read host\n"
        f'if [ "$host" = "{registry.host}" ]; then\n'
        f'  printf \'{{"ServerURL":"%s","Username":"{registry.username}","Secret":"{registry.password}"}}\' "$host"\n'
        "else echo 'credentials not found in native keychain'; exit 1; fi\n"
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = Path(os.environ["HOME"]) / ".docker" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"auths": {registry.host: {}}, "credHelpers": {registry.host: "trtpipetest"}}))
    creds = oci.resolve_credentials(registry.host, Settings.from_env())
    assert creds is not None and creds.source == "docker-credential-trtpipetest"
    oci.OciClient(registry.host, settings=Settings.from_env()).probe()
    assert oci.resolve_credentials("other.example.com:5000", Settings.from_env()) is None
