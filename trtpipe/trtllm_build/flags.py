"""The `trtllm-build` flag contract of each pinned TensorRT-LLM version.

The data lives in `build_configs/trtllm_build_flags/<toolchain>.yaml`, one table per version, taken
from that version's `tensorrt_llm/commands/build.py` (parse_arguments) and `tensorrt_llm/plugin/plugin.py`
(cli_plugin_args / add_plugin_argument). A command is checked against the table before it is run,
so a flag that the pinned `trtllm-build` would refuse (or silently ignore) never reaches it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.datafiles import read_yaml
from trtpipe.errors import IntegrityError
from trtpipe.shipped import configs_dir


def flags_dir(configs: Path | None = None) -> Path:
    """trtllm_build_flags/ of `configs` (the build_configs/ folder; None: the shipped one)."""
    return configs_dir(configs) / "trtllm_build_flags"

FlagKind = Literal["int", "str", "path", "paths", "strs", "switch", "choice"]


class FlagSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FlagKind
    choices: list[str] | None = None
    min: int | None = None
    power_of_two: bool = False
    plugin: bool = False
    aliases: list[str] = Field(default_factory=list)
    deprecated: str | None = None


class FlagContract(BaseModel):
    """Every flag one TRT-LLM version's `trtllm-build` accepts, with kinds and allowed values."""

    model_config = ConfigDict(extra="forbid")

    toolchain: str
    trtllm_version: str
    executable: str = "trtllm-build"
    sources: dict[str, str] = Field(default_factory=dict)
    flags: dict[str, FlagSpec]
    removed: dict[str, str] = Field(default_factory=dict)
    refused: dict[str, str] = Field(default_factory=dict)

    @property
    def plugin_flags(self) -> dict[str, FlagSpec]:
        return {name: spec for name, spec in self.flags.items() if spec.plugin}

    def lookup(self, name: str) -> FlagSpec | None:
        if name in self.flags:
            return self.flags[name]
        for spec in self.flags.values():
            if name in spec.aliases:
                return spec
        return None

    def check_value(self, name: str, value: str | None) -> str | None:
        """Return why `--name value` is not accepted by this version, or None when it is."""
        if name in self.refused:
            return f"--{name} is refused by TensorRT-LLM {self.trtllm_version}: {self.refused[name]}"
        spec = self.lookup(name)
        if spec is None:
            hint = self.removed.get(name)
            suffix = f" ({hint})" if hint else ""
            return f"--{name} is not a trtllm-build flag in TensorRT-LLM {self.trtllm_version}{suffix}"
        if spec.kind == "switch":
            return None if value is None else f"--{name} is a switch and takes no value (got {value!r})"
        if value is None:
            return f"--{name} needs a value"
        if spec.kind == "choice":
            assert spec.choices is not None
            if value not in spec.choices:
                return f"--{name} {value} is not allowed; choose one of {', '.join(spec.choices)}"
        if spec.kind == "int":
            try:
                number = int(value)
            except ValueError:
                return f"--{name} needs an integer (got {value!r})"
            if spec.min is not None and number < spec.min:
                return f"--{name} {number} is below the minimum {spec.min}"
            if spec.power_of_two and (number <= 0 or number & (number - 1)):
                return f"--{name} {number} must be a power of two"
        return None

    def check_command(self, argv: list[str]) -> list[str]:
        """Every problem with `argv` (executable first) against this contract; empty when it is valid."""
        problems: list[str] = []
        seen: set[str] = set()
        i = 1
        while i < len(argv):
            token = argv[i]
            if not token.startswith("--"):
                problems.append(f"unexpected positional argument {token!r}")
                i += 1
                continue
            name = token[2:]
            spec = self.lookup(name)
            takes_value = spec is not None and spec.kind != "switch"
            value: str | None = None
            if takes_value or (spec is None and i + 1 < len(argv) and not argv[i + 1].startswith("--")):
                value = argv[i + 1] if i + 1 < len(argv) else None
                i += 2
            else:
                i += 1
            if name in seen:
                problems.append(f"--{name} given twice")
            seen.add(name)
            problem = self.check_value(name, value)
            if problem:
                problems.append(problem)
        return problems


def contract_path(toolchain_name: str, configs: Path | None = None) -> Path:
    return flags_dir(configs) / f"{toolchain_name}.yaml"


@lru_cache(maxsize=16)
def _load_contract_cached(path: Path, mtime_ns: int) -> FlagContract:
    return FlagContract.model_validate(read_yaml(path))


def load_contract(toolchain_name: str, configs: Path | None = None) -> FlagContract:
    """The flag contract of a toolchain (e.g. "trtllm-1.2.1"); TrtpipeError if none is pinned."""
    path = contract_path(toolchain_name, configs)
    if not path.is_file():
        known = ", ".join(known_contracts(configs)) or "none"
        raise IntegrityError(
            f"no trtllm-build flag contract for toolchain {toolchain_name!r} (known: {known})", path=str(path),
            fix=f"add build_configs/trtllm_build_flags/{path.name} taken from that version's "
                "tensorrt_llm/commands/build.py",
        )
    return _load_contract_cached(path, path.stat().st_mtime_ns)


def known_contracts(configs: Path | None = None) -> list[str]:
    return sorted(p.stem for p in flags_dir(configs).glob("trtllm-*.yaml"))  # rules.yaml beside them is not a contract


def render_value(value: object) -> str | None:
    """How a plugin/feature setting is spelled on the trtllm-build command line."""
    if value is True:
        return "enable"
    if value is False or value is None:
        return "disable"
    return str(value)  # a dtype such as "auto"/"fp8", or an int such as tokens_per_block
