"""Release keys (load, sign, verify, key id) and the trust policy (load, rules, verdicts, errors)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trtpipe.errors import InvalidInput
from trtpipe import signing_keys as K
from trtpipe.release.policy import allows_hand_recorded, load_policy, policy_from
from trtpipe.settings import Settings
from trtpipe.stages import weight_file_rule


def _pair(tmp_path: Path, name: str) -> K.PrivateKey:
    key = K.generate_key()
    K.write_key_pair(key, tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
    return key


def test_key_id_is_sha256_of_der_spki_and_same_for_both_halves(tmp_path):
    key = _pair(tmp_path, "release")
    der = key.public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.key_id == hashlib.sha256(der).hexdigest()
    assert K.load_private_key(tmp_path / "release.key").key_id == key.key_id
    assert K.load_public_key(tmp_path / "release.pub").key_id == key.key_id
    assert (tmp_path / "release.key").stat().st_mode & 0o077 == 0


def test_sign_verify_bytes_and_tamper(tmp_path):
    key = _pair(tmp_path, "release")
    other = _pair(tmp_path, "other")
    pub = K.load_public_key(tmp_path / "release.pub")
    sig = K.sign_bytes(key, b"trail head 42")
    assert K.verify_bytes(pub, b"trail head 42", sig)
    assert not K.verify_bytes(pub, b"trail head 43", sig)
    assert not K.verify_bytes(K.load_public_key(tmp_path / "other.pub"), b"trail head 42", sig)
    assert K.verify_bytes(other.public, b"x", K.sign_bytes(other, b"x"))


def test_openssl_generated_key_loads(tmp_path):
    # the command ci/README.md gives
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(tmp_path / "k.pem")],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(tmp_path / "k.pem"), "-pubout", "-out", str(tmp_path / "k.pub")],
                   check=True, capture_output=True)
    assert K.load_private_key(tmp_path / "k.pem").key_id == K.load_public_key(tmp_path / "k.pub").key_id


def test_signing_key_from_setting_text_or_path(tmp_path):
    key = _pair(tmp_path, "release")
    pem_text = (tmp_path / "release.key").read_text()
    assert K.signing_key_source(None, None) is None
    assert K.signing_key_source("a.pem", "b.pem") == "a.pem"
    assert K.signing_key_source(None, "b.pem") == "b.pem"
    loaded = K.load_signing_key(pem_text)
    assert loaded.key_id == key.key_id and "TRTPIPE_SIGNING_KEY" in loaded.origin
    assert pem_text not in repr(loaded.origin)
    with loaded.pem_file() as path:
        assert path.stat().st_mode & 0o077 == 0
        assert K.load_private_key(path).key_id == key.key_id
    assert not path.exists()


@pytest.mark.parametrize("case", ["missing", "folder", "garbage", "wrong_curve", "rsa", "private_as_public"])
def test_bad_keys_are_one_line_errors(tmp_path, case):
    target = tmp_path / "k.pem"
    loader = K.load_private_key
    if case == "folder":
        target.mkdir()
    elif case == "garbage":
        target.write_text("hello\n")
    elif case == "wrong_curve":
        target.write_bytes(ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    elif case == "rsa":
        from cryptography.hazmat.primitives.asymmetric import rsa
        target.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    elif case == "private_as_public":
        _pair(tmp_path, "k")
        target = tmp_path / "k.key"
        loader = K.load_public_key
    with pytest.raises(InvalidInput) as info:
        loader(target)
    text = str(info.value)
    assert "\n" not in text and str(target) in text
    if case == "wrong_curve":
        assert "P-256" in text
    if case == "private_as_public":
        assert "private key" in text


def _policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(body)
    return path


def test_policy_rules_and_verdicts(tmp_path):
    release = _pair(tmp_path, "release")
    qa = _pair(tmp_path, "qa")
    stranger = K.generate_key()
    policy = load_policy(_policy(tmp_path, """
keys:
  release: release.pub
  qa: qa.pub
default:
  require_signature: true
channels:
  dev: {require_signature: false, allow_hand_recorded: true}
  prod: {signers: [release]}
"""))
    assert set(policy.trusted_key_ids()) == {release.key_id, qa.key_id}
    assert set(policy.trusted_key_ids("prod")) == {release.key_id}
    assert policy.trusted_key_ids("staging") == policy.trusted_key_ids()  # unlisted -> default
    assert allows_hand_recorded(policy, "dev") and not allows_hand_recorded(policy, "prod")
    assert not allows_hand_recorded(None, "dev")

    assert policy.judge([release.key_id], "prod").allowed
    refused = policy.judge([qa.key_id], "prod")
    assert not refused.allowed and "untrusted" in refused.reason and refused.untrusted_key_ids == (qa.key_id,)
    assert policy.judge([qa.key_id]).allowed
    unsigned = policy.judge([])
    assert not unsigned.allowed and unsigned.reason.startswith("unsigned")
    assert not policy.judge([stranger.key_id]).allowed
    assert policy.judge([], "dev").allowed


def test_policy_from_setting_or_flag(tmp_path):
    _pair(tmp_path, "release")
    path = _policy(tmp_path, "keys: {release: release.pub}\n")
    assert policy_from(None, None) is None
    assert policy_from(None, path).source == str(path)
    assert policy_from(str(path), tmp_path / "nope.yaml").source == str(path)


@pytest.mark.parametrize("body,field", [
    ("keys: {release: release.pub}\nchannels: {prod: {signers: [nobody]}}\n", "channels.prod.signers"),
    ("keys: {release: missing.pub}\n", "keys.release"),
    ("default: {require_signature: true}\n", "default.require_signature"),
    ("keys: {release: release.pub}\ndefault: {require_signatures: true}\n", "default.require_signatures"),
    ("keys: [release.pub]\n", "keys"),
    ("keys: {release: release.pub\n", ":"),
])
def test_policy_errors_name_file_and_field(tmp_path, body, field):
    _pair(tmp_path, "release")
    path = _policy(tmp_path, body)
    with pytest.raises(InvalidInput) as info:
        load_policy(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and field in text


def test_a_remote_without_the_pull_hook_is_refused_only_under_a_policy(tmp_path, monkeypatch):
    """A remote's pulls go through the gate it is opened with (nothing sets one on it afterwards); a kind of
    remote whose pulls cannot be judged is refused under a policy, and opened without one."""
    from trtpipe.errors import Untrusted
    from trtpipe.release.trust import PullGate, open_gated
    from trtpipe.store import remote as remotes
    from trtpipe.workspace import Workspace

    class Plain:  # a remote cache of the protocol whose pulls call no gate (it keeps no signatures)
        def __init__(self, url, _settings, _weights, gate) -> None:
            self.url, self.gate = url, gate

    monkeypatch.setitem(remotes.SCHEMES, "folder", remotes.RemoteKind(open=Plain, base_of=lambda ref: ref,
                                                                      judges_pulls=False))
    _pair(tmp_path, "release")
    policy = load_policy(_policy(tmp_path, "keys: {release: release.pub}\n"))
    settings = Settings.from_env()
    workspace = Workspace(tmp_path, settings=settings, weights=weight_file_rule)
    unjudged = PullGate(workspace, None)
    assert isinstance(open_gated(workspace, "folder:///x", unjudged), Plain)  # no policy: nothing to enforce
    with pytest.raises(Untrusted) as info:
        open_gated(workspace, "folder:///x", PullGate(workspace, policy))
    assert "folder:///x cannot verify signatures" in str(info.value)
    gate = PullGate(workspace, policy)
    assert open_gated(workspace, "oci://127.0.0.1:1/cache", gate).gate is gate
    assert open_gated(workspace, "oci://127.0.0.1:1/cache:tag", gate).gate is gate
    assert remotes.open_remote("oci://127.0.0.1:1/cache", settings, weight_file_rule()).gate is None
