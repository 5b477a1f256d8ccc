"""Issue 28, attacks 4, 5 and 8 (real registry: Debian's docker-registry, referrers through the tag schema):
a version tag re-pointed at another signed manifest is refused at pull, a registry channel tag moved back is
reported by `channels --verify`, a junk referrer does not block a genuine pull, and trust status names only
the signer a signature verified against."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtpipe import signing_keys as K
from trtpipe.results import ResultsLog
from trtpipe.store import oci, referrers
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)


def _tag_body(client: oci.OciClient, repository: str, tag: str) -> bytes:
    body = client.get_manifest(repository, tag)
    assert body is not None
    return body


def test_a_registry_channel_tag_moved_back_is_reported(registry_env, store_entry, cli) -> None:
    home = Path(os.environ["TRTPIPE_HOME"])
    url = registry_env.url("bound/channel")
    refs = []
    for key, seed in (("1a1a1a1a1a1a1a1a", "p"), ("1b1b1b1b1b1b1b1b", "q")):
        entry = store_entry(home, key, seed=seed)
        code, out, _ = cli("cache", "push", entry.key, "--to", url, "--json")
        assert code == 0
        refs.append(json.loads(out))
        ResultsLog(home).record(entry.digest, "smoke", True, {"checks": 6})
    for pushed in refs:
        assert cli("promote", pushed["ref"], "--to", "prod")[0] == 0
    assert cli("channels", "--verify")[0] == 0
    # Anyone who can push moves the prod tag back to v1's manifest.
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    client.put_manifest("bound/channel", "tiny-llama.cpu-reference.prod", _tag_body(client, "bound/channel", refs[0]["oci_digest"]))
    code, out, _ = cli("channels", "--verify")
    assert code == 1, out
    assert "tiny-llama.cpu-reference.prod" in out and refs[0]["artifact_digest"] in out and refs[1]["artifact_digest"] in out


# --------------------------------------------------------------------------- helpers


def _keys(tmp_path: Path) -> dict[str, K.PrivateKey]:
    out = {}
    for name in ("release", "stranger"):
        out[name] = K.generate_key()
        K.write_key_pair(out[name], tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
    return out


def _policy(tmp_path: Path, body: str | None = None) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(body or f"keys:\n  release: {tmp_path / 'release.pub'}\ndefault:\n  require_signature: true\n")
    return str(path)


def _push(cli, entry, url: str, *extra: str) -> dict:
    code, out, err = cli("cache", "push", entry.key, "--to", url, *extra, "--json")
    assert code == 0, err
    return json.loads(out)


def _elsewhere(monkeypatch, tmp_path: Path, name: str) -> Path:
    home = tmp_path / name
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    return home


def _refused_pulls(home: Path) -> list:
    from trtpipe.release.audit import read_audit

    return [r for r in read_audit(home) if r.action == "refused" and (r.reason or "").startswith("pull refused")]


# --------------------------------------------------------------------------- attack 5: a malformed referrer


def test_a_malformed_referrer_does_not_block_the_genuine_pull(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    entry = store_entry(home, "5a" * 8, seed="genuine")
    url = registry_env.url("bound/junkref")
    pushed = _push(cli, entry, url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    subject = _tag_body(client, "bound/junkref", pushed["oci_digest"])
    # Anyone who can push: a signature that is junk text, a referrer manifest with no layer, and an index entry
    # naming a manifest that is not there.
    junk = referrers.attach(client, "bound/junkref", subject, artifact_type="application/vnd.dev.sigstore.bundle.v0.3+json",
                            payload=b"not a bundle at all", payload_media_type="application/vnd.dev.sigstore.bundle.v0.3+json",
                            annotations={})
    layerless = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST_MEDIA_TYPE,
                 "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                 "config": {"mediaType": referrers.EMPTY_MEDIA_TYPE, "digest": oci.sha256_bytes(b"{}"), "size": 2},
                 "layers": [], "subject": {"mediaType": oci.OCI_MANIFEST_MEDIA_TYPE, "digest": pushed["oci_digest"],
                                           "size": len(subject)}}
    body = json.dumps(layerless, sort_keys=True).encode()
    client.push_bytes("bound/junkref", b"{}")
    layerless_digest = client.put_manifest("bound/junkref", oci.sha256_bytes(body), body)
    index_tag = referrers.fallback_tag(pushed["oci_digest"])
    _, listed = referrers._query(client, "bound/junkref", pushed["oci_digest"])
    listed.append({"mediaType": oci.OCI_MANIFEST_MEDIA_TYPE, "digest": layerless_digest, "size": len(body),
                   "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"})
    client.put_manifest("bound/junkref", index_tag, referrers._index(listed), media_type=referrers.INDEX_MEDIA_TYPE)
    # A provenance referrer holding junk.
    referrers.attach(client, "bound/junkref", subject, artifact_type="application/vnd.in-toto+json", payload=b"{junk",
                     payload_media_type="application/vnd.dsse.envelope.v1+json", annotations={})
    # One more referrer, attached and then deleted: the index still lists it.
    gone = referrers.attach(client, "bound/junkref", subject, artifact_type="application/vnd.dev.sigstore.bundle.v0.3+json",
                            payload=b"soon gone", payload_media_type="application/vnd.dev.sigstore.bundle.v0.3+json",
                            annotations={})
    with client._request("DELETE", f"/v2/bound/junkref/manifests/{gone}", what="delete", repository="bound/junkref") as response:
        assert response.status_code == 202

    # Under the policy: the genuine signature verifies, the broken referrers are skipped, each named.
    other = _elsewhere(monkeypatch, tmp_path, "deploy")
    code, out, err = cli("cache", "pull", url + ":v1", "--policy", _policy(tmp_path), "--json")
    assert code == 0, err
    assert json.loads(out)["artifact_digest"] == entry.digest
    assert f"referrer {layerless_digest} skipped" in err and f"referrer {gone} skipped" in err, err
    assert "verified" in err and "trusted key release" in err
    assert not _refused_pulls(other)
    code, out, err = cli("cache", "show", url + ":v1", "--provenance", "--policy", _policy(tmp_path), "--json")
    assert code == 0 and json.loads(out)["verified"], err
    # Without a policy too.
    _elsewhere(monkeypatch, tmp_path, "laptop")
    code, _, err = cli("cache", "pull", url + ":v1")
    assert code == 0, err
    assert f"referrer {gone} skipped" in err
    assert junk  # the junk bundle was listed too: it simply verifies under no key


# --------------------------------------------------------------------------- attack 4: tags bound


def test_a_re_pointed_version_tag_is_refused_at_pull(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    url = registry_env.url("bound/versions")
    v1 = _push(cli, store_entry(home, "4a" * 8, seed="one"), url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))
    v2 = _push(cli, store_entry(home, "4b" * 8, seed="two"), url, "--tag", "v2", "--sign", str(tmp_path / "release.key"))
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    # Anyone who can push re-points v2 at v1's (genuinely signed) manifest.
    client.put_manifest("bound/versions", "v2", _tag_body(client, "bound/versions", v1["oci_digest"]))
    deploy = _elsewhere(monkeypatch, tmp_path, "deploy")
    policy = _policy(tmp_path)
    code, out, err = cli("cache", "pull", url + ":v2", "--policy", policy)
    assert code == 1, out
    line = err.strip().splitlines()[0]
    assert "pull refused" in line and f"{url}:v2" in line and "tag v1" in line and "re-pointed" in line, err
    assert "Traceback" not in err
    from trtpipe.store.local import Store

    assert Store.open(deploy).peek("engine", "4a" * 8) is None  # nothing installed
    assert len(_refused_pulls(deploy)) == 1
    # The genuine tags and the digest still pull.
    code, out, err = cli("cache", "pull", url + ":v1", "--policy", policy, "--json")
    assert code == 0 and json.loads(out)["artifact_digest"] == v1["artifact_digest"], err
    code, out, err = cli("cache", "pull", url + "@" + v2["oci_digest"], "--policy", policy, "--json")
    assert code == 0 and json.loads(out)["artifact_digest"] == v2["artifact_digest"], err


def test_a_signature_from_before_tags_were_bound_pulls_by_digest_only(registry_env, store_entry, cli, tmp_path,
                                                                       monkeypatch) -> None:
    from trtpipe.release import trust

    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    url = registry_env.url("bound/legacy")
    with monkeypatch.context() as old_format:
        old_format.setattr(trust, "bind_tags", lambda statement, tags: statement)  # the statement as it was signed before
        pushed = _push(cli, store_entry(home, "4c" * 8, seed="old"), url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))
    _elsewhere(monkeypatch, tmp_path, "deploy")
    policy = _policy(tmp_path)
    code, _, err = cli("cache", "pull", url + ":v1", "--policy", policy)
    assert code == 1 and "names none of its tags" in err and pushed["oci_digest"] in err, err
    code, _, err = cli("cache", "pull", url + "@" + pushed["oci_digest"], "--policy", policy)
    assert code == 0, err
    # Its key tag is bound by the signature over manifest.json (which names kind and key): it pulls.
    _elsewhere(monkeypatch, tmp_path, "builder")
    code, _, err = cli("cache", "pull", url + ":engine-" + "4c" * 8, "--policy", policy)
    assert code == 0, err
    # Signing it again binds its tags (the same manifest, the tag unmoved).
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    _push(cli, store_entry(home, "4c" * 8, seed="old"), url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))
    _elsewhere(monkeypatch, tmp_path, "deploy2")
    code, _, err = cli("cache", "pull", url + ":v1", "--policy", policy)
    assert code == 0, err


def test_a_channel_ref_is_judged_by_the_channels_rule(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    url = registry_env.url("bound/rule")
    entry = store_entry(home, "4d" * 8, seed="unsigned")
    pushed = _push(cli, entry, url)  # unsigned
    ResultsLog(home).record(entry.digest, "smoke", True, {"checks": 6})
    assert cli("promote", pushed["ref"], "--to", "prod")[0] == 0  # no policy in this shell
    policy = _policy(tmp_path, f"keys:\n  release: {tmp_path / 'release.pub'}\ndefault:\n  require_signature: false\n"
                               "channels:\n  prod: {require_signature: true}\n")
    _elsewhere(monkeypatch, tmp_path, "deploy")
    code, _, err = cli("cache", "pull", url + ":tiny-llama.cpu-reference.prod", "--policy", policy)
    assert code == 1 and "pull refused" in err and "channel 'prod'" in err, err
    code, _, err = cli("cache", "pull", pushed["ref"], "--policy", policy)  # the default rule asks for nothing
    assert code == 0, err


# --------------------------------------------------------------------------- attack 8: status from verification


def test_status_names_only_a_verified_signer(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    """An attacker signs with their own key and claims the release key's id in the annotation; another
    artifact carries only junk as its signature. Neither the pull, nor the page without a policy, nor a
    refusal under one calls them signed by the release key."""
    from trtpipe.release.signing import KEY_ID_ANNOTATION, SIGNATURE_ARTIFACT_TYPE
    from trtpipe.release.trust import sign_entry

    home = Path(os.environ["TRTPIPE_HOME"])
    keys = _keys(tmp_path)
    release_id = keys["release"].key_id
    url = registry_env.url("bound/status")
    gates = {"dev": {"smoke": False}}
    forged = store_entry(home, "8a" * 8, seed="forged", gates=gates)
    junked = store_entry(home, "8b" * 8, seed="junk", model="junk-llama", gates=gates)
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    for entry, payload in ((forged, sign_entry(forged, keys["stranger"], tmp_path / "scratch")), (junked, b"junk text")):
        pushed = _push(cli, entry, url, "--tag", entry.key[:4])
        referrers.attach(client, "bound/status", _tag_body(client, "bound/status", pushed["oci_digest"]),
                         artifact_type=SIGNATURE_ARTIFACT_TYPE, payload=payload, payload_media_type=SIGNATURE_ARTIFACT_TYPE,
                         annotations={KEY_ID_ANNOTATION: release_id})
    workspace = _elsewhere(monkeypatch, tmp_path, "workspace")
    for entry in (forged, junked):
        code, _, err = cli("cache", "pull", f"{url}:{entry.key[:4]}")
        assert code == 0, err
        assert release_id[:16] not in err and "signed by" not in err, err
        assert cli("promote", entry.digest, "--to", "dev")[0] == 0
    assert "signature present, not verified" in cli("cache", "pull", f"{url}:{forged.key[:4]}")[2]
    assert "malformed" in cli("cache", "pull", f"{url}:{junked.key[:4]}")[2]

    def page(policy: str | None) -> tuple[dict, str]:
        if policy is None:
            monkeypatch.delenv("TRTPIPE_POLICY", raising=False)
        else:
            monkeypatch.setenv("TRTPIPE_POLICY", policy)
        out_dir = tmp_path / f"page-{policy is not None}"
        code, out, err = cli("report", "--out", str(out_dir), "--json")
        assert code == 0, err
        return {c["digest"]: c for c in json.loads(out)["channels"]}, (out_dir / "index.html").read_text()

    rows, html = page(None)
    assert (rows[forged.digest]["signature"], rows[forged.digest]["signer"]) == ("unverified", None)
    assert (rows[junked.digest]["signature"], rows[junked.digest]["signer"]) == ("malformed", None)
    assert release_id[:16] not in html and "badge signed" not in html
    assert "signature present, not verified" in html
    rows, html = page(_policy(tmp_path))
    assert (rows[forged.digest]["signature"], rows[forged.digest]["signer"]) == ("untrusted", None)
    assert rows[junked.digest]["signature"] == "malformed"
    assert release_id[:16] not in html and "badge signed" not in html
    # A refusal names the keys tried, not the key the annotation claims.
    code, _, err = cli("serve", str(_entry_path(workspace, forged)), "--policy", _policy(tmp_path))
    assert code != 0 and "refused" in err and release_id[:16] not in err, err


def _entry_path(home: Path, entry) -> Path:
    from trtpipe.store.local import Store

    return Path(Store.open(home).find(entry.digest).path)


def test_a_channel_tag_moved_back_is_refused_at_pull(registry_env, store_entry, cli, tmp_path, monkeypatch) -> None:
    """A deploy host pulling the prod tag under the policy gets what the channel's signed trail says, or nothing."""
    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    from trtpipe.signing_keys import ReleaseKey

    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))  # pushes, results and trail heads signed
    url = registry_env.url("bound/prodtag")
    refs = []
    for key, seed in (("4e" * 8, "one"), ("4f" * 8, "two")):
        entry = store_entry(home, key, seed=seed)
        refs.append(_push(cli, entry, url, "--tag", seed))
        ResultsLog(home, ReleaseKey(K.load_signing_key(str(tmp_path / "release.key")))).record(entry.digest, "smoke", True, {"checks": 6})
    for pushed in refs:
        code, _, err = cli("promote", pushed["ref"], "--to", "prod")
        assert code == 0, err
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY")
    prod = url + ":tiny-llama.cpu-reference.prod"
    policy = _policy(tmp_path)
    _elsewhere(monkeypatch, tmp_path, "deploy")
    code, out, err = cli("cache", "pull", prod, "--policy", policy, "--json")
    assert code == 0 and json.loads(out)["artifact_digest"] == refs[1]["artifact_digest"], err
    # Anyone who can push moves the prod tag back to the older, genuinely signed manifest.
    client = oci.OciClient(registry_env.host, settings=Settings.from_env())
    client.put_manifest("bound/prodtag", "tiny-llama.cpu-reference.prod", _tag_body(client, "bound/prodtag", refs[0]["oci_digest"]))
    deploy = _elsewhere(monkeypatch, tmp_path, "deploy2")
    code, _, err = cli("cache", "pull", prod, "--policy", policy)
    assert code == 1, err
    line = err.strip().splitlines()[0]
    assert "pull refused" in line and refs[0]["artifact_digest"] in line and refs[1]["artifact_digest"] in line, err
    assert len(_refused_pulls(deploy)) == 1
    # And the workspace that promoted reports it, with the release key set as well as without.
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and refs[0]["artifact_digest"] in out
    monkeypatch.setenv("TRTPIPE_SIGNING_KEY", str(tmp_path / "release.key"))
    code, out, _ = cli("channels", "--verify")
    assert code == 1 and "tiny-llama.cpu-reference.prod: the channel tag names " + refs[0]["artifact_digest"] in out, out


def test_a_channel_tag_whose_trail_is_unsigned_is_refused_at_pull(registry_env, store_entry, cli, tmp_path,
                                                                   monkeypatch) -> None:
    """Promoted without the release key, the trail's head is unsigned: anyone who can push could rewrite it along
    with the tag, so under a policy that requires signatures the channel tag is not taken on its word."""
    home = Path(os.environ["TRTPIPE_HOME"])
    _keys(tmp_path)
    url = registry_env.url("bound/unsignedtrail")
    entry = store_entry(home, "4g".replace("g", "0") * 8, seed="signed")
    pushed = _push(cli, entry, url, "--tag", "v1", "--sign", str(tmp_path / "release.key"))
    ResultsLog(home).record(entry.digest, "smoke", True, {"checks": 6})
    assert cli("promote", pushed["ref"], "--to", "prod")[0] == 0  # no key: the trail head is unsigned
    _elsewhere(monkeypatch, tmp_path, "deploy")
    code, _, err = cli("cache", "pull", url + ":tiny-llama.cpu-reference.prod", "--policy", _policy(tmp_path))
    assert code == 1 and "pull refused" in err and "not signed by the release key" in err, err
    code, _, err = cli("cache", "pull", url + ":v1", "--policy", _policy(tmp_path))
    assert code == 0, err
