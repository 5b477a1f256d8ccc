"""Issue 28, attack 7: the trust policy belongs to the workspace, and rollback obeys it.

As found: `rollback` put an unsigned artifact back into prod (exit 0), and the policy was only an environment
setting: the same forced promote from a shell without TRTPIPE_POLICY passed. Now `trtpipe policy set FILE`
gives the workspace its own policy (copied with its keys pinned, its digest in the audit trail); promote,
rollback, serve and cache pull use it with TRTPIPE_POLICY unset, a different --policy is refused, and running
without it takes `--no-policy`, which the audit trail records. Also: a pointer's hand-edited set_by/set_at is
reported by `channels --verify`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trtpipe import signing_keys as K
from trtpipe.release.audit import read_audit
from trtpipe.release.channels import ChannelScope, ChannelStore
from trtpipe.results import ResultsLog

pytestmark = pytest.mark.timeout(300)

SCOPE = ChannelScope(model="tiny-llama", target="cpu-reference")
# prod requires a release signature; dev and the default (pull, serve, build) do not ... except where a test
# says so: what matters is that the workspace's rule applies with nothing in the environment.
POLICY = ("keys:\n  release: release.pub\ndefault: {require_signature: false}\n"
          "channels:\n  prod: {require_signature: true}\n")


@pytest.fixture
def no_env_policy(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRTPIPE_POLICY", raising=False)
    monkeypatch.delenv("TRTPIPE_SIGNING_KEY", raising=False)
    return isolated_home


def _policy(tmp_path: Path, body: str = POLICY, name: str = "policy.yaml") -> Path:
    if not (tmp_path / "release.pub").exists():
        K.write_key_pair(K.generate_key(), tmp_path / "release.key", tmp_path / "release.pub")
    path = tmp_path / name
    path.write_text(body)
    return path


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _prod(home: Path) -> str:
    return ChannelStore(home).get(SCOPE, "prod").digest


def _two_in_prod(home: Path, store_entry, cli) -> tuple[object, object]:
    """Two unsigned artifacts promoted into prod before the workspace had a policy (so prod can roll back)."""
    first, second = (store_entry(home, key * 8, seed=key[0]) for key in ("a1", "b2"))
    for entry in (first, second):
        ResultsLog(home).record(entry.digest, "smoke", True, {})
        code, _, err = cli("promote", entry.digest, "--to", "prod")
        assert code == 0, err
    return first, second


def test_rollback_under_the_workspace_policy_refuses_an_unsigned_target(no_env_policy: Path, tmp_path: Path,
                                                                        store_entry, cli) -> None:
    home = no_env_policy
    first, second = _two_in_prod(home, store_entry, cli)
    assert cli("policy", "set", str(_policy(tmp_path)))[0] == 0
    code, _, err = cli("rollback", "prod", "--reason", "bad release")
    line = _one_line(err)
    assert code != 0 and "rollback refused" in line and "unsigned" in line and first.digest in line, line
    assert _prod(home) == second.digest  # nothing moved
    refused = [r for r in read_audit(home) if r.action == "refused"]
    assert len(refused) == 1 and refused[0].reason.startswith("rollback refused") and refused[0].channel == "prod"
    assert refused[0].to_digest == first.digest
    # Without the policy it takes --no-policy, and the trail says who ran what without it.
    code, _, err = cli("rollback", "prod", "--reason", "incident 7", "--no-policy")
    assert code == 0, err
    assert _prod(home) == first.digest
    bypass = [r for r in read_audit(home) if r.action == "policy" and r.reason]
    assert len(bypass) == 1 and bypass[0].reason == "rollback --no-policy" and bypass[0].who == "release-tester"
    assert "workspace policy sha256:" in (bypass[0].detail or "")


def test_the_workspace_policy_applies_with_trtpipe_policy_unset(no_env_policy: Path, tmp_path: Path, store_entry,
                                                                cli, monkeypatch: pytest.MonkeyPatch) -> None:
    home = no_env_policy
    source = _policy(tmp_path)
    code, out, err = cli("policy", "set", str(source), "--json")
    assert code == 0, err
    done = json.loads(out)
    copy = home / "policy" / "policy.yaml"
    assert done["policy"] == str(copy) and done["digest"] == "sha256:" + hashlib.sha256(copy.read_bytes()).hexdigest()
    (record,) = [r for r in read_audit(home) if r.action == "policy"]
    assert record.to_digest == done["digest"] and record.who == "release-tester"
    entry = store_entry(home, "c3" * 8, seed="c")
    ResultsLog(home).record(entry.digest, "smoke", True, {})
    # Not even a forced promote from a shell without TRTPIPE_POLICY gets an unsigned artifact into prod.
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--force", "--reason", "hotfix")
    line = _one_line(err)
    assert code != 0 and "promote refused" in line and "unsigned" in line and str(copy) in line, line
    assert cli("promote", entry.digest, "--to", "dev")[0] == 0  # dev's rule requires nothing
    # The default rule (serve, pull, build) of a workspace policy that requires signatures applies to serve.
    assert cli("policy", "set", str(_policy(tmp_path, "keys: {release: release.pub}\n", "strict.yaml")))[0] == 0
    loose = tmp_path / "loose-repo"
    loose.mkdir()
    code, _, err = cli("serve", str(loose))
    assert code != 0 and "serve refused" in _one_line(err), err
    # A policy named by the flag or the setting that is not the workspace's is refused, not preferred.
    lax = _policy(tmp_path, "default: {require_signature: false}\n", "lax.yaml")
    for args, env in ((("--policy", str(lax)), None), ((), str(lax))):
        if env is not None:
            monkeypatch.setenv("TRTPIPE_POLICY", env)
        code, _, err = cli("promote", entry.digest, "--to", "prod", "--force", "--reason", "r", *args)
        assert code != 0 and "is not this workspace's policy" in _one_line(err), err
    monkeypatch.setenv("TRTPIPE_POLICY", str(tmp_path / "strict.yaml"))  # the same policy: runs under it
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--force", "--reason", "r")
    assert code != 0 and "promote refused" in _one_line(err)
    assert len([r for r in read_audit(home) if r.action == "policy" and not r.reason]) == 2  # two `policy set`


def test_a_hand_edited_removed_or_rekeyed_workspace_policy_is_refused(no_env_policy: Path, tmp_path: Path,
                                                                       store_entry, cli) -> None:
    home = no_env_policy
    assert cli("policy", "set", str(_policy(tmp_path)))[0] == 0
    copy = home / "policy" / "policy.yaml"
    entry = store_entry(home, "d4" * 8, seed="d")
    genuine = copy.read_text()
    copy.write_text(genuine.replace("require_signature: true", "require_signature: false"))  # prod made lax
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--force", "--reason", "r")
    line = _one_line(err)
    assert code != 0 and str(copy) in line and "audit trail records sha256:" in line, line
    copy.unlink()  # deleting it is no way out: the trail says the workspace has a policy
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--force", "--reason", "r")
    assert code != 0 and "missing" in _one_line(err)
    copy.write_text(genuine)
    (key_file,) = (home / "policy" / "keys").iterdir()  # swap the pinned key for another key
    other = K.generate_key()
    key_file.chmod(0o644)
    key_file.write_bytes(other.public_pem())
    code, _, err = cli("policy", "show")
    line = _one_line(err)
    assert code != 0 and other.key_id in line and key_file.stem in line, line
    code, _, err = cli("policy", "set", str(tmp_path / "policy.yaml"))  # put right, recorded
    assert code == 0, err
    assert cli("policy", "show")[0] == 0


def test_cache_pull_uses_the_workspace_policy(registry_env, no_env_policy: Path, tmp_path: Path, store_entry,
                                              cli) -> None:
    entry = store_entry(no_env_policy, "e5" * 8, seed="e")
    ref = registry_env.url("wspolicy/x")
    assert cli("cache", "push", entry.key, "--to", ref, "--tag", "v1")[0] == 0  # unsigned
    fresh = tmp_path / "fresh"
    assert cli("policy", "set", str(_policy(tmp_path, "keys: {release: release.pub}\n")), "--store", str(fresh))[0] == 0
    code, _, err = cli("cache", "pull", f"{ref}:v1", "--store", str(fresh))
    assert code != 0 and "pull refused" in _one_line(err), err
    code, _, err = cli("cache", "pull", f"{ref}:v1", "--store", str(fresh), "--no-policy")
    assert code == 0, err
    assert [r.reason for r in read_audit(fresh) if r.action == "policy" and r.reason] == ["cache pull --no-policy"]


def test_a_hand_edit_of_set_by_or_set_at_never_shows_the_channel_is_the_trails(no_env_policy: Path, store_entry, cli) -> None:
    """The channels are the trail's projection: a state file edited by hand (its stamp recomputed or not) is
    rebuilt by the next read, so who set a channel and when is what the trail records, nothing else."""
    from trtpipe.release.projection import ChannelState, stamp_of, state_path

    home = no_env_policy
    entry = store_entry(home, "f6" * 8, seed="f")
    ResultsLog(home).record(entry.digest, "smoke", True, {})
    assert cli("promote", entry.digest, "--to", "dev")[0] == 0
    assert cli("channels", "--verify", "--no-registry")[0] == 0
    path = state_path(home)
    genuine = path.read_text()
    recorded = ChannelStore(home).get(SCOPE, "dev")
    for field, value in (("set_by", "the-release-manager"), ("set_at", "2020-01-01T00:00:00.000+00:00")):
        for recompute in (False, True):
            doc = json.loads(genuine)
            doc["channels"][0][field] = value
            if recompute:
                edited = ChannelState.model_validate(doc)
                doc["stamp"] = stamp_of(edited.heads, edited.channels)
            path.write_text(json.dumps(doc))
            code, out, _ = cli("channels", "--verify", "--no-registry", "--json")
            assert code == 0, out
            (shown,) = json.loads(out)["channels"]
            assert (shown["set_by"], shown["set_at"]) == (recorded.set_by, recorded.set_at) and value not in out
            assert path.read_text() == genuine  # rebuilt from the trail


def test_promote_with_no_policy_runs_without_it_and_is_audited(no_env_policy: Path, tmp_path: Path, store_entry,
                                                               cli) -> None:
    home = no_env_policy
    source = _policy(tmp_path)
    assert cli("policy", "set", str(source))[0] == 0
    entry = store_entry(home, "a7" * 8, seed="g")
    ResultsLog(home).record(entry.digest, "smoke", True, {})
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--no-policy", "--policy", str(source))
    assert code == 2 and "contradict" in _one_line(err)
    assert cli("promote", entry.digest, "--to", "prod")[0] != 0  # unsigned: the workspace policy refuses it
    code, _, err = cli("promote", entry.digest, "--to", "prod", "--no-policy")
    assert code == 0, err
    assert _prod(home) == entry.digest
    (bypass,) = [r for r in read_audit(home) if r.action == "policy" and r.reason]
    assert bypass.reason == "promote --no-policy" and bypass.from_digest and bypass.from_digest.startswith("sha256:")
