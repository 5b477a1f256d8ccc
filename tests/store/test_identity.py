"""Issue 11 on real builds of the tiny spec: content-only digests, what is promoted is what was built, corrupt
stored bytes never carried into a build, and a damaged artifact that a channel pins restored to its digest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.pipeline import run_build
from trtpipe.results import ResultsLog
from trtpipe.store.local import Store
from trtpipe.store.objects import sha256_file
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def built(tiny_spec: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    home = tmp_path_factory.mktemp("identity-home") / "home"
    report = run_build(tiny_spec, store=home, progress=False, settings=Settings.from_env())
    assert report.status == "ok", report
    return home, report.model_dump()


def _copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)  # keeps the hard links
    return dst


def _flip(path: Path, offset: int) -> None:
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ 0x01]))


def _cli(home: Path, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRTPIPE_HOME": str(home), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "trtpipe.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600)


# A build in another process whose clock is three days ahead (time.time and datetime.now): nothing
# time-derived may reach an artifact.
SHIFTED_CLOCK_BUILD = r"""
import datetime as _dt, sys, time
_real_time, _real_dt = time.time, _dt.datetime
time.time = lambda: _real_time() + 3 * 86400
time.time_ns = lambda: int(time.time() * 1e9)
class _Shifted(_real_dt):
    @classmethod
    def now(cls, tz=None):
        return _real_dt.now(tz) + _dt.timedelta(days=3)
_dt.datetime = _Shifted
from trtpipe.cli import main
sys.exit(main(["build", sys.argv[1], "--json"]))
"""


def test_two_stores_at_different_paths_and_times_give_identical_digests_and_oci_manifests(
    built, tiny_spec: Path, tmp_path: Path, registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_a, report_a = built
    home_b = tmp_path / "some" / "other" / "place" / "home"
    env = {**os.environ, "TRTPIPE_HOME": str(home_b)}
    result = subprocess.run([sys.executable, "-c", SHIFTED_CLOCK_BUILD, str(tiny_spec)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report_b = json.loads(result.stdout)
    assert report_b["artifacts"] == report_a["artifacts"]
    record_b = json.loads(Path(report_b["record_path"]).read_text())
    record_a = json.loads(Path(report_a["record_path"]).read_text())
    assert record_b["started_at"][:10] != record_a["started_at"][:10]  # the clock really was elsewhere
    for kind, stage in (("checkpoint", "checkpoint"), ("engine", "engine"), ("repository", "publish")):
        key = report_a["keys"][stage]
        assert (home_a / kind / key / "manifest.json").read_bytes() == (home_b / kind / key / "manifest.json").read_bytes()
    # Both pushed to one registry: one OCI manifest digest.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    creds = {"TRTPIPE_REGISTRY_USERNAME": registry.username, "TRTPIPE_REGISTRY_PASSWORD": registry.password,
             "HOME": str(tmp_path)}
    pushed = []
    for home in (home_a, home_b):
        result = _cli(home, "cache", "push", report_a["artifacts"]["repository"], "--to",
                      registry.url("identity/tiny"), "--json", extra_env=creds)
        assert result.returncode == 0, result.stderr
        pushed.append(json.loads(result.stdout))
    assert pushed[0]["oci_digest"] == pushed[1]["oci_digest"]
    assert pushed[0]["artifact_digest"] == pushed[1]["artifact_digest"] == report_a["artifacts"]["repository"]


def test_force_engine_twice_keeps_every_digest_and_promote_still_finds_the_results(built, tiny_spec: Path,
                                                                                    tmp_path: Path) -> None:
    home = _copy(built[0], tmp_path / "home")
    digest = built[1]["artifacts"]["repository"]
    log = ResultsLog(home)
    log.record(digest, "smoke", True, {"checks": 6})
    log.record(digest, "parity", True, {"prompts": 3, "mismatches": 0})
    for _ in range(2):
        report = run_build(tiny_spec, store=home, force=["engine"], progress=False, settings=Settings.from_env())
        assert {s.name: s.outcome for s in report.stages}["engine"] == "built"
        assert report.artifacts == built[1]["artifacts"]
    result = _cli(home, "promote", digest, "--to", "prod", "--json")  # tiny_spec's prod gates: smoke + parity
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["to_digest"] == digest and {g["gate"]: g["status"] for g in outcome["gates"]} == {
        "smoke": "passed", "parity": "passed"}


def test_specs_differing_only_in_name_or_gates_are_different_artifacts(built, tiny_spec: Path, tmp_path: Path) -> None:
    home = _copy(built[0], tmp_path / "home")
    text = tiny_spec.read_text()
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text("name: tiny-renamed\n" + text)
    regated = tmp_path / "regated.yaml"
    regated.write_text(text.replace("      parity: true\n", "      parity: false\n      smoke: true\n"))
    assert regated.read_text() != text
    repos = {}
    for spec in (tiny_spec, renamed, regated):
        report = run_build(spec, store=home, progress=False, settings=Settings.from_env())
        outcomes = {s.name: s.outcome for s in report.stages}
        assert outcomes["engine"] == "hit"  # one engine ...
        if spec is not tiny_spec:
            assert outcomes["publish"] == "built"  # ... but never the other spec's repository
        repos[spec.name] = Path(report.repository_path)
    assert len({p.name for p in repos.values()}) == 3
    names = {n: json.loads((p / "trtpipe.json").read_text()) for n, p in repos.items()}
    assert names["renamed.yaml"]["name"] == "tiny-renamed" and names[tiny_spec.name]["name"] == "tiny-llama"
    assert names["regated.yaml"]["release"]["gates"]["prod"]["parity"] is False
    assert names[tiny_spec.name]["release"]["gates"]["prod"]["parity"] is True
    # Promote reads them from the artifact: the renamed one lands in its own channel, under its own gates.
    store = Store.open(home)
    for spec_name, channel_model, gates in (("renamed.yaml", "tiny-renamed", {"smoke", "parity"}),
                                            ("regated.yaml", "tiny-llama", {"smoke"})):
        digest = store.peek("repository", repos[spec_name].name).digest
        result = _cli(home, "promote", digest, "--to", "prod", "--force", "--reason", "test", "--json")
        assert result.returncode == 0, result.stderr
        outcome = json.loads(result.stdout)
        assert outcome["model"] == channel_model and {g["gate"] for g in outcome["gates"]} == gates


def test_a_flipped_object_byte_then_build_force_all_is_caught_and_rebuilt_from_good_bytes(built, tiny_spec: Path,
                                                                                          tmp_path: Path) -> None:
    home = _copy(built[0], tmp_path / "home")
    store = Store.open(home)
    checkpoint = store.get("checkpoint", built[1]["keys"]["checkpoint"])
    rank0 = next(f for f in checkpoint.files if f["path"] == "rank0.safetensors")
    victim = store.objects.path_for(rank0["sha256"])
    assert victim.samefile(checkpoint.path / "rank0.safetensors")  # shared with the engine and the repository
    _flip(victim, offset=victim.stat().st_size // 2)
    report = run_build(tiny_spec, store=home, force=["all"], progress=False, settings=Settings.from_env())
    details = " ".join(s.detail or "" for s in report.stages)
    assert f"sha256:{rank0['sha256'][:12]} did not hold its digest's bytes" in details
    # The very same artifacts as the clean build: the conversion rebuilt the good bytes, and every later
    # stage was built on them, not on the damaged object.
    assert report.artifacts == built[1]["artifacts"]
    for kind, stage in (("checkpoint", "checkpoint"), ("engine", "engine"), ("repository", "publish")):
        entry = Store.open(home).get(kind, report.keys[stage], verify=True)
        assert entry is not None
    assert sha256_file(store.objects.path_for(rank0["sha256"])) == rank0["sha256"]
    assert sha256_file(home / "quarantine" / "objects" / rank0["sha256"]) != rank0["sha256"]
    assert _cli(home, "cache", "verify").returncode == 0


def test_a_stage_never_builds_on_a_stored_input_it_has_not_verified(built, tiny_spec: Path, tmp_path: Path) -> None:
    """A byte flipped in the stored engine, then `--force publish`: publish verifies the engine it
    builds on, finds it damaged, and has it rebuilt (from a checkpoint verified the same way)."""
    home = _copy(built[0], tmp_path / "home")
    store = Store.open(home)
    engine = store.get("engine", built[1]["keys"]["engine"])
    _flip(engine.path / "config.json", offset=5)
    report = run_build(tiny_spec, store=home, force=["publish"], progress=False, settings=Settings.from_env())
    outcomes = [(s.name, s.outcome) for s in report.stages]
    assert ("engine", "built") in outcomes and ("publish", "built") in outcomes
    assert report.artifacts == built[1]["artifacts"]
    assert list((home / "quarantine").glob("engine-*"))
    assert _cli(home, "cache", "verify").returncode == 0


def _pin(home: Path, digest: str) -> None:
    result = _cli(home, "promote", digest, "--to", "prod", "--force", "--reason", "pinned for the test")
    assert result.returncode == 0, result.stderr


def test_a_pinned_entry_with_a_flipped_byte_is_reported_kept_and_repaired_to_the_same_digest(
    built, tiny_spec: Path, tmp_path: Path
) -> None:
    home = _copy(built[0], tmp_path / "home")
    digest = built[1]["artifacts"]["repository"]
    key = built[1]["keys"]["publish"]
    _pin(home, digest)
    _flip(home / "repository" / key / "preprocessing" / "1" / "model.py", offset=3)
    result = _cli(home, "cache", "verify")
    assert result.returncode == 1
    assert "pinned by channel tiny-llama/cpu-reference/prod" in result.stderr
    assert "preprocessing/1/model.py" in result.stderr and "--repair" in result.stderr
    kept = [p for p in (home / "quarantine").iterdir() if p.name.startswith("repository-") and p.is_dir()]
    assert len(kept) == 1 and (kept[0] / "manifest.json").is_file()  # restorable: the manifest says what it was
    assert Store.open(home).peek("repository", key) is None
    # gc never deletes it while the channel pins it and nothing replaced it ...
    gc = json.loads(_cli(home, "cache", "gc", "--json").stdout)
    assert f"quarantine/{kept[0].name}" in gc["kept_pinned"] and kept[0].exists()
    # ... and a second verify still reports it.
    again = _cli(home, "cache", "verify", "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["pinned"][0]["digest"] == digest
    repair = _cli(home, "cache", "verify", "--repair", "--json")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    outcome = json.loads(repair.stdout)["repairs"]
    assert [(o["digest"], o["restored"]) for o in outcome] == [(digest, True)]
    assert outcome[0]["how"].startswith("rebuilt from the spec of build")
    restored = Store.open(home).get("repository", key, verify=True)
    assert restored is not None and restored.digest == digest
    assert _cli(home, "cache", "verify").returncode == 0
    _cli(home, "cache", "gc")
    assert not kept[0].exists()  # a healthy entry of that digest is back: the damaged copy can go


def test_repair_from_the_registry_when_the_inputs_are_gone(built, tiny_spec: Path, tmp_path: Path, registry) -> None:
    home = _copy(built[0], tmp_path / "home")
    digest = built[1]["artifacts"]["repository"]
    key = built[1]["keys"]["publish"]
    creds = {"TRTPIPE_REGISTRY_USERNAME": registry.username, "TRTPIPE_REGISTRY_PASSWORD": registry.password,
             "HOME": str(tmp_path)}
    url = registry.url("identity/repair")
    assert _cli(home, "cache", "push", digest, "--to", url, extra_env=creds).returncode == 0
    _pin(home, digest)
    shutil.rmtree(home / "records")  # no build record: the inputs are unknown here
    _flip(home / "repository" / key / "trtpipe.json", offset=2)
    no_registry = _cli(home, "cache", "verify", "--repair", "--json")
    assert no_registry.returncode == 1
    assert "no build record" in json.loads(no_registry.stdout)["repairs"][0]["detail"]
    repair = _cli(home, "cache", "verify", "--repair", "--store", url, "--json", extra_env=creds)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert json.loads(repair.stdout)["repairs"][0]["how"] == f"pulled from {url}"
    restored = Store.open(home).get("repository", key, verify=True)
    assert restored is not None and restored.digest == digest
