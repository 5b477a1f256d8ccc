"""`trtpipe check`: can this host build (and serve) what the spec asks for?

Compares the NVML probe, the installed Python packages and the Docker daemon with the spec's toolchain and
target, as OK / WARN / FAIL rows each carrying its fix. Exit codes (see EXIT_CODES):
0 nothing failed; 1 a FAIL row; 2 invalid spec (raised before we get here);
3 no NVIDIA GPU here, and the spec targets a GPU (or no spec was given): only cpu-reference is buildable here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from trtpipe import versions
from trtpipe.gpu import HostInfo, catalog_entry_for, load_catalog
from trtpipe.resolve import ResolvedSpec
from trtpipe.spec import Executor
from trtpipe.toolchain import Toolchain, backend_facts, get_toolchain, version_tuple

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_SPEC = 2
EXIT_NO_GPU = 3
EXIT_CODES = {
    EXIT_OK: "no FAIL row: what the spec asks for can be done here (WARN rows are worth reading)",
    EXIT_FAIL: "at least one FAIL row: fix it before building here",
    EXIT_SPEC: "the spec is invalid (one line names file:line:col, the field and the fix)",
    EXIT_NO_GPU: "no NVIDIA GPU on this host: GPU targets can be checked and planned here but not built; "
    "cpu-reference works",
}

# Distribution names to look up, per package we report.
PACKAGES: dict[str, tuple[str, ...]] = {
    "tensorrt_llm": versions.TRTLLM_DISTRIBUTIONS,
    "tensorrt": versions.TENSORRT_DISTRIBUTIONS,
    "torch": ("torch",),
    "nvidia-modelopt": ("nvidia-modelopt",),
    "transformers": ("transformers",),
    "tritonclient": ("tritonclient",),
}
# What the checkpoint stage, the reference runtime and the client need on every host.
EVERYWHERE = ("torch", "transformers", "nvidia-modelopt", "tritonclient")
TOOLCHAIN_FIELD = {
    "tensorrt_llm": "trtllm_version",
    "tensorrt": "tensorrt_version",
    "torch": "torch_version",
    "nvidia-modelopt": "modelopt_version",
    "transformers": "transformers_version",
}

Status = Literal["OK", "WARN", "FAIL"]


class CheckRow(BaseModel):
    status: Status
    item: str
    found: str
    expected: str | None = None
    fix: str | None = None


class DockerStatus(BaseModel):
    available: bool
    detail: str


class CheckReport(BaseModel):
    host: HostInfo
    packages: dict[str, str | None]
    docker: DockerStatus
    spec: str | None = None
    target: str | None = None
    toolchain: str | None = None
    rows: list[CheckRow] = Field(default_factory=list)
    possible_here: list[str] = Field(default_factory=list, description="What this host can do, in words.")
    not_possible_here: list[str] = Field(default_factory=list)
    exit_code: int
    exit_meaning: str


def installed_versions() -> dict[str, str | None]:
    """Installed versions by package (None when absent), from metadata only: nothing heavy is imported."""
    return versions.installed_versions(PACKAGES)


def docker_status(timeout: float = 2.0) -> DockerStatus:
    """Whether a Docker daemon answers a ping within `timeout` seconds."""
    try:
        import docker
    except ImportError:
        return DockerStatus(available=False, detail="the docker Python SDK is not installed")
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        version = client.version().get("Version", "?")
        client.close()
        return DockerStatus(available=True, detail=f"daemon answers (Docker {version})")
    except Exception as exc:  # any failure to reach the daemon is the answer "no daemon"
        reason = str(exc).split(": (")[0][:160]
        return DockerStatus(available=False, detail=f"no Docker daemon answers ({reason})")


def same_release(installed: str, pinned: str) -> bool:
    """'2.9.0+cu130' matches '2.9.0'; '1.2.1' does not match '1.2.0'."""
    a, b = version_tuple(installed.split("+")[0]), version_tuple(pinned.split("+")[0])
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def _driver_at_least(found: str, minimum: str) -> bool:
    return version_tuple(found) >= version_tuple(minimum)


@dataclass(frozen=True)
class _Checked:
    """What the rows compare: this host's facts and what the spec (or the newest toolchain) asks for."""

    host: HostInfo
    packages: dict[str, str | None]
    docker: DockerStatus
    resolved: ResolvedSpec | None
    toolchain: Toolchain
    gpu_target: bool  # the spec targets a GPU (not cpu-reference)
    executor: Executor


def _gpu_rows(rows: list[CheckRow], c: _Checked) -> None:
    """The GPUs NVML sees, and the driver against the toolchain's minimum."""
    if c.host.has_gpu:
        names = ", ".join(f"{g.index}: {g.name} (SM{g.sm}, {g.memory_gib:g} GiB)" for g in c.host.gpus)
        rows.append(CheckRow(status="OK", item="gpu", found=f"{len(c.host.gpus)} GPU(s): {names}"))
    else:
        rows.append(
            CheckRow(
                status="WARN",
                item="gpu",
                found=f"no NVIDIA GPU: {c.host.error or 'NVML reports none'}",
                fix="GPU targets can be checked and planned here but not built; cpu-reference builds work here",
            )
        )
    if c.host.has_gpu:
        if c.toolchain.min_driver is None:
            rows.append(
                CheckRow(
                    status="WARN",
                    item="driver",
                    found=c.host.driver_version or "unknown",
                    expected=f"{c.toolchain.name}: minimum driver unknown",
                    fix="compare with the container's release notes before building",
                )
            )
        elif c.host.driver_version and not _driver_at_least(c.host.driver_version, c.toolchain.min_driver):
            rows.append(
                CheckRow(
                    status="FAIL",
                    item="driver",
                    found=c.host.driver_version,
                    expected=f">= {c.toolchain.min_driver} ({c.toolchain.name}, CUDA {c.toolchain.cuda_version})",
                    fix=f"upgrade the NVIDIA driver to {c.toolchain.min_driver} or newer, or pick an older toolchain",
                )
            )
        else:
            rows.append(
                CheckRow(
                    status="OK",
                    item="driver",
                    found=c.host.driver_version or "unknown",
                    expected=f">= {c.toolchain.min_driver}",
                )
            )


def _target_row(rows: list[CheckRow], c: _Checked) -> None:
    """The spec's target GPU (tp*pp of them) against this host's GPUs."""
    if c.gpu_target and c.host.has_gpu:
        assert c.resolved is not None and c.resolved.gpu is not None
        target = c.resolved.gpu
        want = c.resolved.spec.target.world_size
        catalog = load_catalog(configs=c.resolved.configs)
        exact = [g for g in c.host.gpus if (entry := catalog_entry_for(g, catalog)) and entry.name == target.name]
        same_sm = [g for g in c.host.gpus if g.sm == target.sm]
        if len(exact) >= want:
            rows.append(
                CheckRow(status="OK", item="target", found=f"{len(exact)} x {target.product}", expected=f"{want} x {target.name}")
            )
        elif len(same_sm) >= want:
            rows.append(
                CheckRow(
                    status="WARN",
                    item="target",
                    found=f"{len(same_sm)} GPU(s) of {target.sm_label}: {same_sm[0].name}",
                    expected=f"{want} x {target.name} ({target.product})",
                    fix="an engine built here runs on the target's SM, but memory and speed differ from the plan; "
                    "build on the target GPU to be exact",
                )
            )
        elif same_sm:
            rows.append(
                CheckRow(
                    status="FAIL",
                    item="target",
                    found=f"{len(same_sm)} GPU(s) of {target.sm_label}",
                    expected=f"{want} (tp*pp) x {target.name}",
                    fix=f"build on a host with {want} GPUs of {target.sm_label}, or lower target.tp/pp",
                )
            )
        else:
            host_sms = sorted({f"SM{g.sm}" for g in c.host.gpus})
            rows.append(
                CheckRow(
                    status="FAIL",
                    item="target",
                    found=f"this host has {', '.join(host_sms)} ({c.host.gpus[0].name})",
                    expected=f"{target.name} ({target.sm_label})",
                    fix=f"an engine is bound to the SM it was built on: build on a {target.sm_label} host, "
                    f"or set target.gpu to this host's GPU",
                )
            )


def _package_rows(rows: list[CheckRow], c: _Checked) -> None:
    """Each package's installed version against the toolchain's pin, by what this host needs it for."""
    for package, version in c.packages.items():
        pinned_field = TOOLCHAIN_FIELD.get(package)
        pinned = getattr(c.toolchain, pinned_field) if pinned_field else None
        expected = f"{pinned} ({c.toolchain.name})" if pinned else None
        if package in EVERYWHERE:
            if version is None:
                rows.append(
                    CheckRow(
                        status="FAIL",
                        item=package,
                        found="not installed",
                        expected=expected,
                        fix="install trtpipe's dependencies: pip install -e . (see README)",
                    )
                )
            elif pinned and not same_release(version, pinned):
                rows.append(
                    CheckRow(
                        status="WARN",
                        item=package,
                        found=version,
                        expected=expected,
                        fix=f"checkpoints made with {package} {version} may differ from the pinned toolchain's; "
                        f"pip install '{_dist(package)}=={pinned}' to match",
                    )
                )
            else:
                rows.append(CheckRow(status="OK", item=package, found=version, expected=expected))
            continue
        # tensorrt_llm / tensorrt: only GPU builds with the local executor need them here.
        needed_locally = c.gpu_target and c.host.has_gpu and c.executor in (Executor.local, Executor.auto)
        if version is None:
            if needed_locally and c.executor == Executor.local:
                status: Status = "FAIL"
                fix = f"pip install {_dist(package)}=={pinned} from https://pypi.nvidia.com, or use executor: docker"
            elif needed_locally and not c.docker.available:
                status = "FAIL"
                fix = "install it (pip, NVIDIA index) or start a Docker daemon for the pinned container"
            elif c.resolved is not None and not c.gpu_target:
                rows.append(
                    CheckRow(status="OK", item=package, found="not installed (not needed for cpu-reference)")
                )
                continue
            else:
                status = "WARN"
                fix = (
                    "not needed for cpu-reference; GPU builds use it here or the pinned container"
                    if not needed_locally
                    else "the docker executor will build in the pinned container"
                )
            rows.append(CheckRow(status=status, item=package, found="not installed", expected=expected, fix=fix))
        elif pinned and not same_release(version, pinned):
            status = "FAIL" if needed_locally and c.executor == Executor.local else "WARN"
            rows.append(
                CheckRow(
                    status=status,
                    item=package,
                    found=version,
                    expected=expected,
                    fix=f"engines are bound to the exact version: pip install {_dist(package)}=={pinned}, "
                    "or use executor: docker",
                )
            )
        else:
            rows.append(CheckRow(status="OK", item=package, found=version, expected=expected))


def _docker_row(rows: list[CheckRow], c: _Checked) -> None:
    """Whether a Docker daemon answers, by whether the spec's executor needs one."""
    if c.docker.available:
        rows.append(CheckRow(status="OK", item="docker", found=c.docker.detail, expected=c.toolchain.triton_container))
    elif c.resolved is not None and not c.gpu_target:
        rows.append(CheckRow(status="OK", item="docker", found=f"{c.docker.detail}; not needed for cpu-reference"))
    else:
        needs = c.gpu_target and c.host.has_gpu and c.executor == Executor.docker
        rows.append(
            CheckRow(
                status="FAIL" if needs else "WARN",
                item="docker",
                found=c.docker.detail,
                expected=c.toolchain.triton_container,
                fix="start a Docker daemon (with the NVIDIA container toolkit) for the docker executor; "
                "cpu-reference and the local executor do not need it",
            )
        )


def _toolchain_rows(rows: list[CheckRow], c: _Checked) -> None:
    """The toolchain's own facts (unconfirmed ones said), and which pinned Triton containers serve the backend."""
    unknown = [
        name
        for name in ("tensorrt_version", "cuda_version", "torch_version", "triton_container", "min_driver")
        if getattr(c.toolchain, name) is None
    ]
    rows.append(
        CheckRow(
            status="WARN" if unknown else "OK",
            item="toolchain",
            found=f"{c.toolchain.name}: TensorRT {c.toolchain.tensorrt_version}, CUDA {c.toolchain.cuda_version}, "
            f"SM{c.toolchain.sm_min}-SM{c.toolchain.sm_max}",
            expected=c.toolchain.triton_container,
            fix=f"unconfirmed facts: {', '.join(unknown)} (build_configs/toolchains.yaml)" if unknown else None,
        )
    )
    if c.toolchain.triton_containers:
        wanted = c.resolved.backend_kind if c.resolved is not None else None
        serving = [box for box in c.toolchain.triton_containers if wanted is None or wanted in box.backends]
        listed = "; ".join(f"{box.image}: {', '.join(box.backends)}" for box in c.toolchain.triton_containers)
        # A backend that runs only on the CPU (the reference runtime) is served by no Triton TRT-LLM container.
        missing = wanted is not None and backend_facts(wanted).runs_on != "cpu" and c.gpu_target and not serving
        rows.append(
            CheckRow(
                status="FAIL" if missing else "OK",
                item="containers",
                found=listed,
                expected=f"a container serving {wanted}" if wanted else None,
                fix=(f"no Triton container pinned for {c.toolchain.name} serves {wanted}: pick a toolchain whose "
                     "containers do (build_configs/toolchains.yaml triton_containers)") if missing else None,
            )
        )


def _what_is_possible(c: _Checked) -> tuple[list[str], list[str]]:
    """What this host can and cannot do, in words."""
    possible = ["check and plan any spec (GPU targets included)"]
    impossible: list[str] = []
    if all(c.packages.get(p) for p in EVERYWHERE):
        possible.append("build, serve and test the cpu-reference target")
    if c.host.has_gpu:
        if c.packages.get("tensorrt_llm") or c.docker.available:
            possible.append("build TensorRT-LLM engines for this host's GPUs")
        else:
            impossible.append("build TensorRT-LLM engines: neither tensorrt_llm nor a Docker daemon is here")
    else:
        impossible.append("build or run TensorRT-LLM engines (no NVIDIA GPU here)")
    return possible, impossible


def _exit_code(rows: list[CheckRow], c: _Checked) -> int:
    if any(r.status == "FAIL" for r in rows):
        return EXIT_FAIL
    if not c.host.has_gpu and (c.resolved is None or c.gpu_target):
        return EXIT_NO_GPU
    return EXIT_OK


def run_checks(
    host: HostInfo,
    packages: dict[str, str | None],
    docker: DockerStatus,
    resolved: ResolvedSpec | None = None,
    toolchain: Toolchain | None = None,
    configs: Path | None = None,
) -> CheckReport:
    """Compare this host with the spec (or, without a spec, with the newest toolchain of `configs`: the
    build_configs/ folder, None for the shipped one): one row per fact, in the order GPUs and driver, target,
    packages, Docker, toolchain, containers."""
    toolchain = resolved.toolchain if resolved is not None else (toolchain or get_toolchain(None, configs=configs))
    c = _Checked(host=host, packages=packages, docker=docker, resolved=resolved, toolchain=toolchain,
                 gpu_target=resolved is not None and resolved.gpu is not None,
                 executor=resolved.spec.target.executor if resolved is not None else Executor.auto)
    rows: list[CheckRow] = []
    for add_rows in (_gpu_rows, _target_row, _package_rows, _docker_row, _toolchain_rows):
        add_rows(rows, c)
    possible, impossible = _what_is_possible(c)
    code = _exit_code(rows, c)
    return CheckReport(
        host=host,
        packages=packages,
        docker=docker,
        spec=str(resolved.spec_path) if resolved is not None else None,
        target=(resolved.gpu.name if resolved.gpu else "cpu-reference") if resolved is not None else None,
        toolchain=toolchain.name,
        rows=rows,
        possible_here=possible,
        not_possible_here=impossible,
        exit_code=code,
        exit_meaning=EXIT_CODES[code],
    )


def _dist(package: str) -> str:
    return {"tensorrt_llm": "tensorrt-llm"}.get(package, package)
