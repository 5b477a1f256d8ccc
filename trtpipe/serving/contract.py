"""The upstream Triton contracts (inflight_batcher_llm, llmapi), and whether a repository is a superset of one.

The tables live in `build_configs/triton_contracts/<layout>.yaml` (facts read from the pinned
TensorRT-LLM / tensorrtllm_backend templates, each with its source and line): `inflight_batcher_llm.yaml` for the
five-model layout the trtllm-build backend publishes, `llmapi.yaml` for the one-model layout of the llm-api backend. A client written for upstream
sends some subset of upstream's inputs and asks for some of its outputs; it keeps working against our repository
when every upstream tensor is declared by ours in a compatible way. The rules, stated once:

- inputs: same dtype (an upstream `${...}` dtype is the deployer's choice: any); same rank; equal dims, except that
  for a tensor the readings disagree on, ours may be -1 where a reading is fixed (it then accepts every reading's
  shape); optional wherever upstream is optional (ours may be optional where upstream requires it); on the
  `tensorrt_llm` model the reshape must be equal (the C++ backend reads the reshaped tensor).
- outputs: same dtype and equal dims.
- a name declared with different ranks by two readings is satisfied by matching either declaration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from trtpipe.errors import IntegrityError, MissingCapability
from trtpipe.serving.layouts import INFLIGHT_BATCHER_LLM, LAYOUTS

CONTRACT_FILE = "triton_contracts/inflight_batcher_llm.yaml"  # the default layout's table


def contract_file(layout: str = INFLIGHT_BATCHER_LLM) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown repository layout {layout!r} (known: {', '.join(LAYOUTS)})")
    return f"triton_contracts/{layout}.yaml"
RESHAPE_MATTERS = ("tensorrt_llm",)

Direction = Literal["input", "output"]


class Tensor(BaseModel):
    name: str
    dtype: str
    dims: list[int]
    optional: bool = False
    reshape: list[int] | None = None
    at: dict[str, int] = Field(description="reading id -> line of the tensor's name in that reading")

    @property
    def templated_dtype(self) -> bool:
        return self.dtype.startswith("${")


class ModelContract(BaseModel):
    readings: list[str]
    inputs: list[Tensor]
    outputs: list[Tensor]

    def stable(self, tensor: Tensor) -> bool:
        """Declared identically by every reading of this model."""
        return set(tensor.at) == set(self.readings)


class Reading(BaseModel):
    repo: str
    commit: str
    path: str
    read: str


class ToolchainSource(BaseModel):
    tag: str
    pinned: str
    read_at_tag: bool
    carries: str | None = Field(default=None, description="what the toolchain's container really carries, where it "
                                                            "differs from the pin")


class Contract(BaseModel):
    format: int
    readings: dict[str, Reading]
    toolchains: dict[str, ToolchainSource]
    models: dict[str, ModelContract]
    layout: dict[str, Any] | None = Field(default=None, description="Layout and behaviour facts (llmapi.yaml).")

    def cite(self, model: str, tensor: Tensor) -> str:
        """`repo@commit path:line` of the first reading that declares `tensor`."""
        rid, line = next(iter(tensor.at.items()))
        reading = self.readings[rid]
        return f"{reading.repo}@{reading.commit[:12]} {reading.path.format(model=model)}:{line}"


def contract_path(layout: str = INFLIGHT_BATCHER_LLM, configs: Path | None = None) -> Path:
    from trtpipe.shipped import configs_dir

    return configs_dir(configs) / contract_file(layout)


def load_contract(path: Path | None = None, *, layout: str = INFLIGHT_BATCHER_LLM, configs: Path | None = None) -> Contract:
    from pydantic import ValidationError

    import yaml

    from trtpipe.datafiles import read_yaml

    path = path or contract_path(layout, configs)
    try:
        data = read_yaml(path)
    except FileNotFoundError:
        raise IntegrityError(f"Triton contract table {path} is missing", path=str(path), fix="restore it from git") from None
    except yaml.YAMLError as exc:
        raise IntegrityError(f"Triton contract table {path} is not valid YAML: {exc}", path=str(path), fix="restore it from git") from None
    try:
        contract = Contract.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise IntegrityError(f"{path}: {loc}: {first['msg']}", path=str(path), fix="fix the entry or restore the file from git") from None
    for model, table in contract.models.items():
        for tensor in [*table.inputs, *table.outputs]:
            unknown = set(tensor.at) - set(table.readings)
            if unknown:
                raise IntegrityError(f"{path}: models.{model}: {tensor.name} cites readings not listed for the model: "
                                     f"{', '.join(sorted(unknown))}", path=str(path), fix="restore the file from git")
    return contract


def contract_for(toolchain: str, contract: Contract | None = None, *, layout: str = INFLIGHT_BATCHER_LLM,
                 configs: Path | None = None) -> Contract:
    """The contract a repository of `layout` published with `toolchain` must satisfy (`configs`: the
    build_configs/ folder its table is read from, None for the shipped one)."""
    contract = contract or load_contract(layout=layout, configs=configs)
    if toolchain not in contract.toolchains:
        raise MissingCapability(
            f"no upstream Triton contract for toolchain {toolchain!r} in {contract_file(layout)}",
            fix=f"add it there from its pinned templates (known: {', '.join(contract.toolchains)})",
        )
    return contract


class Declared(BaseModel):
    """One tensor as our config.pbtxt declares it."""

    dtype: str
    dims: list[int]
    optional: bool
    reshape: list[int] | None


class Mismatch(BaseModel):
    model: str
    direction: Direction
    tensor: str
    problem: str
    source: str

    def one_line(self) -> str:
        return f"{self.model}: {self.direction} {self.tensor}: {self.problem} (upstream: {self.source})"


def _problems(model: str, direction: Direction, theirs: Tensor, ours: Declared, stable: bool) -> list[str]:
    problems: list[str] = []
    if not theirs.templated_dtype and ours.dtype != theirs.dtype:
        problems.append(f"dtype {ours.dtype}, upstream {theirs.dtype}")
    if len(ours.dims) != len(theirs.dims):
        problems.append(f"dims {ours.dims}, upstream {theirs.dims}")
    elif ours.dims != theirs.dims:
        widened = all(o == t or o == -1 for o, t in zip(ours.dims, theirs.dims))
        if direction == "output" or stable or not widened:
            problems.append(f"dims {ours.dims}, upstream {theirs.dims}")
    if direction == "input":
        if theirs.optional and not ours.optional:
            problems.append("required here but optional upstream (an upstream client may omit it)")
        if model in RESHAPE_MATTERS and ours.reshape != theirs.reshape:
            problems.append(f"reshape {ours.reshape}, upstream {theirs.reshape}")
    return problems


def check_model(contract: Contract, model: str, declared: dict[Direction, dict[str, Declared]]) -> list[Mismatch]:
    """Every way `declared` (our config's tensors by direction and name) falls short of upstream's `model`."""
    table = contract.models[model]
    found: list[Mismatch] = []
    for direction, tensors in (("input", table.inputs), ("output", table.outputs)):
        by_name: dict[str, list[Tensor]] = {}
        for tensor in tensors:
            by_name.setdefault(tensor.name, []).append(tensor)
        for name, declarations in by_name.items():
            ours = declared[direction].get(name)  # type: ignore[index]
            if ours is None:
                found.append(Mismatch(model=model, direction=direction, tensor=name,  # type: ignore[arg-type]
                                      problem="missing", source=contract.cite(model, declarations[0])))
                continue
            per_declaration = [
                (tensor, _problems(model, direction, tensor, ours, table.stable(tensor)))  # type: ignore[arg-type]
                for tensor in declarations
            ]
            ranks = {len(t.dims) for t in declarations}
            if len(ranks) > 1:  # readings disagree on the rank: one declaration must be met
                if all(problems for _, problems in per_declaration):
                    tensor, problems = per_declaration[0]
                    found.append(Mismatch(model=model, direction=direction, tensor=name,  # type: ignore[arg-type]
                                          problem="; ".join(problems) + " (nor any other upstream declaration)",
                                          source=contract.cite(model, tensor)))
                continue
            for tensor, problems in per_declaration:
                if problems:
                    found.append(Mismatch(model=model, direction=direction, tensor=name,  # type: ignore[arg-type]
                                          problem="; ".join(problems), source=contract.cite(model, tensor)))
    return found
