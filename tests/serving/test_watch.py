"""Issue 14, serving: a broken server does not pretend to serve (real tritonserver, real stubs, real kills).

As found: after the `tensorrt_llm` Python stub is SIGKILLed, tritonserver 2.51.0 keeps reporting live,
ready and model-ready, every request fails with "Stub process ... is not healthy", `trtpipe serve` keeps
running, and the client says "check the prompt and parameters". A busy port printed the serving banner,
then failed with the cause only in the log.

Deadlines here are liveness bounds, not timings: serve checks processes every `TICK_S` (0.5 s) and stops
an unhealthy server within `UNHEALTHY_STOP_S`; the tests allow many times that, for a loaded 2-core host.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.serving.client import ModelProcessDied, TritonLLMClient
from trtpipe.serving.watch import TICK_S, WatchPolicy, Watchdog, find_stubs
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(400)

REPORT_DEADLINE_S = 60 * TICK_S  # 30 s for what the next 0.5 s tick notices
PROMPT = "Once upon a time"


# --------------------------------------------------------------------------- helpers
@pytest.fixture
def home_copy(example_repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the example's store (hard links kept): (home, repository). Servers started here
    leave nothing in the session's store, whatever happens to them."""
    home = tmp_path / "home"
    subprocess.run(["cp", "-a", str(example_repo.parent.parent), str(home)], check=True)
    shutil.rmtree(home / "serving", ignore_errors=True)  # another server's live directory: not ours
    return home, home / "repository" / example_repo.name


def _kill_stub(server_pid: int, model: str) -> int:
    (stub,) = [s for s in find_stubs(server_pid) if s.model == model]
    os.kill(stub.pid, signal.SIGKILL)
    return stub.pid


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie left to a parent that has not reaped it yet."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _group(pgid: int) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except OSError:
            pass
    return found


def _held_port() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _ensemble_successes(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    match = re.search(r'^nv_inference_request_success\{model="ensemble",version="1"\} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


class Served:
    """`trtpipe serve REPO --json ...` in a subprocess, as an orchestrator runs it: events line by line."""

    def __init__(self, home: Path, repo: Path, *args: str) -> None:
        env = {**os.environ, "TRTPIPE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "trtpipe.cli", "serve", str(repo), "--json", *args],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: queue.Queue[dict] = queue.Queue()
        self.stderr: list[str] = []
        self.refusal = ""
        self.readers = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            item = json.loads(line)
            if "event" in item:
                self.events.put(item)
            else:  # a refusal: the JSON object that ends stdout when serve fails
                self.refusal = line

    def next_event(self, timeout: float) -> dict:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event from serve within {timeout:g}s; stderr: {''.join(self.stderr)}") from None

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self.readers:  # both pipes are at their end once the process is gone: drained
            reader.join(timeout=60)
        return code

    def error_line(self) -> str:
        """serve's one error line: exactly one, and its last line on stderr (where, with --json, the events are
        also printed as text)."""
        lines = "".join(self.stderr).strip().splitlines()
        errors = [line for line in lines if line.startswith("error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], lines
        return errors[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def bench_running(url: str, repo: Path, metrics_url: str, seconds: int = 25) -> Iterator[subprocess.Popen]:
    """`trtpipe bench` (closed loop) against `url`, started and seen to complete requests before the block."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtpipe.cli", "bench", url, "--mode", "closed", "--concurrency", "2",
         "--requests", "100000", "--duration", str(seconds), "--input-len", "8", "--output-len", "8",
         "--tokenizer", str(repo)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while _ensemble_successes(metrics_url) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "bench never got going"
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.wait(timeout=seconds + 120)


# --------------------------------------------------------------------------- a dead stub, unwatched: as found
def test_a_dead_stub_is_named_by_the_client_bench_doctor_and_the_watchdog(example_repo: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import tritonclient.grpc as grpcclient

    from trtpipe.serving.server import start_server

    with start_server(example_repo, start_timeout=180, settings=Settings.from_env()) as server:
        client = TritonLLMClient(server.grpc_url, timeout=60)
        assert client.generate(PROMPT, 2, top_k=1).output_token_ids
        watchdog = Watchdog(server, WatchPolicy(probe_interval_s=0))
        assert {s.model for s in watchdog.stubs} == {"preprocessing", "tensorrt_llm", "postprocessing",
                                                     "tensorrt_llm_bls"}
        assert watchdog.check() is None
        blind = Watchdog(server, WatchPolicy(probe_interval_s=0.5, probe_timeout_s=30))
        blind.stubs = []  # probes only: what a stuck (not dead) process would look like

        stub_pid = _kill_stub(server.pid, "tensorrt_llm")

        # The failure as the issue found it: Triton still says all is well.
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert triton.is_server_live() and triton.is_server_ready() and triton.is_model_ready("tensorrt_llm")
        finally:
            triton.close()
        # The client names the dead model and what to do, for the ensemble and the BLS alike.
        for model in ("ensemble", "tensorrt_llm_bls"):
            with pytest.raises(ModelProcessDied) as caught:
                TritonLLMClient(server.grpc_url, model=model, timeout=60).generate(PROMPT, 2)
            err = caught.value
            assert err.dead_model == "tensorrt_llm" and err.instance == "tensorrt_llm_0_0"
            assert "the model tensorrt_llm's backend process died or hangs" in err.one_line()
            assert "must be restarted" in err.one_line() and "prompt" not in err.one_line()
        # The CLI's line for it: one line, with the command that restarts by itself.
        from trtpipe.cli import error_line

        line = error_line(err)
        assert "\n" not in line and "`trtpipe serve REPO --restart on-failure`" in line

        # doctor knows the real message text.
        log = tmp_path / "client.log"
        log.write_text(err.one_line() + "\n")
        capsys.readouterr()
        assert main(["doctor", str(log), "--json"]) == 0
        (diagnosis,) = json.loads(capsys.readouterr().out)["diagnoses"]
        assert diagnosis["pattern_id"] == "python-stub-died" and "tensorrt_llm_0_0" in diagnosis["matched_line"]

        # bench names the dead model.
        code = main(["bench", server.grpc_url, "--mode", "closed", "--concurrency", "1", "--requests", "3",
                     "--input-len", "8", "--output-len", "4", "--tokenizer", str(example_repo)])
        out = capsys.readouterr()
        assert code == 1
        assert re.search(r"the model tensorrt_llm's backend process died \(\d+ requests failed on it\); "
                         r"the server must be restarted", out.out + out.err), out

        # The watchdog: liveness names it at once ...
        problem = watchdog.check()
        assert problem is not None and problem.kind == "stub-died" and problem.model == "tensorrt_llm"
        assert problem.pid == stub_pid and f"pid {stub_pid}" in problem.detail
        assert "was killed by SIGKILL" in problem.detail
        # A watchdog that starts after the death still sees a dead stub among the server's children.
        late = Watchdog(server, WatchPolicy(probe_interval_s=0)).check()
        assert late is not None and late.kind == "stub-died" and late.pid == stub_pid and late.model is None
        assert "was killed by SIGKILL (out of memory, or killed) before it was watched" in late.detail
        # ... and the probes, without liveness, after two failures in a row.
        deadline = time.monotonic() + 3 * 30 + 30
        while (found := blind.check()) is None:
            assert time.monotonic() < deadline, "probes never made the server unhealthy"
            time.sleep(TICK_S)
        assert found.kind == "probe-failed" and found.model == "tensorrt_llm" and blind.failures == 2
        assert "2 probes in a row failed" in found.detail


# --------------------------------------------------------------------------- serve: exit (default) or restart
def test_serve_exits_1_in_one_line_when_a_stub_is_killed_under_bench(home_copy: tuple[Path, Path]) -> None:
    home, repo = home_copy
    served = Served(home, repo)
    try:
        ready = served.next_event(240)
        assert ready["event"] == "ready" and ready["watch"]["restart"] == "no"
        with bench_running(ready["grpc_url"], repo, ready["metrics_url"]) as bench:
            stub_pid = _kill_stub(ready["pid"], "tensorrt_llm")
            unhealthy = served.next_event(REPORT_DEADLINE_S)
            assert unhealthy["event"] == "unhealthy" and _stub_death_seen(unhealthy, "tensorrt_llm"), unhealthy
            if unhealthy["kind"] == "stub-died":
                assert unhealthy["pid"] == stub_pid
            assert unhealthy["action"] == "exit"
            stopped = served.next_event(REPORT_DEADLINE_S + 30)
            assert served.wait(REPORT_DEADLINE_S + 30) == 1
        assert bench.returncode == 1  # its requests failed, and it said so
    finally:
        served.close()
    line = served.error_line()
    if unhealthy["kind"] == "stub-died":
        assert line.startswith("error: model tensorrt_llm: its Python backend process (pid ")
        assert "was killed by SIGKILL" in line
    assert "the server was stopped" in line
    assert "`trtpipe serve REPO --restart on-failure`" in line and "Traceback" not in line
    # The last event says the server is gone, and where its log is kept, and why.
    assert (stopped["event"], stopped["failed"], stopped["log_kept"]) == ("stopped", True, True), stopped
    assert stopped["log"] == unhealthy["log"] and stopped["why_kept"] == "the server failed"
    assert json.loads(served.refusal)["ok"] is False  # and stdout ends with the refusal as JSON
    assert _gone(ready["pid"]) and not [p for p in _group(ready["pid"]) if not _gone(p)]  # server and stubs gone
    assert not Path(ready["serving_dir"]).exists()
    assert Path(unhealthy["log"]).is_file()  # the failed server's log is kept, and named
    shutil.rmtree(Path(unhealthy["log"]).parent)


def _stub_death_seen(event: dict, model: str) -> bool:
    """The watchdog saw the killed stub: as its death (naming its model), or, when tritonserver itself went down
    right after the stub it lost mid-request (seen on a loaded machine), as the server's exit: either way the
    server cannot serve, and the action is the same."""
    if event["kind"] == "stub-died":
        return event["model"] == model
    return event["kind"] == "server-exited"


def test_serve_restarts_on_failure_and_answers_again_then_gives_up(home_copy: tuple[Path, Path]) -> None:
    home, repo = home_copy
    served = Served(home, repo, "--restart", "on-failure", "--max-restarts", "1")
    try:
        first = served.next_event(240)
        assert first["event"] == "ready" and first["restarts"] == 0
        with bench_running(first["grpc_url"], repo, first["metrics_url"]):
            _kill_stub(first["pid"], "tensorrt_llm")
            unhealthy = served.next_event(REPORT_DEADLINE_S)
            assert (unhealthy["event"], unhealthy["action"]) == ("unhealthy", "restart")
            assert _stub_death_seen(unhealthy, "tensorrt_llm"), unhealthy
            restarting = served.next_event(60)
            assert restarting["event"] == "restarting" and restarting["restart"] == 1
            assert restarting["max_restarts"] == 1 and restarting["delay_s"] == 1.0
            again = served.next_event(240)
        assert again["event"] == "restarted" and again["restarts"] == 1 and again["pid"] != first["pid"]
        # Same address, same serving directory: clients keep their URL.
        assert again["grpc_url"] == first["grpc_url"] and again["serving_dir"] == first["serving_dir"]
        assert TritonLLMClient(again["grpc_url"], timeout=60).generate(PROMPT, 4, top_k=1).output_token_ids
        # The bound: a second death with no restart left is the end.
        _kill_stub(again["pid"], "postprocessing")
        last = served.next_event(REPORT_DEADLINE_S)
        assert last["action"] == "exit" and _stub_death_seen(last, "postprocessing"), last
        assert served.wait(REPORT_DEADLINE_S + 30) == 1
    finally:
        served.close()
    lines = "".join(served.stderr).strip().splitlines()
    assert len([line for line in lines if line.startswith("error: ")]) == 1, lines
    assert "after 1 restart, the policy's maximum" in lines[-1]
    if last["kind"] == "stub-died":
        assert lines[-1].startswith("error: model postprocessing: ")
    assert not Path(first["serving_dir"]).exists()


def test_a_restart_that_cannot_start_counts_against_the_bound(home_copy: tuple[Path, Path]) -> None:
    """The port is taken while serve waits to restart: that restart fails, in one line, and with no restart
    left serve gives up (exit 1's CheckFailed), the serving directory removed."""
    from trtpipe.errors import CheckFailed
    from trtpipe.serving.watch import serve_watched

    _home, repo = home_copy
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            serve_watched(repo, on_event=events.put, stop=stop, start_timeout=180,
                          policy=WatchPolicy(probe_interval_s=0, restart="on-failure", max_restarts=1, backoff_s=5), settings=Settings.from_env())
        except BaseException as err:  # noqa: BLE001 - what the test is about
            failure.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    holder = None
    try:
        ready = events.get(timeout=240)
        _kill_stub(ready.pid, "preprocessing")
        assert events.get(timeout=REPORT_DEADLINE_S).action == "restart"
        restarting = events.get(timeout=60)  # sent once the broken server is stopped: its ports are free
        assert restarting.event == "restarting" and restarting.delay_s == 5
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past any TIME_WAIT of the old server
        holder.bind(("127.0.0.1", int(ready.grpc_url.rsplit(":", 1)[1])))
        holder.listen()
        gave_up = events.get(timeout=240)
        thread.join(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=120)
        if holder is not None:
            holder.close()
    assert (gave_up.event, gave_up.kind, gave_up.action) == ("unhealthy", "restart-failed", "exit")
    assert f"the gRPC port {ready.grpc_url} is already in use by pid {os.getpid()}" in gave_up.detail
    (err,) = failure
    assert isinstance(err, CheckFailed) and err.check == "restarts-exhausted"
    assert "tritonserver did not come back" in err.one_line() and "after 1 restart" in err.one_line()
    assert not Path(ready.serving_dir).exists()


def test_serve_notices_a_stuck_stub_by_its_probes(home_copy: tuple[Path, Path]) -> None:
    """A stub alive but stopped (SIGSTOP): liveness cannot see it, the probes do, within the stated bound."""
    home, repo = home_copy
    interval, timeout = 1.0, 5.0
    served = Served(home, repo, "--probe-interval", str(interval), "--probe-timeout", str(timeout))
    try:
        ready = served.next_event(240)
        (stub,) = [s for s in find_stubs(ready["pid"]) if s.model == "tensorrt_llm"]
        os.kill(stub.pid, signal.SIGSTOP)
        unhealthy = served.next_event(10 * (interval + 2 * timeout))  # stated: interval + 2 x timeout
        assert (unhealthy["kind"], unhealthy["model"], unhealthy["action"]) == ("probe-failed", "tensorrt_llm", "exit")
        assert served.wait(REPORT_DEADLINE_S + 30) == 1
    finally:
        served.close()
    line = served.error_line()
    assert line.startswith("error: model tensorrt_llm: 2 probes in a row failed, the last: ")
    assert _gone(stub.pid)  # the stopped stub went with its server


def test_serve_exits_1_when_tritonserver_itself_dies(home_copy: tuple[Path, Path]) -> None:
    home, repo = home_copy
    served = Served(home, repo, "--probe-interval", "0")
    try:
        ready = served.next_event(240)
        os.kill(ready["pid"], signal.SIGKILL)
        unhealthy = served.next_event(REPORT_DEADLINE_S)
        assert unhealthy["kind"] == "server-exited" and unhealthy["action"] == "exit"
        assert served.wait(REPORT_DEADLINE_S + 30) == 1
    finally:
        served.close()
    line = served.error_line()
    assert line.startswith(f"error: tritonserver (pid {ready['pid']}) was killed by SIGKILL")
    assert "CUDA" not in line  # not the CPU-only noise of its log, which says nothing about a kill


# --------------------------------------------------------------------------- busy ports
@pytest.mark.parametrize("flag,service", [("--grpc-port", "gRPC"), ("--http-port", "HTTP"),
                                          ("--metrics-port", "metrics")])
def test_a_busy_port_is_one_line_before_any_banner(example_repo: Path, flag: str, service: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import trtpipe.serving.server as server_module

    def no_server(*_args, **_kwargs):
        raise AssertionError("a server was started on a busy port")

    monkeypatch.setattr(server_module, "_start", no_server)  # refused before any server starts
    holder, port = _held_port()
    try:
        assert main(["serve", str(example_repo), flag, str(port)]) == 2
    finally:
        holder.close()
    out = capsys.readouterr()
    assert out.out == ""  # no banner
    (line,) = out.err.strip().splitlines()
    assert line.startswith(f"error: the {service} port 127.0.0.1:{port} is already in use by pid {os.getpid()} (")
    assert "give another port" in line


def test_a_port_taken_after_the_check_is_read_from_the_server_log(example_repo: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Another process takes the HTTP port between the check and the bind: tritonserver serves gRPC,
    then exits on HTTP. Before issue 14 the banner was out by then; now the log's line becomes the
    same one-line error as the check's, and doctor knows that log."""
    import trtpipe.serving.server as server_module
    from trtpipe.errors import UsageError

    monkeypatch.setattr(server_module, "check_ports", lambda *_a, **_k: None)  # the race: the check saw it free
    holder, port = _held_port()
    log = tmp_path / "tritonserver.log"
    try:
        with pytest.raises(UsageError) as caught:
            server_module.start_server(example_repo, http_port=port, start_timeout=180, log_path=log, settings=Settings.from_env())
        assert main(["serve", str(example_repo), "--http-port", str(port)]) == 2
    finally:
        holder.close()
    expected = f"the HTTP port 127.0.0.1:{port} is already in use by pid {os.getpid()} ("
    assert caught.value.one_line().startswith(expected)
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().startswith(f"error: {expected}") and len(out.err.strip().splitlines()) == 1
    assert f"Socket '127.0.0.1:{port}' already in use" in log.read_text()  # the real text it came from
    assert main(["doctor", str(log), "--json"]) == 0
    ids = [d["pattern_id"] for d in json.loads(capsys.readouterr().out)["diagnoses"]]
    assert "port-in-use" in ids


# --------------------------------------------------------------------------- one exit code per kind of mistake
@pytest.mark.parametrize("args", [
    ["--grpc-port", "0"], ["--http-port", "70000"], ["--grpc-port", "18123", "--metrics-port", "18123"],
    ["--restart", "always"], ["--max-restarts", "-1"], ["--probe-interval", "-1"], ["--probe-timeout", "0"],
])
def test_every_bad_serve_option_is_one_line_exit_2(example_repo: Path, args: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(example_repo), *args]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in line


def test_a_start_past_its_deadline_is_exit_5_with_the_option_to_raise(example_repo: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(example_repo), "--start-timeout", "0.2"]) == 5
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.strip().splitlines()
    assert "did not become ready" in line and "within 0.2s" in line
    assert "`trtpipe serve REPO --start-timeout SECONDS`" in line


# --------------------------------------------------------------------------- the rules, without a server
def test_how_a_dead_unreaped_child_ended_is_read_from_proc() -> None:
    from trtpipe.serving.watch import how_it_ended

    killed = subprocess.Popen(["sleep", "60"])
    exited = subprocess.Popen(["sh", "-c", "exit 3"])
    killed.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    try:  # neither is reaped yet: zombies, as a dead stub of tritonserver is
        while how_it_ended(killed.pid) == "is gone" or how_it_ended(exited.pid) == "is gone":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert how_it_ended(killed.pid) == "was killed by SIGKILL (out of memory, or killed)"
        assert how_it_ended(exited.pid) == "exited with code 3"
    finally:
        killed.wait()
        exited.wait()
    assert how_it_ended(killed.pid) == "is gone"


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    from trtpipe.serving.watch import BACKOFF_MAX_S

    policy = WatchPolicy(restart="on-failure", max_restarts=8)
    assert [policy.delay_before(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, BACKOFF_MAX_S, BACKOFF_MAX_S]


def test_a_model_is_named_from_its_instance() -> None:
    from trtpipe.serving.client import dead_model

    assert dead_model("in ensemble 'ensemble', Stub process 'tensorrt_llm_0_0' is not healthy.") == \
        ("tensorrt_llm", "tensorrt_llm_0_0")
    # Named instance groups, or none: only the server's model list can tell.
    assert dead_model("Stub process 'llama_3_0' is not healthy.", ["ensemble", "llama_3"]) == ("llama_3", "llama_3_0")
    assert dead_model("Stub process 'fast_0' is not healthy.", ["llm"]) == ("fast", "fast_0")
    assert dead_model("Prompt length (300) exceeds maximum input length (256).") is None


def test_two_failed_probes_in_a_row_make_a_server_unhealthy_a_success_resets() -> None:
    """The counting rule, with probes answered from a script and a clock the test moves."""
    from types import SimpleNamespace

    from trtpipe.errors import CheckFailed

    answers = iter([None, CheckFailed("no", check="probe"), None, CheckFailed("no", check="probe"),
                    CheckFailed("still no", check="probe")])
    now = [0.0]
    handle = SimpleNamespace(pid=os.getpid(), alive=lambda: True, models=["ensemble"], grpc_url="127.0.0.1:1")
    watchdog = Watchdog(handle, WatchPolicy(probe_interval_s=10), run_probe=lambda: next(answers),  # type: ignore[arg-type]
                        clock=lambda: now[0])
    assert watchdog.stubs == []  # pytest has no Python-backend children
    seen = []
    for _ in range(5):
        now[0] += 10
        assert watchdog.check() is None  # starts a probe
        watchdog.running.done.wait(10)
        now[0] += 1
        problem = watchdog.check()  # reads it
        seen.append(watchdog.failures)
        if problem is not None:
            break
    assert seen == [0, 1, 0, 1, 2]
    assert problem is not None and problem.kind == "probe-failed" and "still no" in problem.detail
