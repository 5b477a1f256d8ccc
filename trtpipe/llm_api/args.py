"""The TorchLlmArgs table of each pinned TensorRT-LLM release, and the check every llm_args.json passes.

The data lives in `build_configs/llm_api_args/<table>.yaml` (read from that release's
tensorrt_llm/llmapi/llm_args.py; the file says how and at which copy). `check_llm_args` holds a document of
`LLM()` keyword arguments (the artifact's llm_args.json, the llmapi model's model.yaml) to the table the way
TorchLlmArgs itself would: an unknown key, a value of the wrong type, a choice outside its Literal or a number
outside its validator's range is refused in one line naming the key. A field whose value is a Python object
(a tokenizer instance, a LoRA config object, an enum JSON cannot carry) is refused too: a file cannot hold it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.datafiles import read_yaml
from trtpipe.errors import IntegrityError, InvalidInput
from trtpipe.shipped import configs_dir

FieldKind = Literal["int", "float", "bool", "str", "choice", "int_list", "config", "object"]
FACTORY = "<factory>"


class ArgField(BaseModel):
    """One field of TorchLlmArgs (or of a nested config class)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FieldKind
    required: bool = False
    nullable: bool = False
    default: Any = None
    choices: list[str] | None = None
    min: float | None = None
    max: float | None = None
    config: str | None = Field(default=None, description="kind config: the nested class's name under `configs:`.")
    status: Literal["beta", "prototype", "deprecated"] | None = None
    verified: bool = True
    cite: str | None = None
    note: str | None = None


class ArgConfig(BaseModel):
    """A nested config class (KvCacheConfig, CudaGraphConfig, SchedulerConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str | None = None
    verified: bool = True
    fields: dict[str, ArgField]


class QuantSupport(BaseModel):
    """One recipe of the PyTorch backend's quantization matrices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: str
    architectures: list[str]
    models: dict[str, bool]


class LlmArgsTable(BaseModel):
    """Every TorchLlmArgs field one TensorRT-LLM release takes (as far as `complete` says it was read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    toolchain: str
    trtllm_version: str
    complete: bool
    sources: dict[str, dict[str, Any]]
    classes: dict[str, dict[str, str]] = Field(default_factory=dict)
    fields: dict[str, ArgField]
    configs: dict[str, ArgConfig]
    quantization: dict[str, QuantSupport] = Field(default_factory=dict)

    def unverified(self, args: dict[str, Any]) -> list[str]:
        """The keys of `args` (nested ones dotted) whose table entry was not seen in this release's source."""
        found = []
        for key, value in args.items():
            spec = self.fields.get(key)
            if spec is None:
                continue
            if not spec.verified:
                found.append(key)
            if spec.kind == "config" and isinstance(value, dict) and spec.config in self.configs:
                nested = self.configs[spec.config]
                if not nested.verified:
                    found += [f"{key}.{k}" for k in value]
        return found


def tables_dir(configs: Path | None = None) -> Path:
    """llm_api_args/ of `configs` (the build_configs/ folder; None: the shipped one)."""
    return configs_dir(configs) / "llm_api_args"


@lru_cache(maxsize=8)
def _load(path: str) -> LlmArgsTable:
    file = Path(path)
    if not file.is_file():
        raise IntegrityError(f"TorchLlmArgs table {file} is missing", path=str(file),
                             fix="restore build_configs/llm_api_args/ from git")
    try:
        return LlmArgsTable.model_validate(read_yaml(file))
    except Exception as exc:  # yaml or validation error: the shipped table is damaged
        raise IntegrityError(f"TorchLlmArgs table {file} is invalid: {str(exc).splitlines()[0]}", path=str(file),
                             fix="restore build_configs/llm_api_args/ from git") from None


def load_args_table(name: str, configs: Path | None = None) -> LlmArgsTable:
    """The table `build_configs/llm_api_args/<name>.yaml` (a toolchain's llm-api backend names it)."""
    return _load(str(tables_dir(configs) / f"{name}.yaml"))


def _type_problem(spec: ArgField, value: Any) -> str | None:
    """Why `value` does not fit `spec` (None when it does)."""
    if value is None:
        return None if spec.nullable or spec.default is None and not spec.required else "may not be null"
    kind = spec.kind
    if kind == "object":
        return "holds a Python object (or an enum whose members were not read), which a file cannot carry"
    if kind == "bool":
        return None if isinstance(value, bool) else f"must be true or false, not {value!r}"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, not {value!r}"
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, not {value!r}"
    elif kind == "str":
        return None if isinstance(value, str) else f"must be a string, not {value!r}"
    elif kind == "choice":
        assert spec.choices is not None
        if value not in spec.choices:
            return f"must be one of {', '.join(spec.choices)}, not {value!r}"
        return None
    elif kind == "int_list":
        if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            return f"must be a non-empty list of integers, not {value!r}"
        return None
    elif kind == "config":
        return None if isinstance(value, dict) else f"must be a mapping of {spec.config} fields, not {value!r}"
    if spec.min is not None and value < spec.min:
        return f"must be at least {spec.min:g}, not {value!r}"
    if spec.max is not None and value > spec.max:
        return f"must be at most {spec.max:g}, not {value!r}"
    return None


def llm_args_problems(args: Any, table: LlmArgsTable) -> list[str]:
    """Every reason TorchLlmArgs of `table`'s release would refuse `args` (empty: it takes them)."""
    if not isinstance(args, dict):
        return [f"the document must be a mapping of LLM() arguments, not {type(args).__name__}"]
    problems: list[str] = []
    release = f"TensorRT-LLM {table.trtllm_version}"
    reading = "" if table.complete else " (as far as trtpipe's table of this preview line was read)"

    def check(fields: dict[str, ArgField], where: str, owner: str, values: dict[str, Any]) -> None:
        for key, value in values.items():
            name = f"{where}{key}"
            spec = fields.get(key)
            if spec is None:
                problems.append(f"{name}: not a field of {owner} in {release}{reading}")
                continue
            problem = _type_problem(spec, value)
            if problem:
                problems.append(f"{name}: {problem}")
                continue
            if spec.kind == "config" and isinstance(value, dict):
                assert spec.config is not None
                nested = table.configs.get(spec.config)
                if nested is None:
                    problems.append(f"{name}: trtpipe's table has no {spec.config} fields to check it against")
                    continue
                check(nested.fields, f"{name}.", spec.config, value)

    check(table.fields, "", "TorchLlmArgs", args)
    return problems


def check_llm_args(args: Any, table: LlmArgsTable, *, where: str) -> None:
    """Refuse `args` in one line (InvalidInput naming `where` and the first key) unless the release takes them."""
    problems = llm_args_problems(args, table)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidInput(f"{where}: {problems[0]}{more}",
                           fix=f"use the TorchLlmArgs fields of {table.toolchain} "
                               f"(build_configs/llm_api_args/{table.toolchain}.yaml)")
