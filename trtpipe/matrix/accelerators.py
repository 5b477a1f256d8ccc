"""What a cell asks the cluster for: CPUs, GPUs and the Ray accelerator type of its target GPU.

A Ray node labels itself with the accelerator type of its first GPU, derived from the product string
NVML reports (ray 2.60.0, python/ray/_private/accelerators/nvidia_gpu.py:22 (NVIDIA_GPU_NAME_PATTERN)
and :86-99 (_gpu_name_to_accelerator_type)): the run of upper-case tokens up to the first token with a
digit, a hyphenated SKU suffix dropped ("NVIDIA A100-SXM4-80GB" -> "A100", "NVIDIA H100 80GB HBM3" ->
"H100"). It advertises that as the resource `accelerator_type:<TYPE>`, which is what
`ray.remote(accelerator_type=...)` asks for (python/ray/util/accelerators/accelerators.py:6-13 list the
NVIDIA constants used below). So each catalog GPU maps to the label a node with that GPU carries without
any configuration; tests/matrix/test_accelerators.py checks every row against Ray's own function on each
`nvml_names` product string of build_configs/gpus.yaml.

Ray's labels are per family: an A100 40GB and an A100 80GB node are both "A100", and the H100 SXM, PCIe and
NVL are all "H100" (Ray has "A100-40G"/"A100-80G" constants, but no node sets them by itself:
accelerators.py:60-64). A cell for a100-80gb may therefore run on an A100 40GB node; the SM, which is what
an engine is compiled for, is the same. Where NVML reports a name without the "NVIDIA " prefix (the
catalog lists "A100-SXM4-80GB" as such a name), the pattern does not match and Ray falls back to the
whole name, hyphenated (nvidia_gpu.py:92-99): such a node is labelled "A100-SXM4-80GB". A GPU therefore
has one or more labels; a cell asks for the first one some node of the cluster carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpipe.errors import InvalidInput
from trtpipe.spec import CPU_REFERENCE

# catalog GPU (build_configs/gpus.yaml) -> the accelerator types a Ray node with that GPU advertises, one per
# product string of its `nvml_names` (ray 2.60.0 nvidia_gpu.py:22,86-99; constants accelerators.py:6-13)
RAY_ACCELERATOR_TYPES: dict[str, tuple[str, ...]] = {
    # "NVIDIA A100-SXM4-40GB" -> accelerators.py:9 NVIDIA_A100; "A100-SXM4-40GB" -> the fallback, nvidia_gpu.py:96-99
    "a100-40gb": ("A100", "A100-SXM4-40GB"),
    # "NVIDIA A100-SXM4-80GB" -> accelerators.py:9 NVIDIA_A100; "A100-SXM4-80GB" -> the fallback, nvidia_gpu.py:96-99
    "a100-80gb": ("A100", "A100-SXM4-80GB"),
    "a100-80gb-pcie": ("A100",),  # "NVIDIA A100 80GB PCIe"; accelerators.py:9 NVIDIA_A100
    "a10g": ("A10G",),            # "NVIDIA A10G"; accelerators.py:6 NVIDIA_TESLA_A10G
    "l4": ("L4",),                # "NVIDIA L4"; accelerators.py:7 NVIDIA_L4
    "l40s": ("L40S",),            # "NVIDIA L40S"; accelerators.py:8 NVIDIA_L40S
    "h100-sxm": ("H100",),        # "NVIDIA H100 80GB HBM3"; accelerators.py:10 NVIDIA_H100
    "h100-pcie": ("H100",),       # "NVIDIA H100 PCIe"; accelerators.py:10 NVIDIA_H100
    "h100-nvl": ("H100",),        # "NVIDIA H100 NVL"; accelerators.py:10 NVIDIA_H100
    "h200": ("H200",),            # "NVIDIA H200"; accelerators.py:11 NVIDIA_H200
    "b200": ("B200",),            # "NVIDIA B200"; accelerators.py:13 NVIDIA_B200
}

# The resource name prefix a node advertises its accelerator type under (what feasibility reads).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
# Every cell takes one CPU slot: a build is one process (trtllm-build, or the CPU conversion).
CPUS_PER_CELL = 1.0


@dataclass(frozen=True)
class Request:
    """What one cell's task asks Ray for: CPUs, GPUs on one node, and one of the GPU's accelerator types."""

    cpus: float
    gpus: int
    accelerators: tuple[str, ...]  # Ray accelerator types a node with the GPU carries; () for cpu-reference
    gpu: str  # the catalog name (or cpu-reference), for messages

    def describe(self) -> str:
        if not self.gpus:
            return f"{self.cpus:g} CPU"
        types = " or ".join(self.accelerators)
        return f"{self.gpus} GPU{'s' if self.gpus > 1 else ''} of Ray accelerator type {types} ({self.gpu}) on one node"

    def accelerator_on(self, resources: dict[str, float]) -> str | None:
        """The accelerator type this request takes on a node with these total resources (None: cannot run
        there; "" for a CPU-only request that fits)."""
        if resources.get("CPU", 0.0) < self.cpus or resources.get("GPU", 0.0) < self.gpus:
            return None
        if not self.accelerators:
            return ""
        return next((a for a in self.accelerators if resources.get(ACCELERATOR_RESOURCE_PREFIX + a, 0.0) > 0), None)

    def ray_options(self, accelerator: str) -> dict[str, object]:
        """Options for `remote_function.options(...)`, asking for `accelerator` (from `accelerator_on`)."""
        options: dict[str, object] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if accelerator:
            options["accelerator_type"] = accelerator
        return options


def request_for(gpu: str, world_size: int) -> Request:
    """The request of a cell targeting catalog GPU `gpu` with tp*pp = world_size (cpu-reference: CPU only)."""
    if gpu == CPU_REFERENCE:
        return Request(cpus=CPUS_PER_CELL, gpus=0, accelerators=(), gpu=gpu)
    accelerators = RAY_ACCELERATOR_TYPES.get(gpu)
    if accelerators is None:
        raise InvalidInput(f"target GPU {gpu!r} has no Ray accelerator type in trtpipe's table",
                           fix="add it to RAY_ACCELERATOR_TYPES in trtpipe/matrix/accelerators.py with the types "
                               "Ray labels its nodes with")
    return Request(cpus=CPUS_PER_CELL, gpus=world_size, accelerators=accelerators, gpu=gpu)
