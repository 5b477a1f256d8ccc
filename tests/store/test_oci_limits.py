"""Hostile OCI artifacts (issue 14) against the real test registry: odd file titles and absurd declared sizes
are refused in one line before a byte of any file is downloaded; a download longer than its descriptor
is cut off; and push and pull read each file once, with the registry's own digest check catching a
damaged stored file on push (issue 15)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.errors import IntegrityError
from trtpipe.store import oci
from trtpipe.store.keys import canonical_json
from trtpipe.store.local import Store
from trtpipe.store.manifest import MAX_OTHER_FILE_BYTES, MAX_RANK_FILE_BYTES
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)

KEY = "e" * 64


@pytest.fixture
def env(registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Credentials for the test registry; HOME isolated (a user's Docker config must not leak in)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", registry.password)
    return registry


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The digest of every blob a pull asks the registry for (config and files alike)."""
    asked: list[str] = []
    original = oci.OciClient.fetch_blob

    def counting(self, repository, digest, size, dest):  # noqa: ANN001
        asked.append(digest)
        return original(self, repository, digest, size, dest)

    monkeypatch.setattr(oci.OciClient, "fetch_blob", counting)
    return asked


def _push(registry, repository: str, tag: str, files: dict[str, bytes], *, layer_edits=None, listed_edits=None) -> str:
    """Push a real engine artifact of `files`, then re-tag `tag` at a manifest with its layers (and, with
    `listed_edits`, its trtpipe manifest's file items) edited the way an attacker would."""
    client = oci.OciClient(registry.host, settings=Settings.from_env())
    items = [{"path": rel, "mode": "0644", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
             for rel, body in sorted(files.items())]
    for item in items:
        item.update((listed_edits or {}).get(item["path"], {}))
    config = canonical_json({"manifest_version": 2, "kind": "engine", "key": KEY, "inputs": {"name": "x"}, "files": items})
    layers = []
    for rel, body in sorted(files.items()):
        digest = client.push_bytes(repository, body)
        layer = {"mediaType": oci.FILE_MEDIA_TYPE, "digest": digest, "size": len(body), "annotations": {oci.TITLE_ANNOTATION: rel}}
        edit = (layer_edits or {}).get(rel, {})
        if "title" in edit:
            layer["annotations"][oci.TITLE_ANNOTATION] = edit.pop("title")
        layer.update(edit)
        layers.append(layer)
    manifest = {
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": oci.config_media_type("engine"), "digest": client.push_bytes(repository, config),
                   "size": len(config)},
        "layers": layers,
        "annotations": {"org.trtpipe.kind": "engine", "org.trtpipe.key": KEY, oci.ARTIFACT_DIGEST_ANNOTATION: oci.sha256_bytes(config)},
    }
    client.put_manifest(repository, tag, json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    return f"oci://{registry.host}/{repository}:{tag}"


FILES = {"config.json": b'{"version": "1.2.1"}', "rank0.safetensors": os.urandom(4096)}


def _pull(store: Path, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["cache", "pull", url, "--store", str(store)])
    return code, capsys.readouterr().err


def _nothing_installed(store: Path) -> None:
    """No entry, no staging folder left, no object: nothing of the artifact reached the store."""
    if not store.exists():
        return  # refused before the store was even opened
    assert Store(store).peek("engine", KEY) is None
    assert not list((store / "tmp").iterdir())
    assert all(p.is_dir() for p in (store / "objects").rglob("*"))


ODD_TITLES = {
    "a NUL byte": "rank0\x00.safetensors",
    "a newline": "rank0.safe\ntensors",
    "a space": "rank 0.safetensors",
    "an absolute path": "/etc/cron.d/x",
    "a parent folder": "../rank0.safetensors",
    "a dot folder": "./rank0.safetensors",
    "an empty name": "",
    "a backslash": "..\\rank0.safetensors",
    "a name of 300 characters": "r" * 300,
}


@pytest.mark.parametrize("odd", sorted(ODD_TITLES))
def test_an_odd_file_title_is_refused_in_one_line_before_any_download(
    odd: str, env, tmp_path: Path, capsys: pytest.CaptureFixture[str], downloads: list[str]
) -> None:
    url = _push(env, "hostile/titles", "t" + str(sorted(ODD_TITLES).index(odd)), FILES,
                layer_edits={"rank0.safetensors": {"title": ODD_TITLES[odd]}})
    code, err = _pull(tmp_path / "store", url, capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "layer title" in lines[0] and "refused before downloading anything" in lines[0]
    assert "Traceback" not in err and "ValueError" not in err
    assert downloads == []
    _nothing_installed(tmp_path / "store")


SIZES = {
    "10^12 bytes of weights": ("rank0.safetensors", 10**12, "more than a engine's rank0.safetensors can hold"),
    "a config of a GiB": ("config.json", 2**30, "more than a engine's config.json can hold"),
    "a negative size": ("config.json", -1, "not a byte count"),
    # The real registry refuses to store these; a registry that checks nothing serves them.
    "a string": ("config.json", "20", "not a byte count"),
    "true": ("config.json", True, "not a byte count"),
    "a float": ("config.json", 20.0, "not a byte count"),
}


class _Lenient(BaseHTTPRequestHandler):
    """A registry that checks nothing: serves `manifests` and `blobs` as they are (no auth)."""

    manifests: dict[str, bytes] = {}
    blobs: dict[str, bytes] = {}

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass

    def do_GET(self) -> None:  # noqa: N802
        name = self.path.rsplit("/", 1)[-1]
        body = b"" if self.path == "/v2/" else (self.manifests.get(name) if "/manifests/" in self.path else self.blobs.get(name))
        self.send_response(404 if body is None else 200)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")


@pytest.fixture
def lenient():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Lenient)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", sorted(SIZES))
def test_an_absurd_declared_size_is_refused_before_any_download(
    case: str, env, lenient: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], downloads: list[str]
) -> None:
    rel, size, why = SIZES[case]
    if isinstance(size, int) and not isinstance(size, bool):
        url = _push(env, "hostile/sizes", "s" + str(sorted(SIZES).index(case)), FILES,
                    layer_edits={rel: {"size": size}}, listed_edits={rel: {"size": size}})
    else:  # the same artifact, its manifest edited after the fact and served by a registry that checks nothing
        url = _push(env, "hostile/sizes", "base", FILES)
        ref = oci.parse_oci_ref(url)
        manifest = json.loads(oci.OciClient(env.host, settings=Settings.from_env()).get_manifest(ref.repository, ref.tag))
        for layer in manifest["layers"]:
            if layer["annotations"][oci.TITLE_ANNOTATION] == rel:
                layer["size"] = size
        _Lenient.manifests = {"edited": json.dumps(manifest).encode()}
        _Lenient.blobs = {}
        url = f"oci://{lenient}/hostile/sizes:edited"
    code, err = _pull(tmp_path / "store", url, capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert why in err and "refused before downloading anything" in err
    assert downloads == []
    _nothing_installed(tmp_path / "store")


def test_the_caps_hold_every_gpu_in_the_catalog_and_every_example_file() -> None:
    """The cap rule's premise: one GPU's share of an engine fits the rank-file cap (the largest GPU in the
    catalog), and the other files of a published repository are far below theirs."""
    from trtpipe.gpu import load_catalog

    memories = [gpu.memory_gib * 2**30 for gpu in load_catalog().values()]
    assert len(memories) > 5 and max(memories) < MAX_RANK_FILE_BYTES
    templates = Path(__file__).resolve().parents[2] / "triton_repo"
    assert max(p.stat().st_size for p in templates.rglob("*") if p.is_file()) < MAX_OTHER_FILE_BYTES


def test_a_pull_larger_than_the_free_disk_is_refused_before_downloading_files(
    env, tmp_path: Path, capsys: pytest.CaptureFixture[str], downloads: list[str]
) -> None:
    store = tmp_path / "store"
    Store.open(store)
    free = shutil.disk_usage(store).free
    size = free + 2**30
    if size > MAX_RANK_FILE_BYTES:
        pytest.skip(f"{free} bytes free here: more than a rank file may declare")
    url = _push(env, "hostile/disk", "big", FILES, layer_edits={"rank0.safetensors": {"size": size}},
                listed_edits={"rank0.safetensors": {"size": size}})
    code, err = _pull(store, url, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"is {size + len(FILES['config.json'])} bytes, but only" in err and "nothing was downloaded" in err
    assert len(downloads) == 1  # the trtpipe manifest (the config blob) only: no file
    _nothing_installed(store)


def test_layers_that_are_not_what_the_trtpipe_manifest_lists_are_refused_before_download(
    env, tmp_path: Path, capsys: pytest.CaptureFixture[str], downloads: list[str]
) -> None:
    url = _push(env, "hostile/lists", "other", FILES, listed_edits={"rank0.safetensors": {"sha256": "0" * 64}})
    code, err = _pull(tmp_path / "store", url, capsys)
    assert code == 1 and "refused before downloading it" in err, err
    assert len(downloads) == 1
    _nothing_installed(tmp_path / "store")


def test_a_blob_longer_than_declared_is_refused_by_its_length(
    env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The registry serves the whole blob (with its Content-Length); the descriptor says 10 bytes."""
    body = FILES["rank0.safetensors"]
    url = _push(env, "hostile/long", "long", FILES, layer_edits={"rank0.safetensors": {"size": 10}},
                listed_edits={"rank0.safetensors": {"size": 10}})
    code, err = _pull(tmp_path / "store", url, capsys)
    assert code == 1 and f"serves {len(body)} bytes, not the 10 its descriptor declares" in err, err
    _nothing_installed(tmp_path / "store")


class _EndlessBlob(BaseHTTPRequestHandler):
    """A registry that answers /v2/ and streams any blob without a Content-Length, without end."""

    sent = 0

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v2/":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"x" * 65536
        try:
            for _ in range(1024):  # 64 MiB at most
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                type(self).sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_a_download_past_its_declared_size_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EndlessBlob)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        client = oci.OciClient(host, timeout=(5.0, 10.0), settings=Settings.from_env())
        dest = tmp_path / "blob"
        with pytest.raises(IntegrityError, match="more than 1024 bytes"):
            client.fetch_blob("any/repo", "sha256:" + "0" * 64, 1024, dest)
        assert not dest.exists()
    finally:
        server.shutdown()
        server.server_close()
    # It stopped reading at once: what was sent is the first chunks plus the sockets' buffers, not 64 MiB.
    assert _EndlessBlob.sent < 32 * 2**20


def test_push_takes_digests_from_the_manifest_and_the_registry_catches_a_damaged_file(
    env, tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Push reads each file once (to upload it: the digest is the manifest's); a stored file whose bytes no
    longer match is refused by the registry's own check of every upload, in one line, and nothing is tagged."""
    store = Store.open(tmp_path / "store")
    with store.building("engine", KEY) as handle:
        for rel, body in FILES.items():
            (handle.dir / rel).write_bytes(body)
        entry = handle.commit(inputs={"name": "x"})
    hashed: list[str] = []
    monkeypatch.setattr(hashlib, "file_digest", lambda *a, **k: hashed.append("file") or pytest.fail("push re-hashed"))
    target = entry.path / "rank0.safetensors"
    os.chmod(target, 0o644)
    with open(target, "r+b") as handle:  # one byte, in place, same size: only a digest check can tell
        handle.seek(100)
        handle.write(bytes([FILES["rank0.safetensors"][100] ^ 0xFF]))
    url = f"oci://{env.host}/hostile/push"
    code = main(["cache", "push", f"engine/{KEY}", "--to", url, "--tag", "v1", "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "does not hold the bytes of sha256:" in err and "trtpipe cache verify --repair" in err
    assert hashed == []
    assert oci.OciClient(env.host, settings=Settings.from_env()).get_manifest("hostile/push", "v1") is None


def test_a_port_that_refuses_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, err = _pull(tmp_path / "store", f"oci://127.0.0.1:{port}/a/b:v1", capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "unreachable" in err


def test_pull_hashes_each_file_once_as_it_streams_and_the_entry_is_then_vouched_for(
    env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Store.open(tmp_path / "a")
    with source.building("engine", KEY) as handle:
        for rel, body in FILES.items():
            (handle.dir / rel).write_bytes(body)
        entry = handle.commit(inputs={"name": "x"})
    url = f"oci://{env.host}/travel/pull"
    assert main(["cache", "push", f"engine/{KEY}", "--to", url, "--tag", "v1", "--store", str(tmp_path / "a")]) == 0
    rehashed: list[str] = []
    original = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, d: rehashed.append(f.name) or original(f, d))
    assert main(["cache", "pull", f"{url}:v1", "--store", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    assert rehashed == []  # hashed while streaming (hashlib.sha256 updates), never read back
    pulled = Store(tmp_path / "b")
    got = pulled.peek("engine", KEY)
    assert got is not None and got.digest == entry.digest
    assert pulled.verify_entry(got) == [] and rehashed == []  # the digest cache vouches: nothing read


def test_llm_api_weight_files_get_the_weight_cap_and_nothing_else_does() -> None:
    """An LLM-API artifact (hf-checkpoint) is not sharded by GPU: its HF weight files, and the same files
    hard-linked under an llmapi repository's tensorrt_llm/1/checkpoint/, hold the whole model."""
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.manifest import KINDS, size_cap

    weights = weight_file_rule()  # as the stages and layouts declare their weight files
    assert "hf-checkpoint" in KINDS and oci.KINDS is KINDS
    for name in ("model.safetensors", "model-00001-of-00004.safetensors"):
        assert size_cap("hf-checkpoint", name, weights) == MAX_RANK_FILE_BYTES
        assert size_cap("repository", f"tensorrt_llm/1/checkpoint/{name}", weights) == MAX_RANK_FILE_BYTES
    for kind, name in (("hf-checkpoint", "tokenizer.json"), ("hf-checkpoint", "llm_args.json"),
                       ("hf-checkpoint", "sub/model.safetensors"), ("hf-checkpoint", "rank0.safetensors"),
                       ("repository", "tensorrt_llm/1/checkpoint/config.json"),
                       ("repository", "tensorrt_llm/1/model.safetensors"), ("checkpoint", "model.safetensors")):
        assert size_cap(kind, name, weights) == MAX_OTHER_FILE_BYTES, (kind, name)
