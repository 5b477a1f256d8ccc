"""Watch a served tritonserver, and stop or restart it when it can no longer serve.

tritonserver 2.51.0 does not notice when one of its Python-backend processes ("stubs", one per model
instance) dies: it keeps answering live, ready and model-ready, and every request that reaches that model
fails with "Stub process '<instance>' is not healthy" (python_backend r24.10 does not restart a stub:
src/python_be.cc:2291-2293). So `serve` watches for itself:

- liveness, every `TICK_S` (0.5 s): the tritonserver process, and every stub process, found as the
  server's children running `triton_python_backend_stub` (its argv: stub, `<model dir>/<version>/model.py`,
  shm region, shm sizes, parent pid, backend dir, IPC handle, instance name, model dir:
  python_backend r24.10 src/stub_launcher.cc:376-381). A dead one is reported at the next tick, naming
  its model, its pid and how it ended (the kernel keeps a dead child's wait status until its parent
  reaps it, and tritonserver does not: /proc/PID/stat field 52);
- a real inference every `probe_interval_s` (default 10 s; 0 turns it off): one token from each text model
  (`ensemble`, `tensorrt_llm_bls`) with a "ping" prompt, all answered within `probe_timeout_s` (30 s). Two
  failed probes in a row (`failures_to_unhealthy`) make the server unhealthy: that catches what
  liveness cannot (a stub alive but stuck, a model that answers only errors).

A GPU target's server is its Triton container (trtpipe.serving.container): liveness then watches its `docker run`
client (the container's processes are not this host's children) and the probes watch its models; restarting it
runs the same container again on the same ports.

So a dead process is reported within about a second (the next tick). A server whose models start
failing is unhealthy within `failures_to_unhealthy * probe_interval_s` (20 s by default) when the probes
get errors; when they get no answer at all, within `probe_interval_s + failures_to_unhealthy *
probe_timeout_s` (70 s): a probe starts at most `probe_interval_s` after the previous one started, or as
soon as a slower one ended. What then happens is the policy's `restart`: "no" (the default) stops the server
and raises `CheckFailed` (exit 1), so an orchestrator sees the failure and restarts what it runs;
"on-failure" restarts tritonserver on the same serving directory and the same ports, at most
`max_restarts` times, waiting `backoff_s`, then twice as long each time (at most `BACKOFF_MAX_S`);
every step is an event the caller prints: `ServerReady`, `ServerUnhealthy`, `ServerRestarting`, `ServerRestarted`,
and `ServerStopped` last (where the last server's log is, and whether and why it is kept: trtpipe.serving.server_log).
With a ready file, serve writes it before each ready/restarted event and removes it when it stops
(trtpipe.serving.ready_file).

Each probe is a request the server counts: with the default interval, one per text model every 10 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from trtpipe.errors import CheckFailed, TrtpipeError, UsageError
from trtpipe.serving.ready_file import ServedServer, remove_ready_file, write_ready_file
from trtpipe.serving.server import (
    UNHEALTHY_STOP_S,
    Launcher,
    TritonServerHandle,
    last_error,
    port_clash,
    restart_server,
    start_server,
)
from trtpipe.serving.server_log import LogFollower, ServerLog
from trtpipe.settings import Settings

TICK_S = 0.5
BACKOFF_MAX_S = 30.0
STUB_EXECUTABLE = "triton_python_backend_stub"
PROBE_MODELS = ("ensemble", "tensorrt_llm_bls")
PROBE_PROMPT = "ping"

RestartPolicy = Literal["no", "on-failure"]


@dataclass(frozen=True)
class WatchPolicy:
    """How `serve` watches its server and what it does when the server cannot serve."""

    probe_interval_s: float = 10.0
    probe_timeout_s: float = 30.0
    failures_to_unhealthy: int = 2
    restart: RestartPolicy = "no"
    max_restarts: int = 3
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.restart not in ("no", "on-failure"):
            raise UsageError(f"restart policy {self.restart!r} is not one of no, on-failure", fix="use no or on-failure")
        if self.probe_interval_s < 0:
            raise UsageError(f"the probe interval {self.probe_interval_s:g}s is negative",
                             fix="give seconds between probes, or 0 for no probes")
        if self.probe_timeout_s <= 0:
            raise UsageError(f"the probe timeout {self.probe_timeout_s:g}s is not positive", fix="give seconds above 0")
        if self.failures_to_unhealthy < 1:
            raise UsageError("a server needs at least one failed probe to be unhealthy", fix="give 1 or more")
        if self.max_restarts < 0:
            raise UsageError(f"the number of restarts {self.max_restarts} is negative", fix="give 0 or more")
        if self.backoff_s < 0:
            raise UsageError(f"the restart backoff {self.backoff_s:g}s is negative", fix="give 0 or more seconds")

    def delay_before(self, restart: int) -> float:
        """Seconds to wait before restart number `restart` (1-based): backoff_s, doubling, at most BACKOFF_MAX_S."""
        return min(BACKOFF_MAX_S, self.backoff_s * 2 ** (restart - 1))

    def describe(self) -> dict[str, Any]:
        return {"liveness_interval_s": TICK_S, "probe_interval_s": self.probe_interval_s,
                "probe_timeout_s": self.probe_timeout_s, "failures_to_unhealthy": self.failures_to_unhealthy,
                "restart": self.restart, "max_restarts": self.max_restarts}


# --- events (what the caller prints; `serve --json` prints each as one JSON line) --------------------
class ServerReady(ServedServer):
    """Every model is ready and the server reports the repository's digest."""

    event: Literal["ready"] = "ready"

    @classmethod
    def of(cls, handle: TritonServerHandle, policy: WatchPolicy, restarts: int, *,
           content: Literal["verified", "unverified"] = "unverified") -> ServerReady:
        return cls(grpc_url=handle.grpc_url, http_url=handle.http_url, metrics_url=handle.metrics_url, pid=handle.pid,
                   log=str(handle.log_path), models=handle.models, repository_digest=handle.repository_digest,
                   serving_dir=str(handle.serving_dir), restarts=restarts, watch=policy.describe(),
                   container=getattr(handle, "image", None), content=content)


class ServerRestarted(ServerReady):
    """Ready again after a restart (`restarts` says which): the same addresses, a new process."""

    event: Literal["restarted"] = "restarted"  # type: ignore[assignment]


class ServerStopped(BaseModel):
    """serve has stopped its server: asked to (`failed` false), or because it could not serve. `log`: the last
    server's log, `log_kept` whether it is still there and `why_kept` why (`trtpipe.serving.server_log`)."""

    event: Literal["stopped"] = "stopped"
    failed: bool
    restarts: int
    log: str
    log_kept: bool
    why_kept: str | None = None
    failed_requests: int | None = None  # what the last server counted (nv_inference_request_failure); None: unread


class ServerUnhealthy(BaseModel):
    event: Literal["unhealthy"] = "unhealthy"
    kind: Literal["server-exited", "stub-died", "probe-failed", "restart-failed"]
    model: str | None = None
    pid: int | None = None
    detail: str
    action: Literal["restart", "exit"]
    restarts: int
    max_restarts: int
    log: str


class ServerRestarting(BaseModel):
    event: Literal["restarting"] = "restarting"
    restart: int
    max_restarts: int
    delay_s: float
    reason: str


ServeEvent = ServerReady | ServerRestarted | ServerUnhealthy | ServerRestarting | ServerStopped


# --- the stub processes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StubProcess:
    pid: int
    model: str | None  # None: it was dead when found, and a dead process no longer says
    instance: str | None
    process: Any = field(compare=False, repr=False)  # psutil.Process: its start time guards against pid reuse

    def dead(self) -> bool:
        import psutil

        try:
            return not self.process.is_running() or self.process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True


def find_stubs(server_pid: int) -> list[StubProcess]:
    """The Python-backend stub processes of the tritonserver `server_pid`, with the model each serves."""
    import psutil

    stubs = []
    try:
        children = psutil.Process(server_pid).children()
    except psutil.Error:
        return []
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.ZombieProcess:
            if _name(child).startswith(STUB_EXECUTABLE[:15]):
                # Dead before we looked (a zombie keeps only its 15-character name): which model, it no longer says.
                stubs.append(StubProcess(pid=child.pid, model=None, instance=None, process=child))
            continue
        except psutil.Error:
            continue
        if len(argv) < 2 or Path(argv[0]).name != STUB_EXECUTABLE:
            continue
        model = Path(argv[1]).parent.parent.name  # <model repository>/<model>/<version>/model.py
        instance = argv[8] if len(argv) > 8 else model
        stubs.append(StubProcess(pid=child.pid, model=model, instance=instance, process=child))
    return stubs


def _name(process: Any) -> str:
    try:
        return str(process.name())
    except Exception:  # noqa: BLE001 - gone meanwhile
        return ""


def how_it_ended(pid: int) -> str:
    """"was killed by SIGKILL", "exited with code 1" ... for a dead child its parent has not reaped (a zombie
    keeps its wait status in /proc/PID/stat, field 52, since Linux 3.5); "is gone" when that cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()  # fields 3 (state) onwards
    except (OSError, ValueError):
        return "is gone"
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return "is gone"
    status = int(fields[49])
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        cause = " (out of memory, or killed)" if number == signal.SIGKILL else ""
        return f"was killed by {name}{cause}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return "is gone"


# --- the probe -------------------------------------------------------------------------------------
def probe(url: str, models: list[str], timeout: float) -> TrtpipeError | None:
    """One real one-token generation from each text model; the first error, or None when all answered."""
    from trtpipe.serving.client import TritonLLMClient

    for model in models:
        try:
            TritonLLMClient(url, model=model, timeout=timeout).generate(PROBE_PROMPT, 1)
        except TrtpipeError as err:
            return err
    return None


class _Probe:
    """One probe running in a daemon thread (so that liveness ticks go on while it waits)."""

    def __init__(self, run: Callable[[], TrtpipeError | None], started: float) -> None:
        self.started = started
        self.error: TrtpipeError | None = None
        self.done = threading.Event()

        def work() -> None:
            try:
                self.error = run()
            except Exception as exc:  # noqa: BLE001 - a probe that breaks is a failed probe
                self.error = CheckFailed(f"the probe failed: {' '.join(str(exc).split())[:300]}", check="probe")
            finally:
                self.done.set()

        threading.Thread(target=work, name="trtpipe-serve-probe", daemon=True).start()


@dataclass
class Problem:
    kind: Literal["server-exited", "stub-died", "probe-failed", "restart-failed"]
    detail: str  # one line, naming the model where there is one
    model: str | None = None
    pid: int | None = None


class Watchdog:
    """Liveness of a server and its stubs, and periodic probes; `check()` once per tick."""

    def __init__(self, handle: TritonServerHandle, policy: WatchPolicy,
                 run_probe: Callable[[], TrtpipeError | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.handle = handle
        self.policy = policy
        self.clock = clock
        self.stubs = find_stubs(handle.pid)
        text_models = [m for m in PROBE_MODELS if m in handle.models]
        if run_probe is None and text_models and policy.probe_interval_s > 0:
            run_probe = lambda: probe(handle.grpc_url, text_models, policy.probe_timeout_s)  # noqa: E731
        self.run_probe = run_probe if policy.probe_interval_s > 0 else None
        self.next_probe = clock() + policy.probe_interval_s
        self.running: _Probe | None = None
        self.failures = 0

    def check(self) -> Problem | None:
        """What makes the server unable to serve now, or None."""
        if not self.handle.alive():
            return Problem("server-exited", self._server_exit())
        for stub in self.stubs:
            if stub.dead() and stub.model is None:
                return Problem("stub-died", pid=stub.pid,
                               detail=f"a Python backend process of tritonserver (pid {stub.pid}) "
                                      f"{how_it_ended(stub.pid)} before it was watched; the server cannot serve "
                                      "the model it ran")
            if stub.dead():
                return Problem(
                    "stub-died", model=stub.model, pid=stub.pid,
                    detail=f"model {stub.model}: its Python backend process (pid {stub.pid}, instance "
                           f"{stub.instance}) {how_it_ended(stub.pid)}; tritonserver cannot serve {stub.model}",
                )
        return self._probes()

    def _probes(self) -> Problem | None:
        if self.run_probe is None:
            return None
        now = self.clock()
        if self.running is not None:
            # A probe not answered within the timeout has failed, whatever its client still waits for.
            if self.running.done.is_set():
                error = self.running.error
            elif now - self.running.started > self.policy.probe_timeout_s:
                error = CheckFailed(f"the probe got no answer within {self.policy.probe_timeout_s:g}s", check="probe")
            else:
                return None
            self.running = None
            if error is None:
                self.failures = 0
            else:
                self.failures += 1
                if self.failures >= self.policy.failures_to_unhealthy:
                    model = getattr(error, "dead_model", None)
                    subject = f"model {model}: " if model else ""
                    return Problem("probe-failed", model=model,
                                   detail=f"{subject}{self.failures} probes in a row failed, the last: "
                                          f"{' '.join(error.message.split())}")
        if self.running is None and now >= self.next_probe:
            self.running = _Probe(self.run_probe, now)
            self.next_probe = now + self.policy.probe_interval_s
        return None

    def _server_exit(self) -> str:
        code = self.handle.process.returncode
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        line = f"{self.handle.described} (pid {self.handle.pid}) {how}"
        if code is not None and code < 0:
            return line  # a signal from outside: its log says nothing about it
        tail = self.handle.log_tail(80)
        clash = port_clash(tail)
        if clash is not None:
            return f"{line}: its {clash[0]} port {clash[1]}:{clash[2]} was taken by another process"
        error = last_error(tail)
        return f"{line}; its last error: {error}" if error else line


def watch(watchdog: Watchdog, stop: threading.Event, *, tick: float = TICK_S) -> Problem | None:
    """Watch until the server cannot serve (the problem) or `stop` is set (None)."""
    while not stop.wait(tick):
        problem = watchdog.check()
        if problem is not None:
            return problem
    return None


# --- serve: start, watch, restart or stop ------------------------------------------------------------
def serve_watched(
    repo: Path,
    *,
    on_event: Callable[[ServeEvent], None],
    stop: threading.Event,
    policy: WatchPolicy = WatchPolicy(),
    host: str = "127.0.0.1",
    grpc_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    start_timeout: float = 120,
    launcher: Launcher | None = None,
    ready_file: Path | None = None,
    server_log: ServerLog = ServerLog(),
    verified: Any = None,
    settings: Settings,
) -> None:
    """Serve `repo` until `stop` is set, watching the server (module docstring). Returns when stopped;
    raises CheckFailed when the server cannot serve and the policy allows no (more) restarts. `launcher`: how the
    server starts (default: what the repository's manifest asks for: tritonserver here for cpu-reference, the
    Triton container for a GPU target; trtpipe.serving.server.launcher_for). `ready_file`: written when the server
    is ready and after each restart, removed when serve stops (trtpipe.serving.ready_file). `server_log`: where
    the server's log goes, whether it is kept, and a stream it is followed to (trtpipe.serving.server_log).
    Every server started is stopped before this returns or raises, and a `stopped` event says where its log is."""
    if ready_file is not None:
        remove_ready_file(ready_file)  # an earlier run's: a waiter must never take it for this one
    if server_log.path is not None:
        server_log.path.parent.mkdir(parents=True, exist_ok=True)  # appended to: each server reads its own part
    handle = start_server(repo, host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                          start_timeout=start_timeout, launcher=launcher, log_path=server_log.path, verified=verified,
                          settings=settings)
    content: Literal["verified", "unverified"] = (
        "verified" if verified is not None and getattr(verified, "signature_verified", False) else "unverified")
    handle.keep_log = handle.keep_log or server_log.keep
    follower = _follow(handle, server_log)
    restarts = 0
    failed = True  # until serve returns because it was asked to stop
    failures: int | None = None
    try:
        # The stubs are taken before anyone hears the server is ready: nothing a client does first goes unseen.
        watchdog = Watchdog(handle, policy)
        _announce(ServerReady.of(handle, policy, restarts, content=content), on_event, ready_file)
        while True:
            problem = watch(watchdog, stop)
            if problem is None:
                failed = False
                return
            while True:  # restart until one comes up, or no restart is left
                again = policy.restart == "on-failure" and restarts < policy.max_restarts
                on_event(ServerUnhealthy(kind=problem.kind, model=problem.model, pid=problem.pid, detail=problem.detail,
                                         action="restart" if again else "exit", restarts=restarts,
                                         max_restarts=policy.max_restarts, log=str(handle.log_path)))
                if not again:
                    handle.stop(timeout=UNHEALTHY_STOP_S, failed=True)
                    raise _gave_up(problem, policy, restarts, handle)
                handle.stop_for_restart()  # a broken server answers only errors: not through the backoff
                restarts += 1
                delay = policy.delay_before(restarts)
                on_event(ServerRestarting(restart=restarts, max_restarts=policy.max_restarts, delay_s=delay,
                                          reason=problem.detail))
                if stop.wait(delay):
                    failed = False
                    return
                try:
                    handle = restart_server(handle, start_timeout=start_timeout)
                    break
                except TrtpipeError as err:
                    problem = Problem("restart-failed", f"tritonserver did not come back: {err.one_line()}")
            _stop_following(follower)
            follower = _follow(handle, server_log)
            watchdog = Watchdog(handle, policy)
            _announce(ServerRestarted.of(handle, policy, restarts, content=content), on_event, ready_file)
    finally:
        if handle.alive():
            failures = handle.failed_requests()  # before the server goes: what it answered with errors
            if failures:
                handle.keep_log = True
        handle.stop()
        _stop_following(follower)
        if ready_file is not None:
            remove_ready_file(ready_file, serve_pid=os.getpid())
        on_event(_stopped(handle, failed=failed, restarts=restarts, failures=failures, asked=server_log.keep))


def _announce(event: ServerReady, on_event: Callable[[ServeEvent], None], ready_file: Path | None) -> None:
    """The ready file first (a waiter on it may act at once), then the event."""
    if ready_file is not None:
        write_ready_file(ready_file, event)
    on_event(event)  # type: ignore[arg-type]


def _follow(handle: TritonServerHandle, server_log: ServerLog) -> LogFollower | None:
    if server_log.follow is None:
        return None
    return LogFollower(handle.log_path, server_log.follow, offset=handle.log_offset)


def _stop_following(follower: LogFollower | None) -> None:
    if follower is not None:
        follower.stop()


def _stopped(handle: TritonServerHandle, *, failed: bool, restarts: int, failures: int | None,
             asked: bool) -> ServerStopped:
    kept = handle.log_kept() and handle.log_path.exists()
    why = None
    if kept:  # the first reason that holds, most telling first
        if failed or restarts:
            why = "the server failed"
        elif failures:
            why = f"the server counted {failures} failed request{'s' if failures != 1 else ''}"
        elif handle.log_chosen:
            why = "a log file was named"
        elif asked:
            why = "asked to keep it"
        else:
            why = f"the server exited with code {handle.process.returncode}"
    return ServerStopped(failed=failed, restarts=restarts, log=str(handle.log_path), log_kept=kept, why_kept=why,
                         failed_requests=failures)


def _gave_up(problem: Problem, policy: WatchPolicy, restarts: int, handle: TritonServerHandle) -> CheckFailed:
    if policy.restart == "no":
        done, check = "the server was stopped", problem.kind
    else:
        done = f"the server was stopped after {restarts} restart{'s' if restarts != 1 else ''}, the policy's maximum"
        check = "restarts-exhausted"
    return CheckFailed(
        f"{problem.detail}; {done}", check=check,
        fix=f"see the server log {handle.log_path}; if a process was killed for memory, give the host more",
    )
