"""A stand-in for the Docker daemon that runs a container's exact `run_kwargs` in a bubblewrap sandbox.

No Docker engine runs here, but the docker executor's conversion container can still be exercised for
real: `SandboxClient().containers.run(**spec.run_kwargs())` starts the container's command with its
environment and working directory in a sandbox whose filesystem holds ONLY the container's bind mounts
(read-only where the spec says so) plus what stands in for the image: the system's /usr and /etc and
this test's Python environment (which, like the toolchain's container, has ModelOpt, transformers and
torch, and no trtpipe reachable except through the mounts). It has no network. No GPU either: the jobs
run here use --device cpu. What it proves: the command, the environment and the mounts are enough, and
nothing else of the host is needed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any


def requirement_closure(roots: Iterable[str]) -> set[str]:
    """The installed distributions `roots` need, transitively (canonical names; extras left out)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def _site_packages_binds(distributions: set[str]) -> list[str]:
    """bwrap arguments that show only these distributions' files in this environment's site-packages."""
    from packaging.utils import canonicalize_name

    site = Path(sysconfig.get_paths()["purelib"])
    entries: set[str] = set()
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in distributions:
            continue
        for file in dist.files or []:
            top = Path(file).parts[0]
            if top not in ("..", "__pycache__") and (site / top).exists():
                entries.add(top)
    args = ["--tmpfs", str(site)]
    for top in sorted(entries):
        args += ["--ro-bind", str(site / top), str(site / top)]
    return args


def image_stand_in(only: set[str] | None = None) -> list[str]:
    """bwrap arguments for the 'image': system dirs, the Python install and its environment (read-only);
    with `only`, the environment shows just those distributions (the container's package set)."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("bin", "lib", "lib64", "sbin"):
        link = Path("/") / name
        if link.is_symlink():
            args += ["--symlink", str(Path(link.readlink())), str(link)]
    # bwrap applies mounts in order: the empty /tmp first, so an environment that lives under /tmp (a
    # fresh clone's .venv in CI) is bound over it instead of being hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for prefix in dict.fromkeys([sys.base_prefix, sys.prefix]):
        args += ["--ro-bind", prefix, prefix]
    if only is not None:
        args += _site_packages_binds(only)
    return args


def sandbox_unavailable() -> str | None:
    """None when bubblewrap can make a sandbox here, else why not (a skip reason)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", *image_stand_in(), "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bwrap cannot make a sandbox here: {probe.stderr.strip()[:160]}"
    return None


class SandboxContainer:
    """What the docker executor uses of a container: streamed logs, exit status, kill, remove."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.attrs: dict[str, Any] = {}
        self.removed = False

    def logs(self, stream: bool, follow: bool) -> Iterator[bytes]:
        assert self.proc.stdout is not None
        yield from iter(self.proc.stdout.readline, b"")

    def wait(self) -> dict[str, int]:
        return {"StatusCode": self.proc.wait()}

    def reload(self) -> None:
        self.attrs = {"State": {"OOMKilled": False, "ExitCode": self.proc.returncode}}

    def kill(self) -> None:
        self.proc.kill()

    def remove(self, force: bool) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.removed = True


class SandboxClient:
    """Stands in for `docker.from_env()`: `containers.run(**run_kwargs)` starts the sandbox.

    `keep_mount` can drop mounts (to prove that the sandbox really hides what is not mounted);
    `extra_env` adds variables; `only_distributions` limits the Python environment to those
    distributions (the container's package set: nothing else can be imported)."""

    def __init__(self, *, keep_mount: Callable[[dict], bool] = lambda mount: True,
                 extra_env: dict[str, str] | None = None, only_distributions: set[str] | None = None) -> None:
        self.keep_mount = keep_mount
        self.only_distributions = only_distributions
        self.extra_env = extra_env or {}
        self.argv: list[str] = []
        self.run_kwargs: dict[str, Any] = {}
        self.container: SandboxContainer | None = None
        outer = self

        class Images:
            def get(self, image: str) -> str:
                return image

        class Containers:
            def run(self, **kwargs: Any) -> SandboxContainer:
                return outer._run(**kwargs)

        self.images, self.containers = Images(), Containers()

    def _run(self, **kwargs: Any) -> SandboxContainer:
        self.run_kwargs = kwargs
        argv = ["bwrap", "--unshare-all", "--die-with-parent", *image_stand_in(self.only_distributions)]
        for mount in kwargs["mounts"]:
            assert mount["Type"] == "bind"
            if self.keep_mount(mount):
                argv += ["--ro-bind" if mount["ReadOnly"] else "--bind", mount["Source"], mount["Target"]]
        env = {**kwargs.get("environment", {}), **self.extra_env,
               "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/bin:/bin"}  # `python3` is the environment's
        argv += ["--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        argv += ["--chdir", kwargs.get("working_dir", "/"), *kwargs["command"]]
        self.argv = argv
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.container = SandboxContainer(proc)
        return self.container
