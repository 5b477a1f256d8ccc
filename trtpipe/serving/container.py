"""GPU targets: the toolchain's Triton container, run by `serve` as a watched child process.

The exact `docker run` that `serve --print` shows (`trtpipe.serving.server.docker_command`; its processes are
the repository layout's) runs in the foreground as a child of trtpipe, with the runtime executable the settings name (`TRTPIPE_DOCKER`, default
`docker` on PATH). So the container is started, waited for, checked and watched like the CPU server
(trtpipe.serving.server `_start`, trtpipe.serving.watch): ready once gRPC says every model is ready and the HTTP and
metrics ports answer, refused unless it reports the repository's digest, restarted on the same ports by
`--restart on-failure`, and stopped by SIGTERM to its `docker run` client, which relays it to the container
(`--sig-proxy`, on by default; `--init` passes it on to tritonserver). A container whose client died is removed by
its name (`container_name`). A start that fails is one line with the end of its log; the runtime's own "no daemon"
and "no GPU driver" answers are a missing capability (exit 3).

The container's Python-backend processes are not children of this host's process tree, so the watchdog's liveness
sees the `docker run` client only; its probes (real requests) see the models.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.errors import MissingCapability, TrtpipeError
from trtpipe.serving.server import TritonServerHandle, container_image, container_name, docker_command
from trtpipe.settings import Settings, child_environment

DEFAULT_RUNTIME = "docker"
TAIL_LINES = 3  # of the container's log, in a failure's one line
# What the docker CLI says when it cannot run a GPU container here (its own messages, seen as written).
NO_DAEMON = "Cannot connect to the Docker daemon"
NO_GPU_DRIVER = "could not select device driver"


def runtime_executable(settings: Settings) -> str:
    """The container runtime's executable (settings' TRTPIPE_DOCKER, else docker on PATH); MissingCapability when
    there is none."""
    name = settings.docker or DEFAULT_RUNTIME
    found = shutil.which(name)
    if found is None:
        raise MissingCapability(
            f"no container runtime {name!r} here (GPU targets serve inside the toolchain's Triton container, through a "
            "Docker daemon)",
            fix="install Docker with the NVIDIA container toolkit on this GPU host, or set TRTPIPE_DOCKER to the "
                "runtime's executable",
        )
    return found


def log_end(tail: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` non-empty lines of a log, on one line."""
    kept = [" ".join(line.split()) for line in tail.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) if kept else "(empty)"


class ContainerServerHandle(TritonServerHandle):
    """The `docker run` client of a Triton container, watched as a tritonserver is."""

    def __init__(self, *args: Any, runtime: str, name: str | None, image: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runtime = runtime
        self.name = name
        self.image = image

    @property
    def described(self) -> str:
        return f"the Triton container {self.image} ({Path(self.runtime).name} run)"

    def listening(self) -> bool:
        """The HTTP and metrics ports answer through the container's published ports (the client itself listens on
        none: the runtime's proxy does, even before the server inside does, so it takes an answer)."""
        for url in (f"http://{self.host}:{self.http_port}/v2/health/ready", self.metrics_url):
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback, our own ports
                    if response.status != 200:
                        return False
            except OSError:
                return False
        return True

    def cleanup(self) -> None:
        if self.name and self.process.returncode not in (0, None):
            # The client was killed or failed: the container may outlive it, holding the ports and the serving
            # directory. Remove it by name first (best effort: "no such container" is the usual answer).
            try:
                subprocess.run([self.runtime, "rm", "-f", self.name], env=child_environment(), timeout=60,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
        super().cleanup()


@dataclass
class ContainerTriton:
    """Start the repository's Triton container with `runtime` (a Launcher: trtpipe.serving.server)."""

    runtime: str
    manifest: dict[str, Any]
    what: str = "the Triton container"

    @classmethod
    def from_settings(cls, manifest: dict[str, Any], settings: Settings) -> ContainerTriton:
        return cls(runtime=runtime_executable(settings), manifest=manifest,
                   what=f"the Triton container {container_image(manifest)}")

    def command(self, serving: Any, host: str, ports: tuple[int, int, int], work_dir: Path,
                shm_prefix: str) -> list[str]:
        argv = docker_command(serving.path, self.manifest, grpc_port=ports[0], http_port=ports[1],
                              metrics_port=ports[2], name=container_name(serving.repository_digest, ports[0]))
        return [self.runtime, *argv[1:]]  # exactly what `serve --print` shows, with this host's runtime

    def environment(self) -> dict[str, str]:
        return child_environment()  # no secrets: the container runs repository code

    def handle(self, process: subprocess.Popen[bytes], argv: list[str], host: str, ports: tuple[int, int, int],
               work_dir: Path, log_path: Path, shm_prefix: str, models: list[str]) -> TritonServerHandle:
        name = argv[argv.index("--name") + 1] if "--name" in argv else None
        # No shared-memory prefix: the container's regions are in its own /dev/shm, gone with it.
        return ContainerServerHandle(process, host, ports, work_dir, log_path, "", models, runtime=self.runtime,
                                     name=name, image=container_image(self.manifest))

    def start_failure(self, tail: str) -> tuple[str, TrtpipeError | None]:
        said = f"its log ends: {log_end(tail)}"
        image = container_image(self.manifest)
        for pattern, problem, fix in (
            (NO_DAEMON, f"no Docker daemon reachable to run {image}",
             "start Docker with the NVIDIA container toolkit on this GPU host, or print the command and run it where "
             "Docker is"),
            (NO_GPU_DRIVER, f"Docker cannot give {image} a GPU",
             "install the NVIDIA container toolkit and restart Docker, on a host with the target's GPUs"),
        ):
            line = next((" ".join(line.split()) for line in tail.splitlines() if pattern in line), None)
            if line is not None:
                return said, MissingCapability(f"{problem} ({Path(self.runtime).name} said: {line})", fix=fix)
        return said, None
