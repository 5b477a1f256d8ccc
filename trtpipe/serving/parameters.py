"""The tensorrtllm backend's parameter contract: which `parameters` keys the C++ backend and trtpipe's own Python
models read, and whether a config's values are ones they accept.

The facts live in `build_configs/triton_contracts/tensorrtllm_parameters.yaml` (each row cites the file, function
and commit it was read at). This module loads that table (pydantic at the boundary) and judges a model's
parameters against it; `trtpipe.serving.validate` turns each finding into one issue line. It knows nothing of
repositories, manifests or Triton's config protobuf: its inputs are plain dicts of key -> string_value.

trtpipe is stricter than the backend in one way, on purpose: an optional key whose value does not convert (or is
outside the accepted values) loads upstream, with the default and a warning in the log; here it is an error,
because the server would not run what the config says. An empty string is how trtpipe leaves an optional key
unset (the backend then applies its default, as the table explains).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from trtpipe.errors import IntegrityError

PARAMETER_FILE = "triton_contracts/tensorrtllm_parameters.yaml"

BackendType = Literal["string", "bool", "int32", "uint32", "uint64", "float", "int_list", "device_lists",
                      "int_list_list"]
PythonType = Literal["relative_path", "bool_exact", "int", "int_list", "model_name"]

_INT = re.compile(r"[+-]?\d+")
_UINT = re.compile(r"\+?\d+")
# A decimal or exponent float; std::stof would also take inf/nan/hex, which no deployer means here.
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_BOOLS = {"True": True, "true": True, "TRUE": True, "1": True, "False": False, "false": False, "FALSE": False,
          "0": False}
_INT32 = (-(2**31), 2**31 - 1)


class Citation(BaseModel):
    reading: str
    file: str
    function: str
    line: int | None = None


class Reading(BaseModel):
    repo: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    path: str
    read: str


class TypeRule(BaseModel):
    parse: str
    source: Citation


class Range(BaseModel):
    gt: float | None = None
    lt: float | None = None

    def holds(self, value: float) -> bool:
        return (self.gt is None or value > self.gt) and (self.lt is None or value < self.lt)

    def text(self) -> str:
        low = f"> {self.gt:g}" if self.gt is not None else ""
        high = f"< {self.lt:g}" if self.lt is not None else ""
        return " and ".join(part for part in (low, high) if part)


class Parameter(BaseModel):
    key: str
    required: bool
    type: BackendType
    default: str | None = None
    accepted: list[str] | None = None
    unset: list[str] | None = Field(default=None, description="values the backend treats as not set (required keys)")
    range: Range | None = None
    range_source: Citation | None = None
    on_bad_value: Literal["fails", "default"]
    note: str | None = None
    source: Citation
    also_read: list[str] = []
    verified: bool


class Rule(BaseModel):
    id: str
    keys: list[str]
    rule: str
    fix: str
    source: Citation
    verified: bool


class LogitsRule(BaseModel):
    rule: str
    outputs: list[str]
    dtypes: dict[str, str] = Field(description="engine logits_dtype -> the Triton data type the backend serves")
    engine_default: str
    source: Citation
    check_source: Citation
    verified: bool


class PythonParameter(BaseModel):
    model: str
    key: str
    type: PythonType
    default: str
    source: Citation
    verified: bool


class ToolchainCarry(BaseModel):
    tag: str
    carries: str
    read_at_tag: bool


class ParameterTable(BaseModel):
    format: int
    consumer: str
    readings: dict[str, Reading]
    toolchains: dict[str, ToolchainCarry]
    types: dict[BackendType, TypeRule]
    parameters: list[Parameter]
    unread: list[str] = []
    rules: list[Rule]
    logits: LogitsRule
    python_models: list[PythonParameter]

    def row(self, key: str) -> Parameter | None:
        return next((p for p in self.parameters if p.key == key), None)

    @property
    def required_keys(self) -> list[str]:
        return [p.key for p in self.parameters if p.required]

    def rule(self, rule_id: str) -> Rule:
        return next(r for r in self.rules if r.id == rule_id)

    def cite(self, citation: Citation) -> str:
        """`repo@commit12 path function[:line]` of a citation."""
        reading = self.readings[citation.reading]
        line = f":{citation.line}" if citation.line is not None else ""
        return (f"{reading.repo}@{reading.commit[:12]} {reading.path.format(file=citation.file)}{line} "
                f"{citation.function}")

    def citations(self) -> list[tuple[str, Citation]]:
        """Every citation in the table, with what it is for (for the tests and the loader's own check)."""
        found = [(f"types.{name}", rule.source) for name, rule in self.types.items()]
        for p in self.parameters:
            found.append((f"parameters.{p.key}", p.source))
            if p.range_source is not None:
                found.append((f"parameters.{p.key}.range", p.range_source))
        found += [(f"rules.{r.id}", r.source) for r in self.rules]
        found += [("logits", self.logits.source), ("logits.check", self.logits.check_source)]
        found += [(f"python_models.{p.model}.{p.key}", p.source) for p in self.python_models]
        return found


class Finding(BaseModel):
    """One way a model's parameters break the table: the key, what is wrong, the fix, and the row it breaks."""

    key: str
    message: str
    fix: str
    row: str = Field(description="where the rule comes from: the table row and its citation")

    def one_line(self) -> str:
        return f"parameters.{self.key}: {self.message}; {self.fix} ({self.row})"


class EngineFacts(BaseModel):
    """What the cross-key rules need from the engine's config.json (None: not recorded there)."""

    paged_context_fmha: bool | None = None
    paged_kv_cache: bool | None = None
    encoder_decoder: bool = False


def parameter_path(configs: Path | None = None) -> Path:
    from trtpipe.shipped import configs_dir

    return configs_dir(configs) / PARAMETER_FILE


def load_parameter_table(path: Path | None = None, *, configs: Path | None = None) -> ParameterTable:
    from trtpipe.datafiles import read_yaml

    import yaml

    path = path or parameter_path(configs)
    try:
        data = read_yaml(path)
    except FileNotFoundError:
        raise IntegrityError(f"parameter table {path} is missing", path=str(path), fix="restore it from git") from None
    except yaml.YAMLError as exc:
        raise IntegrityError(f"parameter table {path} is not valid YAML: {exc}", path=str(path),
                             fix="restore it from git") from None
    try:
        table = ParameterTable.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise IntegrityError(f"{path}: {loc}: {first['msg']}", path=str(path),
                             fix="fix the entry or restore the file from git") from None
    for what, citation in table.citations():
        if citation.reading not in table.readings:
            raise IntegrityError(f"{path}: {what} cites reading {citation.reading!r}, not listed under readings",
                                 path=str(path), fix="restore the file from git")
    unknown = [r.id for r in table.rules if r.id not in _RULES]
    if unknown:
        raise IntegrityError(f"{path}: rules {', '.join(unknown)} have no check in trtpipe.serving.parameters",
                             path=str(path), fix="implement the rule there, or restore the file from git")
    return table


# --- values -------------------------------------------------------------------------------------------------

def _int_item(text: str, low: int, high: int) -> int | None:
    text = text.strip()
    if not _INT.fullmatch(text):
        return None
    value = int(text)
    return value if low <= value <= high else None


def _int_list(text: str) -> list[int] | None:
    if not text.strip():
        return None
    items = [_int_item(item, *_INT32) for item in text.split(",")]
    return None if any(i is None for i in items) else items  # type: ignore[return-value]


def convert(kind: BackendType, value: str) -> tuple[bool, object]:
    """(converts, value) as the backend's conversion of `kind` reads `value` whole."""
    if kind == "string":
        return True, value
    if kind == "bool":
        return (value in _BOOLS), _BOOLS.get(value)
    if kind == "int32":
        number = _int_item(value, *_INT32)
        return number is not None, number
    if kind in ("uint32", "uint64"):
        text = value.strip()
        if not _UINT.fullmatch(text):
            return False, None
        number = int(text)
        return number < 2 ** (32 if kind == "uint32" else 64), number
    if kind == "float":
        text = value.strip()
        if not _FLOAT.fullmatch(text):
            return False, None
        number = float(text)
        return math.isfinite(number), number
    if kind == "int_list":
        items = _int_list(value)
        return items is not None, items
    if kind == "device_lists":
        parts = value.split(";")
        if parts and parts[-1] == "":
            parts = parts[:-1]  # the backend's split drops a trailing empty field
        lists = [_int_list(part) for part in parts]
        return all(item is not None for item in lists), lists
    if kind == "int_list_list":
        groups = re.fullmatch(r"\s*\{[^{}]*\}(\s*,\s*\{[^{}]*\})*\s*", value)
        if not groups:
            return False, None
        lists = [_int_list(inner) for inner in re.findall(r"\{([^{}]*)\}", value)]
        return all(item is not None for item in lists), lists
    raise AssertionError(kind)


def _expected(row: Parameter) -> str:
    if row.accepted:
        return f"one of {', '.join(row.accepted)}"
    return {"bool": 'a bool ("true" or "false")', "int32": "an integer", "uint32": "a non-negative integer",
            "uint64": "a non-negative integer", "float": "a decimal number", "int_list": 'a comma list of integers',
            "device_lists": 'comma lists of device ids separated by ";"', "int_list_list": 'braced lists "{1,2},{3}"',
            "string": "a string"}[row.type]


def _where(table: ParameterTable, row: Parameter) -> str:
    return f"{PARAMETER_FILE} parameters.{row.key}: {table.cite(row.source)}"


def check_backend(table: ParameterTable, params: dict[str, str], engine: EngineFacts | None = None) -> list[Finding]:
    """Every way the C++ tensorrtllm model's `params` (key -> string_value) break the table."""
    found: list[Finding] = []
    values: dict[str, object] = {}
    for row in table.parameters:
        where = _where(table, row)
        if row.key not in params:
            if row.required:
                found.append(Finding(
                    key=row.key, row=where,
                    message="missing: the backend reads it unguarded, throws 'Cannot find parameter with name' and "
                            "the model instance is never created",
                    fix='write it (empty "" leaves it unset)' if row.unset else "write it"))
            continue
        value = params[row.key]
        if row.unset is not None and value in row.unset:
            continue
        if not row.required and value == "":
            continue  # trtpipe's "unset": the backend applies its default
        ok, parsed = convert(row.type, value)
        if ok and row.accepted is not None and value not in row.accepted:
            ok = False
        if not ok:
            effect = ("the model does not load" if row.on_bad_value == "fails"
                      else f"the backend would ignore it and use {row.default}")
            found.append(Finding(key=row.key, row=where, message=f"{value!r} is not {_expected(row)} ({effect})",
                                 fix=f"write {_expected(row)}" + ("" if row.required else ', or "" for the default')))
            continue
        if row.range is not None and row.range_source is not None:
            numbers = parsed if isinstance(parsed, list) else [parsed]
            if not all(row.range.holds(float(n)) for n in numbers):  # type: ignore[arg-type]
                found.append(Finding(
                    key=row.key, row=f"{where}; range: {table.cite(row.range_source)}",
                    message=f"{value} is outside {row.range.text()} (the executor refuses it and the instance fails)",
                    fix=f"write a value {row.range.text()}"))
                continue
        values[row.key] = parsed
    for rule in table.rules:
        problem = _RULES[rule.id](params, values, engine or EngineFacts())
        if problem is not None:
            key, message = problem
            found.append(Finding(key=key, message=message, fix=rule.fix,
                                 row=f"{PARAMETER_FILE} rules.{rule.id}: {table.cite(rule.source)}"))
    return found


def _lookahead(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    if params.get("decoding_mode") != "lookahead":
        return None
    sizes = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
    missing = [k for k in sizes if k not in values]
    if missing:
        return missing[0], f"decoding_mode is lookahead but {', '.join(missing)} is missing or not an unsigned integer"
    return None


def _guided(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    backend = params.get("guided_decoding_backend", "")
    path = params.get("xgrammar_tokenizer_info_path", "")
    if backend in ("", "${guided_decoding_backend}") or path in ("", "${xgrammar_tokenizer_info_path}"):
        return None  # either one unset: guided decoding is off and the backend checks nothing more
    if backend != "xgrammar":
        return "guided_decoding_backend", f"{backend!r} with a tokenizer info path set: only xgrammar is accepted"
    return None


def _engine_path(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    if params.get("gpt_model_path") or params.get("encoder_model_path"):
        return None
    return "gpt_model_path", "neither gpt_model_path nor encoder_model_path names an engine"


def _chunked(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    if values.get("enable_chunked_context") is True and (engine.paged_context_fmha is False
                                                         or engine.paged_kv_cache is False):
        return "enable_chunked_context", ("true, but the engine was built without paged context FMHA or paged KV "
                                          "cache (its config.json)")
    return None


def _onboard(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    if values.get("kv_cache_onboard_blocks") is False and engine.paged_context_fmha:
        return "kv_cache_onboard_blocks", "false, but the engine uses paged context FMHA (its config.json)"
    return None


def _cross_kv(params: dict[str, str], values: dict[str, object], engine: EngineFacts) -> tuple[str, str] | None:
    if "cross_kv_cache_fraction" in values and not engine.encoder_decoder:
        return "cross_kv_cache_fraction", "set on a decoder-only engine"
    return None


# Each rule id of the table, checked by one function: (params as written, converted values, engine) -> problem.
_RULES = {
    "lookahead-needs-sizes": _lookahead,
    "guided-decoding-needs-xgrammar": _guided,
    "engine-path": _engine_path,
    "chunked-context-needs-paged-context-fmha": _chunked,
    "onboard-blocks-with-paged-context-fmha": _onboard,
    "cross-kv-cache-fraction-decoder-only": _cross_kv,
}
RULE_IDS = tuple(_RULES)


def check_python_model(table: ParameterTable, model: str, params: dict[str, str],
                       models: tuple[str, ...] = ()) -> list[Finding]:
    """Every way trtpipe's own Python `model` (its template folder name) would misread `params`. `models`: the
    repository's model names (a model_name value must be one of them)."""
    found: list[Finding] = []
    for row in (r for r in table.python_models if r.model == model):
        if row.key not in params:
            continue  # read with its default when missing
        value = params[row.key]
        where = f"{PARAMETER_FILE} python_models {row.model}.{row.key}: {table.cite(row.source)}"
        problem: str | None = None
        fix = ""
        if row.type == "bool_exact" and value not in ("true", "false"):
            problem, fix = f"{value!r} reads as false (the model takes only exactly \"true\" as true)", 'write "true" or "false"'
        elif row.type == "int":
            try:
                int(value or 0)
            except ValueError:
                problem, fix = f"{value!r} is not an integer (the model fails to initialize)", "write an integer"
        elif row.type == "int_list" and (_int_list(value) is None or any(i <= 0 for i in _int_list(value) or [])):
            problem, fix = f"{value!r} is not a comma list of positive integers", "write e.g. \"4096\" or \"32,512\""
        elif row.type == "relative_path" and (not value or Path(value).is_absolute() or ".." in Path(value).parts):
            problem, fix = f"{value!r} is not a path inside the model folder", f'write a relative path, e.g. "{row.default}"'
        elif row.type == "model_name" and models and value not in models:
            problem, fix = f"{value!r} names no model of this repository", f"write one of {', '.join(models)}"
        if problem is not None:
            found.append(Finding(key=row.key, message=problem, fix=fix, row=where))
    return found


def logits_datatype(table: ParameterTable, engine_logits_dtype: str | None) -> str | None:
    """The Triton data type the backend serves for an engine whose config.json says `engine_logits_dtype`
    (None: absent, TensorRT-LLM's default applies); None when the backend serves no logits of that type."""
    return table.logits.dtypes.get(engine_logits_dtype or table.logits.engine_default)
