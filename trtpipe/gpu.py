"""The GPU catalog (`build_configs/gpus.yaml`) and the probe of this host's GPUs (NVML).

The probe sits behind `HostProbe` so `trtpipe check` can be fed a recorded answer of another host
(`RecordedProbe`), which is how the tests compare A100 and H100 host answers with specs (the shipped ones are
reconstructed, not captured: see their `_note`).
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import InvalidInput, NotFound, TrtpipeError
from trtpipe.shipped import configs_dir

Architecture = Literal["ampere", "ada", "hopper", "blackwell"]


class GpuInfo(BaseModel):
    """One GPU model of the catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description='Catalog name, e.g. "h100-sxm".')
    aliases: list[str] = Field(default_factory=list)
    product: str = Field(description='Product string as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".')
    nvml_names: list[str] = Field(default_factory=list, description="Every product string NVML may report.")
    architecture: Architecture = Field(description="The GPU family: picks the build profile's kernels.")
    sm: int = Field(description="Compute capability as major*10+minor, e.g. 90.")
    memory_gib: float
    memory_type: str | None = None
    memory_bandwidth_gbs: float = Field(description="Datasheet memory bandwidth in GB/s (1e9 bytes).")
    precisions: list[str] = Field(
        description="Tensor-core data types: a quantization format runs where its `precision` is listed.")
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def sm_label(self) -> str:
        return f"SM{self.sm}"

    def has_precision(self, precision: str | None) -> bool:
        """Whether this GPU's tensor cores run `precision` (None: any, the model's own dtype)."""
        return precision is None or precision in self.precisions


class UnknownGpu(TrtpipeError):
    exit_code = 2


def load_catalog(path: Path | None = None, *, configs: Path | None = None) -> dict[str, GpuInfo]:
    """Every GPU of the catalog by canonical name (`path`, or the gpus.yaml of `configs`: the build_configs/
    folder, None for the shipped one)."""
    # YAML loads only with the catalog: a build record's host probe (this module's NVML half) needs none.
    from trtpipe.datafiles import load_table

    path = path or configs_dir(configs) / "gpus.yaml"
    return {gpu.name: gpu for gpu in load_table(path, "GPU catalog", "gpus", GpuInfo)}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def find_gpu(name: str, catalog: dict[str, GpuInfo] | None = None) -> GpuInfo | None:
    """A catalog entry by name, alias or NVML product string; None when unknown."""
    catalog = catalog if catalog is not None else load_catalog()
    wanted = _normalise(name)
    for gpu in catalog.values():
        names = [gpu.name, *gpu.aliases, gpu.product, *gpu.nvml_names]
        if wanted in (_normalise(n) for n in names):
            return gpu
    return None


def get_gpu(name: str, catalog: dict[str, GpuInfo] | None = None) -> GpuInfo:
    """A catalog entry by name or alias; raises UnknownGpu with the nearest names."""
    catalog = catalog if catalog is not None else load_catalog()
    gpu = find_gpu(name, catalog)
    if gpu is not None:
        return gpu
    known = list(catalog)
    every = known + [a for g in catalog.values() for a in g.aliases]
    close = difflib.get_close_matches(_normalise(name), every, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownGpu(
        f"unknown GPU {name!r}",
        fix=f"{hint}known GPUs: {', '.join(known)}, or cpu-reference (build_configs/gpus.yaml)",
    )


# ---------------------------------------------------------------------------------------------- host probe


class HostGpu(BaseModel):
    """One GPU seen on this host."""

    index: int
    name: str = Field(description="Product string from NVML.")
    sm: int
    memory_gib: float
    uuid: str | None = None


class HostInfo(BaseModel):
    """What the probe learned about this host."""

    driver_version: str | None = None
    cuda_driver_version: str | None = Field(default=None, description='CUDA version the driver supports, "12.4".')
    gpus: list[HostGpu] = Field(default_factory=list)
    probe: str = Field(default="nvml", description="nvml, or recorded:<file>.")
    error: str | None = Field(default=None, description="Why NVML gave no answer, when it did not.")

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


class HostProbe(Protocol):
    """Anything that can say which driver and GPUs a host has."""

    def probe(self) -> HostInfo: ...


# What pynvml's NVMLError_LibraryNotFound says (nvidia-ml-py: NVML_ERROR_LIBRARY_NOT_FOUND's string).
NVML_LIBRARY_NOT_FOUND = "NVML Shared Library Not Found"


class NvmlProbe:
    """Asks NVML (nvidia-ml-py) on this host. No GPU or no driver is an answer, not an error."""

    def record(self) -> dict[str, Any]:
        """The raw answer, in the JSON format RecordedProbe replays (`trtpipe check --record-probe FILE`)."""
        if sys.platform.startswith("linux"):
            # The library nvmlInit loads first (pynvml's loader does the same dlopen): where it is missing, the
            # answer is known without importing the bindings, which cost more than the rest of a warm build's
            # host probe on a machine without NVIDIA's driver.
            import ctypes

            try:
                ctypes.CDLL("libnvidia-ml.so.1")
            except OSError:
                return {"error": f"NVML is not available: {NVML_LIBRARY_NOT_FOUND} (no NVIDIA driver or GPU on this "
                                 "host)", "gpus": []}
        try:
            import pynvml
        except ImportError:
            return {"error": "nvidia-ml-py (pynvml) is not installed", "gpus": []}
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return {"error": f"NVML is not available: {exc} (no NVIDIA driver or GPU on this host)", "gpus": []}
        try:
            record: dict[str, Any] = {"driver_version": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
            try:
                cuda = pynvml.nvmlSystemGetCudaDriverVersion()
                record["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
            except pynvml.NVMLError:
                record["cuda_driver_version"] = None
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                try:
                    uuid: str | None = _text(pynvml.nvmlDeviceGetUUID(handle))
                except pynvml.NVMLError:
                    uuid = None
                record["gpus"].append(
                    {
                        "index": index,
                        "name": _text(pynvml.nvmlDeviceGetName(handle)),
                        "compute_capability": [major, minor],
                        "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                        "uuid": uuid,
                    }
                )
            return record
        except pynvml.NVMLError as exc:
            return {"error": f"NVML query failed: {exc}", "gpus": []}
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def probe(self) -> HostInfo:
        return host_info_from_record(self.record(), probe="nvml")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def host_info_from_record(data: dict[str, Any], probe: str) -> HostInfo:
    """HostInfo from a raw NVML answer (live or recorded)."""
    gpus = []
    for entry in data.get("gpus", []):
        major, minor = entry["compute_capability"]
        gpus.append(
            HostGpu(
                index=entry["index"],
                name=entry["name"],
                sm=int(major) * 10 + int(minor),
                memory_gib=round(entry["memory_total_bytes"] / 2**30, 2),
                uuid=entry.get("uuid"),
            )
        )
    return HostInfo(
        driver_version=data.get("driver_version"),
        cuda_driver_version=data.get("cuda_driver_version"),
        gpus=gpus,
        probe=probe,
        error=data.get("error"),
    )


class RecordedProbe:
    """Replays a recorded NVML answer (JSON), e.g. one captured on an A100 or H100 host.

    Format (what `NvmlProbe.record()` writes):
      {"driver_version": "535.129.03", "cuda_driver_version": "12.2",
       "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": [8, 0],
                 "memory_total_bytes": 85899345920, "uuid": "GPU-..."}]}
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def probe(self) -> HostInfo:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise NotFound(f"recorded probe {self.path} does not exist", what="recorded probe", ref=str(self.path),
                           fix="check the path") from None
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"recorded probe {self.path} is not JSON: {exc}", fix="record it again") from None
        try:
            return host_info_from_record(data, probe=f"recorded:{self.path.name}")
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(
                f"recorded probe {self.path} is not in the recorded format ({exc!r})",
                fix="record it again on that host: the host check writes the format it replays",
            ) from None


def probe_host(probe: HostProbe | None = None) -> HostInfo:
    """This host's driver and GPUs (NVML unless another probe is given)."""
    return (probe or NvmlProbe()).probe()


def catalog_entry_for(host_gpu: HostGpu, catalog: dict[str, GpuInfo] | None = None) -> GpuInfo | None:
    """The catalog entry whose NVML product string matches a host GPU, if any."""
    return find_gpu(host_gpu.name, catalog)
