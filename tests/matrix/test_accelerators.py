"""What a cell asks Ray for: the accelerator-type table checked against Ray's own detection of each catalog GPU."""

from __future__ import annotations

import pytest
from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
from ray.util.accelerators import accelerators as ray_accelerators

from trtpipe.errors import InvalidInput
from trtpipe.gpu import load_catalog
from trtpipe.matrix.accelerators import RAY_ACCELERATOR_TYPES, request_for


def test_every_catalog_gpu_maps_to_the_types_ray_labels_its_nodes_with() -> None:
    """For each catalog GPU, the labels Ray derives from every product string NVML may report for it (Ray's
    own function, the one a node runs at start-up), first the one of the catalog's product string."""
    catalog = load_catalog()
    assert set(RAY_ACCELERATOR_TYPES) == set(catalog)
    for name, gpu in catalog.items():
        detected = [NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(n) for n in [gpu.product, *gpu.nvml_names]]
        assert RAY_ACCELERATOR_TYPES[name] == tuple(dict.fromkeys(detected)), name
    # the family labels are Ray's named constants
    constants = {v for k, v in vars(ray_accelerators).items() if k.startswith("NVIDIA_")}
    assert {types[0] for types in RAY_ACCELERATOR_TYPES.values()} <= constants


def test_requests() -> None:
    cpu = request_for("cpu-reference", 1)
    assert (cpu.gpus, cpu.accelerators, cpu.ray_options("")) == (0, (), {"num_cpus": 1.0, "num_gpus": 0})
    h100 = request_for("h100-sxm", 4)
    assert h100.ray_options("H100") == {"num_cpus": 1.0, "num_gpus": 4, "accelerator_type": "H100"}
    assert h100.describe() == "4 GPUs of Ray accelerator type H100 (h100-sxm) on one node"
    node = {"CPU": 8.0, "GPU": 8.0, "accelerator_type:H100": 1.0}
    assert h100.accelerator_on(node) == "H100"
    assert h100.accelerator_on({**node, "GPU": 2.0}) is None  # four GPUs on one node, or nowhere
    assert h100.accelerator_on({"CPU": 8.0, "GPU": 8.0, "accelerator_type:A100": 1.0}) is None
    assert cpu.accelerator_on({"CPU": 1.0}) == "" and cpu.accelerator_on({"CPU": 0.0}) is None
    # a node whose driver reports the name without "NVIDIA " carries Ray's fallback label: still placed
    a100 = request_for("a100-80gb", 1)
    assert a100.accelerator_on({"CPU": 1.0, "GPU": 1.0, "accelerator_type:A100-SXM4-80GB": 1.0}) == "A100-SXM4-80GB"
    with pytest.raises(InvalidInput, match="has no Ray accelerator type"):
        request_for("v100", 1)
