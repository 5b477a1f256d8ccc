"""Executors: process-group/timeout/log machinery with real child processes, host preflight that fails
in one line, the docker container spec (pure, no daemon), and the reference executor end to end."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trtpipe.engine.executors.base import BuildFailed, run_logged_process
from trtpipe.engine.executors.docker import (
    CHECKPOINT_MOUNT,
    ENGINE_MOUNT,
    DockerExecutor,
    container_spec,
)
from trtpipe.engine.executors.local import LocalExecutor
from trtpipe.engine.plan import make_build_plan
from trtpipe.engine.stage import build_engine, choose_executor_name
from trtpipe.errors import MissingCapability, TimedOut

from .conftest import resolve_example, resolve_text

# A stand-in for the trtllm-build binary: a real process that logs, spawns a grandchild, and exits
# as told. It tests OUR process handling (group kill, timeout, log streaming, diagnosis), not a build.
STAND_IN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    mode = os.environ.get("STAND_IN_MODE", "ok")
    print("[TRT-LLM] [I] argv:", " ".join(sys.argv[1:]), flush=True)
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(os.environ["STAND_IN_PIDFILE"], "w").write(str(child.pid))
        print("[TRT-LLM] [I] building rank 0 ...", flush=True)
        time.sleep(600)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", flush=True)
        sys.exit(1)
    if mode == "fail":
        print("something unexpected", flush=True)
        sys.exit(3)
    for i in range(3):
        print(f"[TRT-LLM] [I] step {i}", flush=True)
    sys.exit(0)
    """
)


@pytest.fixture
def stand_in(tmp_path: Path) -> list[str]:
    script = tmp_path / "stand_in_trtllm_build.py"
    script.write_text(STAND_IN, encoding="utf-8")
    return [sys.executable, str(script)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_logged_process_streams_every_line_to_the_log(tmp_path, stand_in):
    log = tmp_path / "logs" / "build.log"
    outcome = run_logged_process(stand_in + ["--x", "1"], log, timeout_s=60, show_progress=False)
    assert outcome.returncode == 0 and not outcome.timed_out
    text = log.read_text()
    assert "argv: --x 1" in text and "step 2" in text


@pytest.mark.timeout(60)
def test_timeout_kills_the_whole_process_group(tmp_path, stand_in, monkeypatch):
    pidfile = tmp_path / "grandchild.pid"
    monkeypatch.setenv("STAND_IN_MODE", "hang")
    monkeypatch.setenv("STAND_IN_PIDFILE", str(pidfile))
    log = tmp_path / "build.log"
    # The timeout leaves the stand-in time to start its grandchild even on a loaded machine.
    outcome = run_logged_process(stand_in, log, timeout_s=8, show_progress=False, kill_grace_s=2)
    assert outcome.timed_out and outcome.returncode != 0
    assert pidfile.exists(), f"the stand-in did not start its grandchild in time: {log.read_text()}"
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:  # a signalled process takes a moment to exit
        time.sleep(0.05)
    assert not _alive(grandchild), "the grandchild survived: the group was not killed"
    assert "killed after timeout" in log.read_text()


@pytest.mark.timeout(60)
def test_local_executor_timeout_is_a_timed_out_error_naming_the_spec_field(tmp_path, stand_in, monkeypatch):
    """Typed since issue 13 (a BuildFailed with the doctor's build-timeout diagnosis before): the limit, the
    spec field that sets it, the log."""
    monkeypatch.setenv("STAND_IN_MODE", "hang")
    monkeypatch.setenv("STAND_IN_PIDFILE", str(tmp_path / "pid"))
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    executor = LocalExecutor(plan_toolchain(), target_sm=90, executable=stand_in, timeout_s=2,
                             check_host=False, show_progress=False)
    with pytest.raises(TimedOut) as info:
        executor.run(plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")
    assert info.value.operation == "trtllm-build" and info.value.seconds == 2 and info.value.exit_code == 5
    line = info.value.one_line()
    assert "ran past its limit of 2s" in line and "backend.build_timeout" in line and str(tmp_path / "build.log") in line
    assert "killed after timeout" in (tmp_path / "build.log").read_text()


def test_the_spec_sets_each_executors_timeout(tmp_path, llama8b_config):
    from trtpipe.engine.conversion import make_conversion_executor
    from trtpipe.engine.stage import make_executor

    for executor_name in ("local", "docker"):
        resolved = resolve_text(tmp_path, f"model:\n  config: {llama8b_config}\ntarget:\n  gpu: h100-sxm\n"
                                          f"  executor: {executor_name}\nengine:\n  timeout: 90\n"
                                          "  conversion_timeout: 600.5\n")
        plan = make_build_plan(resolved)
        assert make_executor(resolved, plan).timeout_s == 90
        assert make_conversion_executor(resolved, plan, progress=False).timeout_s == 600.5
    default = make_executor(resolve_example("llama3-8b-fp8-h100"), plan)
    assert default.timeout_s == 4 * 3600


def plan_toolchain():
    return resolve_example("llama3-8b-fp8-h100").toolchain


def test_local_executor_runs_the_rendered_command(tmp_path, stand_in):
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    executor = LocalExecutor(plan_toolchain(), target_sm=90, executable=stand_in, check_host=False,
                             show_progress=False)
    result = executor.run(plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")
    assert result.returncode == 0
    assert result.command[len(stand_in):] == plan.render_command(tmp_path / "ckpt", tmp_path / "engine")[1:]
    assert f"--checkpoint_dir {tmp_path / 'ckpt'}" in (tmp_path / "build.log").read_text()


def test_failed_build_carries_the_doctor_diagnosis(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("STAND_IN_MODE", "oom")
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    executor = LocalExecutor(plan_toolchain(), target_sm=90, executable=stand_in, check_host=False,
                             show_progress=False)
    with pytest.raises(BuildFailed) as info:
        executor.run(plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")
    line = info.value.one_line()
    assert "cuda-oom-build" in line and "exit status 1" in line and "\n" not in line
    assert info.value.diagnoses[0].pattern_id == "cuda-oom-build"


def test_unrecognized_failure_points_at_the_log(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("STAND_IN_MODE", "fail")
    plan = make_build_plan(resolve_example("llama3-8b-fp8-h100"))
    executor = LocalExecutor(plan_toolchain(), target_sm=90, executable=stand_in, check_host=False,
                             show_progress=False)
    with pytest.raises(BuildFailed, match="exit status 3.*log: .*read the end of the log"):
        executor.run(plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")


# --- acceptance: local / docker on a host without GPU / TensorRT-LLM / daemon: one line, right type


def _host_has_local_toolchain() -> bool:
    from trtpipe.engine.executors.local import installed_version

    return installed_version("tensorrt_llm", "tensorrt-llm") is not None


@pytest.mark.skipif(_host_has_local_toolchain(), reason="this host has TensorRT-LLM installed")
def test_local_executor_names_everything_missing_in_one_line(tmp_path):
    resolved = resolve_example("llama3-8b-fp8-h100")
    resolved.spec.target.executor = "local"
    plan = make_build_plan(resolved)
    with pytest.raises(MissingCapability) as info:
        build_engine(resolved, plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")
    line = info.value.one_line()
    assert "\n" not in line
    assert "TensorRT-LLM 1.2.1 (not installed)" in line
    assert "a GPU with SM 90" in line
    assert info.value.exit_code == 3
    assert not (tmp_path / "build.log").exists()  # nothing started


def test_docker_executor_without_daemon_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    resolved = resolve_example("llama3-8b-fp8-h100")
    resolved.spec.target.executor = "docker"
    plan = make_build_plan(resolved)
    with pytest.raises(MissingCapability) as info:
        build_engine(resolved, plan, tmp_path / "ckpt", tmp_path / "engine", tmp_path / "build.log")
    line = info.value.one_line()
    assert "\n" not in line and "no Docker daemon reachable" in line and info.value.exit_code == 3


def test_cli_exit_for_missing_capability_is_one_line(tmp_path, monkeypatch, capsys):
    """The same failure through the CLI: one line on stderr, exit 3, no traceback."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    from trtpipe.engine.executors.docker import connect

    with pytest.raises(MissingCapability) as info:
        connect()
    assert info.value.one_line().count("Docker") >= 1


def test_executor_choice():
    assert choose_executor_name(resolve_example("llama3-8b-fp8-h100")) in ("local", "docker")
    resolved = resolve_example("llama3-8b-fp8-h100")
    resolved.spec.target.executor = "docker"
    assert choose_executor_name(resolved) == "docker"


# --- docker container spec: pure function, pinned


def _toolchain_with_image(resolved, image: str, digest: str | None = None):
    return resolved.toolchain.model_copy(update={"triton_container": image, "triton_container_digest": digest})


IMAGE = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
DIGEST = "sha256:" + "ab" * 32


def test_container_spec_h100_fp8_is_pinned(tmp_path):
    resolved = resolve_example("llama3-8b-fp8-h100")
    plan = make_build_plan(resolved)
    spec = container_spec(plan, _toolchain_with_image(resolved, IMAGE), Path("/data/ckpt"), Path("/data/engine"))
    assert spec.image == IMAGE and spec.image_digest is None
    assert spec.command == plan.render_command(CHECKPOINT_MOUNT, ENGINE_MOUNT)
    assert spec.device_requests == [{"Driver": "nvidia", "Capabilities": [["gpu"]], "Count": 1}]
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [
        ("/data/ckpt", "/trtpipe/checkpoint", True),
        ("/data/engine", "/trtpipe/engine", False),
    ]
    assert spec.ulimits == [{"name": "memlock", "soft": -1, "hard": -1},
                            {"name": "stack", "soft": 67108864, "hard": 67108864}]
    assert spec.ipc_mode == "host"
    assert " ".join(spec.docker_cli()) == (
        "docker run --rm --gpus 1 --ipc host --ulimit memlock=-1 --ulimit stack=67108864 "
        "-v /data/ckpt:/trtpipe/checkpoint:ro -v /data/engine:/trtpipe/engine:rw -e HOME=/tmp -w /tmp "
        f"{IMAGE} " + " ".join(plan.render_command(CHECKPOINT_MOUNT, ENGINE_MOUNT))
    )


def test_container_spec_a100_int4_by_digest_and_gpu_ids():
    resolved = resolve_example("llama3-8b-int4awq-a100")
    plan = make_build_plan(resolved)
    spec = container_spec(plan, _toolchain_with_image(resolved, IMAGE, DIGEST), Path("/c"), Path("/e"),
                          gpus=["2"], ipc_host=False, shm_size="32g")
    assert spec.image == f"nvcr.io/nvidia/tritonserver@{DIGEST}"
    assert spec.image_tag == IMAGE
    assert spec.device_requests == [{"Driver": "nvidia", "Capabilities": [["gpu"]], "DeviceIDs": ["2"]}]
    kwargs = spec.run_kwargs()
    assert kwargs["shm_size"] == "32g" and "ipc_mode" not in kwargs
    request = kwargs["device_requests"][0]
    assert request["DeviceIDs"] == ["2"] and request["Driver"] == "nvidia"
    assert [dict(u) for u in kwargs["ulimits"]] == [{"Name": "memlock", "Soft": -1, "Hard": -1},
                                                    {"Name": "stack", "Soft": 67108864, "Hard": 67108864}]
    mounts = kwargs["mounts"]
    assert mounts[0]["ReadOnly"] is True and mounts[1]["ReadOnly"] is False


def test_container_spec_needs_enough_gpus_for_the_world_size():
    resolved = resolve_example("llama3-70b-fp8-4xh100")
    plan = make_build_plan(resolved)
    toolchain = _toolchain_with_image(resolved, IMAGE)
    assert container_spec(plan, toolchain, Path("/c"), Path("/e")).device_requests[0]["Count"] == 4
    with pytest.raises(Exception, match="world size is 4"):
        container_spec(plan, toolchain, Path("/c"), Path("/e"), gpus=2)


def test_docker_run_without_daemon_fails_before_touching_anything(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    resolved = resolve_example("llama3-8b-fp8-h100")
    plan = make_build_plan(resolved)
    with pytest.raises(MissingCapability):
        DockerExecutor(_toolchain_with_image(resolved, IMAGE)).run(plan, tmp_path / "c", tmp_path / "e", tmp_path / "l")
    assert not (tmp_path / "l").exists()


# --- reference executor, end to end through the stage (real checkpoint conversion of the tiny model)


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory, tiny_llama_dir):
    from trtpipe.checkpoint.convert import convert_checkpoint

    from .conftest import resolve_text

    work = tmp_path_factory.mktemp("tiny-ref")
    resolved = resolve_text(
        work,
        f"model:\n  path: {tiny_llama_dir}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n"
        "engine:\n  max_batch_size: 4\n  max_input_len: 64\n  max_seq_len: 128\n",
    )
    # This test is about the engine stage: let the converter use the installed ModelOpt/transformers
    # even where the toolchain table's pins are spelled differently (the checkpoint tests check pins).
    import dataclasses

    toolchain = resolved.toolchain.model_copy(update={"modelopt_version": None, "transformers_version": None})
    resolved = dataclasses.replace(resolved, toolchain=toolchain)
    ckpt = work / "ckpt"
    ckpt.mkdir()
    convert_checkpoint(resolved, ckpt)
    return resolved, ckpt, work


def test_reference_engine_is_built_and_validated(tiny_reference):
    resolved, ckpt, work = tiny_reference
    plan = make_build_plan(resolved)
    out = work / "engine"
    result = build_engine(resolved, plan, ckpt, out, work / "engine.log")
    config = json.loads((out / "config.json").read_text())
    assert config["version"] == resolved.toolchain.trtllm_version
    assert config["trtpipe_reference"] is True
    assert config["build_config"] == plan.build_config
    assert config["pretrained_config"] == json.loads((ckpt / "config.json").read_text())
    assert (out / "rank0.safetensors").stat().st_ino == (ckpt / "rank0.safetensors").stat().st_ino  # hard link
    assert result.executor == "reference" and result.validation.reference
    assert result.validation.gpu_sm is None and result.executor == "reference"


def test_reference_engine_loads_in_the_reference_runtime(tiny_reference):
    resolved, ckpt, work = tiny_reference
    plan = make_build_plan(resolved)
    out = work / "engine-rt"
    build_engine(resolved, plan, ckpt, out, work / "rt.log")
    from trtpipe.reference.runtime import ReferenceModel

    model = ReferenceModel.load(out)
    logits = model.logits([1, 2, 3])
    assert logits.shape[0] == 3


def test_preflight_fails_fast_before_any_stage_runs(tmp_path, monkeypatch):
    from trtpipe.engine.stage import preflight

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    resolved = resolve_example("llama3-8b-int4awq-a100")
    plan = make_build_plan(resolved)
    resolved.spec.target.executor = "docker"
    with pytest.raises(MissingCapability) as info:
        preflight(resolved, plan)
    assert f"nothing listens at unix://{tmp_path}/none.sock" in info.value.one_line()
    if not _host_has_local_toolchain():
        resolved.spec.target.executor = "local"
        with pytest.raises(MissingCapability, match="a GPU with SM 80"):
            preflight(resolved, plan)


def test_reference_target_needs_no_capability(tiny_reference):
    from trtpipe.engine.stage import preflight

    resolved, _, _ = tiny_reference
    assert preflight(resolved, make_build_plan(resolved)) == "reference"


def test_container_spec_without_pinned_image_is_a_clear_error():
    resolved = resolve_example("llama3-8b-fp8-h100")
    plan = make_build_plan(resolved)
    toolchain = resolved.toolchain.model_copy(update={"triton_container": None})
    with pytest.raises(Exception, match="pins no triton_container image"):
        container_spec(plan, toolchain, Path("/c"), Path("/e"))


def test_engine_plan_cli_json(capsys):
    from trtpipe.cli import main

    from .conftest import EXAMPLES

    assert main(["engine-plan", str(EXAMPLES / "llama3-8b-fp8-h100.yaml"), "--docker", "--json",
                 "--checkpoint-dir", "/ckpt", "--output-dir", "/engine"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["command"] == make_build_plan(resolve_example("llama3-8b-fp8-h100")).render_command("/ckpt", "/engine")
    assert payload["plan"]["build_config"]["plugin_config"]["use_fp8_context_fmha"] is True
    assert payload["container"]["docker_run"][:3] == ["docker", "run", "--rm"]


@pytest.mark.timeout(60)
def test_ctrl_c_kills_the_build_group(tmp_path):
    """SIGINT to trtpipe (as Ctrl-C sends it) kills trtllm-build's whole process group."""
    import signal
    import subprocess

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN, encoding="utf-8")
    pidfile = tmp_path / "grandchild.pid"
    driver = (
        "import sys\nfrom pathlib import Path\nfrom trtpipe.engine.executors.base import run_logged_process\n"
        f"run_logged_process([sys.executable, {str(script)!r}], Path({str(tmp_path / 'b.log')!r}), "
        "timeout_s=300, show_progress=False, kill_grace_s=2)\n"
    )
    env = dict(os.environ, STAND_IN_MODE="hang", STAND_IN_PIDFILE=str(pidfile))
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.exists(), "the stand-in never started"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert "interrupted; process group killed" in (tmp_path / "b.log").read_text()


class _StandInContainer:
    """Stands in for a docker container object (no daemon here): logs, exit status, OOM state."""

    def __init__(self, lines: list[bytes], status: int, oom: bool) -> None:
        self._lines, self._status, self._oom = lines, status, oom
        self.attrs: dict = {}
        self.removed = False

    def logs(self, stream: bool, follow: bool):
        return iter(self._lines)

    def wait(self):
        return {"StatusCode": self._status}

    def reload(self):
        self.attrs = {"State": {"OOMKilled": self._oom, "ExitCode": self._status}}

    def kill(self):
        pass

    def remove(self, force: bool):
        self.removed = True


class _StandInClient:
    def __init__(self, container: _StandInContainer) -> None:
        self.container = container
        self.run_kwargs: dict = {}
        outer = self

        class Images:
            def get(self, image):
                return image

        class Containers:
            def run(self, **kwargs):
                outer.run_kwargs = kwargs
                return outer.container

        self.images, self.containers = Images(), Containers()


@pytest.mark.parametrize(
    "status, oom, lines, expect",
    [
        (0, False, [b"[TRT-LLM] [I] Total time of building all engines: 00:00:42\n"], None),
        (137, True, [b"[TRT-LLM] [I] building rank 0\n"], "container-oom-killed"),
        (1, False, [b"[TRT] [E] 2: Error Code 2: OutOfMemory (Requested size was 8589934592 bytes.)\n"], "cuda-oom-build"),
    ],
)
def test_docker_run_exit_status_and_oom_kill(tmp_path, status, oom, lines, expect):
    resolved = resolve_example("llama3-8b-fp8-h100")
    plan = make_build_plan(resolved)
    container = _StandInContainer(lines, status, oom)
    client = _StandInClient(container)
    executor = DockerExecutor(_toolchain_with_image(resolved, IMAGE), client=client)
    log = tmp_path / "docker.log"
    if expect is None:
        result = executor.run(plan, tmp_path / "c", tmp_path / "e", log)
        assert result.returncode == 0 and result.image == IMAGE and result.gpu_sm == 90
    else:
        with pytest.raises(BuildFailed) as info:
            executor.run(plan, tmp_path / "c", tmp_path / "e", log)
        assert expect in info.value.one_line()
    assert container.removed
    assert client.run_kwargs["user"] == f"{os.getuid()}:{os.getgid()}"
    assert client.run_kwargs["command"] == plan.render_command(CHECKPOINT_MOUNT, ENGINE_MOUNT)
    assert "docker run --rm" in log.read_text()
