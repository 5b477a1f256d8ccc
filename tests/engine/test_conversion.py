"""Checkpoint conversion where the engine is built (GPU targets): the job, the container, the key, refusals,
and real conversions of the tiny model through both executors on this CPU (--device cpu).

The docker executor's container runs in a bubblewrap sandbox standing in for the Docker daemon
(tests/engine/sandbox_runtime.py): the container's exact run_kwargs, a filesystem of only its mounts
plus a Python environment holding only the container's package set. GPU calibration itself needs a GPU
host: tests/engine/test_gpu_conversion.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trtpipe
from trtpipe.cli import main
from trtpipe.engine.conversion import (
    CONTAINER_PACKAGES,
    convert_in_executor,
    job_dir_for,
    job_spec,
    make_job,
)
from trtpipe.engine.executors.base import BuildFailed, ConversionJob
from trtpipe.engine.executors.docker import DockerExecutor, conversion_container_spec
from trtpipe.engine.executors.local import LocalExecutor
from trtpipe.errors import SpecError, TimedOut, TrtpipeError

from .sandbox_runtime import SandboxClient, requirement_closure, sandbox_unavailable
from trtpipe.settings import Settings

IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _hf_cache_snapshot(root: Path, model_dir: Path) -> Path:
    """The tiny model laid out as the Hugging Face cache does: snapshot files are relative symlinks
    into the repository's blobs folder."""
    repo = root / "hub" / "models--acme--tiny-llama"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / REVISION
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for source in sorted(model_dir.iterdir()):
        data = source.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / source.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snapshot


def _calibration_text(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(f"Paragraph {i}: a calibration sample about checkpoints, engines and the GPUs "
                                f"they run on, number {i}." for i in range(48)) + "\n", encoding="utf-8")
    return path


def _spec(root: Path, model: Path, *, gpu: str = "h100-sxm", executor: str = "docker", dataset: Path | None = None,
          toolchain: str = "trtllm-1.2.1", algo: str = "fp8") -> Path:
    calibration = f", calibration: {{dataset: {dataset}, samples: 8, max_seq_len: 64}}" if dataset else ""
    path = root / "specs" / f"{gpu}-{executor}-{toolchain}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"name: tiny\nmodel: {{path: {model}}}\ntarget: {{gpu: {gpu}, executor: {executor}}}\n"
        f"quantization: {{algo: {algo}{calibration}}}\n"
        "engine: {max_batch_size: 4, max_input_len: 128, max_seq_len: 256}\n"
        f"toolchain: {toolchain}\n",
        encoding="utf-8",
    )
    return path


def _resolve(path: Path):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    return resolve(load_spec(path))


def _with_image(resolved):
    import dataclasses

    return dataclasses.replace(resolved, toolchain=resolved.toolchain.model_copy(update={"triton_container": IMAGE}))


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def layout(tmp_path_factory, tiny_llama_dir):
    """A GPU-target spec of the tiny model from an HF-cache-style snapshot, with a calibration file
    elsewhere, and the checkpoint an in-process (CPU) conversion of it writes."""
    from trtpipe.checkpoint.convert import convert_checkpoint

    root = tmp_path_factory.mktemp("conversion")
    snapshot = _hf_cache_snapshot(root, tiny_llama_dir)
    dataset = _calibration_text(root / "data" / "calibration.txt")
    spec = _spec(root, snapshot, dataset=dataset)
    resolved = _resolve(spec)
    reference = root / "in-process"
    reference.mkdir()
    convert_checkpoint(resolved, reference)
    return {"root": root, "snapshot": snapshot, "dataset": dataset, "spec": spec, "resolved": resolved,
            "reference": _files(reference)}


# --- the job and the container: pure


def test_container_mounts_the_inputs_read_only_and_nothing_else(layout, tmp_path):
    resolved, snapshot, dataset = layout["resolved"], layout["snapshot"], layout["dataset"]
    out = tmp_path / "store" / "tmp" / "checkpoint-KEY-abcd"
    job = make_job(resolved, out)
    spec = conversion_container_spec(_with_image(resolved).toolchain, job, user="1000:1000",
                                     trtpipe_package=Path("/src/trtpipe"), build_configs=Path("/src/build_configs"))
    blobs = snapshot.parent.parent / "blobs"
    job_dir = tmp_path / "store" / "tmp" / ".checkpoint-KEY-abcd-job"
    assert job.job_dir == job_dir == job_dir_for(out)
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
        (str(snapshot), str(snapshot), True),  # the model folder, read-only
        (str(blobs), str(blobs), True),  # where its symlinks point (the HF cache's blobs)
        (str(dataset), str(dataset), True),  # the calibration data
        (str(job_dir), str(job_dir), False),  # the job's spec in, its summary out
        (str(out), str(out), False),  # the checkpoint
        ("/src/trtpipe", "/opt/trtpipe-src/trtpipe", True),
        ("/src/build_configs", "/opt/trtpipe-src/build_configs", True),
    ]
    # Every file the model folder names resolves inside a read-only mount at the same path.
    same_path_ro = [Path(m.source) for m in spec.mounts if m.read_only and m.source == m.target]
    for entry in snapshot.iterdir():
        real = entry.resolve()
        assert any(real == m or m in real.parents for m in same_path_ro), entry
    # Nothing else of the host: not the spec's folder, not the store, not the root of the layout.
    sources = {m.source for m in spec.mounts}
    assert not sources & {str(layout["spec"].parent), str(tmp_path / "store"), str(layout["root"])}
    assert spec.command == ["python3", "-m", "trtpipe.engine.convert_entry", "--spec", f"{job_dir}/spec.json",
                            "--out", str(out), "--summary", f"{job_dir}/summary.json", "--device", "cuda"]
    assert spec.environment["PYTHONPATH"] == "/opt/trtpipe-src"
    assert spec.environment["HF_HUB_OFFLINE"] == "1"
    assert spec.user == "1000:1000" and spec.image == IMAGE
    assert spec.device_requests == [{"Driver": "nvidia", "Capabilities": [["gpu"]], "Count": 1}]
    kwargs = spec.run_kwargs()
    assert [(m["Source"], m["ReadOnly"]) for m in kwargs["mounts"]] == [(m.source, m.read_only) for m in spec.mounts]


def test_a_calibration_file_inside_the_model_folder_needs_no_mount_of_its_own(tmp_path, tiny_llama_dir):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    dataset = _calibration_text(model / "calibration.txt")
    resolved = _resolve(_spec(tmp_path, model, dataset=dataset))
    assert make_job(resolved, tmp_path / "out").read_only == [model.resolve()]


def test_job_spec_converts_exactly_what_the_key_covers(layout, trtpipe_home):
    """The spec the executor reads has absolute real paths; its keys equal the original spec's."""
    import json

    from trtpipe.pipeline import stage_keys

    resolved = layout["resolved"]
    converted = job_spec(resolved)
    assert converted["model"]["path"] == str(layout["snapshot"].resolve())
    assert converted["quantization"]["calibration"]["dataset"] == str(layout["dataset"].resolve())
    original = resolved.spec.model_dump(mode="json")
    for section in ("target", "limits", "runtime", "backend", "toolchain"):
        assert converted[section] == original[section]
    assert {k: v for k, v in converted["quantization"].items() if k != "calibration"} == \
        {k: v for k, v in original["quantization"].items() if k != "calibration"}
    written = layout["root"] / "job-spec.json"
    written.write_text(json.dumps(converted), encoding="utf-8")
    assert stage_keys(written, settings=Settings.from_env()) == stage_keys(layout["spec"], settings=Settings.from_env())


def test_the_key_does_not_depend_on_where_the_conversion_runs(layout, trtpipe_home):
    from trtpipe.pipeline import stage_keys

    root, snapshot, dataset = layout["root"], layout["snapshot"], layout["dataset"]
    keys = {executor: stage_keys(_spec(root, snapshot, executor=executor, dataset=dataset), settings=Settings.from_env())
            for executor in ("auto", "local", "docker")}
    assert keys["auto"] == keys["local"] == keys["docker"]
    # cpu-reference converts in-process: still the same checkpoint key (its engine differs, of course)
    reference = stage_keys(_spec(root, snapshot, gpu="cpu-reference", executor="auto", dataset=dataset), settings=Settings.from_env())
    assert reference["checkpoint"] == keys["docker"]["checkpoint"]


def test_local_conversion_command_and_environment(tmp_path):
    toolchain = _resolve_example_toolchain()
    job = ConversionJob(job_dir=tmp_path / "job", out_dir=tmp_path / "out", read_only=[tmp_path / "m"])
    executor = LocalExecutor(toolchain, target_sm=90, check_host=False, env={"PYTHONPATH": "/elsewhere", "X": "1"})
    assert executor.conversion_command(job) == [
        sys.executable, "-m", "trtpipe.engine.convert_entry", "--spec", str(tmp_path / "job" / "spec.json"),
        "--out", str(tmp_path / "out"), "--summary", str(tmp_path / "job" / "summary.json"), "--device", "cuda"]
    env = executor.conversion_env()
    # The child converts with the trtpipe that computed the key, whatever else is on PYTHONPATH.
    assert env["PYTHONPATH"].split(os.pathsep) == [str(Path(trtpipe.__file__).resolve().parent.parent), "/elsewhere"]
    assert env["X"] == "1" and env["HF_HUB_OFFLINE"] == "1" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def _resolve_example_toolchain():
    from .conftest import resolve_example

    return resolve_example("llama3-8b-fp8-h100").toolchain


# --- refusals, before anything heavy


@pytest.mark.parametrize("toolchain, pins", [("trtllm-0.21.0", "0.31.0 and transformers 4.51.3"),
                                             ("trtllm-1.0.0", "0.33 and transformers 4.53.1")])
def test_toolchains_the_converter_is_not_written_for_are_refused(toolchain, pins, layout, trtpipe_home, capsys):
    spec = _spec(layout["root"], layout["snapshot"], toolchain=toolchain, dataset=layout["dataset"])
    code = main(["build", str(spec)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert f"toolchain {toolchain} converts with nvidia-modelopt {pins}" in errors[0]
    assert "use toolchain trtllm-1.1.0 or trtllm-1.2.1" in errors[0] and "Traceback" not in err
    assert not any((trtpipe_home / "checkpoint").glob("*"))


def test_a_toolchain_without_converter_pins_is_refused(layout, monkeypatch):
    """resolve (so spec-check) refuses it at the spec's toolchain field: the key could not name the pins."""
    import trtpipe.resolve

    pinned = layout["resolved"].toolchain  # trtllm-1.2.1: ModelOpt 0.37, transformers 4.57.3
    unpinned = pinned.model_copy(update={"modelopt_version": None})
    monkeypatch.setattr(trtpipe.resolve, "get_toolchain", lambda name, configs: unpinned)
    with pytest.raises(SpecError, match="pins no nvidia-modelopt version, so the checkpoint key cannot name") as info:
        _resolve(layout["spec"])
    assert info.value.field == "toolchain"


def test_local_preflight_names_converter_packages_that_differ_from_the_pins():
    """Read from package metadata (nothing imported): this host has ModelOpt 0.37.0 and transformers 4.57.3."""
    from trtpipe.versions import installed_version

    toolchain = _resolve_example_toolchain().model_copy(update={"modelopt_version": "0.33"})
    missing = LocalExecutor(toolchain, target_sm=90).missing_converter_packages()
    assert missing == [f"nvidia-modelopt 0.33 (found {installed_version('nvidia-modelopt')})"]
    assert LocalExecutor(_resolve_example_toolchain(), target_sm=90).missing_converter_packages() == []


def test_entry_point_without_the_container_packages_fails_in_one_line(tmp_path):
    """`python -S` sees no site-packages: the entry names what it lacks, exit 3, before importing any."""
    source_root = str(Path(trtpipe.__file__).resolve().parent.parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "trtpipe.engine.convert_entry", "--spec", str(tmp_path / "s.json"),
         "--out", str(tmp_path)], capture_output=True, text=True, env={"PYTHONPATH": source_root}, timeout=120)
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        f"[trtpipe-convert] error: this Python environment ({sys.executable}) lacks pydantic, pyyaml, rich, torch, "
        "safetensors, tokenizers, transformers, nvidia-modelopt, accelerate, which the conversion imports; "
        "run it in the toolchain's TensorRT-LLM container or environment"]


def test_the_entry_points_error_and_exit_status_reach_the_host(tmp_path):
    """A failing container's last `[trtpipe-convert] error:` line becomes the stage's one-line error."""
    from .test_executors import _StandInClient, _StandInContainer

    line = (b"[trtpipe-convert] error: nvidia-modelopt 0.35.1 is installed but toolchain trtllm-1.2.1 pins 0.37; "
            b"pip install nvidia-modelopt==0.37\n")
    container = _StandInContainer([b"[trtpipe] converting on cuda ...\n", line], 1, False)
    executor = DockerExecutor(_resolve_example_toolchain().model_copy(update={"triton_container": IMAGE}),
                              client=_StandInClient(container), show_progress=False)
    job = ConversionJob(job_dir=tmp_path / "job", out_dir=tmp_path / "out")
    with pytest.raises(BuildFailed) as info:
        executor.run_conversion(job, tmp_path / "conversion.log")
    text = info.value.one_line()
    assert text.startswith(f"checkpoint conversion (docker, {IMAGE}) failed: nvidia-modelopt 0.35.1 is installed")
    assert "\n" not in text and info.value.exit_code == 1 and container.removed
    missing = _StandInContainer([b"[trtpipe-convert] error: this Python environment lacks accelerate\n"], 3, False)
    executor.client = _StandInClient(missing)
    with pytest.raises(BuildFailed) as info:
        executor.run_conversion(job, tmp_path / "conversion2.log")
    assert info.value.exit_code == 3 and "lacks accelerate" in info.value.one_line()


@pytest.mark.timeout(60)
def test_a_silent_container_is_killed_at_the_timeout(tmp_path):
    """The timeout holds while the container prints nothing (the log stream blocks until it is killed)."""
    import threading

    killed = threading.Event()

    class Silent:
        attrs: dict = {}
        removed = False

        def logs(self, stream, follow):
            yield b"[trtpipe] loading model: 0/1\n"
            killed.wait(30)

        def kill(self):
            killed.set()

        def wait(self):
            return {"StatusCode": 137}

        def reload(self):
            self.attrs = {"State": {"OOMKilled": False}}

        def remove(self, force):
            self.removed = True

    from .test_executors import _StandInClient

    container = Silent()
    executor = DockerExecutor(_resolve_example_toolchain().model_copy(update={"triton_container": IMAGE}),
                              client=_StandInClient(container), timeout_s=1, show_progress=False)
    with pytest.raises(TimedOut, match="ran past its limit of 1s") as info:  # a BuildFailed before issue 13
        executor.run_conversion(ConversionJob(job_dir=tmp_path / "j", out_dir=tmp_path / "o"), tmp_path / "c.log")
    assert info.value.seconds == 1 and "backend.conversion_timeout" in info.value.one_line()
    assert killed.is_set() and container.removed
    assert "killed after timeout of 1s" in (tmp_path / "c.log").read_text()


# --- real conversions of the tiny model through the executors (CPU here; the GPU host: test_gpu_conversion)


def _progress_counts(log: Path) -> list[tuple[int, int]]:
    """The calibration's progress lines the executor relayed: windows of pass 1 (ModelOpt's whole-model path)
    or decoder layers (the layer-wise path CPU calibration takes), as (done, total)."""
    pattern = r"\[trtpipe\] calibrating (?:\(pass 1\)|and exporting layers): (\d+)/(\d+)"
    return [(int(a), int(b)) for a, b in re.findall(pattern, log.read_text())]


@pytest.mark.timeout(600)
def test_local_executor_converts_the_same_checkpoint_as_in_process(layout, tmp_path):
    out = tmp_path / "store" / "tmp" / "checkpoint-KEY-local"
    out.mkdir(parents=True)
    log = tmp_path / "conversion.log"
    executor = LocalExecutor(layout["resolved"].toolchain, target_sm=90, check_host=False, show_progress=False)
    meta = convert_in_executor(layout["resolved"], out, log, executor=executor, device="cpu")
    assert _files(out) == layout["reference"]  # byte for byte: the same checkpoint, the same digest
    assert meta["conversion"]["executor"] == "local" and meta["convert"]["quant_algo"] == "FP8"
    assert not job_dir_for(out).exists()
    text = log.read_text()
    assert f"with trtpipe {trtpipe.__version__} from {Path(trtpipe.__file__).resolve().parent}," in text
    counts = _progress_counts(log)
    assert counts and counts[0][0] == 0 and counts[-1][0] == counts[-1][1] > 0


@pytest.mark.timeout(600)
def test_docker_executor_converts_in_a_sandbox_of_only_its_mounts(layout, tmp_path):
    """The container's exact run_kwargs, run where only its mounts exist and only the container's
    package set is importable: the same checkpoint, byte for byte, with trtpipe from the mount."""
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    resolved = _with_image(layout["resolved"])
    out = tmp_path / "store" / "tmp" / "checkpoint-KEY-docker"
    out.mkdir(parents=True)
    log = tmp_path / "conversion.log"
    client = SandboxClient(only_distributions=requirement_closure(CONTAINER_PACKAGES))
    executor = DockerExecutor(resolved.toolchain, client=client, show_progress=False)
    meta = convert_in_executor(resolved, out, log, executor=executor, device="cpu")
    assert _files(out) == layout["reference"]
    assert meta["conversion"] == {**meta["conversion"], "executor": "docker", "image": IMAGE, "device": "cpu"}
    text = log.read_text()
    assert "with trtpipe 0.1.0 from /opt/trtpipe-src/trtpipe," in text.replace(trtpipe.__version__, "0.1.0")
    assert text.startswith("$ docker run --rm --gpus 1 ")
    counts = _progress_counts(log)
    assert counts and counts[-1][0] == counts[-1][1] > 0
    assert client.container is not None and client.container.removed and not job_dir_for(out).exists()


@pytest.mark.timeout(300)
def test_the_sandbox_hides_what_is_not_mounted(layout, tmp_path):
    """Without the calibration file's mount the same container fails, in one line naming the file:
    the sandbox test above proves the mounts suffice, not merely that the host was visible."""
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    resolved = _with_image(layout["resolved"])
    out = tmp_path / "out"
    out.mkdir()
    dataset = str(layout["dataset"].resolve())
    client = SandboxClient(keep_mount=lambda mount: mount["Source"] != dataset,
                           only_distributions=requirement_closure(CONTAINER_PACKAGES))
    executor = DockerExecutor(resolved.toolchain, client=client, show_progress=False)
    with pytest.raises(TrtpipeError) as info:
        convert_in_executor(resolved, out, tmp_path / "c.log", executor=executor, device="cpu")
    text = info.value.one_line()
    assert f"quantization.calibration.dataset: {dataset} does not exist" in text and "\n" not in text
    assert not any(out.iterdir())


@pytest.mark.timeout(300)
def test_build_of_a_gpu_target_converts_in_the_executors_container(layout, trtpipe_home, monkeypatch, capsys):
    """`trtpipe build` of a GPU target hands the conversion to the docker executor's container (here the
    sandbox standing in for the daemon) and asks it for the target's GPU: with no GPU there, the
    converter inside refuses in one line, exit 3, after the host's checks passed; nothing is stored."""
    if reason := sandbox_unavailable():
        pytest.skip(reason)
    client = SandboxClient(only_distributions=requirement_closure(CONTAINER_PACKAGES))
    monkeypatch.setattr("trtpipe.engine.executors.docker.connect", lambda timeout_s=0.8: client)
    monkeypatch.setattr("trtpipe.engine.stage.connect", lambda timeout_s=0.8: client)
    code = main(["build", str(layout["spec"])])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 3 and len(errors) == 1, err
    assert errors[0].startswith(f"error: checkpoint conversion (docker, {IMAGE}) failed: checkpoint conversion on "
                                "the GPU: torch ") and "sees no CUDA device" in errors[0]
    kwargs = client.run_kwargs
    assert kwargs["command"][-2:] == ["--device", "cuda"] and kwargs["user"] == f"{os.getuid()}:{os.getgid()}"
    assert kwargs["device_requests"][0]["Count"] == 1 and kwargs["device_requests"][0]["Driver"] == "nvidia"
    logs = list((trtpipe_home / "logs").glob("checkpoint-*.log"))
    assert len(logs) == 1 and "converting on cuda with trtpipe" in logs[0].read_text()
    assert "from /opt/trtpipe-src/trtpipe," in logs[0].read_text()
    assert not any((trtpipe_home / "checkpoint").glob("*"))
    assert not [p for p in (trtpipe_home / "tmp").iterdir() if "checkpoint-" in p.name]


def test_dry_run_shows_the_local_command_and_a_refusal(layout, trtpipe_home, capsys):
    import json

    root, snapshot, dataset = layout["root"], layout["snapshot"], layout["dataset"]
    assert main(["build", str(_spec(root, snapshot, executor="local", dataset=dataset)), "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    checkpoint = next(s for s in report["stages"] if s["name"] == "checkpoint")
    assert checkpoint["outcome"] == "would-build" and checkpoint["executor"] == "local"
    assert checkpoint["command"][:3] == [sys.executable, "-m", "trtpipe.engine.convert_entry"]
    assert checkpoint["command"][-2:] == ["--device", "cuda"] and checkpoint["container"] is None
    # A toolchain the converter is not written for: resolve refuses it, so a dry run does too (exit 2, one
    # line); before issue 13 the dry run passed and only noted "(refused: ...)" under the conversion.
    assert main(["build", str(_spec(root, snapshot, toolchain="trtllm-1.0.0", dataset=dataset)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "toolchain trtllm-1.0.0 converts with nvidia-modelopt 0.33" in err and "Traceback" not in err
