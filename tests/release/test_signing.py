"""Issue 18, signing and trust (real registry: Debian's docker-registry, which has no referrers API, so the
tag-schema fallback carries the signatures): sign at push, verify at pull against the trust policy, refuse
a modified model.py and an untrusted key at pull and at serve, audit every refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtpipe import signing_keys as K
from trtpipe.release.audit import read_audit
from trtpipe.store import oci, referrers, signatures
from trtpipe.store.keys import canonical_json
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)

MODEL_PY = b"import json\n\nclass TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
EVIL_PY = b"import os; os.system('id > /tmp/pwned')\n\nclass TritonPythonModel:\n    pass\n"


def _keys(tmp_path: Path) -> dict[str, K.PrivateKey]:
    out = {}
    for name in ("release", "stranger"):
        key = K.generate_key()
        K.write_key_pair(key, tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
        out[name] = key
    return out


def _policy(tmp_path: Path, body: str | None = None) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(body or f"keys:\n  release: {tmp_path / 'release.pub'}\ndefault:\n  require_signature: true\n")
    return path


def _repository(home: Path, key: str = "r" * 64, model_py: bytes = MODEL_PY):
    """A small repository artifact with Python model code, committed into the real store."""
    from trtpipe.store.local import Store

    store = Store.open(home)
    with store.building("repository", key) as b:
        if b.existing is not None:
            return b.existing
        (b.dir / "preprocessing" / "1").mkdir(parents=True)
        (b.dir / "preprocessing" / "1" / "model.py").write_bytes(model_py)
        (b.dir / "preprocessing" / "config.pbtxt").write_text('name: "preprocessing"\nbackend: "python"\n')
        return b.commit(inputs={"name": "tiny-llama", "target": {"gpu": "cpu-reference"}, "seed": "s"})


def _push_as(registry, repository: str, kind: str, key: str, files: dict[str, bytes], inputs: dict, tag: str) -> tuple[str, bytes]:
    """What someone with registry write access and no release key can push: any files, under any key."""
    import hashlib

    client = oci.OciClient(registry.host, settings=Settings.from_env())
    items = [{"path": rel, "mode": "0644", "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
             for rel, body in sorted(files.items())]
    config = canonical_json({"manifest_version": 2, "kind": kind, "key": key, "inputs": inputs, "files": items})
    layers = [{"mediaType": oci.FILE_MEDIA_TYPE, "digest": client.push_bytes(repository, body), "size": len(body),
               "annotations": {oci.TITLE_ANNOTATION: rel}} for rel, body in sorted(files.items())]
    manifest = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST_MEDIA_TYPE,
                "config": {"mediaType": oci.config_media_type(kind), "digest": client.push_bytes(repository, config),
                           "size": len(config)},
                "layers": layers,
                "annotations": {"org.trtpipe.kind": kind, "org.trtpipe.key": key,
                                oci.ARTIFACT_DIGEST_ANNOTATION: oci.sha256_bytes(config)}}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    client.put_manifest(repository, tag, body)
    return f"oci://{registry.host}/{repository}:{tag}", body


def _files_of(entry) -> dict[str, bytes]:
    return {item["path"]: (entry.path / item["path"]).read_bytes() for item in entry.files}


def _refusals(home: Path) -> list:
    return [r for r in read_audit(home) if r.action == "refused"]


def test_sign_push_pull_verify(registry_env, isolated_home: Path, tmp_path: Path, cli, monkeypatch) -> None:
    keys = _keys(tmp_path)
    entry = _repository(isolated_home)
    url = registry_env.url("signed/repos")
    code, out, err = cli("cache", "push", entry.key, "--to", url, "--tag", "v1", "--sign", str(tmp_path / "release.key"), "--json")
    assert code == 0, err
    pushed = json.loads(out)
    assert pushed["signature"]["key_id"] == keys["release"].key_id
    assert pushed["signature"]["referrers"] == "tag-schema"  # docker-registry 2.8 answers 404 to the referrers API
    # The fallback index under sha256-<hex> lists the signature and the provenance, each with its subject.
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    listed = referrers.list_referrers(client, "signed/repos", pushed["oci_digest"])
    assert sorted(r.artifact_type for r in listed) == ["application/vnd.dev.sigstore.bundle.v0.3+json",
                                                       "application/vnd.in-toto+json"]
    for item in listed:
        manifest, _ = referrers.fetch_payload(client, "signed/repos", item)
        assert referrers.subject_of(manifest) == pushed["oci_digest"]
    # Another machine, under the policy: verified before it enters the store.
    other = tmp_path / "other-home"
    monkeypatch.setenv("TRTPIPE_HOME", str(other))
    code, out, err = cli("cache", "pull", url + ":v1", "--policy", str(_policy(tmp_path)), "--json")
    assert code == 0, err
    assert "verified" in err and "trusted key release" in err
    assert json.loads(out)["artifact_digest"] == entry.digest
    record = signatures.read_record(other, entry.digest)
    assert record is not None and record["pulled_from"].endswith(pushed["oci_digest"]) and len(record["bundles"]) == 1
    # The signature covers every file: the bundle's statement lists each with its sha256, and manifest.json.
    from trtpipe.release.signing import signed_files

    listed_files = signed_files(record["bundles"][0]["bundle"].encode())
    assert {p: d for p, d in listed_files.items() if p != "manifest.json"} == {i["path"]: i["sha256"] for i in entry.files}
    assert listed_files["manifest.json"] == entry.digest.removeprefix("sha256:")
    # Serving it under the same policy passes the trust check (then fails only for lack of a real repository).
    from trtpipe.release.policy import load_policy
    from trtpipe.release.trust import judge_entry
    from trtpipe.store.local import Store

    pulled = Store.open(other).find(entry.digest)
    assert judge_entry(pulled, load_policy(_policy(tmp_path)), None, other).allowed
    assert not _refusals(other)


@pytest.mark.parametrize("variant", ["unsigned", "replayed signature", "untrusted key"])
def test_modified_model_py_refused_at_pull_and_serve(registry_env, isolated_home: Path, tmp_path: Path, cli,
                                                     monkeypatch, variant: str) -> None:
    keys = _keys(tmp_path)
    entry = _repository(isolated_home)
    url = registry_env.url(f"victim/{variant.replace(' ', '-')}")
    code, out, err = cli("cache", "push", entry.key, "--to", url, "--sign", str(tmp_path / "release.key"), "--json")
    assert code == 0, err
    genuine = json.loads(out)
    # The attacker: registry write access, no release key. model.py changed, same kind and key.
    files = _files_of(entry)
    files["preprocessing/1/model.py"] = EVIL_PY
    repository = url.split("/", 3)[3]
    evil_url, evil_body = _push_as(registry_env, repository, "repository", entry.key, files, entry.inputs, "evil")
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    if variant == "replayed signature":
        # The genuine bundle, attached to the modified artifact (what a copy of the referrer does).
        from trtpipe.release.signing import KEY_ID_ANNOTATION, SIGNATURE_ARTIFACT_TYPE
        from trtpipe.release.trust import fetch_signatures

        bundle = fetch_signatures(client, repository, genuine["oci_digest"]).bundles[0]["bundle"].encode()
        referrers.attach(client, repository, evil_body, artifact_type=SIGNATURE_ARTIFACT_TYPE, payload=bundle,
                         payload_media_type=SIGNATURE_ARTIFACT_TYPE, annotations={KEY_ID_ANNOTATION: keys["release"].key_id})
    elif variant == "untrusted key":
        from trtpipe.release.signing import KEY_ID_ANNOTATION, SIGNATURE_ARTIFACT_TYPE, sign_folder

        staged = tmp_path / "evil"
        for rel, body in files.items():
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            (staged / rel).write_bytes(body)
        config = client.fetch_blob_bytes(repository, json.loads(evil_body)["config"]["digest"],
                                         json.loads(evil_body)["config"]["size"])
        (staged / "manifest.json").write_bytes(config)
        referrers.attach(client, repository, evil_body, artifact_type=SIGNATURE_ARTIFACT_TYPE,
                         payload=sign_folder(staged, keys["stranger"]), payload_media_type=SIGNATURE_ARTIFACT_TYPE,
                         annotations={KEY_ID_ANNOTATION: keys["stranger"].key_id})
    victim = tmp_path / "victim-home"
    monkeypatch.setenv("TRTPIPE_HOME", str(victim))
    policy = _policy(tmp_path)
    code, _, err = cli("cache", "pull", evil_url, "--policy", str(policy))
    assert code == 1 and "pull refused" in err and "Traceback" not in err, err
    assert {"unsigned": "unsigned", "replayed signature": "model.py",
            "untrusted key": "none of its 1 signature(s) verifies"}[variant] in err
    assert keys["stranger"].key_id[:16] not in err  # the key id an annotation claims is never named as the signer
    assert not (victim / "repository" / entry.key).exists()  # nothing was installed
    refused = _refusals(victim)
    assert len(refused) == 1 and refused[0].reason.startswith("pull refused") and refused[0].ref == evil_url.split(":evil")[0] + "@" + oci.sha256_bytes(evil_body)
    # Pulled without a policy (it goes in, said to be unchecked), it is then refused at serve.
    code, _, err = cli("cache", "pull", evil_url)
    assert code == 0, err
    served = victim / "repository" / entry.key
    assert (served / "preprocessing" / "1" / "model.py").read_bytes() == EVIL_PY
    monkeypatch.setenv("TRTPIPE_POLICY", str(policy))
    code, _, err = cli("serve", str(served))
    assert code == 1 and "serve refused" in err and "Traceback" not in err, err
    refused = _refusals(victim)
    assert len(refused) == 2 and refused[1].reason.startswith("serve refused")
    assert refused[1].to_digest == oci.sha256_bytes((served / "manifest.json").read_bytes()) != entry.digest


def test_a_file_changed_after_a_trusted_pull_is_refused_at_serve(registry_env, isolated_home: Path, tmp_path: Path,
                                                                  cli, monkeypatch) -> None:
    _keys(tmp_path)
    entry = _repository(isolated_home)
    url = registry_env.url("victim/after-pull")
    assert cli("cache", "push", entry.key, "--to", url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))[0] == 0
    victim = tmp_path / "victim-home"
    monkeypatch.setenv("TRTPIPE_HOME", str(victim))
    monkeypatch.setenv("TRTPIPE_POLICY", str(_policy(tmp_path)))
    assert cli("cache", "pull", url + ":v1")[0] == 0
    model_py = victim / "repository" / entry.key / "preprocessing" / "1" / "model.py"
    os.chmod(model_py, 0o644)
    model_py.write_bytes(EVIL_PY)
    code, _, err = cli("serve", str(victim / "repository" / entry.key))
    assert code == 1 and "tampered" in err and "model.py" in err, err
    assert [r.reason.split(":")[0] for r in _refusals(victim)] == ["serve refused"]


def test_a_folder_outside_any_store_is_refused_at_serve_under_a_policy(isolated_home: Path, tmp_path: Path, cli) -> None:
    _keys(tmp_path)
    folder = tmp_path / "loose-repo"
    folder.mkdir()
    code, _, err = cli("serve", str(folder), "--policy", str(_policy(tmp_path)))
    assert code == 1 and "carries no signature" in err
    assert len(_refusals(isolated_home)) == 1


def test_keyless_signing_without_network_is_one_clear_line(registry_env, isolated_home: Path, tmp_path: Path, cli) -> None:
    entry = _repository(isolated_home)
    code, _, err = cli("cache", "push", entry.key, "--to", registry_env.url("keyless/x"), "--sign", "sigstore")
    assert code == 3 and "keyless sigstore signing failed" in err and "OIDC" in err and "Traceback" not in err, err
    assert oci.OciClient(registry_env.host, settings=Settings.from_env()).get_manifest("keyless/x", f"repository-{entry.key}") is None  # nothing pushed


def test_bad_key_fails_before_the_push(registry_env, isolated_home: Path, tmp_path: Path, cli) -> None:
    entry = _repository(isolated_home)
    (tmp_path / "bad.key").write_text("not a key\n")
    code, _, err = cli("cache", "push", entry.key, "--to", registry_env.url("badkey/x"), "--sign", str(tmp_path / "bad.key"))
    assert code == 2 and str(tmp_path / "bad.key") in err
    assert oci.OciClient(registry_env.host, settings=Settings.from_env()).get_manifest("badkey/x", f"repository-{entry.key}") is None


def test_signing_key_from_the_environment(registry_env, isolated_home: Path, tmp_path: Path, cli, monkeypatch) -> None:
    keys = _keys(tmp_path)
    entry = _repository(isolated_home)
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", (tmp_path / "release.key").read_text())  # the PEM text, as a CI secret
    code, out, err = cli("cache", "push", entry.key, "--to", registry_env.url("envkey/x"), "--json")
    assert code == 0, err
    assert json.loads(out)["signature"]["key_id"] == keys["release"].key_id
    assert (tmp_path / "release.key").read_text() not in out + err


def test_promote_into_a_channel_that_requires_signatures(registry_env, isolated_home: Path, tmp_path: Path, cli) -> None:
    keys = _keys(tmp_path)
    policy = _policy(tmp_path, f"keys:\n  release: {tmp_path / 'release.pub'}\ndefault:\n  require_signature: false\n"
                               "channels:\n  prod: {require_signature: true, signers: [release]}\n")
    unsigned = _repository(isolated_home, key="u" * 64)
    signed = _repository(isolated_home, key="s" * 64, model_py=MODEL_PY + b"# v2\n")
    # Not even a forced promotion skips the signature; the refusal lists what is missing and is audited.
    code, _, err = cli("promote", unsigned.digest, "--to", "prod", "--force", "--reason", "hotfix", "--policy", str(policy))
    assert code == 1 and "promote refused" in err and "unsigned" in err and "a signature by release" in err, err
    refused = _refusals(isolated_home)
    assert len(refused) == 1 and refused[0].channel == "prod" and refused[0].to_digest == unsigned.digest
    assert refused[0].model == "tiny-llama" and refused[0].target == "cpu-reference"
    # A channel whose rule requires nothing is not affected.
    code, _, err = cli("promote", unsigned.digest, "--to", "dev", "--force", "--reason", "try", "--policy", str(policy))
    assert code == 0, err
    # Signed (at push) by the key the channel trusts: promoted.
    assert cli("cache", "push", signed.key, "--to", registry_env.url("promo/x"), "--sign", str(tmp_path / "release.key"))[0] == 0
    code, _, err = cli("promote", signed.digest, "--to", "prod", "--force", "--reason", "release", "--policy", str(policy))
    assert code == 0, err
    # Signed by a key the channel does not trust: refused, naming the keys tried (which key made the signature is
    # not known: the key id its annotation claims is the pusher's word, so it is not named).
    other = _repository(isolated_home, key="o" * 64, model_py=MODEL_PY + b"# v3\n")
    assert cli("cache", "push", other.key, "--to", registry_env.url("promo/x"), "--sign", str(tmp_path / "stranger.key"))[0] == 0
    code, _, err = cli("promote", other.digest, "--to", "prod", "--force", "--reason", "r", "--policy", str(policy))
    assert code == 1 and "not signed by any key that channel 'prod'" in err and "(release)" in err, err
    assert keys["stranger"].key_id[:16] not in err
    assert len(_refusals(isolated_home)) == 2


def test_referrers_api_when_the_registry_has_it(registry_env, isolated_home: Path, cli, monkeypatch) -> None:
    """Where GET /v2/<repo>/referrers/<digest> answers (the docker-registry here does not: 404), the answer is
    used and no fallback tag is written. The API's answer is emulated at the one function that reads it."""
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    entry = _repository(isolated_home)
    code, out, err = cli("cache", "push", entry.key, "--to", registry_env.url("api/x"), "--json")
    assert code == 0, err
    subject = client.get_manifest("api/x", json.loads(out)["oci_digest"])
    real_get = referrers._get
    answered: dict[str, bytes] = {}

    def api_get(client_, path, accept, what, repository):
        if "/referrers/" in path:
            return answered.get("index", referrers._index([]))
        return real_get(client_, path, accept, what, repository)

    monkeypatch.setattr(referrers, "_get", api_get)
    digest = referrers.attach(client, "api/x", subject, artifact_type="application/example", payload=b"x",
                              payload_media_type="application/example", annotations={})
    tag_path = f"/v2/api/x/manifests/{referrers.fallback_tag(oci.sha256_bytes(subject))}"
    assert real_get(client, tag_path, referrers.INDEX_MEDIA_TYPE, "read", "api/x") is None
    answered["index"] = referrers._index([{"mediaType": oci.OCI_MANIFEST_MEDIA_TYPE, "digest": digest, "size": 1,
                                           "artifactType": "application/example"}])
    assert [r.digest for r in referrers.list_referrers(client, "api/x", oci.sha256_bytes(subject))] == [digest]
    # And without the API (the real answer, 404): the fallback tag is written and read.
    monkeypatch.setattr(referrers, "_get", real_get)
    again = referrers.attach(client, "api/x", subject, artifact_type="application/example", payload=b"y",
                             payload_media_type="application/example", annotations={})
    assert json.loads(real_get(client, tag_path, referrers.INDEX_MEDIA_TYPE, "read", "api/x"))["manifests"][0]["digest"] == again
    assert [r.digest for r in referrers.list_referrers(client, "api/x", oci.sha256_bytes(subject))] == [again]
