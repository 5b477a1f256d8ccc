"""Issue 22: GPU serve is watched like CPU serve. The Triton container's `docker run` is a child process that is
waited for, identity-checked over gRPC, watched and restarted (trtpipe.serving.container).

No Docker daemon or GPU here: the runtime executable (TRTPIPE_DOCKER, or the launcher's `runtime`) is a stand-in
(docker_standin.py) that takes the exact `docker run` argv and starts the CPU tritonserver on the mounted folder and
published ports instead. The repository it serves is the tiny cpu-reference one, served through the container
path (the launcher is the container's); the CLI tests serve a real GPU repository (published with
`publish --engine` from a stand-in engine), which the stand-in cannot run, so they see its failures and a server
that answers with another repository's digest. Deadlines are liveness bounds for a loaded 2-core host; every wait
is on an event.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.serving.client import TritonLLMClient
from trtpipe.serving.watch import TICK_S, WatchPolicy, find_stubs
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(600)

STANDIN = Path(__file__).with_name("docker_standin.py")
REPORT_DEADLINE_S = 60 * TICK_S
PROMPT = "Once upon a time"
ACCEPTANCE = Path(__file__).resolve().parents[2] / "build_configs" / "examples" / "llama3-8b-fp8-h100.yaml"


class Standin:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.runtime = root / "docker"
        self.calls_file = root / "calls.jsonl"
        self.shm = f"standin_{os.getpid()}_{root.name[-6:]}_"

    def calls(self) -> list[list[str]]:
        if not self.calls_file.is_file():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "standin"
    (root / "work").mkdir(parents=True)
    made = Standin(root)
    made.runtime.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    made.runtime.chmod(0o755)
    monkeypatch.setenv("STANDIN_CALLS", str(made.calls_file))
    monkeypatch.setenv("STANDIN_WORK", str(root / "work"))
    monkeypatch.setenv("STANDIN_SHM", made.shm)
    monkeypatch.delenv("STANDIN_MODE", raising=False)
    # A secret in serve's environment: the stand-in refuses to start if the runtime is handed it.
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", "not-for-containers")
    yield made
    for region in Path("/dev/shm").glob(f"{made.shm}*"):  # what a killed stub of the stand-in's server left
        region.unlink(missing_ok=True)


@pytest.fixture
def cpu_home(example_repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the example's store (hard links kept): (store, the cpu-reference repository in it)."""
    import shutil

    home = tmp_path / "home"
    subprocess.run(["cp", "-a", str(example_repo.parent.parent), str(home)], check=True)
    shutil.rmtree(home / "serving", ignore_errors=True)  # another server's live directory: not ours
    return home, home / "repository" / example_repo.name


@pytest.fixture
def gpu_repo(tmp_path: Path, tiny_llama_dir: Path, standin_engine, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    """A real GPU repository of the 8B example (publish --engine of a stand-in engine): (its path, its digest)."""
    engine = standin_engine(ACCEPTANCE, tmp_path / "engine")
    assert main(["publish", str(ACCEPTANCE), "--engine", str(engine), "--store", str(tmp_path / "gpu-store"),
                 "--tokenizer", str(tiny_llama_dir), "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)
    return Path(outcome["repository_path"]), outcome["repository_digest"]


def _entry_digest(repo: Path) -> str:
    from trtpipe.store.local import Store

    return Store.holding(repo)[1].digest  # type: ignore[index]


def _free_ports() -> list[str]:
    from trtpipe.serving.server import free_ports

    return [str(p) for p in free_ports(3)]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- the container path, served for real
def test_the_container_path_waits_checks_identity_and_restarts_a_killed_stub(cpu_home: tuple[Path, Path],
                                                                            standin: Standin) -> None:
    from trtpipe.serving.container import ContainerTriton
    from trtpipe.serving.repository_files import read_manifest
    from trtpipe.serving.server import container_image, container_name, docker_command
    from trtpipe.serving.watch import serve_watched

    _home, repo = cpu_home
    manifest = read_manifest(repo)
    launcher = ContainerTriton(runtime=str(standin.runtime), manifest=manifest, what="the Triton container")
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve_watched(repo, on_event=events.put, stop=stop, start_timeout=240, launcher=launcher,
                          policy=WatchPolicy(probe_interval_s=0, restart="on-failure", max_restarts=1, backoff_s=0.5), settings=Settings.from_env())
        except BaseException as err:  # noqa: BLE001 - what the test is about
            failure.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        ready = events.get(timeout=300)
        assert ready.event == "ready" and ready.restarts == 0, (ready, failure)
        # Ready means: every model ready, HTTP and metrics answering, and the server reported this digest.
        assert ready.repository_digest == _entry_digest(repo) and ready.container == container_image(manifest)
        # What ran is exactly the container command `serve --print` renders, with the runtime executable in front.
        (run_call,) = [c for c in standin.calls() if c[0] == "run"]
        grpc, http, metrics = (int(u.rsplit(":", 1)[1].split("/")[0]) for u in
                               (ready.grpc_url, ready.http_url, ready.metrics_url))
        expected = docker_command(Path(ready.serving_dir), manifest, grpc_port=grpc, http_port=http,
                                  metrics_port=metrics, name=container_name(ready.repository_digest, grpc))
        assert run_call == expected[1:]
        assert f"{ready.serving_dir}:/trtpipe/repo:ro" in run_call and "127.0.0.1:%d:%d" % (grpc, grpc) in run_call
        assert TritonLLMClient(ready.grpc_url, timeout=120).generate(PROMPT, 2, top_k=1).output_token_ids

        (stub,) = [s for s in find_stubs(ready.pid) if s.model == "tensorrt_llm"]
        os.kill(stub.pid, signal.SIGKILL)
        unhealthy = events.get(timeout=REPORT_DEADLINE_S)
        assert (unhealthy.event, unhealthy.action) == ("unhealthy", "restart"), unhealthy
        assert unhealthy.kind == "server-exited" or unhealthy.model == "tensorrt_llm", unhealthy
        restarting = events.get(timeout=60)
        assert restarting.event == "restarting" and restarting.restart == 1
        again = events.get(timeout=300)
        assert again.event == "restarted" and again.restarts == 1 and again.pid != ready.pid, (again, failure)
        assert again.grpc_url == ready.grpc_url and again.serving_dir == ready.serving_dir
        assert again.repository_digest == ready.repository_digest
        assert len([c for c in standin.calls() if c[0] == "run"]) == 2  # the same container command, again
        assert TritonLLMClient(again.grpc_url, timeout=120).generate(PROMPT, 2, top_k=1).output_token_ids
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and failure == []
    assert not Path(ready.serving_dir).exists()  # removed with its server
    assert _port_free(grpc)


# --------------------------------------------------------------------------- the CLI on a GPU repository
def test_a_server_reporting_another_digest_is_refused_naming_both(gpu_repo: tuple[Path, str],
                                                                  cpu_home: tuple[Path, Path], standin: Standin,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The stand-in serves another repository than the one mounted (say, an old container still holding the
    port): ready, but it reports the other digest; serve stops it and exits 1, naming both."""
    from trtpipe.serving.serving_copy import prepare

    repo, digest = gpu_repo
    _home, cpu_repo = cpu_home
    other = prepare(cpu_repo, kept=True)
    monkeypatch.setenv("TRTPIPE_DOCKER", str(standin.runtime))
    monkeypatch.setenv("STANDIN_MODE", "other")
    monkeypatch.setenv("STANDIN_OTHER", str(other.path))
    grpc, http, metrics = _free_ports()
    code = main(["serve", str(repo), "--grpc-port", grpc, "--http-port", http, "--metrics-port", metrics,
                 "--start-timeout", "300", "--probe-interval", "0"])
    out = capsys.readouterr()
    assert code == 1, out
    (line,) = out.err.strip().splitlines()
    assert line.startswith(f"error: the server at 127.0.0.1:{grpc} reports trtpipe_repository_digest "
                           f"{other.repository_digest}, not {digest} of {repo}")
    assert other.repository_digest != digest and "Traceback" not in out.err
    assert out.out == ""  # never announced as ready
    assert [c[0] for c in standin.calls()][0] == "run" and {c[0] for c in standin.calls()} <= {"run", "rm"}
    assert len([c for c in standin.calls() if c[0] == "run"]) == 1
    assert _port_free(int(grpc))  # the server that was not ours was stopped


def test_a_container_that_exits_at_once_is_one_line_with_its_log_tail(gpu_repo: tuple[Path, str],
                                                                      standin: Standin,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    repo, _digest = gpu_repo
    monkeypatch.setenv("TRTPIPE_DOCKER", str(standin.runtime))
    monkeypatch.setenv("STANDIN_MODE", "fail")
    grpc, http, metrics = _free_ports()
    code = main(["serve", str(repo), "--grpc-port", grpc, "--http-port", http, "--metrics-port", metrics,
                 "--start-timeout", "300"])
    out = capsys.readouterr()
    assert code == 1 and out.out == ""
    (line,) = out.err.strip().splitlines()
    assert line.startswith("error: the Triton container nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 did not "
                           f"become ready on {repo} (the Triton container ")
    assert "exited with code 1: its log ends: " in line
    assert ("E1201 00:00:00.001 1 model_repository_manager.cc:1] failed to load 'tensorrt_llm': stand-in failure | "
            "error: creating server: Internal - failed to load all models)") in line
    log = Path(line.rsplit("see the server log ", 1)[1].split(";")[0])
    assert "stand-in failure" in log.read_text()
    (run_call,) = [c for c in standin.calls() if c[0] == "run"]
    assert ["--name", f"trtpipe-{_digest.removeprefix('sha256:')[:12]}-{grpc}"] == \
        run_call[run_call.index("--name"):run_call.index("--name") + 2]
    # The client exited with an error: the container is removed by name, in case it outlived its client.
    assert ["rm", "-f", f"trtpipe-{_digest.removeprefix('sha256:')[:12]}-{grpc}"] in standin.calls()


def test_no_container_runtime_or_no_daemon_is_exit_3(gpu_repo: tuple[Path, str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    repo, _digest = gpu_repo
    grpc, http, metrics = _free_ports()
    ports = ["--grpc-port", grpc, "--http-port", http, "--metrics-port", metrics]
    monkeypatch.setenv("TRTPIPE_DOCKER", str(tmp_path / "no-such-docker"))
    assert main(["serve", str(repo), *ports]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"no container runtime '{tmp_path / 'no-such-docker'}' here" in line and "TRTPIPE_DOCKER" in line
    # The real docker CLI, where there is one but no daemon behind it: its own answer becomes exit 3.
    import shutil

    monkeypatch.delenv("TRTPIPE_DOCKER")
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI here")
    if subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("a Docker daemon is reachable here")
    assert main(["serve", str(repo), *ports]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: no Docker daemon reachable to run nvcr.io/nvidia/tritonserver:26.04")
    assert "Cannot connect to the Docker daemon" in line


# --------------------------------------------------------------------------- issue 23: waited for and logged the same
def test_the_container_path_writes_the_ready_file_streams_its_log_and_says_where_it_is(
        cpu_home: tuple[Path, Path], standin: Standin, tmp_path: Path) -> None:
    """The ready file, the named log with the container's output, the follower and the stopped event, through the
    Triton container's launcher (the stand-in runs the CPU server from the docker argv)."""
    import io

    from trtpipe.serving.container import ContainerTriton
    from trtpipe.serving.repository_files import read_manifest
    from trtpipe.serving.server import container_image
    from trtpipe.serving.server_log import ServerLog
    from trtpipe.serving.watch import serve_watched

    _home, repo = cpu_home
    manifest = read_manifest(repo)
    launcher = ContainerTriton(runtime=str(standin.runtime), manifest=manifest, what="the Triton container")
    ready_file, log = tmp_path / "serve.json", tmp_path / "triton.log"
    followed = io.StringIO()
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve_watched(repo, on_event=events.put, stop=stop, start_timeout=240, launcher=launcher,
                          policy=WatchPolicy(probe_interval_s=0), ready_file=ready_file,
                          server_log=ServerLog(path=log, follow=followed), settings=Settings.from_env())
        except BaseException as err:  # noqa: BLE001 - what the test is about
            failure.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        ready = events.get(timeout=300)
        assert ready.event == "ready", (ready, failure)
        on_file = json.loads(ready_file.read_text())
        assert on_file["container"] == container_image(manifest) and on_file["pid"] == ready.pid
        assert on_file["repository_digest"] == _entry_digest(repo) and on_file["log"] == str(log)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and failure == []
    stopped = events.get(timeout=10)
    assert (stopped.event, stopped.failed, stopped.log, stopped.log_kept) == ("stopped", False, str(log), True)
    assert not ready_file.exists()
    # What the container's client printed is in the named log, and was followed as it came.
    assert "successfully loaded 'ensemble'" in log.read_text() and "successfully loaded 'ensemble'" in followed.getvalue()


def test_a_detached_gpu_serve_whose_container_fails_returns_its_line_and_exit_code(
        gpu_repo: tuple[Path, str], standin: Standin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, _digest = gpu_repo
    monkeypatch.setenv("TRTPIPE_DOCKER", str(standin.runtime))
    monkeypatch.setenv("STANDIN_MODE", "fail")
    ready_file = tmp_path / "serve.json"
    grpc, http, metrics = _free_ports()
    done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "serve", str(repo), "--detach", "--ready-file",
                           str(ready_file), "--grpc-port", grpc, "--http-port", http, "--metrics-port", metrics,
                           "--start-timeout", "300"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: the Triton container nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 did not "
                           f"become ready on {repo} (the Triton container ")
    log = tmp_path / "serve.json.log"
    assert line.endswith(f"(serve's output and its server's log: {log})")
    assert "stand-in failure" in log.read_text() and not ready_file.exists()
