"""Start a real `tritonserver` for a published repository.

cpu-reference: the tritonserver binary shipped in the nvidia-pytriton wheel, started with the
recipe in shared/notes/triton-on-cpu.md (private backends folder with the stub for this Python,
the venv first on PATH, loopback, explicit free ports, a start deadline, every model ready).
GPU targets: the toolchain's Triton container, its exact `docker run` (`docker_command`, what `serve --print`
shows) run in the foreground as a child process (trtpipe.serving.container), so that it is waited for, watched,
stopped and restarted as the CPU server is. Which one a repository gets is its manifest's target (`launcher_for`);
how it starts is a `Launcher`, and everything after that is shared: the readiness wait, the identity check,
the watchdog (trtpipe.serving.watch), the restart on the same ports.
Either way the server reads a serving directory (`trtpipe.serving.serving_copy`), never the stored
entry: nothing a server or backend writes can change an artifact, and the serving copy's configs
carry the repository digest the server then reports (`trtpipe.serving.identity`), which is checked over
gRPC before the server is called ready: a server that answers with another digest (another server on the
port, a container that mounted another folder) is refused, naming both.
"""

from __future__ import annotations

import errno
import json
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from trtpipe.errors import CheckFailed, InvalidInput, MissingCapability, TimedOut, TrtpipeError, UsageError
from trtpipe.settings import Settings, child_environment

log = logging.getLogger(__name__)

PORT_ATTEMPTS = 4
EXIT_TIMEOUT_S = 5
# A server that can no longer serve gets its own exit timeout and a second more before SIGKILL: an open
# client stream (a benchmark) holds tritonserver past SIGTERM, and meanwhile it answers only errors.
UNHEALTHY_STOP_S = EXIT_TIMEOUT_S + 1
SHM_DIR = Path("/dev/shm")
SERVICES = ("gRPC", "HTTP", "metrics")  # the order of a handle's ports

# How tritonserver 2.51.0 (the r24.10 line of triton-inference-server/server, e0f0734d) says a port is
# taken: src/main.cc:245/257/293 log "failed to start {GRPC,HTTP,Metrics} service" with the error of
# src/grpc/grpc_server.cc:2546 or src/http_server.cc:221, "Socket 'HOST:PORT' already in use ", then exit 1.
PORT_IN_USE = re.compile(r"failed to start (GRPC|HTTP|Metrics) service: .*?Socket '([^']*):(\d+)' already in use",
                         re.IGNORECASE)


# --- locating the server -------------------------------------------------------------------
def tritonserver_home() -> Path:
    """The `pytriton/tritonserver` folder of the installed nvidia-pytriton wheel (not imported)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise MissingCapability(
            "the tritonserver binary is not installed (nvidia-pytriton wheel missing)",
            fix="pip install --no-deps nvidia-pytriton==0.7.0",
        )
    home = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (home / "bin" / "tritonserver").is_file():
        raise MissingCapability(f"{home}/bin/tritonserver not found", fix="reinstall nvidia-pytriton==0.7.0")
    return home


def python_stub(home: Path) -> Path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise MissingCapability(
            f"no Triton Python-backend stub for Python {version} in {home}",
            fix="use Python 3.8 to 3.13 for the trtpipe environment",
        )
    return stub


def stub_environment() -> dict[str, str]:
    """The stub runs the first python3 on PATH and links libpython from LD_LIBRARY_PATH. Secrets
    (registry credentials, the release key) are left out: the server and its stubs run repository code."""
    env = child_environment()
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    env.pop("PYTHONHOME", None)
    return env


def check_stub_links(stub: Path, env: dict[str, str]) -> None:
    """A stub that cannot link makes model loading hang forever: refuse up front."""
    try:
        out = subprocess.run(["ldd", str(stub)], env=env, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return  # no ldd: the start deadline still guards
    missing = [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]
    if missing:
        raise MissingCapability(
            f"the Triton Python stub cannot load {', '.join(missing)}",
            fix="install the shared libpython of this Python (e.g. apt-get install libpython3.11)",
        )


def make_backends_dir(home: Path, dest: Path) -> Path:
    python_dir = dest / "python"
    python_dir.mkdir(parents=True)
    wheel_python = home / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (python_dir / name).symlink_to(wheel_python / name)
    (python_dir / "triton_python_backend_stub").symlink_to(python_stub(home))
    return dest


# --- ports -------------------------------------------------------------------------------------
def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports free right now (tritonserver does not accept port 0)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


def check_ports(host: str, ports: dict[str, int | None]) -> None:
    """Refuse, before anything starts, ports the server could not bind: out of range, given twice, or
    taken (a bind test on `host` with SO_REUSEADDR, as the server's own listeners bind: a port left
    in TIME_WAIT passes, one another process listens on does not). `ports`: service name -> port."""
    given = {service: port for service, port in ports.items() if port is not None}
    for service, port in given.items():
        if not 1 <= port <= 65535:
            raise UsageError(f"the {service} port {port} is not one tritonserver can listen on",
                             fix="give a port from 1 to 65535, or none to have a free one picked")
    seen: dict[int, str] = {}
    for service, port in given.items():
        if port in seen:
            raise UsageError(f"port {port} is given for both {seen[port]} and {service}",
                             fix="give each service its own port")
        seen[port] = service
    for service, port in given.items():
        problem = _bind_problem(host, port)
        if problem is not None:
            raise port_error(service, host, port, problem)


def _bind_problem(host: str, port: int) -> str | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return "in use"
            return err.strerror or str(err)
    return None


def port_error(service: str, host: str, port: int, problem: str = "in use") -> UsageError:
    """One line for a port the server cannot have, naming what holds it when this host lets us see."""
    if problem != "in use":
        return UsageError(f"cannot bind the {service} port {host}:{port} ({problem})",
                          fix="give another port, or none to have a free one picked")
    holder = _listener(port)
    return UsageError(f"the {service} port {host}:{port} is already in use{f' by {holder}' if holder else ''}",
                      fix="stop what listens there, or give another port (or none, to have a free one picked)")


def _listener(port: int) -> str | None:
    """`pid N (name)` of the process listening on `port`, when the OS tells us (best effort)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy; the port is busy either way
        return None
    return None


def port_clash(log_text: str) -> tuple[str, str, int] | None:
    """(service, host, port) of the first "already in use" failure in a tritonserver log, else None."""
    match = PORT_IN_USE.search(log_text)
    if match is None:
        return None
    service = {"grpc": "gRPC", "http": "HTTP", "metrics": "metrics"}[match.group(1).lower()]
    return service, match.group(2), int(match.group(3))


# Errors tritonserver logs on every start without a GPU (the notes' "quieter on CPU" flags leave these two);
# they are never why it failed.
CPU_ONLY_NOISE = ("CudaDriverHelper has not been initialized", "CUDA driver version is insufficient")


def last_error(log_text: str) -> str | None:
    """The last error line (E...) of a tritonserver log that is not CPU-only noise, else None."""
    errors = [line for line in log_text.splitlines()
              if line.startswith("E") and not any(noise in line for noise in CPU_ONLY_NOISE)]
    return errors[-1] if errors else None


FAILURE_METRIC = re.compile(r"^nv_inference_request_failure\{[^}]*\} (\S+)$", re.MULTILINE)


def failed_requests(metrics_url: str, *, timeout: float = 5) -> int | None:
    """The sum of Triton's `nv_inference_request_failure` counters at `metrics_url` (Prometheus text), or None
    when it cannot be read."""
    import urllib.request

    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:  # noqa: S310 - our own loopback port
            text = response.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    try:
        return int(sum(float(value) for value in FAILURE_METRIC.findall(text)))
    except ValueError:
        return None


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (empty when it cannot be read)."""
    try:
        import psutil

        return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr}
    except Exception:  # noqa: BLE001 - gone, or not ours to read: the caller's deadline decides
        return set()


def repository_models(repo: Path) -> list[str]:
    return sorted(p.name for p in Path(repo).iterdir() if (p / "config.pbtxt").is_file())


def models_to_load(repo: Path, manifest: dict[str, Any] | None = None) -> list[str]:
    """The models the server is told to load (`--model-control-mode=explicit`, one `--load-model` each): those
    the repository's trtpipe.json names (`models`, written by publish and covered by its signature), never
    whatever else has a folder there: a model folder added beside a published repository is not loaded. A
    folder without that list (a hand-made repository) loads its model folders, as the server's default would."""
    from trtpipe.serving.templates import MANIFEST_NAME

    # The folder's own trtpipe.json first (the serving copy's: the bytes the server reads), else `manifest`.
    try:
        manifest = json.loads((Path(repo) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        manifest = manifest or {}
    named = manifest.get("models") if isinstance(manifest, dict) else None
    if isinstance(named, list) and named and all(isinstance(n, str) and n for n in named):
        # `--load-model=*` means every model in the folder: a name is a model folder's name, nothing else.
        bad = next((n for n in named if not _MODEL_NAME.match(n)), None)
        if bad is not None:
            raise InvalidInput(f"{Path(repo) / MANIFEST_NAME}: models names {bad!r}, which is no model folder name",
                               fix="publish the repository again from its spec")
        return list(dict.fromkeys(named))
    return repository_models(repo)


_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def load_flags(models: list[str]) -> list[str]:
    """tritonserver's flags to load exactly `models` (Triton r24.10 docs/user_guide/model_management.md:
    in explicit mode only the models named by --load-model are loaded at startup)."""
    return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in models)]


# --- the running server ------------------------------------------------------------------------
class TritonServerHandle:
    """A tritonserver process on loopback. Use as a context manager, or call `stop()`."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        host: str,
        ports: tuple[int, int, int],
        work_dir: Path,
        log_path: Path,
        shm_prefix: str,
        models: list[str],
        serving: Any = None,
    ) -> None:
        self.serving = serving  # trtpipe.serving.serving_copy.ServingDir: removed when the server is gone
        self.process = process
        self.host = host
        self.grpc_port, self.http_port, self.metrics_port = ports
        self.work_dir = work_dir
        self.log_path = log_path
        self.shm_prefix = shm_prefix
        self.models = models
        self.keep_log = False  # set when the server failed (or serve was asked to): its log outlives a clean exit then
        self.log_chosen = False  # the log is a file the caller named: appended to by a restart, never removed
        self.log_offset = 0  # where this server's part of its log starts (a named log holds earlier servers' too)
        self.launcher: Launcher | None = None  # what started it (a restart starts the same way)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def described(self) -> str:
        """How a message names the process watched."""
        return "tritonserver"

    @property
    def ports(self) -> tuple[int, int, int]:
        """(gRPC, HTTP, metrics), the order of `SERVICES`."""
        return self.grpc_port, self.http_port, self.metrics_port

    @property
    def serving_dir(self) -> Path | None:
        return self.serving.path if self.serving is not None else None

    @property
    def repository_digest(self) -> str | None:
        """The artifact digest the server's configs report (None for a repository outside a store)."""
        return self.serving.repository_digest if self.serving is not None else None

    def alive(self) -> bool:
        return self.process.poll() is None

    def listening(self) -> bool:
        """The server listens on all three of its ports (tritonserver binds gRPC, then HTTP, then metrics, and
        exits if a later one fails: ready over gRPC alone is not yet serving)."""
        return set(self.ports) <= listening_ports(self.pid)

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines this server wrote to its log (not an earlier server's, in a named log)."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(self.log_offset)
                text = log_file.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def failed_requests(self, timeout: float = 5) -> int | None:
        """Requests the server answered with an error so far, from its metrics (`nv_inference_request_failure`,
        every model and reason); None when the metrics cannot be read (the server is gone)."""
        return failed_requests(self.metrics_url, timeout=timeout)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would. Its stubs are reaped by `stop()`."""
        if self.alive():
            self.process.kill()
            self.process.wait(timeout=10)

    def _kill_leftover_stubs(self) -> None:
        # The server runs in its own session (process group = its pid); Python-backend stubs of a
        # server that died hard outlive it there. Nothing else is in that group.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # SIGKILL is asynchronous: wait until the group is gone
            try:
                os.killpg(self.process.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)

    def detach_serving(self) -> Any:
        """Take the serving directory from this handle, so that `stop()` leaves it for a restarted server."""
        serving, self.serving = self.serving, None
        return serving

    def stop_for_restart(self) -> None:
        """Stop a server that can no longer serve, keeping its serving directory for the next one."""
        serving = self.detach_serving()
        try:
            self.stop(timeout=UNHEALTHY_STOP_S, failed=True)
        finally:
            self.serving = serving

    def stop(self, timeout: float = EXIT_TIMEOUT_S + 10, *, failed: bool = False) -> None:
        """SIGTERM, then SIGKILL past `timeout` (an open client stream can hold the server up). `failed`: the
        server could no longer serve, so its log is kept and a SIGKILL is expected, not worth a warning."""
        self.keep_log = self.keep_log or failed
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.log(logging.INFO if failed else logging.WARNING,
                        "tritonserver %d ignored SIGTERM for %.0fs; killing it", self.pid, timeout)
                self.process.kill()
                self.process.wait(timeout=10)
        self.cleanup()

    def cleanup(self) -> None:
        self._kill_leftover_stubs()
        # Python-backend stubs that died hard leave their shared-memory regions; ours carry our prefix (a server
        # whose regions are not on this host's /dev/shm, in a container, has none: never glob everything).
        for region in (SHM_DIR.glob(f"{self.shm_prefix}*") if self.shm_prefix else ()):
            try:
                region.unlink()
            except OSError:
                pass
        shutil.rmtree(self.work_dir / "backends", ignore_errors=True)
        if self.log_path.parent != self.work_dir or (self.process.returncode is not None and not self.log_kept()):
            # Nothing left to keep there: the log is elsewhere, or this was a clean exit nobody asked to keep.
            shutil.rmtree(self.work_dir, ignore_errors=True)
        if self.serving is not None and not self.alive():
            self.serving.remove()

    def log_kept(self) -> bool:
        """Whether the log outlives the server: a log the caller named, one asked to be kept, or the log of a
        server that failed or exited with an error."""
        return (self.log_chosen or self.keep_log or self.log_path.parent != self.work_dir
                or self.process.returncode not in (0, None))

    def __enter__(self) -> TritonServerHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _wait_ready(handle: TritonServerHandle, deadline: float) -> str | None:
    """None when the server and every model are ready and the server listens on all three of its ports
    (`handle.listening()`); else why not ("timeout", or the server exited)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(handle.grpc_url)
    try:
        while time.monotonic() < deadline:
            if not handle.alive():
                return f"{handle.described} exited with code {handle.process.returncode}"
            try:
                if client.is_server_ready(client_timeout=2) and all(
                    client.is_model_ready(name, client_timeout=2) for name in handle.models
                ) and handle.listening():
                    return None
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)
        return "timeout"
    finally:
        client.close()


# --- how a server starts ------------------------------------------------------------------------
class Launcher(Protocol):
    """How a tritonserver starts on a serving directory: its argv and environment, the handle that watches it,
    and what its log says when it could not start. The CPU server (LocalTriton) and the Triton container
    (trtpipe.serving.container.ContainerTriton) are the two; everything else about serving is theirs in common."""

    what: str  # how messages name it: "tritonserver", "the Triton container ..."

    def command(self, serving: Any, host: str, ports: tuple[int, int, int], work_dir: Path,
                shm_prefix: str) -> list[str]: ...

    def environment(self) -> dict[str, str]: ...

    def handle(self, process: subprocess.Popen[bytes], argv: list[str], host: str, ports: tuple[int, int, int],
               work_dir: Path, log_path: Path, shm_prefix: str, models: list[str]) -> TritonServerHandle: ...

    def start_failure(self, tail: str) -> tuple[str, TrtpipeError | None]:
        """(what the log says, in one line; an error that replaces the generic one, e.g. a missing capability)."""
        ...


@dataclass
class LocalTriton:
    """The CPU server: the nvidia-pytriton wheel's tritonserver, with the recipe of shared/notes/triton-on-cpu.md
    (private backends folder with this Python's stub, the venv first on PATH, loopback, CPU-only flags)."""

    home: Path
    env: dict[str, str]
    what: str = "tritonserver"

    @classmethod
    def here(cls) -> LocalTriton:
        """This host's server; MissingCapability when it is not installed or its stub cannot load."""
        home = tritonserver_home()
        env = stub_environment()
        check_stub_links(python_stub(home), env)
        return cls(home=home, env=env)

    def command(self, serving: Any, host: str, ports: tuple[int, int, int], work_dir: Path,
                shm_prefix: str) -> list[str]:
        backends = make_backends_dir(self.home, work_dir / "backends")
        return [
            str(self.home / "bin" / "tritonserver"),
            f"--model-repository={serving.path}",
            f"--backend-directory={backends}",
            f"--http-address={host}",
            f"--grpc-address={host}",
            f"--metrics-address={host}",
            f"--http-port={ports[1]}",
            f"--grpc-port={ports[0]}",
            f"--metrics-port={ports[2]}",
            "--allow-gpu-metrics=false",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
            *load_flags(models_to_load(serving.path)),
        ]

    def environment(self) -> dict[str, str]:
        return self.env

    def handle(self, process: subprocess.Popen[bytes], argv: list[str], host: str, ports: tuple[int, int, int],
               work_dir: Path, log_path: Path, shm_prefix: str, models: list[str]) -> TritonServerHandle:
        return TritonServerHandle(process, host, ports, work_dir, log_path, shm_prefix, models)

    def start_failure(self, tail: str) -> tuple[str, TrtpipeError | None]:
        error = last_error(tail)
        return (f"its last error: {error}" if error else f"its log ends: {(tail.splitlines() or ['(empty)'])[-1]}",
                None)


def in_container(manifest: dict[str, Any]) -> bool:
    """Whether a repository's server is its toolchain's Triton container (a GPU target), not the CPU
    tritonserver here (cpu-reference): what its manifest records."""
    return not manifest.get("reference")


def launcher_for(manifest: dict[str, Any], settings: Settings) -> Launcher:
    """The launcher a repository's manifest asks for: the CPU server for cpu-reference, else its toolchain's
    Triton container (the runtime executable from the caller's settings, TRTPIPE_DOCKER)."""
    if not in_container(manifest):
        return LocalTriton.here()
    from trtpipe.serving.container import ContainerTriton

    return ContainerTriton.from_settings(manifest, settings)


def start_server(
    repo: Path,
    *,
    host: str = "127.0.0.1",
    start_timeout: float = 60,
    grpc_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    log_path: Path | None = None,
    validate: bool = True,
    launcher: Launcher | None = None,
    verified: Any = None,
    settings: Settings,
) -> TritonServerHandle:
    """Start a server on a serving directory of `repo` and wait until every model is ready and the server reports
    the repository's digest. `launcher`: how (default: what the repository's manifest asks for, `launcher_for`,
    with the caller's `settings`).
    The serving directory is removed when the server stops. `verified`: what a trust policy verified
    (`trtpipe.release.trust.require_trusted_folder`); the serving directory then holds exactly those files."""
    from trtpipe.serving.repository_files import read_manifest
    from trtpipe.serving.serving_copy import prepare
    from trtpipe.serving.validate import errors_only, validate_repository
    from trtpipe.shipped import build_configs_dir

    repo = Path(repo).resolve()
    manifest = read_manifest(repo)
    if validate:
        errors = errors_only(validate_repository(repo, configs=build_configs_dir(settings)))
        if errors:
            raise InvalidInput(f"{repo} does not validate: {errors[0].one_line()}",
                               fix="publish the repository again from its spec")
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding tritonserver to %s, not loopback", host)
    # A port the user gave that the server cannot bind: one line now, before any banner.
    check_ports(host, dict(zip(SERVICES, (grpc_port, http_port, metrics_port))))
    if launcher is None:
        launcher = launcher_for(manifest, settings)
    serving = prepare(repo, verified=verified)
    try:
        return _start(serving, launcher=launcher, host=host, start_timeout=start_timeout,
                      ports=(grpc_port, http_port, metrics_port), log_path=log_path)
    except BaseException:
        serving.remove()
        raise


def _start(serving: Any, *, launcher: Launcher, host: str, start_timeout: float,
           ports: tuple[int | None, int | None, int | None], log_path: Path | None) -> TritonServerHandle:
    repo = serving.path
    models = models_to_load(repo)  # what the server is told to load (LocalTriton.command, docker_command)
    explicit = ports
    failure, log_seen = "", Path()
    for attempt in range(PORT_ATTEMPTS):
        picked = free_ports(3, host)
        chosen = tuple(given or free for given, free in zip(explicit, picked))
        work_dir = Path(tempfile.mkdtemp(prefix="trtpipe-triton-"))
        server_log = log_path or work_dir / "tritonserver.log"
        shm_prefix = f"trtpipe_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        cmd = launcher.command(serving, host, chosen, work_dir, shm_prefix)  # type: ignore[arg-type]
        with open(server_log, "ab") as log_file:
            offset = log_file.tell()  # a named log: this server's lines start here
            process = subprocess.Popen(
                cmd, env=launcher.environment(), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop it cleanly
                # The serving directory's lock: held while this server lives, even if we die first.
                pass_fds=(serving.lock_fd,) if serving.lock_fd is not None else (),
            )
        handle = launcher.handle(process, cmd, host, chosen, work_dir, Path(server_log),  # type: ignore[arg-type]
                                 shm_prefix, models)
        handle.launcher = launcher
        handle.log_chosen, handle.log_offset = log_path is not None, offset
        why = _wait_ready(handle, time.monotonic() + start_timeout)
        if why is None:
            mismatch = _identity_mismatch(handle, serving)
            if mismatch is None:
                handle.serving = serving
                return handle
            handle.stop(timeout=UNHEALTHY_STOP_S, failed=True)
            raise CheckFailed(mismatch, check="identity",
                              fix="stop whatever else serves on that port (or give other ports), then serve again; "
                                  f"see the server log {handle.log_path}")
        tail = handle.log_tail(80)
        clash = port_clash(tail)
        handle.stop(failed=clash is None)  # a failed start keeps its log, which the error names
        log_seen = Path(server_log)
        if clash is not None:
            service, _, port = clash
            if explicit[SERVICES.index(service)] is not None:
                # A port the user gave, taken after the check: the same one line as the check's.
                raise port_error(service, host, port)
            log.info("tritonserver port clash on %s (attempt %d); retrying on other ports", port, attempt + 1)
            failure = f"the {service} port {port} was taken by another process as the server started"
            continue
        said, instead = launcher.start_failure(tail)
        if instead is not None:
            raise instead
        if why == "timeout":
            raise TimedOut(
                f"{launcher.what} did not become ready on {serving.source} within {start_timeout:g}s ({said})",
                operation="tritonserver start", seconds=start_timeout,
                fix=f"allow a longer start if the models are just slow to load; see the server log {log_seen}",
            )
        failure = f"{why}: {said}"
        break
    raise CheckFailed(
        f"{launcher.what} did not become ready on {serving.source} ({failure})", check="ready",
        fix=f"see the server log {log_seen}",
    )


def _identity_mismatch(handle: TritonServerHandle, serving: Any) -> str | None:
    """Why the ready server is not the one this serving directory holds (None: it reports exactly its digest).
    Asked over gRPC, as smoke and bench ask before they record (trtpipe.serving.identity)."""
    from trtpipe.serving.identity import REPOSITORY_DIGEST, read_served_identity

    expected = serving.repository_digest
    try:
        reported = read_served_identity(handle.grpc_url, timeout=30).repository_digest
    except TrtpipeError as err:
        return f"the server at {handle.grpc_url} could not say what it serves: {err.one_line()}"
    if reported == expected:
        return None
    return (f"the server at {handle.grpc_url} reports {REPOSITORY_DIGEST} {reported or 'none'}, not "
            f"{expected or 'none'} of {serving.source}: it serves another repository; it was stopped")


def restart_server(handle: TritonServerHandle, *, start_timeout: float) -> TritonServerHandle:
    """Stop `handle`'s server and start a new one the same way, on the same serving directory and the same ports
    (clients keep their address). If the new one does not start, the directory goes back to `handle`, whose
    `stop()` then removes it."""
    launcher = handle.launcher
    handle.stop_for_restart()
    serving = handle.detach_serving()
    try:
        if launcher is None:
            launcher = LocalTriton.here()
        restarted = _start(serving, launcher=launcher, host=handle.host, start_timeout=start_timeout,
                           ports=handle.ports, log_path=handle.log_path if handle.log_chosen else None)
        restarted.keep_log = handle.keep_log  # asked for, or the server before it failed: this one's is kept too
        return restarted
    except BaseException:
        handle.serving = serving
        raise


# --- GPU targets: the Triton container ---------------------------------------------------------
def container_image(manifest: dict[str, Any]) -> str:
    """The serving container, pinned by digest when the toolchain records one."""
    image = manifest["serving_container"]
    digest = manifest.get("serving_container_digest")
    return f"{image.split('@')[0]}@{digest}" if digest else image


def _world_size(manifest: dict[str, Any]) -> int:
    """GPUs the repository's model needs: the engine's ranks, or the llm-api artifact's tp x pp."""
    section = manifest.get("engine") or manifest.get("artifact") or {}
    return int(section.get("world_size", 1))


def container_name(digest: str | None, grpc_port: int) -> str:
    """The container's name: one per repository digest and gRPC port on a host (two servers cannot share a port),
    so a container whose `docker run` client died can still be found and removed."""
    label = digest.removeprefix("sha256:")[:12] if digest else "unstored"
    return f"trtpipe-{label}-{grpc_port}"


def _run_options(name: str | None) -> list[str]:
    # --rm: the container goes when its server exits; --init: a real init (tini) as PID 1 passes the SIGTERM that
    # `docker run` relays from its client on to tritonserver, and reaps the backend processes.
    return ["docker", "run", "--rm", "--init", *(["--name", name] if name else [])]


def docker_command(
    repo: Path, manifest: dict[str, Any], *, grpc_port: int = 8001, http_port: int = 8000,
    metrics_port: int = 8002, shm_size: str = "2g", name: str | None = None,
) -> list[str]:
    """The exact `docker run` for the toolchain's Triton container. Which tritonserver processes it runs, and
    the models each loads, are the repository layout's (trtpipe.serving.layouts): an inflight_batcher_llm
    repository runs one server per rank (MPI), rank 0 serving the manifest's models; an llmapi repository one
    server under `mpirun -n 1` whatever its world size. It runs in the foreground: `serve` runs it as a child
    process and watches it (trtpipe.serving.container). The container sees tp x pp GPUs; every process gets
    --disable-auto-complete-config and a per-rank shm prefix, as upstream's launch script gives them.
    """
    from trtpipe.serving.layouts import layout_of

    layout = layout_of(repo, manifest)
    mount = manifest.get("container_repo_mount", "/trtpipe/repo")
    world = _world_size(manifest)
    devices = ",".join(str(i) for i in range(world))
    cmd = [
        *_run_options(name),
        f"--gpus=\"device={devices}\"",
        f"--shm-size={shm_size}",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-p", f"127.0.0.1:{grpc_port}:{grpc_port}",
        "-p", f"127.0.0.1:{http_port}:{http_port}",
        "-p", f"127.0.0.1:{metrics_port}:{metrics_port}",
        "-v", f"{Path(repo).resolve()}:{mount}:ro",
        container_image(manifest),
    ]

    def server(rank: int, models: list[str]) -> list[str]:
        return [
            "/opt/tritonserver/bin/tritonserver",
            f"--model-repository={mount}",
            f"--grpc-port={grpc_port}", f"--http-port={http_port}", f"--metrics-port={metrics_port}",
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
            *load_flags(models),
        ]

    servers = layout.server_models(Path(repo), manifest, models_to_load(repo, manifest), world)
    if len(servers) == 1 and not layout.always_mpirun:
        return cmd + server(0, servers[0])
    cmd += ["mpirun", "--allow-run-as-root"]
    for rank, models in enumerate(servers):
        cmd += ["-n", "1", *server(rank, models)]
        if rank != len(servers) - 1:
            cmd.append(":")
    return cmd
