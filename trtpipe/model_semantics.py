"""What a model's config.json says the model *computes*, and how each runtime that serves it keeps it: one table.

A checkpoint conversion can be exact tensor by tensor and still serve another function, when a setting that changes
the function is not a tensor: a sliding attention window is a runtime setting in TensorRT-LLM, not a checkpoint field,
so a converter that carries every weight drops it without a word. Each row below names such a config.json field, what
it does, and how each runtime honours it (the TensorRT-LLM engine runtime, TensorRT-LLM's PyTorch LLM-API runtime,
trtpipe's reference runtime: a backend's `runtime` fact says which runs what it builds, trtpipe.toolchain): carried
in the checkpoint, passed as a runtime parameter (and where), applied by trtpipe's reference runtime, or refused. `trtpipe.resolve` consults the table (a field a backend cannot honour is
refused at its position, with the reason), and the stages that carry a field read it from here
(`attention_windows`, `token_vocab_size`), so there is one derivation.

Sources for the HF semantics (transformers 4.57.3, the pinned version): MistralConfig.sliding_window (every layer;
masking_utils.sliding_window_overlay: key j is seen from query i when j > i - window, so a window of W keys including
the current token); Qwen2Config (sliding_window only when use_sliding_window, on the layers i >= max_window_layers, or
as `layer_types` says). TensorRT-LLM's runtime setting: the tensorrt_llm model's `max_attention_window_size` parameter
(a comma list of per-layer windows, repeated over the layers; build_configs/triton_contracts/tensorrtllm_parameters.yaml
row max_attention_window_size, KvCacheConfig::setMaxAttentionWindowVec) and the LLM API's
`kv_cache_config.max_attention_window` (build_configs/llm_api_args/trtllm-1.2.1.yaml).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

How = Literal["checkpoint", "runtime-parameter", "applied", "refused"]
# The runtimes a backend's model runs in (trtpipe.toolchain.BackendFacts.runtime, which
# tests/reference/test_model_semantics.py holds this to: a new runtime needs its column; a new backend on one of
# these needs none). Named here, not imported: the reference runtime loads this module in the server, and the
# toolchain tables (YAML) have no business there.
RUNTIMES = ("tensorrt-engine", "pytorch-llm-api", "reference")
# Rope scalings the reference runtime computes (trtpipe.reference.runtime.rope_inverse_frequencies).
REFERENCE_ROPE_TYPES = ("default", "linear", "llama3")
# What TensorRT-LLM carries as rotary_scaling (tensorrt_llm/functional.py RotaryScalingType: none, linear, dynamic,
# longrope, llama3, yarn, mrope; read at the code index's copy, not at the 1.2.1 tag).
TRTLLM_ROPE_TYPES = ("default", "linear", "dynamic", "longrope", "llama3", "yarn")
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# The reference engine's config.json key for the tokenizer's vocabulary, written when the checkpoint pads beyond it.
TOKEN_VOCAB_KEY = "trtpipe_token_vocab_size"


class Handling(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    how: How
    where: str  # the checkpoint field, the runtime parameter, or why it is refused


class SemanticField(BaseModel):
    """One config.json field that changes what the model computes, and how each runtime keeps it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    meaning: str
    handling: dict[str, Handling]


TABLE: tuple[SemanticField, ...] = (
    SemanticField(
        field="sliding_window",
        meaning="each query attends to at most this many keys, itself included (per layer: layer_types, "
                "use_sliding_window / max_window_layers)",
        handling={
            "tensorrt-engine": Handling(how="runtime-parameter",
                                        where="tensorrt_llm config.pbtxt max_attention_window_size (per-layer list)"),
            "pytorch-llm-api": Handling(how="runtime-parameter", where="llm_args kv_cache_config.max_attention_window"),
            "reference": Handling(how="applied", where="trtpipe.reference.runtime masks keys outside the window"),
        }),
    SemanticField(
        field="rope_scaling",
        meaning="how rotary position frequencies are scaled for long contexts (rope_type and its parameters)",
        handling={
            "tensorrt-engine": Handling(how="checkpoint", where="checkpoint config rotary_scaling"),
            "pytorch-llm-api": Handling(how="checkpoint", where="the HF config.json the PyTorch backend reads"),
            "reference": Handling(how="applied", where=f"rope types {', '.join(REFERENCE_ROPE_TYPES)}"),
        }),
    SemanticField(
        field="head_dim",
        meaning="width of one attention head, when it is not hidden_size / num_attention_heads",
        handling={name: Handling(how="checkpoint", where="checkpoint config head_size") for name in RUNTIMES}),
    SemanticField(
        field="tie_word_embeddings",
        meaning="the output head is the input embedding",
        handling={name: Handling(how="checkpoint", where="lm_head tensor (a copy of the embedding)")
                  for name in RUNTIMES}),
    SemanticField(
        field="attention_bias",
        meaning="q/k/v projections carry a bias (always on Qwen2)",
        handling={name: Handling(how="checkpoint", where="attention.qkv.bias tensors") for name in RUNTIMES}),
    SemanticField(
        field="vocab_size",
        meaning="the tokenizer's ids; a checkpoint may pad its embedding and head beyond them (ModelOpt pads to a "
                "multiple of 64 for INT4-AWQ), and a padded id is no token",
        handling={
            "tensorrt-engine": Handling(how="runtime-parameter",
                                        where="preprocessing bans the padded ids (bad words); trtpipe.json records both"),
            "pytorch-llm-api": Handling(how="checkpoint", where="the HF export keeps the tokenizer's vocabulary"),
            "reference": Handling(how="applied", where="the sampler never returns an id >= vocab_size"),
        }),
    SemanticField(
        field="layer_types",
        meaning="the attention kind of each layer",
        handling={name: Handling(how="applied", where=f"kinds {', '.join(ATTENTION_LAYER_TYPES)}, as "
                                 "sliding_window says; any other kind is refused") for name in RUNTIMES}),
)


class Refusal(BaseModel):
    field: str
    message: str
    fix: str


def _rope_type(config: dict[str, Any]) -> str | None:
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict):
        return None
    return str(scaling.get("rope_type", scaling.get("type", "default"))).lower()


def layer_windows(config: dict[str, Any]) -> list[int | None]:
    """Per layer, the model's attention window (None: full attention), as transformers 4.57 reads config.json."""
    layers = int(config["num_hidden_layers"])
    window = config.get("sliding_window")
    model_type = config.get("model_type")
    if model_type == "qwen2" and not config.get("use_sliding_window", False):
        window = None  # Qwen2Config keeps sliding_window only when use_sliding_window
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return [None] * layers
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == layers:
        return [window if kind == "sliding_attention" else None for kind in kinds]
    if model_type == "qwen2":
        first_full = int(config.get("max_window_layers", layers))
        return [window if index >= first_full else None for index in range(layers)]
    return [window] * layers


def attention_windows(config: dict[str, Any], max_seq_len: int) -> list[int] | None:
    """The per-layer attention windows a runtime must be given for `max_seq_len`, or None when no window is shorter
    than max_seq_len (full attention everywhere is then exact)."""
    windows = [max_seq_len if w is None else min(w, max_seq_len) for w in layer_windows(config)]
    return windows if any(w < max_seq_len for w in windows) else None


def window_parameter(config: dict[str, Any], max_seq_len: int) -> str:
    """tensorrt_llm's max_attention_window_size value: the per-layer windows (a comma list; the C++ backend refuses
    an empty one), max_seq_len when the model has no shorter window."""
    windows = attention_windows(config, max_seq_len)
    if windows is None:
        return str(max_seq_len)
    if len(set(windows)) == 1:
        return str(windows[0])
    return ",".join(str(w) for w in windows)


def token_vocab_size(config: dict[str, Any]) -> int:
    """The ids the model's tokenizer has: the HF config's vocab_size (a padded checkpoint holds more rows)."""
    return int(config["vocab_size"])


def refusals(config: dict[str, Any], runtime: str, *, on_cpu: bool) -> list[Refusal]:
    """The fields of `config` the `runtime` (one of RUNTIMES) cannot honour (`on_cpu`: the target is cpu-reference,
    where the reference runtime serves what any backend builds)."""
    out: list[Refusal] = []
    rope = _rope_type(config)
    if rope is not None:
        reference_runtime = on_cpu or runtime == "reference"
        known = REFERENCE_ROPE_TYPES if reference_runtime else TRTLLM_ROPE_TYPES
        if rope not in known:
            where = "the cpu-reference runtime" if reference_runtime else "TensorRT-LLM"
            out.append(Refusal(field="rope_scaling", message=f"rope_type {rope!r} is not computed by {where} "
                               f"(it computes {', '.join(known)}), so the served model would not be this one",
                               fix="use a model with a supported rope scaling, or another target"))
    kinds = config.get("layer_types")
    if isinstance(kinds, list):
        odd = sorted({str(k) for k in kinds if k not in ATTENTION_LAYER_TYPES})
        if odd:
            out.append(Refusal(field="layer_types", message=f"layer kinds {', '.join(odd)} have no equivalent in "
                               "trtpipe's converter and runtimes", fix="use a model whose layers are "
                               f"{' or '.join(ATTENTION_LAYER_TYPES)}"))
    return out


def describe_windows(config: dict[str, Any], max_seq_len: int) -> str | None:
    """One line for plans and summaries, or None without a window."""
    windows = attention_windows(config, max_seq_len)
    if windows is None:
        return None
    sliding = sum(1 for w in windows if w < max_seq_len)
    return (f"sliding attention window {min(windows)} on {sliding} of {len(windows)} layers "
            f"(max_attention_window_size {window_parameter(config, max_seq_len)})")
