"""Installed package versions, read from distribution metadata only (nothing heavy is imported)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

# The distribution names each package ships under, in the order to look for them.
TRTLLM_DISTRIBUTIONS = ("tensorrt_llm", "tensorrt-llm")
# TensorRT: the meta package and the CUDA-specific wheels.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu12", "tensorrt_cu12", "tensorrt-cu13", "tensorrt_cu13", "tensorrt-libs")


def installed_version(*distributions: str) -> str | None:
    """The installed version of the first of these distributions that is present, else None."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_versions(packages: Mapping[str, tuple[str, ...]]) -> dict[str, str | None]:
    """Version (or None) per package name, each looked up under its distribution names."""
    return {package: installed_version(*distributions) for package, distributions in packages.items()}


def versions_match(installed: str, pinned: str) -> bool:
    """`0.37.0` matches pins `0.37.0`, `0.37`, `0.37.x`, `0.37.*` and `~=0.37.0`; nothing else."""
    pin = pinned.strip().removeprefix("~=").removeprefix("==").rstrip("*").rstrip("x").rstrip(".")
    pin_parts, have_parts = pin.split("."), installed.split("+")[0].split(".")
    return bool(pin) and have_parts[: len(pin_parts)] == pin_parts
