"""Issue 18 with a real build of the tiny model (cpu-reference) and a real registry: provenance round-trips and
names the build's exact input digests; an engine pulled under the victim spec's key is no silent cache hit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trtpipe import signing_keys as K
from trtpipe.release.audit import read_audit
from trtpipe.store import oci
from trtpipe.store.keys import canonical_json
from trtpipe.store.local import Store
from trtpipe.settings import Settings

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.fixture(scope="module")
def built(tmp_path_factory, publish_example):
    """The tiny example built once into its own store: (tmp dir, spec path, store root, repository path)."""
    base = tmp_path_factory.mktemp("signed-build")
    repo = publish_example(base)
    return base, base / "spec" / "tiny-llama-cpu.yaml", base / "store", Path(repo)


def _release_key(tmp_path: Path) -> tuple[K.PrivateKey, Path]:
    key = K.generate_key()
    K.write_key_pair(key, tmp_path / "release.key", tmp_path / "release.pub")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys:\n  release: {tmp_path / 'release.pub'}\n")
    return key, policy


def test_provenance_round_trips_with_the_builds_input_digests(built, registry_env, tmp_path: Path, cli, monkeypatch) -> None:
    base, spec, store_root, repo = built
    key, policy = _release_key(tmp_path)
    store = Store.open(store_root)
    repository = store.find("repository/" + repo.name)
    url = registry_env.url("prov/tiny")
    code, out, err = cli("cache", "push", "repository/" + repository.key, "--to", url, "--tag", "v1",
                         "--sign", str(tmp_path / "release.key"), "--store", str(store_root), "--json")
    assert code == 0, err
    # Read back from the registry on a machine that has nothing of it.
    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "elsewhere"))
    code, out, err = cli("cache", "show", url + ":v1", "--provenance", "--policy", str(policy), "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["verified"] and shown["signed_by"] == "release"
    statement = shown["statement"]
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    # The subject names the tags it was pushed under (the signature binds them: a re-pointed tag is refused at pull).
    assert statement["subject"] == [{"name": f"repository/{repository.key}",
                                     "digest": {"sha256": repository.digest.removeprefix("sha256:")},
                                     "annotations": {"org.trtpipe.tags": sorted(["v1", f"repository-{repository.key}"])}}]
    definition = statement["predicate"]["buildDefinition"]
    named = {d["digest"]["sha256"] for d in definition["resolvedDependencies"]}
    # Exactly the bytes the build read: every weight file and the config of the model directory.
    model_dir = Path(definition["externalParameters"]["spec"]["model"]["path"])
    for weight in sorted(model_dir.glob("*.safetensors")):
        assert hashlib.sha256(weight.read_bytes()).hexdigest() in named, weight.name
    assert hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest() in named
    by_name = {d["name"]: d["digest"]["sha256"] for d in definition["resolvedDependencies"]}
    assert by_name["checkpoint.inputs.model.weights[0]"] == hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert by_name["repository.inputs.tokenizer"] == repository.inputs["tokenizer"]  # the tokenizer files' digest
    # Every stage: its key and its artifact digest, as the build record has them.
    record = json.loads((sorted((store_root / "records").glob("*.json"))[-1]).read_text())
    assert definition["internalParameters"]["stage_keys"] == record["keys"]
    for digest in record["artifacts"].values():
        assert digest.removeprefix("sha256:") in named | {repository.digest.removeprefix("sha256:")}
    run = statement["predicate"]["runDetails"]
    assert run["metadata"]["invocationId"] == record["id"]
    assert run["byproducts"][0]["annotations"]["record"]["id"] == record["id"]
    # Under a policy that does not list the signer, the same provenance is shown as not verified.
    other = K.generate_key()
    K.write_key_pair(other, tmp_path / "other.key", tmp_path / "other.pub")
    (tmp_path / "other-policy.yaml").write_text(f"keys:\n  other: {tmp_path / 'other.pub'}\n")
    code, out, _ = cli("cache", "show", url + ":v1", "--provenance", "--policy", str(tmp_path / "other-policy.yaml"), "--json")
    assert code == 0 and not json.loads(out)["verified"] and "verifies under none of the keys" in json.loads(out)["signature"]
    assert key.key_id[:16] not in json.loads(out)["signature"]  # a claimed key id is not shown as the signer
    # The local store that pushed it shows the same signed statement.
    code, out, _ = cli("cache", "show", repository.digest, "--provenance", "--policy", str(policy), "--store", str(store_root), "--json")
    assert code == 0 and json.loads(out)["verified"] and json.loads(out)["statement"] == statement


def _negated(body: bytes) -> bytes:
    """The safetensors file with every float's sign bit flipped (same size, same header)."""
    header = 8 + int.from_bytes(body[:8], "little")
    data = bytearray(body)
    for i in range(header + 1, len(data), 2):  # fp16 little-endian: the sign is the high byte's top bit
        data[i] ^= 0x80
    return bytes(data)


def test_an_engine_pulled_under_the_victims_key_is_no_silent_cache_hit(built, registry_env, tmp_path: Path, cli,
                                                                       monkeypatch) -> None:
    base, spec, store_root, _ = built
    _, policy = _release_key(tmp_path)
    genuine = next(Store.open(store_root).entries("engine"))
    # The attacker: same spec (so the same engine key), negated weights, pushed without the release key.
    files = {item["path"]: (genuine.path / item["path"]).read_bytes() for item in genuine.files}
    rank = next(p for p in files if p.endswith(".safetensors"))
    files[rank] = _negated(files[rank])
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    items = [{"path": p, "mode": "0644", "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in sorted(files.items())]
    config = canonical_json({"manifest_version": 2, "kind": "engine", "key": genuine.key, "inputs": genuine.inputs, "files": items})
    layers = [{"mediaType": oci.FILE_MEDIA_TYPE, "digest": client.push_bytes("evil/engines", b), "size": len(b),
               "annotations": {oci.TITLE_ANNOTATION: p}} for p, b in sorted(files.items())]
    manifest = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST_MEDIA_TYPE, "layers": layers,
                "config": {"mediaType": oci.config_media_type("engine"), "digest": client.push_bytes("evil/engines", config),
                           "size": len(config)},
                "annotations": {"org.trtpipe.kind": "engine", "org.trtpipe.key": genuine.key,
                                oci.ARTIFACT_DIGEST_ANNOTATION: oci.sha256_bytes(config)}}
    client.put_manifest("evil/engines", "latest", json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    evil_digest = oci.sha256_bytes(config)

    victim = tmp_path / "victim"
    monkeypatch.setenv("TRTPIPE_HOME", str(victim))
    code, _, err = cli("cache", "pull", registry_env.url("evil/engines") + ":latest")
    assert code == 0, err  # no policy: it goes in, said to be unchecked
    assert "unsigned" in err
    # No policy: the build uses it, and says so.
    code, out, err = cli("build", str(spec), "--verify", "--json")
    assert code == 0, err
    report = json.loads(out)
    engine = next(s for s in report["stages"] if s["name"] == "engine")
    assert engine["outcome"] == "hit" and engine["digest"] == evil_digest
    assert "using an unsigned pulled entry" in engine["detail"]
    # Under a policy: not a cache hit; the engine is rebuilt here and the refusal is in the trail.
    code, out, err = cli("build", str(spec), "--policy", str(policy), "--json")
    assert code == 0, err
    report = json.loads(out)
    engine = next(s for s in report["stages"] if s["name"] == "engine")
    assert engine["outcome"] == "built" and engine["digest"] == genuine.digest != evil_digest
    refused = [r for r in read_audit(victim) if r.action == "refused"]
    assert len(refused) == 1 and refused[0].reason.startswith("build refused") and refused[0].to_digest == evil_digest
    assert "unsigned" in refused[0].reason
    # The rebuilt entry is the genuine one, and it is no longer marked as pulled.
    assert Store.open(victim).get("engine", genuine.key, verify=True).digest == genuine.digest
    code, out, err = cli("build", str(spec), "--policy", str(policy), "--json")
    assert code == 0 and all(s["outcome"] == "hit" for s in json.loads(out)["stages"] if s.get("key")), err
    assert len([r for r in read_audit(victim) if r.action == "refused"]) == 1


def test_a_signed_pulled_entry_is_a_cache_hit_under_the_policy(built, registry_env, tmp_path: Path, cli, monkeypatch) -> None:
    base, spec, store_root, _ = built
    key, policy = _release_key(tmp_path)
    store = Store.open(store_root)
    engine = next(store.entries("engine"))
    checkpoint = next(store.entries("checkpoint"))
    url = registry_env.url("signed/engines")
    for entry in (checkpoint, engine):
        code, _, err = cli("cache", "push", f"{entry.kind}/{entry.key}", "--to", url, "--sign", str(tmp_path / "release.key"),
                           "--store", str(store_root))
        assert code == 0, err
    victim = tmp_path / "victim"
    monkeypatch.setenv("TRTPIPE_HOME", str(victim))
    # The build consults the registry (the remote cache), pulls both through the trust gate, and reuses them.
    code, out, err = cli("build", str(spec), "--store", url, "--policy", str(policy), "--json")
    assert code == 0, err
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert stages["checkpoint"]["outcome"] == "pulled" and stages["engine"]["outcome"] == "pulled", stages
    assert stages["engine"]["digest"] == engine.digest
    assert "verified" in err and "trusted key release" in err
    # A later build with the local store finds them as hits, judged again (their signatures re-checked): no rebuild.
    code, out, err = cli("build", str(spec), "--policy", str(policy), "--json")
    assert code == 0, err
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert stages["engine"]["outcome"] == "hit" and "signed by trusted key release" in stages["engine"]["detail"]
    assert not [r for r in read_audit(victim) if r.action == "refused"]
