"""A model's config.json, read within bounds and checked before anything is sized from it.

Every consumer of a model's shape goes through `check_model_config` (one place): resolve (and so `plan`,
`spec-check` and every build), the converter's source check (`trtpipe.checkpoint.hf_source`), and the
reference runtime reading a TensorRT-LLM checkpoint (`trtpipe.reference.runtime`). A config that is not a
decoder LLM any of them could size is refused with one line naming the file, the line and the field, before
a loop over its layers or an allocation of its tensors: a float (`1e9`), a string (`"256"`), a bool, zero or
a negative number, a value past the bounds below, or widths that do not divide.

Bounds (`BOUNDS`): generous ceilings over every released decoder, so a real model never meets one, while a
hostile or corrupt file cannot make trtpipe loop a billion times or plan negative parameters. For reference,
the largest figures among released decoders: 126 layers, hidden 16,384, 128 heads, intermediate 53,248
(Llama-3.1-405B config.json); vocabulary 262,144 (Gemma 3); 10,485,760 positions (Llama 4 Scout); head
dimensions 64-256.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtpipe.errors import InvalidInput

# A config.json is a few KB (some carry label maps of a few hundred KB); anything larger is not one.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# The most GPUs a TensorRT-LLM checkpoint's mapping may name (trtpipe.spec.MAX_GPUS: what a spec may target).
MAX_WORLD_SIZE = 512

Flavour = Literal["hf", "trtllm"]


@dataclass(frozen=True)
class Bound:
    """A whole-number field: its name in an HF config.json, in a TRT-LLM checkpoint config, and its range."""

    hf: str
    trtllm: str
    low: int
    high: int
    required: bool


BOUNDS: tuple[Bound, ...] = (
    Bound("num_hidden_layers", "num_hidden_layers", 1, 1024, True),
    Bound("hidden_size", "hidden_size", 1, 131_072, True),
    Bound("num_attention_heads", "num_attention_heads", 1, 1024, True),
    Bound("num_key_value_heads", "num_key_value_heads", 1, 1024, False),
    Bound("head_dim", "head_size", 1, 1024, False),
    Bound("intermediate_size", "intermediate_size", 1, 1_048_576, True),
    Bound("vocab_size", "vocab_size", 1, 4_194_304, True),
    Bound("max_position_embeddings", "max_position_embeddings", 1, 16_777_216, False),
)
# Fields whose type the consumers trust (bool("false") is True; float("x") raises deep inside a conversion).
_BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "share_embedding_table", "use_parallel_embedding")
_NUMBER_FIELDS = ("rms_norm_eps", "rope_theta", "norm_epsilon", "rotary_base", "rotary_pct")
_TEXT_FIELDS = ("model_type", "torch_dtype", "dtype", "hidden_act", "architecture")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, float):
        return "a number with a fraction or an exponent"
    if isinstance(value, str):
        return "text"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


class ConfigProblem:
    """Builds the one-line error: `FILE[:LINE]: "field": VALUE-as-written what is wrong; fix`."""

    def __init__(self, source: str | Path, text: str | None) -> None:
        self.source = str(source)
        self.text = text

    def _written(self, field: str) -> tuple[int | None, str | None]:
        """(line, the value's text as written in the file) of the first `"field":` in it, when known."""
        if self.text is None:
            return None, None
        match = re.search(r'"' + re.escape(field) + r'"\s*:\s*', self.text)
        if match is None:
            return None, None
        line = self.text.count("\n", 0, match.start()) + 1
        rest = self.text[match.end(): match.end() + 80]
        if rest[:1] in ("{", "["):  # an object or list: shown as parsed (the caller's json.dumps)
            return line, None
        token = re.match(r'"(?:[^"\\]|\\.)*"|[^,}\]\s]+', rest)
        return line, token.group(0) if token else None

    def error(self, field: str, value: Any, what: str, fix: str) -> InvalidInput:
        line, written = self._written(field)
        shown = written if written is not None else json.dumps(value)[:80]
        where = f"{self.source}:{line}" if line is not None else self.source
        return InvalidInput(f'{where}: "{field}": {shown} {what}', fix=fix)

    def plain(self, what: str, fix: str) -> InvalidInput:
        return InvalidInput(f"{self.source}: {what}", fix=fix)


def _whole_number(problem: ConfigProblem, config: dict[str, Any], bound: Bound, name: str) -> int | None:
    if name not in config or (config[name] is None and not bound.required):
        return None  # a missing required field is refused by the caller, with every other one missing
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise problem.error(name, value, f"is {_kind(value)}, not a whole number",
                            f"write {name} as a plain integer (no quotes, no decimals, no exponent)")
    if value < bound.low:
        raise problem.error(name, value, f"is below {bound.low}", f"{name} must be a positive whole number")
    if value > bound.high:
        raise problem.error(name, value, f"is beyond {bound.high:,}, far past any released model",
                            f"restore the model's config.json ({name} at most {bound.high:,})")
    return value


def check_model_config(config: Any, source: str | Path, *, flavour: Flavour = "hf", text: str | None = None) -> dict[str, Any]:
    """Check `config` (a parsed HF config.json, or a TRT-LLM checkpoint's config with `flavour="trtllm"`) and
    return it. Raises one InvalidInput naming `source` (the file), the line when `text` (the file's text) is
    given, and the field. Nothing here allocates in proportion to any value of the config."""
    problem = ConfigProblem(source, text)
    if not isinstance(config, dict):
        raise problem.plain(f"is {_kind(config)}, not a JSON object", "restore the model's config.json")
    names = {bound.hf: bound.hf if flavour == "hf" else bound.trtllm for bound in BOUNDS}
    missing = [names[b.hf] for b in BOUNDS if b.required and names[b.hf] not in config]
    if missing:
        raise problem.plain(f"lacks {', '.join(missing)}: not a decoder LLM config trtpipe can plan",
                            "point at a Llama/Mistral/Qwen2-style config.json")
    values: dict[str, int | None] = {}
    for bound in BOUNDS:
        values[bound.hf] = _whole_number(problem, config, bound, bound.hf if flavour == "hf" else bound.trtllm)
    # A flag or a number, when written, is never null: its readers take `config.get(name, default)`.
    for name in _BOOL_FIELDS:
        if name in config and not isinstance(config[name], bool):
            raise problem.error(name, config[name], f"is {_kind(config[name])}, not true or false", f"write {name} as true or false")
    for name in _NUMBER_FIELDS:
        if name not in config:
            continue
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise problem.error(name, value, f"is {_kind(value)}, not a number", f"write {name} as a plain number")
        if not math.isfinite(value) or value < 0:
            raise problem.error(name, value, "is not a finite, non-negative number", "restore the model's config.json")
    for name in _TEXT_FIELDS:
        if config.get(name) is not None and not isinstance(config[name], str):
            raise problem.error(name, config[name], f"is {_kind(config[name])}, not text", f"write {name} as a string")
    architectures = config.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise problem.error("architectures", architectures, "is not a list of class names",
                            'write it as a list such as ["LlamaForCausalLM"]')
    for name in ("rope_scaling", "rotary_scaling", "quantization", "mapping"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise problem.error(name, config[name], f"is {_kind(config[name])}, not an object", f"write {name} as an object or null")

    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    kv_heads, head_dim = values["num_key_value_heads"], values["head_dim"]
    head_dim_name = "head_dim" if flavour == "hf" else "head_size"
    assert hidden is not None and heads is not None  # required fields
    if head_dim is None and hidden % heads:
        raise problem.error("hidden_size", hidden, f"does not divide by num_attention_heads {heads}, so the heads have "
                            "no whole width", f"restore the model's config.json (or give {head_dim_name})")
    width = head_dim if head_dim is not None else hidden // heads
    if width % 2:
        field = head_dim_name if head_dim is not None else "hidden_size"
        raise problem.error(field, head_dim if head_dim is not None else hidden,
                            f"gives heads of odd width {width}; rotary embeddings rotate pairs of dimensions",
                            "restore the model's config.json")
    if kv_heads is not None:
        if kv_heads > heads or heads % kv_heads:
            raise problem.error("num_key_value_heads", kv_heads, f"does not divide num_attention_heads {heads} into "
                                "equal groups", "restore the model's config.json")
    if flavour == "trtllm":
        _check_mapping(problem, config.get("mapping") or {})
        if "embedding_sharding_dim" in config:  # TRT-LLM shards the embedding along dim 0 or 1
            value = config["embedding_sharding_dim"]
            if isinstance(value, bool) or value not in (0, 1):
                raise problem.error("embedding_sharding_dim", value, "is not 0 or 1", "re-export the checkpoint")
    rotary_pct = config.get("rotary_pct")
    if rotary_pct is not None and rotary_pct > 1:  # a number (checked above): the share of a head that rotates
        raise problem.error("rotary_pct", rotary_pct, "is more than 1 (the whole head)", "restore the model's config")
    return config


def _check_mapping(problem: ConfigProblem, mapping: dict[str, Any]) -> None:
    for name in ("tp_size", "pp_size", "world_size"):
        if name in mapping:
            value = mapping[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD_SIZE:
                raise problem.error(name, value, f"is not a whole number from 1 to {MAX_WORLD_SIZE}",
                                    "re-export the checkpoint")


def file_text(path: Path | str) -> str | None:
    """The text of a config file already parsed elsewhere, for the line numbers of an error (None if unreadable
    or larger than a config.json can be)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        return data.decode("utf-8") if len(data) <= MAX_CONFIG_BYTES else None
    except (OSError, UnicodeDecodeError):
        return None


def read_model_config(path: Path, *, flavour: Flavour = "hf") -> dict[str, Any]:
    """Read and check a config.json: at most MAX_CONFIG_BYTES, UTF-8 JSON, an object; an HF multimodal wrapper's
    `text_config` merged in (the language model's fields live there). Raises one InvalidInput naming the file."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist", fix="give the model folder's config.json") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it ({exc.strerror})", fix="check the file and its permissions") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a model's config.json",
                           fix="restore the model's config.json")
    try:
        text = data.decode("utf-8")
        config = json.loads(text)
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text", fix="restore the model's config.json") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})", fix="restore the model's config.json") from None
    except (ValueError, RecursionError) as exc:  # an integer past int()'s digit limit; nesting past the parser's
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise InvalidInput(f"{path}: not a usable config.json ({what})", fix="restore the model's config.json") from None
    if flavour == "hf" and isinstance(config, dict) and "num_hidden_layers" not in config \
            and isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    return check_model_config(config, path, flavour=flavour, text=text)
