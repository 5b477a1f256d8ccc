"""Issue 28, attack 10: hostile trust policy files, each refused by the real CLI in one line, without blocking.

As found: `/dev/zero` as the policy ended in a MemoryError traceback, a FIFO named as a key file hung the
command, a duplicate `default:` let the laxer one win, `require_signature: 'no'` was read as false,
`channels: {Prod: ...}` matched nothing (prod fell to the lax default), and a key file swapped for another
key was trusted. Each case runs `trtpipe cache pull` in a subprocess with a deadline (a hang fails the test,
it cannot stall the suite); the policy is read before the registry is contacted, so no registry is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe import signing_keys as K
from trtpipe.release.policy import load_policy

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60  # a refusal takes a second; a blocked open or an unbounded read never ends
NOWHERE = "oci://127.0.0.1:9/nowhere/x:v1"  # never reached: the policy is refused first


def _cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRTPIPE_POLICY", "TRTPIPE_SIGNING_KEY")}
    environ.update(TRTPIPE_HOME=str(home), PYTHONPATH=str(REPO), TRTPIPE_USER="policy-tester", **(env or {}))
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", *args], env=environ, capture_output=True, text=True,
                          timeout=DEADLINE_S)


def _refused_in_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, K.PrivateKey]:
    out = {}
    for name in ("release", "other"):
        out[name] = K.generate_key()
        K.write_key_pair(out[name], tmp_path / f"{name}.key", tmp_path / f"{name}.pub")
    return out


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_a_fifo_as_the_policy_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)  # no writer ever opens it: a plain open() would block forever
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(fifo)),
                         str(fifo), "FIFO", "not a regular trust policy file")


def test_a_fifo_as_a_key_file_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "release.pub")
    policy = _write(tmp_path, "keys: {release: release.pub}\n")
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(policy)),
                         f"{policy}:1", "keys.release", "FIFO")


@pytest.mark.parametrize("name,needle", [("/dev/zero", "a device"), ("folder", "a folder")])
def test_a_device_or_a_folder_as_the_policy_is_refused(tmp_path: Path, name: str, needle: str) -> None:
    target = Path(name) if name.startswith("/") else tmp_path / name
    if name == "folder":
        target.mkdir()
    # Through the setting as well as the flag: TRTPIPE_POLICY is read the same way.
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, env={"TRTPIPE_POLICY": str(target)}),
                         str(target), needle)


def test_an_oversized_policy_is_refused_after_reading_at_most_its_bound(tmp_path: Path) -> None:
    policy = _write(tmp_path, "# padding\n" * 200_000)  # 2 MB of valid YAML comments: too large to be a policy
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(policy)),
                         str(policy), "larger than 1048576 bytes")


@pytest.mark.parametrize("body,needles", [
    ("keys: {release: release.pub}\ndefault: {require_signature: true}\ndefault: {require_signature: false}\n",
     (":3:", "default: given twice (first at line 2)")),
    ("keys: {release: release.pub}\nchannels:\n  prod: {require_signature: true, require_signature: false}\n",
     (":3:", "channels.prod.require_signature: given twice")),
    ("keys: {release: release.pub}\ndefault:\n  require_signature: 'no'\n",
     (":3:", "default.require_signature", "valid boolean", "true or false")),
    ("keys: {release: release.pub}\nchannels:\n  prod:\n    allow_hand_recorded: 'yes'\n",
     (":4:", "channels.prod.allow_hand_recorded", "valid boolean")),
    ("keys: {release: release.pub}\ndefault: {require_signature: false}\nchannels:\n  dev: {}\n  Prod: {}\n",
     (":5:", "channels.Prod: not a known channel", "dev, staging, prod")),
    ("version: '1'\nkeys: {release: release.pub}\n", (":1:", "version")),
    # Nested aliases ("billion laughs"): 9 levels of 9 would be walked and validated 9**9 times.
    ("keys: {release: release.pub}\nx0: &x0 [a, a, a, a, a, a, a, a, a]\n"
     + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]\n" for i in range(1, 10)), (":2:", "alias")),
])
def test_lax_yaml_is_refused_at_its_line(tmp_path: Path, keys, body: str, needles: tuple[str, ...]) -> None:
    policy = _write(tmp_path, body)
    line = _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(policy)),
                                str(policy), *needles)
    assert line.startswith(f"error: {policy}:"), line


def test_a_swapped_key_file_is_refused_by_its_pin_naming_both_ids(tmp_path: Path, keys) -> None:
    release, other = keys["release"], keys["other"]
    policy = _write(tmp_path, f"keys:\n  release: {{path: release.pub, id: {release.key_id}}}\n")
    assert load_policy(policy).keys["release"].key_id == release.key_id  # the genuine file loads
    short = _write(tmp_path, f"keys:\n  release: {{path: release.pub, id: {release.key_id[:16]}}}\n")
    assert load_policy(short).keys["release"].key_id == release.key_id  # a fingerprint prefix pins too
    (tmp_path / "release.pub").write_bytes((tmp_path / "other.pub").read_bytes())  # the swap
    policy = _write(tmp_path, f"keys:\n  release: {{path: release.pub, id: {release.key_id}}}\n")
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(policy)),
                         f"{policy}:2", "keys.release", other.key_id, release.key_id)


def test_a_malformed_pin_names_its_field(tmp_path: Path, keys) -> None:
    policy = _write(tmp_path, "keys:\n  release: {path: release.pub, id: not-hex}\n")
    _refused_in_one_line(_cli(tmp_path / "home", "cache", "pull", NOWHERE, "--policy", str(policy)),
                         f"{policy}:2", "keys.release.id")


def test_the_documented_policies_still_load(tmp_path: Path, keys) -> None:
    # The shape ci/README.md and trtpipe/release/policy.py document, and a channel beyond the known three
    # declared under extra_channels.
    policy = load_policy(_write(tmp_path, """
keys:
  release: release.pub
  qa: {path: other.pub, id: %s}
default:
  require_signature: true
  signers: [release]
extra_channels: [canary]
channels:
  dev:  {require_signature: false, allow_hand_recorded: true}
  prod: {signers: [release]}
  canary: {require_signature: yes}
""" % keys["other"].key_id))
    assert policy.requires_signature("canary") and not policy.requires_signature("dev")
    assert set(policy.trusted_key_ids("prod")) == {keys["release"].key_id}
