"""`trtpipe build` end to end on the tiny cpu-reference spec: cold, warm, dry run, records, history,
keys that follow real file and spec changes, and corruption caught and rebuilt."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtpipe.pipeline import run_build, stage_keys
from trtpipe.store.local import Store
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def built(tiny_spec: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One cold build of the tiny spec (shared: it is the expensive step), plus its report."""
    home = tmp_path_factory.mktemp("built-home")
    report = run_build(tiny_spec, store=home, progress=False, settings=Settings.from_env())
    return home, report.model_dump()


def _copy_store(src: Path, dst: Path) -> Path:
    """A private copy of a store that keeps its hard links (objects and entry files share inodes)."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def test_cold_build_builds_every_stage_and_records_it(built, tools) -> None:
    home, report = built
    assert report["status"] == "ok", report
    outcomes = {s["name"]: s["outcome"] for s in report["stages"]}
    assert outcomes == {"resolve": "ran", "plan": "ran", "checkpoint": "built", "engine": "built", "publish": "built"}
    assert set(report["artifacts"]) == {"checkpoint", "engine", "repository"}
    repo = Path(report["repository_path"])
    assert repo == home / "repository" / report["keys"]["publish"]
    assert (repo / "ensemble" / "config.pbtxt").is_file()
    assert sorted(line["kind"] for line in tools.built_lines(home)) == ["checkpoint", "engine", "repository"]
    record = json.loads(Path(report["record_path"]).read_text())
    assert record["status"] == "ok" and record["keys"] == report["keys"]
    assert record["memory_plan"] and record["versions"]["transformers"]
    assert [s["name"] for s in record["stages"]] == ["resolve", "plan", "checkpoint", "engine", "publish"]


def test_manifests_are_content_only_and_the_repository_records_name_and_gates(built, tiny_spec: Path) -> None:
    from trtpipe.release.promote import load_gates
    from trtpipe.spec_loader import load_spec

    home, report = built
    store = Store.open(home)
    spec = load_spec(tiny_spec).spec
    for kind, stage in (("checkpoint", "checkpoint"), ("engine", "engine"), ("repository", "publish")):
        entry = store.get(kind, report["keys"][stage])
        assert entry is not None and entry.digest == report["artifacts"][kind]
        assert set(entry.manifest) == {"manifest_version", "kind", "key", "inputs", "files"}
        text = (entry.path / "manifest.json").read_text()
        assert str(home) not in text and "created_at" not in text and "_seconds\"" not in text
    repository = store.get("repository", report["keys"]["publish"])
    inputs = repository.manifest["inputs"]
    assert inputs["engine"] == {"digest": report["artifacts"]["engine"]}  # the engine's bytes, not its key
    assert inputs["name"] == spec.artifact_name and inputs["release"] == spec.release.model_dump(mode="json")
    trtpipe_json = json.loads((repository.path / "trtpipe.json").read_text())
    assert trtpipe_json["name"] == spec.artifact_name and trtpipe_json["release"] == inputs["release"]
    gates, source = load_gates(None, repository.manifest, "prod")
    assert source == "artifact" and gates.parity and gates.smoke
    # What the build did (durations, logs, converter summary) is in the build record instead.
    record = json.loads(Path(report["record_path"]).read_text())
    stages = {s["name"]: s for s in record["stages"]}
    assert stages["engine"]["facts"]["build_log"] and stages["checkpoint"]["facts"]["build_seconds"] >= 0


def test_warm_build_is_all_hits_and_does_no_stage_work(built, tiny_spec: Path, tools, tmp_path: Path) -> None:
    home = _copy_store(built[0], tmp_path / "home")
    lines_before = len(tools.built_lines(home))
    result = tools.run_cli(home, "build", str(tiny_spec), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {s["name"]: s["outcome"] for s in report["stages"]}["checkpoint"] == "hit"
    assert all(s["outcome"] in ("ran", "hit") for s in report["stages"])
    assert report["artifacts"] == built[1]["artifacts"]
    assert len(tools.built_lines(home)) == lines_before
    # History shows both builds, newest first, filterable.
    shown = json.loads(tools.run_cli(home, "history", "--json").stdout)
    assert len(shown) == 2 and shown[0]["started_at"] > shown[1]["started_at"]
    assert shown[0]["stages"][2]["outcome"] == "hit" and shown[1]["stages"][2]["outcome"] == "built"
    assert json.loads(tools.run_cli(home, "history", "--json", "--target", "h100-sxm").stdout) == []
    assert len(json.loads(tools.run_cli(home, "history", "--json", "--model", "tiny-llama").stdout)) == 2


def test_dry_run_prints_keys_and_builds_nothing(built, tiny_spec: Path, tmp_path: Path, tools) -> None:
    home = tmp_path / "empty-home"
    result = tools.run_cli(home, "build", str(tiny_spec), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "dry-run"
    # Same inputs, same keys, whatever the store; the repository key follows the engine's digest,
    # which only exists once the engine does.
    assert report["keys"] == {k: v for k, v in built[1]["keys"].items() if k != "publish"}
    assert [s["outcome"] for s in report["stages"][2:]] == ["would-build"] * 3
    assert "engine's digest" in report["stages"][4]["detail"]
    assert not list(Path(home).glob("checkpoint/*")) and not list((home / "records").iterdir())
    text = tools.run_cli(built[0], "build", str(tiny_spec), "--dry-run", "--json")
    assert text.returncode == 0 and json.loads(text.stdout)["keys"] == built[1]["keys"]
    text = tools.run_cli(built[0], "build", str(tiny_spec), "--dry-run")
    assert text.returncode == 0 and built[1]["keys"]["engine"] in text.stderr  # whole keys printed


def test_force_rebuilds_only_that_stage_and_same_bytes_keep_their_digests(built, tiny_spec: Path, tmp_path: Path,
                                                                          tools) -> None:
    home = _copy_store(built[0], tmp_path / "home")
    for _ in range(2):
        report = run_build(tiny_spec, store=home, force=["engine"], progress=False, settings=Settings.from_env())
        outcomes = {s.name: s.outcome for s in report.stages}
        assert outcomes["checkpoint"] == "hit" and outcomes["engine"] == "built"
        # The rebuilt engine has the same bytes, so the same digest, so the same repository.
        assert outcomes["publish"] == "hit"
        assert report.keys == built[1]["keys"] and report.artifacts == built[1]["artifacts"]
    assert tools.run_cli(home, "build", str(tiny_spec), "--force", "linker").returncode == 2


def test_gpu_dry_run_prints_the_trtllm_build_command(built, tiny_llama_dir: Path, tmp_path: Path) -> None:
    spec = tmp_path / "h100.yaml"
    spec.write_text(f"model:\n  path: {tiny_llama_dir}\ntarget:\n  gpu: h100-sxm\n  executor: docker\n")
    report = run_build(spec, store=built[0], dry_run=True, progress=False, settings=Settings.from_env())
    engine = report.stage("engine")
    assert engine is not None and engine.key and engine.command
    assert engine.command[0] == "trtllm-build" and "--checkpoint_dir" in engine.command
    assert str(built[0] / "checkpoint" / report.keys["checkpoint"]) in engine.command
    assert engine.container is not None  # the docker executor's spec, or why there is none
    assert report.keys["engine"] != built[1]["keys"]["engine"]


def _flip_byte(path: Path, offset: int = 10) -> None:
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ 0x01]))


def test_flipped_byte_is_caught_by_verify_and_rebuilt(built, tiny_spec: Path, tmp_path: Path, tools) -> None:
    home = _copy_store(built[0], tmp_path / "home")
    store = Store.open(home)
    engine = store.get("engine", built[1]["keys"]["engine"])
    config_item = next(f for f in engine.files if f["path"] == "config.json")
    victim = store.objects.path_for(config_item["sha256"])
    assert victim.samefile(engine.path / "config.json")
    _flip_byte(victim)

    # build --verify notices, never reuses or publishes it, and rebuilds.
    report = run_build(tiny_spec, store=home, verify=True, progress=False, settings=Settings.from_env())
    outcomes = {s.name: s.outcome for s in report.stages}
    assert outcomes["engine"] == "built" and outcomes["publish"] == "built", outcomes
    rebuilt = store.get("engine", report.keys["engine"], verify=True)
    assert rebuilt is not None
    from trtpipe.store.objects import sha256_file

    assert sha256_file(rebuilt.path / "config.json") == config_item["sha256"]  # good bytes again
    assert (home / "quarantine" / "objects" / config_item["sha256"]).exists()  # the damaged one, moved aside
    assert tools.run_cli(home, "cache", "verify").returncode == 0

    # cache verify notices it too, moves it aside, and the next build rebuilds it.
    engine = store.get("engine", report.keys["engine"])
    _flip_byte(engine.path / "config.json", offset=20)
    result = tools.run_cli(home, "cache", "verify", "--json")
    assert result.returncode == 1
    problems = json.loads(result.stdout)["problems"]
    assert any(p["kind"] == "engine" and p["file"] == "config.json" for p in problems)
    assert store.get("engine", report.keys["engine"]) is None
    again = run_build(tiny_spec, store=home, progress=False, settings=Settings.from_env())
    assert {s.name: s.outcome for s in again.stages}["engine"] == "built"
    assert tools.run_cli(home, "cache", "verify").returncode == 0


def test_cache_commands(built, tmp_path: Path, tools) -> None:
    home = _copy_store(built[0], tmp_path / "home")
    listed = json.loads(tools.run_cli(home, "cache", "ls", "--json").stdout)
    assert {row["kind"] for row in listed} == {"checkpoint", "engine", "repository"}
    key = built[1]["keys"]["engine"]
    shown = json.loads(tools.run_cli(home, "cache", "show", key[:10], "--json").stdout)
    assert shown["manifest"]["key"] == key and shown["digest"] == built[1]["artifacts"]["engine"]
    # A channel pin protects an artifact from rm and gc (the pins come from the release area's channels).
    from trtpipe.release.audit import append_audit

    channel = dict(channel="prod", model="tiny", target="cpu-reference", at="t", who="test")
    moved = append_audit(home, action="promote", from_digest=None, to_digest=built[1]["artifacts"]["engine"], **channel)
    refused = tools.run_cli(home, "cache", "rm", f"engine/{key}")
    assert refused.returncode == 4 and "tiny/cpu-reference/prod" in refused.stderr  # Conflict: a channel pins it
    gc = json.loads(tools.run_cli(home, "cache", "gc", "--max-size", "1B", "--json").stdout)
    assert f"engine/{key}" in gc["kept_pinned"]
    assert {a["name"] for a in gc["removed"] if a["what"] == "entry"} == {
        f"checkpoint/{built[1]['keys']['checkpoint']}", f"repository/{built[1]['keys']['publish']}"
    }
    assert tools.run_cli(home, "cache", "verify").returncode == 0
    # The move undone in the trail (an aborted record): the channel no longer pins it.
    append_audit(home, action="aborted", from_digest=moved.to_digest, to_digest=None, undoes=moved.seq, **channel)
    assert tools.run_cli(home, "cache", "rm", f"engine/{key}").returncode == 0
    assert json.loads(tools.run_cli(home, "cache", "ls", "--json").stdout) == []
    assert tools.run_cli(home, "cache", "show", "nope").returncode == 2


def _spec_text(model: Path, extra: str, dtype: str = "auto", quant: str = "") -> str:
    return f"model:\n  path: {model}\n  dtype: {dtype}\ntarget:\n  gpu: cpu-reference\n{quant}{extra}"


CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog.\n" * 8


def _work_spec(work: Path, tiny_llama_dir: Path, quantized: bool) -> tuple[Path, Path, Path]:
    """(spec, model dir, calibration file) of the base case under `work`: a private copy of the model."""
    model = work / "model"
    shutil.copytree(tiny_llama_dir, model)
    calib = work / "calib.txt"
    calib.write_text(CALIBRATION_TEXT)
    spec = work / "spec.yaml"
    spec.write_text(_spec_text(model, "", quant=_quant(calib, quantized)))
    return spec, model, calib


def _quant(calib: Path, quantized: bool) -> str:
    return (f"quantization:\n  algo: int4_awq\n  group_size: 32\n  calibration:\n    dataset: {calib}\n    samples: 4\n"
            if quantized else f"quantization:\n  calibration:\n    dataset: {calib}\n")


@pytest.fixture(scope="module")
def base_homes(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Stores holding the built base case (unquantized and INT4-AWQ): keys never hold paths, so any copy
    of the same model and calibration text has these keys, and a dry run can key the repository from
    the engine digest stored here."""
    homes = {}
    for quantized in (False, True):
        work = tmp_path_factory.mktemp(f"base-{quantized}")
        spec, _, _ = _work_spec(work, tiny_llama_dir, quantized)
        report = run_build(spec, store=work / "home", progress=False, settings=Settings.from_env())
        assert report.status == "ok", report
        homes[quantized] = work / "home"
    return homes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    change=st.sampled_from(["weight file", "calibration file", "tokenizer file", "spec: triton.streaming",
                            "spec: engine.max_batch_size", "spec: model.dtype", "toolchain", "spec: name",
                            "spec: release.gates"]),
    quantized=st.booleans(),
)
def test_real_changes_move_exactly_the_dependent_keys(tiny_llama_dir: Path, tmp_path: Path, base_homes, change: str,
                                                      quantized: bool) -> None:
    work = tmp_path / f"case-{change.replace(' ', '_').replace(':', '')}-{quantized}"
    if work.exists():
        shutil.rmtree(work)
    spec, model, calib = _work_spec(work, tiny_llama_dir, quantized)
    quant = _quant(calib, quantized)
    home = base_homes[quantized]  # read only: a dry run builds nothing
    before = stage_keys(spec, store=home, settings=Settings.from_env())
    assert set(before) == {"checkpoint", "engine", "publish"}

    expected: set[str]
    if change == "weight file":
        _flip_byte(model / "model.safetensors", offset=(model / "model.safetensors").stat().st_size - 3)
        expected = {"checkpoint", "engine", "publish"}
    elif change == "calibration file":
        calib.write_text("A different calibration text.\n" * 8)
        expected = {"checkpoint", "engine", "publish"} if quantized else set()
    elif change == "tokenizer file":
        config = json.loads((model / "tokenizer_config.json").read_text())
        config["model_max_length"] = 12345
        (model / "tokenizer_config.json").write_text(json.dumps(config))
        expected = {"publish"}
    elif change == "spec: triton.streaming":
        spec.write_text(_spec_text(model, "triton:\n  streaming: false\n", quant=quant))
        expected = {"publish"}
    elif change == "spec: name":
        spec.write_text(_spec_text(model, "name: renamed\n", quant=quant))
        expected = {"publish"}
    elif change == "spec: release.gates":
        spec.write_text(_spec_text(model, "release:\n  gates:\n    prod:\n      parity: true\n", quant=quant))
        expected = {"publish"}
    elif change == "spec: engine.max_batch_size":
        spec.write_text(_spec_text(model, "engine:\n  max_batch_size: 3\n", quant=quant))
        expected = {"engine", "publish"}
    elif change == "spec: model.dtype":
        spec.write_text(_spec_text(model, "", dtype="bfloat16", quant=quant))
        expected = {"checkpoint", "engine", "publish"}
    else:
        from trtpipe.toolchain import get_toolchain

        # (trtllm-1.1.0: the older toolchains pin converters trtpipe's converter is not written for, which
        # resolve refuses since issue 13.)
        spec.write_text(_spec_text(model, "toolchain: trtllm-1.1.0\n", quant=quant))
        old, new = get_toolchain(None), get_toolchain("trtllm-1.1.0")
        converter_changed = (old.modelopt_version, old.transformers_version) != (new.modelopt_version,
                                                                                 new.transformers_version)
        expected = {"checkpoint", "engine", "publish"} if converter_changed else {"engine", "publish"}
    after = stage_keys(spec, store=home, settings=Settings.from_env())
    # A key that moved, or that a dry run can no longer compute (its engine is not built under the new key).
    changed = {name for name in before if before[name] != after.get(name)}
    assert changed == expected, (change, quantized)


def test_history_of_a_channel_reads_the_release_audit(tmp_path: Path, tools) -> None:
    result = tools.run_cli(tmp_path / "home", "history", "--channel", "prod", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


WARM_IMPORTS = r"""
import sys
from trtpipe.cli import main
code = main(["build", sys.argv[1], "--json"])
heavy = sorted(m for m in ("torch", "transformers", "modelopt", "safetensors", "tritonclient", "docker", "numpy")
               if m in sys.modules)
# The stages' implementations load only when a stage builds or a dry run previews it.
stage_code = sorted(m for m in ("trtpipe.checkpoint.convert", "trtpipe.engine.conversion", "trtpipe.engine.stage",
                                "trtpipe.engine.executors.docker", "trtpipe.engine.executors.local",
                                "trtpipe.reference.runtime") if m in sys.modules)
print("HEAVY=" + ",".join(heavy + stage_code), file=sys.stderr)
sys.exit(code)
"""


def test_warm_build_imports_no_heavy_library(built, tiny_spec: Path, tmp_path: Path, tools) -> None:
    import sys

    home = _copy_store(built[0], tmp_path / "home")
    result = subprocess.run([sys.executable, "-c", WARM_IMPORTS, str(tiny_spec)], env=tools.cli_env(home),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "HEAVY=\n" in result.stderr or result.stderr.rstrip().endswith("HEAVY="), result.stderr[-500:]
    report = json.loads(result.stdout)
    # resolve and plan ran, or were reused from the resolution memo when the inputs were old enough (trtpipe.warm)
    outcomes = [s["outcome"] for s in report["stages"]]
    assert outcomes[2:] == ["hit", "hit", "hit"] and outcomes[0] == outcomes[1] and outcomes[0] in ("ran", "hit")
