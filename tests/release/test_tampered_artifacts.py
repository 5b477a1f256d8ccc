"""Issue 11: a crafted artifact in a registry (a file listed under a stock file's sha256, same size, other
bytes) never gets its bytes into the store, and so never into a build's output. Real registry, real build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trtpipe.store import oci
from trtpipe.store.keys import canonical_json
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)

STOCK = Path(__file__).resolve().parents[2] / "triton_repo" / "preprocessing" / "1" / "model.py"
TARGET = "preprocessing/1/model.py"


def _evil_twin(stock: bytes) -> bytes:
    """Other bytes of exactly the stock file's size (what a size check alone would accept)."""
    payload = b"import os; os.system('echo pwned')  # "
    return (payload + b"#" * len(stock))[: len(stock) - 1] + b"\n"


def _push_crafted(registry, repository: str, key: str, files: list[dict], blobs: dict[str, bytes], tag: str) -> str:
    client = oci.OciClient(registry.host, settings=Settings.from_env())
    config = canonical_json({"manifest_version": 2, "kind": "repository", "key": key, "inputs": {"name": "tiny-llama"},
                             "files": files})
    layers = []
    for rel, body in blobs.items():
        digest = client.push_bytes(repository, body)  # the registry itself checks a blob against its digest
        layers.append({"mediaType": oci.FILE_MEDIA_TYPE, "digest": digest, "size": len(body),
                       "annotations": {oci.TITLE_ANNOTATION: rel}})
    manifest = {
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": oci.config_media_type("repository"), "digest": client.push_bytes(repository, config),
                   "size": len(config)},
        "layers": layers,
        "annotations": {"org.trtpipe.kind": "repository", "org.trtpipe.key": key,
                        oci.ARTIFACT_DIGEST_ANNOTATION: oci.sha256_bytes(config)},
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    client.put_manifest(repository, tag, body)
    return f"oci://{registry.host}/{repository}:{tag}"


@pytest.mark.parametrize("variant", ["listed under the stock digest", "listed twice"])
def test_a_crafted_pull_is_refused_and_plants_nothing(registry_env, isolated_home: Path, cli, variant: str) -> None:
    stock = STOCK.read_bytes()
    evil = _evil_twin(stock)
    assert len(evil) == len(stock) and evil != stock
    stock_sha, evil_sha = hashlib.sha256(stock).hexdigest(), hashlib.sha256(evil).hexdigest()
    entry = {"path": TARGET, "mode": "0644", "size": len(stock), "sha256": stock_sha}
    files = [entry] if variant == "listed under the stock digest" else [entry, {**entry, "sha256": evil_sha}]
    key = "c" * 64
    url = _push_crafted(registry_env, "crafted/tiny", key, files, {TARGET: evil}, tag=variant.replace(" ", "-"))
    code, _, err = cli("cache", "pull", url)
    assert code == 1 and "refused" in err and "Traceback" not in err
    from trtpipe.store.local import Store

    store = Store.open(isolated_home)
    assert store.peek("repository", key) is None
    assert not store.objects.path_for(stock_sha).exists() and not store.objects.path_for(evil_sha).exists()
    assert not list((isolated_home / "tmp").iterdir())


def test_a_planted_object_never_reaches_a_builds_output(isolated_home: Path, tiny_llama_dir: Path, cli,
                                                        tmp_path: Path) -> None:
    """Bytes under a stock file's digest in objects/ (whoever put them there, an older trtpipe's pull
    say): the next build compares before it links, sets them aside and publishes the real bytes."""
    from trtpipe.store.local import Store

    stock = STOCK.read_bytes()
    stock_sha = hashlib.sha256(stock).hexdigest()
    store = Store.open(isolated_home)
    planted = store.objects.path_for(stock_sha)
    planted.parent.mkdir(parents=True)
    planted.write_bytes(_evil_twin(stock))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"model:\n  path: {tiny_llama_dir}\ntarget:\n  gpu: cpu-reference\n"
                    "engine:\n  max_batch_size: 4\n  max_input_len: 64\n  max_seq_len: 128\n")
    code, out, err = cli("build", str(spec), "--json")
    assert code == 0, err
    report = json.loads(out)
    repo = Path(report["repository_path"])
    assert (repo / TARGET).read_bytes() == stock
    assert store.objects.path_for(stock_sha).read_bytes() == stock
    assert f"sha256:{stock_sha[:12]} did not hold its digest's bytes" in json.dumps(report["stages"])
    assert cli("cache", "verify")[0] == 0
