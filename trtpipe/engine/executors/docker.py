"""The docker executor: runs trtllm-build (or the checkpoint conversion) inside the toolchain's pinned
NGC container through the Docker SDK.

`container_spec` / `conversion_container_spec` are pure functions (tested without a daemon): image by
tag or, once the toolchain has it, by digest; GPUs by count or by ids; the checkpoint mounted
read-only and the output read-write; the shared memory, ulimits and IPC that TRT-LLM's NCCL/MPI
need. `DockerExecutor.run` talks to the daemon: it fails in well under a second with one line when
there is none, streams the container log to the build log, and detects the exit status and OOM-kill.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from trtpipe.engine.executors.base import ConversionJob, ExecutorResult, conversion_failure, failure_from_log
from trtpipe.engine.executors.base import timed_out as timed_out_error
from trtpipe.engine.executors.local import CONVERSION_ENV
from trtpipe.errors import InvalidInput, MissingCapability
from trtpipe.shipped import configs_dir, package_dir
from trtpipe.backend_options import DEFAULT_TIMEOUT_S

CHECKPOINT_MOUNT = "/trtpipe/checkpoint"
ENGINE_MOUNT = "/trtpipe/engine"
TRTPIPE_SOURCE_MOUNT = "/opt/trtpipe-src"
DEFAULT_SHM_SIZE = "16g"
# What NVIDIA's TRT-LLM container docs ask for: unlimited locked memory (pinned host buffers, NCCL)
# and a 64 MiB stack.
ULIMITS = ({"name": "memlock", "soft": -1, "hard": -1}, {"name": "stack", "soft": 67108864, "hard": 67108864})
DAEMON_TIMEOUT_S = 0.8


class Mount(BaseModel):
    source: str
    target: str
    read_only: bool


class ContainerSpec(BaseModel):
    """Everything needed to start the build container; `run_kwargs()` maps it onto the Docker SDK."""

    model_config = ConfigDict(extra="forbid")

    image: str
    image_tag: str
    image_digest: str | None
    command: list[str]
    gpu_count: int | None = None
    gpu_ids: list[str] | None = None
    mounts: list[Mount]
    shm_size: str | None = DEFAULT_SHM_SIZE
    ipc_mode: str | None = "host"
    ulimits: list[dict[str, int | str]] = Field(default_factory=lambda: [dict(u) for u in ULIMITS])
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str = "/tmp"
    user: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def device_requests(self) -> list[dict[str, Any]]:
        """The NVIDIA device request (Docker API form): by ids when given, else by count."""
        request: dict[str, Any] = {"Driver": "nvidia", "Capabilities": [["gpu"]]}
        if self.gpu_ids:
            request["DeviceIDs"] = list(self.gpu_ids)
        else:
            request["Count"] = self.gpu_count if self.gpu_count is not None else -1
        return [request]

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for docker's `client.containers.run(..., detach=True)`."""
        import docker.types

        requests = []
        for req in self.device_requests:
            requests.append(
                docker.types.DeviceRequest(
                    driver=req["Driver"], count=req.get("Count", 0), device_ids=req.get("DeviceIDs"),
                    capabilities=req["Capabilities"],
                )
            )
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": self.command,
            "device_requests": requests,
            "mounts": [
                docker.types.Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
                for m in self.mounts
            ],
            "ulimits": [docker.types.Ulimit(name=u["name"], soft=u["soft"], hard=u["hard"]) for u in self.ulimits],
            "environment": self.environment,
            "working_dir": self.working_dir,
            "labels": self.labels,
            "detach": True,
        }
        if self.ipc_mode:
            kwargs["ipc_mode"] = self.ipc_mode
        if self.shm_size and self.ipc_mode != "host":
            kwargs["shm_size"] = self.shm_size
        if self.user:
            kwargs["user"] = self.user
        return kwargs

    @computed_field  # type: ignore[prop-decorator]
    @property
    def docker_run(self) -> list[str]:
        """The equivalent `docker run` argv (in dumps, so a dry run shows it)."""
        return self.docker_cli()

    def docker_cli(self) -> list[str]:
        """The equivalent `docker run` command line, for dry runs and for users without the SDK."""
        argv = ["docker", "run", "--rm"]
        if self.gpu_ids:
            argv += ["--gpus", f'"device={",".join(self.gpu_ids)}"']
        else:
            argv += ["--gpus", "all" if self.gpu_count is None else str(self.gpu_count)]
        if self.ipc_mode:
            argv += ["--ipc", self.ipc_mode]
        if self.shm_size and self.ipc_mode != "host":
            argv += ["--shm-size", self.shm_size]
        for u in self.ulimits:
            argv += ["--ulimit", f"{u['name']}={u['soft']}:{u['hard']}" if u["soft"] != u["hard"] else f"{u['name']}={u['soft']}"]
        for m in self.mounts:
            argv += ["-v", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
        for key, value in sorted(self.environment.items()):
            argv += ["-e", f"{key}={value}"]
        if self.user:
            argv += ["--user", self.user]
        argv += ["-w", self.working_dir, self.image, *self.command]
        return argv


def image_reference(toolchain: Any) -> tuple[str, str, str | None]:
    """(image to run, tag reference, digest): by digest when the toolchain has pinned one."""
    tag_ref = toolchain.triton_container
    if not tag_ref:
        raise MissingCapability(
            f"toolchain {toolchain.name} pins no triton_container image",
            fix="add the NGC image (and its digest) to build_configs/toolchains.yaml, or use target.executor: local",
        )
    digest = getattr(toolchain, "triton_container_digest", None)
    if digest:
        repo = tag_ref.split("@")[0]
        last = repo.rsplit("/", 1)[-1]
        if ":" in last:
            repo = repo[: len(repo) - len(last)] + last.split(":")[0]
        return f"{repo}@{digest}", tag_ref, digest
    return tag_ref, tag_ref, None


def _gpu_selection(gpus: int | list[str] | list[int] | None, world_size: int) -> tuple[int | None, list[str] | None]:
    if gpus is None:
        return world_size, None
    if isinstance(gpus, int):
        if gpus < world_size:
            raise InvalidInput(f"{gpus} GPU(s) requested but the engine's world size is {world_size}",
                               fix=f"request at least {world_size} GPUs")
        return gpus, None
    ids = [str(g) for g in gpus]
    if len(ids) < world_size:
        raise InvalidInput(f"GPU ids {ids} are fewer than the engine's world size {world_size}",
                           fix=f"give {world_size} GPU ids")
    return None, ids


def container_spec(
    plan: Any,
    toolchain: Any,
    checkpoint_dir: Path,
    out_dir: Path,
    gpus: int | list[str] | list[int] | None = None,
    *,
    shm_size: str = DEFAULT_SHM_SIZE,
    ipc_host: bool = True,
    user: str | None = None,
) -> ContainerSpec:
    """The container that runs this plan's trtllm-build. Pure: no daemon, no filesystem access."""
    image, tag_ref, digest = image_reference(toolchain)
    count, ids = _gpu_selection(gpus, plan.world_size)
    command = plan.render_command(CHECKPOINT_MOUNT, ENGINE_MOUNT)
    return ContainerSpec(
        image=image,
        image_tag=tag_ref,
        image_digest=digest,
        command=command,
        gpu_count=count,
        gpu_ids=ids,
        mounts=[
            Mount(source=str(Path(checkpoint_dir).absolute()), target=CHECKPOINT_MOUNT, read_only=True),
            Mount(source=str(Path(out_dir).absolute()), target=ENGINE_MOUNT, read_only=False),
        ],
        shm_size=shm_size,
        ipc_mode="host" if ipc_host else None,
        environment={"HOME": "/tmp"},
        user=user,
        labels={"org.trtpipe.stage": "engine", "org.trtpipe.toolchain": toolchain.name},
    )


def trtpipe_source_dirs(configs: Path | None = None) -> tuple[Path, Path]:
    """(this trtpipe package, the build_configs folder `configs` or the shipped one): what a conversion container
    mounts of trtpipe."""
    return package_dir().resolve(), configs_dir(configs)


def conversion_container_spec(
    toolchain: Any,
    job: ConversionJob,
    *,
    gpus: int | list[str] | None = None,
    shm_size: str = DEFAULT_SHM_SIZE,
    user: str | None = None,
    trtpipe_package: Path | None = None,
    build_configs: Path | None = None,
) -> ContainerSpec:
    """The container that runs a checkpoint conversion (HF -> TRT-LLM checkpoint, ModelOpt calibration on
    the GPU). Pure: no daemon; of the filesystem it reads only where trtpipe itself lies.

    The toolchain's container carries TensorRT-LLM with its Python dependencies (ModelOpt, transformers,
    torch with CUDA, accelerate, pydantic, rich: trtpipe.engine.conversion.CONTAINER_PACKAGES); trtpipe
    itself is not installed there, so its package and build_configs are mounted read-only and put on
    PYTHONPATH. The job's inputs are mounted read-only at their host paths (the job's spec names them
    so), its private job folder and the output folder read-write; nothing else of the host.
    """
    image, tag_ref, digest = image_reference(toolchain)
    count, ids = _gpu_selection(gpus, job.world_size)
    if trtpipe_package is None or build_configs is None:
        package, configs = trtpipe_source_dirs()
        trtpipe_package, build_configs = trtpipe_package or package, build_configs or configs
    mounts: list[Mount] = []
    for path in job.read_only:
        if all(str(path) != m.source for m in mounts):
            mounts.append(Mount(source=str(path), target=str(path), read_only=True))
    for path in (job.job_dir, job.out_dir):
        mounts.append(Mount(source=str(path), target=str(path), read_only=False))
    mounts.append(Mount(source=str(trtpipe_package), target=f"{TRTPIPE_SOURCE_MOUNT}/trtpipe", read_only=True))
    mounts.append(Mount(source=str(build_configs), target=f"{TRTPIPE_SOURCE_MOUNT}/build_configs", read_only=True))
    return ContainerSpec(
        image=image,
        image_tag=tag_ref,
        image_digest=digest,
        # `python3` is the interpreter that the container's TensorRT-LLM was pip-installed into.
        command=["python3", "-m", "trtpipe.engine.convert_entry", *job.entry_arguments()],
        gpu_count=count,
        gpu_ids=ids,
        mounts=mounts,
        shm_size=shm_size,
        ipc_mode="host",
        environment={
            "HOME": "/tmp",
            # torch names its inductor cache after getpass.getuser(), which fails for a uid without a
            # passwd entry (we run as the caller's uid) unless USER is set.
            "USER": "trtpipe",
            "PYTHONPATH": TRTPIPE_SOURCE_MOUNT,
            "PYTHONDONTWRITEBYTECODE": "1",  # the source is read-only
            "TRTPIPE_BUILD_CONFIGS": f"{TRTPIPE_SOURCE_MOUNT}/build_configs",
            **CONVERSION_ENV,
        },
        user=user,
        labels={"org.trtpipe.stage": "checkpoint", "org.trtpipe.toolchain": toolchain.name},
    )


def connect(timeout_s: float = DAEMON_TIMEOUT_S) -> Any:
    """A Docker client, or MissingCapability (one line) when no daemon answers within timeout_s."""
    try:
        import docker
    except ImportError as err:  # pragma: no cover - docker is a dependency
        raise MissingCapability("docker executor: the `docker` Python package is not installed",
                                fix="pip install docker") from err
    try:
        client = docker.from_env(timeout=timeout_s)  # type: ignore[arg-type]
        client.ping()
        return client
    except Exception as err:
        host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        text = str(err)
        if "FileNotFoundError" in text or "No such file" in text or "Connection refused" in text:
            reason = f"nothing listens at {host}"
        elif "Permission denied" in text:
            reason = f"permission denied on {host} (add the user to the docker group)"
        else:
            reason = f"{host}: {text.splitlines()[0][:120] if text else type(err).__name__}"
        raise MissingCapability(
            f"docker executor: no Docker daemon reachable ({reason})",
            fix="start dockerd with the NVIDIA container toolkit, set DOCKER_HOST, or use target.executor: local",
        ) from None


class DockerExecutor:
    name = "docker"

    def __init__(
        self,
        toolchain: Any,
        *,
        gpus: int | list[str] | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        client: Any = None,
        pull: bool = True,
        show_progress: bool = True,
        configs: Path | None = None,
    ) -> None:
        self.toolchain = toolchain
        self.configs = configs  # the build_configs/ folder the conversion container mounts (None: the shipped one)
        self.gpus = gpus
        self.timeout_s = timeout_s
        self.client = client
        self.pull = pull
        self.show_progress = show_progress

    def _client(self) -> Any:
        if self.client is None:
            self.client = connect()
        return self.client

    def run(self, plan: Any, checkpoint_dir: Path, out_dir: Path, log: Path) -> ExecutorResult:
        client = self._client()
        # Run as the calling user so the engine files are ours (the store renames and removes them).
        spec = container_spec(plan, self.toolchain, checkpoint_dir, out_dir, self.gpus,
                              user=f"{os.getuid()}:{os.getgid()}")
        result = self.run_container(client, spec, log, what="trtllm-build")
        result.tensorrt_version = self.toolchain.tensorrt_version
        result.gpu_sm = plan.gpu_sm
        return result

    def run_container(self, client: Any, spec: ContainerSpec, log: Path, *, what: str) -> ExecutorResult:
        """Start the container, stream its log into `log` (and its last line to a status line), wait,
        and turn failure into a diagnosed error. The timeout holds even while the container prints
        nothing; on timeout or Ctrl-C the container is killed, and it is always removed."""
        import docker.errors

        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            if not self.pull:
                raise MissingCapability(f"docker executor: image {spec.image} is not present", fix=f"docker pull {spec.image}")
            client.images.pull(spec.image)
        container = client.containers.run(**spec.run_kwargs())
        timed_out = oom = False
        status: Any = {"StatusCode": 1}
        status_line = None
        try:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"$ {' '.join(spec.docker_cli())}\n")
                out.flush()
                last_line = [""]

                def pump() -> None:
                    for chunk in container.logs(stream=True, follow=True):
                        text = chunk.decode("utf-8", errors="replace")
                        out.write(text)
                        out.flush()
                        if text.strip():
                            last_line[0] = text.strip().splitlines()[-1][-160:]

                reader = threading.Thread(target=pump, daemon=True)
                reader.start()
                if self.show_progress:
                    from rich.console import Console

                    status_line = Console(stderr=True).status(f"{what} starting")
                    status_line.start()
                while reader.is_alive():
                    reader.join(timeout=0.2)
                    if status_line is not None:
                        status_line.update(f"{what} {time.monotonic() - started:5.0f}s | {last_line[0]}")
                    if self.timeout_s is not None and time.monotonic() - started > self.timeout_s:
                        timed_out = True
                        container.kill()
                        reader.join(timeout=5.0)
                        out.write(f"\n[trtpipe] killed after timeout of {self.timeout_s}s\n")
                        break
                status = container.wait()
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
                if oom:
                    out.write("\n[trtpipe] container was OOM-killed\n")
        except KeyboardInterrupt:
            container.kill()
            raise
        finally:
            if status_line is not None:
                status_line.stop()
            try:
                container.remove(force=True)
            except Exception:
                pass
        code = int(status.get("StatusCode", 1)) if isinstance(status, dict) else int(status)
        if timed_out:
            field = "backend.conversion_timeout" if what == "checkpoint conversion" else "backend.build_timeout"
            raise timed_out_error(f"{what} (docker, {spec.image_tag})", self.timeout_s, log, spec_field=field)
        if oom or code != 0:
            reason = "OOM-killed" if oom else None
            if what == "checkpoint conversion":
                raise conversion_failure(log, code, where=f"docker, {spec.image_tag}", reason=reason)
            raise failure_from_log(what, log, code, reason=reason)
        return ExecutorResult(
            executor=self.name, returncode=code, log_path=log, duration_s=time.monotonic() - started,
            command=spec.command, image=spec.image,
        )

    def conversion_spec(self, job: ConversionJob) -> ContainerSpec:
        # As the calling user, so the checkpoint files are ours (the store renames and removes them).
        return conversion_container_spec(self.toolchain, job, gpus=self.gpus, user=f"{os.getuid()}:{os.getgid()}",
                                         build_configs=self.configs)

    def run_conversion(self, job: ConversionJob, log: Path) -> ExecutorResult:
        """Run the job's conversion in the toolchain's container on the GPUs (one line when no daemon)."""
        client = self._client()
        return self.run_container(client, self.conversion_spec(job), log, what="checkpoint conversion")
