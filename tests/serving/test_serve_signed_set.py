"""Issue 28, attack 1 and the last clause of attack 10: serve exactly the signed set, and record results only for
bytes a serve verified. Real registry (the signature is made by `cache push --sign`, as a release does), real
tritonserver; the published example repository is the session's, copied (hard links) into a private workspace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trtpipe.release.audit import read_audit
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)


def _cli(home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full = {**os.environ, "TRTPIPE_HOME": str(home), "TRTPIPE_USER": "serve-tester", **(env or {})}
    full.pop("TRTPIPE_POLICY", None)
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", *args], env=full, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def signed(example_repo: Path, registry, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A private workspace holding the example repository, signed by the release key (pushed with --sign to the
    real registry), and a policy that requires that key's signature."""
    from trtpipe import signing_keys as K

    base = tmp_path_factory.mktemp("signed-set")
    home = base / "home"
    subprocess.run(["cp", "-a", str(example_repo.parent.parent), str(home)], check=True)  # keeps the hard links
    key = K.generate_key()
    K.write_key_pair(key, base / "release.key", base / "release.pub")
    policy = base / "policy.yaml"
    policy.write_text(f"keys:\n  release: {base / 'release.pub'}\ndefault:\n  require_signature: true\n")
    creds = {"TRTPIPE_REGISTRY_USERNAME": registry.username, "TRTPIPE_REGISTRY_PASSWORD": registry.password}
    done = _cli(home, "cache", "push", example_repo.name, "--to", registry.url("signed-set/repo"), "--tag", "v1",
                "--sign", str(base / "release.key"), env=creds)
    assert done.returncode == 0, done.stderr
    return SimpleNamespace(home=home, repo=home / "repository" / example_repo.name, policy=policy, base=base)


def _copy(repo: Path, dest: Path) -> Path:
    """A writable copy of a repository entry, outside any store (what an attacker serves)."""
    shutil.copytree(repo, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dest


def _add_stray_model(repo: Path, marker: Path) -> None:
    """The attack: one model folder beside the signed ones, whose code leaves `marker` the moment it is imported."""
    (repo / "zz_extra" / "1").mkdir(parents=True)
    (repo / "zz_extra" / "config.pbtxt").write_text(
        'name: "zz_extra"\nbackend: "python"\ninstance_group [{ kind: KIND_CPU }]\n')
    (repo / "zz_extra" / "1" / "model.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n\nclass TritonPythonModel:\n    def execute(self, requests):\n"
        "        return []\n")


@pytest.mark.parametrize("extra", ["model folder", "file"])
def test_an_unsigned_addition_to_a_signed_copy_is_refused_under_a_policy(signed, tmp_path: Path, extra: str) -> None:
    copy = _copy(signed.repo, tmp_path / "copy")
    marker = tmp_path / "MARKER"
    if extra == "model folder":
        _add_stray_model(copy, marker)
        named = "zz_extra/1/model.py, zz_extra/config.pbtxt"
    else:
        (copy / "preprocessing" / "1" / "helper.py").write_text("import os\n")
        named = "preprocessing/1/helper.py"
    before = len([r for r in read_audit(signed.home) if r.action == "refused"])
    done = _cli(signed.home, "serve", str(copy), "--policy", str(signed.policy))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "serve refused" in lines[0] and named in lines[0], done.stderr
    assert "not signed" in lines[0] and "Traceback" not in done.stderr
    assert not [line for line in lines if line.startswith("serving ")]  # no server was started
    assert not marker.exists()
    refused = [r for r in read_audit(signed.home) if r.action == "refused"]
    assert len(refused) == before + 1 and named in refused[-1].reason and refused[-1].reason.startswith("serve refused")
    # The same copy without the addition passes the same check: the refusal is the addition's.
    if extra == "model folder":
        shutil.rmtree(copy / "zz_extra")
    else:
        (copy / "preprocessing" / "1" / "helper.py").unlink()
    from trtpipe.release.policy import load_policy
    from trtpipe.release.trust import require_trusted_folder
    from trtpipe.workspace import Workspace

    verified = require_trusted_folder(Workspace(signed.home, settings=Settings.from_env()), copy, load_policy(signed.policy), action="serve")
    assert verified.signature_verified and "zz_extra/config.pbtxt" not in verified.files


def test_the_serving_directory_holds_only_the_verified_bytes(signed, tmp_path: Path) -> None:
    """Between the check and the copy: a file added is not served, a file changed is refused."""
    from trtpipe.errors import IntegrityError
    from trtpipe.release.policy import load_policy
    from trtpipe.release.trust import require_trusted_folder
    from trtpipe.workspace import Workspace
    from trtpipe.serving.serving_copy import prepare

    copy = _copy(signed.repo, tmp_path / "copy")
    verified = require_trusted_folder(Workspace(signed.home, settings=Settings.from_env()), copy, load_policy(signed.policy), action="serve")
    _add_stray_model(copy, tmp_path / "MARKER")  # after the check
    serving = prepare(copy, verified=verified)
    try:
        served = sorted(p.relative_to(serving.path).as_posix() for p in serving.path.rglob("*") if p.is_file())
        assert served == sorted(verified.files) and not (serving.path / "zz_extra").exists()
    finally:
        serving.remove()
    model_py = copy / "postprocessing" / "1" / "model.py"
    model_py.write_text(model_py.read_text() + "\n# v2\n")  # after the check
    with pytest.raises(IntegrityError, match="postprocessing/1/model.py changed after it was verified"):
        prepare(copy, verified=verified)


def test_without_a_policy_a_stray_model_is_not_loaded_and_serve_says_unverified(signed, tmp_path: Path) -> None:
    """No policy: the copy is served (said once to be unverified), but tritonserver loads only the models its
    trtpipe.json names (explicit model control): the stray folder's code never runs."""
    copy = _copy(signed.repo, tmp_path / "copy")
    marker = tmp_path / "MARKER"
    _add_stray_model(copy, marker)
    env = {**os.environ, "TRTPIPE_HOME": str(signed.home), "PYTHONUNBUFFERED": "1"}
    env.pop("TRTPIPE_POLICY", None)
    proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "serve", str(copy), "--json", "--probe-interval", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the ready event: printed once every model is ready
        assert line, proc.stderr.read()
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["content"] == "unverified"
        assert "zz_extra" not in ready["models"] and "ensemble" in ready["models"]
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(ready["grpc_url"])
        try:
            assert not client.is_model_ready("zz_extra")
            index = {m["name"]: m.get("state") for m in client.get_model_repository_index(as_json=True)["models"]}
            assert index.get("ensemble") == "READY" and not index.get("zz_extra")
        finally:
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert not marker.exists()
    unverified = [line for line in err.splitlines() if "serving unverified content" in line]
    assert len(unverified) == 1 and "no trust policy is set" in unverified[0], err


def test_a_server_whose_configs_claim_a_digest_gets_nothing_recorded_for_it(signed, tmp_path: Path) -> None:
    """Attack 10: a folder holding other bytes (v2), whose configs say they are v1 (the identity parameter
    written by hand), served by a tritonserver that no `trtpipe serve` started: smoke --record v1 records
    nothing, because no live serve verified those bytes against v1."""
    from trtpipe.results import ResultsLog
    from trtpipe.serving import server as server_module
    from trtpipe.serving.identity import REPOSITORY_DIGEST, parameter_block
    from trtpipe.store.local import Store

    v1 = Store.holding(signed.repo)[1]
    copy = _copy(signed.repo, tmp_path / "v2")
    model_py = copy / "postprocessing" / "1" / "model.py"
    model_py.write_text(model_py.read_text() + "\n# v2: other bytes\n")
    for config in copy.glob("*/config.pbtxt"):
        config.write_text(config.read_text() + parameter_block({REPOSITORY_DIGEST: v1.digest}))
    recorded_before = len(ResultsLog(signed.home).for_digest(v1.digest))  # the session's store may hold some
    launcher = server_module.LocalTriton.here()
    ports = tuple(server_module.free_ports(3))
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    prefix = f"trtpipe_test_{os.getpid()}_"
    argv = launcher.command(SimpleNamespace(path=copy), "127.0.0.1", ports, work_dir, prefix)
    log_path = work_dir / "tritonserver.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, env=launcher.environment(), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    handle = launcher.handle(process, argv, "127.0.0.1", ports, work_dir, log_path, prefix,
                             server_module.models_to_load(copy))
    try:
        assert server_module._wait_ready(handle, time.monotonic() + 180) is None, handle.log_tail()
        done = _cli(signed.home, "smoke", handle.grpc_url, "--record", str(signed.repo), "--max-tokens", "2")
        assert done.returncode == 2, done.stdout + done.stderr
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and "refused to record" in err and "nothing recorded" in err, err
        assert "no live `trtpipe serve`" in err and "Traceback" not in err
    finally:
        handle.stop()
    assert len(ResultsLog(signed.home).for_digest(v1.digest)) == recorded_before


def test_the_models_loaded_are_the_ones_trtpipe_json_names_and_never_a_wildcard(tmp_path: Path) -> None:
    from trtpipe.errors import InvalidInput
    from trtpipe.serving.server import load_flags, models_to_load

    for name in ("ensemble", "zz_extra"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    assert models_to_load(tmp_path) == ["ensemble", "zz_extra"]  # a hand-made folder: its model folders
    (tmp_path / "trtpipe.json").write_text(json.dumps({"models": ["ensemble"]}))
    assert load_flags(models_to_load(tmp_path)) == ["--model-control-mode=explicit", "--load-model=ensemble"]
    (tmp_path / "trtpipe.json").write_text(json.dumps({"models": ["ensemble", "*"]}))  # Triton: every model
    with pytest.raises(InvalidInput, match="which is no model folder name"):
        models_to_load(tmp_path)
