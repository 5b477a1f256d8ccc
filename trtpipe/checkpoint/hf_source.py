"""Checks and loading of the Hugging Face model directory a conversion starts from.

Everything here runs before any weight is read into torch, so a damaged or mismatched model directory
(pickle weights, a config without weights, a truncated shard, shapes that disagree with config.json) fails in
a second with one line, not after minutes of calibration. The spec's rules (architecture, tp/pp against the
model's shape, the AWQ group size against every GEMM width) are trtpipe.resolve's, applied before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.config_json import read_model_config
from trtpipe.errors import IntegrityError, InvalidInput
from trtpipe.model_folder import TOKENIZER_MARKERS
from trtpipe.resolve import SUPPORTED_ARCHITECTURES

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


@dataclass(frozen=True)
class HfSource:
    """A checked HF model directory."""

    model_dir: Path
    tokenizer_dir: Path
    config: dict[str, Any]
    architecture: str
    weight_files: tuple[Path, ...]  # the files transformers will read, sorted
    uses_pickle: bool

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]


def dims(config: dict[str, Any]) -> dict[str, int]:
    """The widths that decide tensor shapes (HF names in, plain names out)."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    return {
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": int(config["intermediate_size"]),
        "vocab": int(config["vocab_size"]),
        "layers": int(config["num_hidden_layers"]),
    }


def check_architecture(config: dict[str, Any], where: Path) -> str:
    architectures = config.get("architectures") or []
    arch = architectures[0] if architectures else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise InvalidInput(
            f"{where}: architecture {arch or '(none given)'} is not supported by trtpipe's converter",
            fix=f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
    return arch


def _weight_files(model_dir: Path, allow_pickle: bool) -> tuple[tuple[Path, ...], bool]:
    safetensors = sorted(model_dir.glob("*.safetensors"))
    pickled = sorted(p for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES and p.name != "training_args.bin")
    if safetensors:
        return tuple(safetensors), False
    if pickled:
        if not allow_pickle:
            raise InvalidInput(
                f"{model_dir}: only pickle weights ({pickled[0].name}); loading pickle can run arbitrary code",
                fix="convert the weights to safetensors, or set model.allow_pickle: true in the spec if you trust them",
            )
        return tuple(pickled), True
    raise InvalidInput(
        f"{model_dir}: config.json but no weights (*.safetensors)", fix="download the model's weight files too"
    )


def expected_hf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The HF tensor names and shapes a Llama/Mistral/Qwen2 checkpoint must hold."""
    d = dims(config)
    q, kv = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (d["vocab"], d["hidden"]),
        "model.norm.weight": (d["hidden"],),
    }
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (d["vocab"], d["hidden"])
    qwen2 = check_architecture(config, Path("config.json")) == "Qwen2ForCausalLM"
    attention_bias = qwen2 or bool(config.get("attention_bias", False))
    for i in range(d["layers"]):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (d["hidden"],)
        shapes[f"{p}.post_attention_layernorm.weight"] = (d["hidden"],)
        shapes[f"{p}.self_attn.q_proj.weight"] = (q, d["hidden"])
        shapes[f"{p}.self_attn.k_proj.weight"] = (kv, d["hidden"])
        shapes[f"{p}.self_attn.v_proj.weight"] = (kv, d["hidden"])
        shapes[f"{p}.self_attn.o_proj.weight"] = (d["hidden"], q)
        if attention_bias:
            shapes[f"{p}.self_attn.q_proj.bias"] = (q,)
            shapes[f"{p}.self_attn.k_proj.bias"] = (kv,)
            shapes[f"{p}.self_attn.v_proj.bias"] = (kv,)
        shapes[f"{p}.mlp.gate_proj.weight"] = (d["intermediate"], d["hidden"])
        shapes[f"{p}.mlp.up_proj.weight"] = (d["intermediate"], d["hidden"])
        shapes[f"{p}.mlp.down_proj.weight"] = (d["hidden"], d["intermediate"])
    return shapes


def _check_safetensors_shapes(model_dir: Path, files: tuple[Path, ...], config: dict[str, Any]) -> None:
    """Compare the safetensors headers (no tensor data is read) with the shapes config.json implies."""
    from safetensors import safe_open

    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    found[name] = tuple(handle.get_slice(name).get_shape())
        except Exception as exc:  # truncated or not a safetensors file
            raise IntegrityError(f"{path}: not a readable safetensors file ({exc})", path=str(path),
                                 fix="re-download it") from None
    for name, shape in expected_hf_shapes(config).items():
        if name not in found:
            raise IntegrityError(
                f"{model_dir}: tensor {name} is missing from the weights", path=str(model_dir),
                fix="the weight files do not match config.json; re-download the model",
            )
        if found[name] != shape:
            raise IntegrityError(
                f"{model_dir}: tensor {name} has shape {list(found[name])}, config.json implies {list(shape)}",
                path=str(model_dir),
                fix="the weight files do not match config.json; re-download the model or fix config.json",
            )


def inspect_source(
    model_dir: Path, tokenizer_dir: Path | None, *, allow_pickle: bool = False
) -> HfSource:
    """Check an HF directory without loading it: architecture, weight format, tensor shapes, tokenizer."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise InvalidInput(f"{model_dir}: no config.json", fix="give the folder of a Hugging Face model")
    config = read_model_config(config_path)  # bounds and types checked before any shape is derived from it
    arch = check_architecture(config, config_path)
    files, uses_pickle = _weight_files(model_dir, allow_pickle)
    if not uses_pickle:
        _check_safetensors_shapes(model_dir, files, config)
    tokenizer_dir = tokenizer_dir or model_dir
    if not any((tokenizer_dir / name).is_file() for name in TOKENIZER_MARKERS):
        raise InvalidInput(
            f"{tokenizer_dir}: no tokenizer (tokenizer.json or tokenizer.model)",
            fix="copy the model's tokenizer files there, or set model.tokenizer in the spec",
        )
    return HfSource(model_dir, tokenizer_dir, config, arch, files, uses_pickle)


def load_model(source: HfSource, dtype: Any, *, trust_remote_code: bool = False, device_map: str | None = None) -> Any:
    """Load the HF model in `dtype` (torch dtype): on the CPU, or placed by accelerate when `device_map` is
    given ("auto": spread over the visible GPUs). Safetensors only unless the source is pickle (allowed)."""
    from transformers import AutoModelForCausalLM

    placement = {"device_map": device_map} if device_map is not None else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.model_dir,
            dtype=dtype,
            use_safetensors=not source.uses_pickle,
            trust_remote_code=trust_remote_code,
            low_cpu_mem_usage=True,
            attn_implementation="eager",
            **placement,
        )
    except (OSError, ValueError, RuntimeError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(f"{source.model_dir}: transformers could not load the model: {first_line}",
                           fix="check that the folder holds a complete Hugging Face model of a supported "
                           "architecture") from None
    model.eval()
    return model
