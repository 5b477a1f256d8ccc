"""The build spec's JSON Schema, for editors (`trtpipe spec-schema`): completion and checking as the spec is typed.

The shape comes from the spec's own models (trtpipe.spec, every section `extra="forbid"`, so a misplaced or
misspelt key is flagged where it stands). What the models check with a validator against a table is added as the
table's values: `quantization.algo` and `quantization.kv_cache` (trtpipe.quant) and
`toolchain` (build_configs/toolchains.yaml, previews included) as enums; `target.gpu` as examples only (the catalog's
names and cpu-reference), because trtpipe also takes a GPU's aliases and product names in any case. The schema
checks shape, not the rules that need the model or the catalog's facts: `trtpipe spec-check` applies those.
`backend` is one section per backend, told apart by `kind` (a discriminator: an editor completes the fields of the
kind written and flags another backend's); it is optional, as in the spec (its target's default backend). A spec in
the earlier shape (engine:, triton:) still loads (trtpipe.spec_shape) but is not offered here.
"""

from __future__ import annotations

from typing import Any

from trtpipe import quant
from trtpipe.spec import CPU_REFERENCE, BuildSpec
from trtpipe.toolchain import BACKEND_KINDS, backend_facts

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _nullable_enum(values: list[str]) -> dict[str, Any]:
    return {"anyOf": [{"type": "string", "enum": values}, {"type": "null"}]}


def _backend_section(union: dict[str, Any]) -> dict[str, Any]:
    """The backend union as JSON Schema can check it: a section that names its `kind` is that backend's (and only
    its fields are allowed); one without `kind` is the target's default backend's, an engine backend on either
    target (the spec fills `kind` in). pydantic's `oneOf` would refuse a section without `kind` that fits two."""
    members = union["oneOf"]
    defaults = [{"$ref": union["discriminator"]["mapping"][kind]}
                for kind in BACKEND_KINDS if backend_facts(kind).default_on is not None]
    return {key: union[key] for key in ("title", "description", "discriminator")} | {"anyOf": [
        *({"allOf": [member], "required": ["kind"]} for member in members),
        *({"allOf": [member], "not": {"required": ["kind"]}} for member in defaults),
    ]}


def spec_schema(*, gpus: list[str], toolchains: list[str]) -> dict[str, Any]:
    """The JSON Schema of a build spec, with `gpus` (the catalog's names) as target.gpu's examples and
    `toolchains` (every pinned line's name) as toolchain's values."""
    schema = BuildSpec.model_json_schema()
    defs = schema["$defs"]
    props = schema["properties"]
    props["backend"] = _backend_section(props["backend"])
    schema["required"] = [name for name in schema.get("required", []) if name != "backend"]
    props["toolchain"] = {**props["toolchain"], **_nullable_enum(list(toolchains))}
    quantization = defs["QuantizationSection"]["properties"]
    quantization["algo"] = {**quantization["algo"], "enum": list(quant.FORMATS)}
    quantization["kv_cache"] = {**quantization["kv_cache"], "enum": list(quant.KV_CACHES)}
    target = defs["TargetSection"]["properties"]
    target["gpu"] = {**target["gpu"], "examples": [CPU_REFERENCE, *gpus]}
    return {"$schema": SCHEMA_DIALECT, **schema, "title": "trtpipe build spec"}
