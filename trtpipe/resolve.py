"""Resolve a loaded spec against the toolchain table, the GPU catalog and the model's config.json.

Every cross-field rule lives here and fails with a SpecError citing the YAML position of the field
to change. Nothing here touches a GPU, TensorRT or the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from trtpipe.errors import TrtpipeError
from trtpipe.gpu import FP8_MIN_SM, NVFP4_MIN_SM, GpuInfo, UnknownGpu, get_gpu, load_catalog
from trtpipe.spec import BuildSpec, Executor, KvCacheDtype, QuantAlgo
from trtpipe.spec_loader import LoadedSpec
from trtpipe.toolchain import Toolchain, UnknownToolchain, get_toolchain

REQUIRED_CONFIG_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

FALSY_PLUGIN_VALUES = (False, None, "disable", "disabled", "false", "off", "no", "none")


def plugin_disabled(value: Any) -> bool:
    return value in FALSY_PLUGIN_VALUES or (isinstance(value, str) and value.lower() in FALSY_PLUGIN_VALUES)


def plugin_enabled(value: Any) -> bool:
    return not plugin_disabled(value)


@dataclass
class ResolvedSpec:
    """A spec with its toolchain, target GPU and model config looked up and every cross-field rule checked.

    A dataclass, not a pydantic model: the interface name `model_config` (the HF config.json) is reserved
    on pydantic models.
    """

    spec: BuildSpec
    spec_path: Path
    toolchain: Toolchain
    gpu: GpuInfo | None  # None for cpu-reference
    model_config: dict[str, Any]  # the HF config.json
    model_dir: Path | None  # local HF folder with the weights; None when resolved for planning only
    tokenizer_dir: Path | None
    config_path: Path  # the config.json that was read
    weights_needed: bool = True  # False when resolved for planning only
    loaded: LoadedSpec | None = field(default=None, repr=False)  # for positioned errors downstream

    @property
    def is_cpu_reference(self) -> bool:
        return self.gpu is None

    @property
    def sm(self) -> int | None:
        return self.gpu.sm if self.gpu else None

    @property
    def weight_dtype(self) -> str:
        """The model's compute dtype: float16 or bfloat16 (auto follows config.json; float32 becomes float16)."""
        return resolve_dtype(self.spec, self.model_config)

    @property
    def kv_cache_dtype(self) -> str:
        """float16, bfloat16, fp8 or int8 (auto follows the weight dtype)."""
        return resolve_kv_dtype(self.spec, self.weight_dtype)

    def error(self, field_path: tuple[str | int, ...], message: str, fix: str | None = None) -> TrtpipeError:
        """A positioned SpecError when the YAML is known, else a plain TrtpipeError (for specs built in code)."""
        if self.loaded is not None:
            return self.loaded.error(field_path, message, fix)
        return TrtpipeError(f"{'.'.join(map(str, field_path))}: {message}", fix=fix, exit_code=2)


def resolve_dtype(spec: BuildSpec, config: dict[str, Any]) -> str:
    if spec.model.dtype.value != "auto":
        return spec.model.dtype.value
    declared = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    return "bfloat16" if declared == "bfloat16" else "float16"


def resolve_kv_dtype(spec: BuildSpec, weight_dtype: str) -> str:
    kv = spec.quantization.kv_cache
    return {
        KvCacheDtype.auto: weight_dtype,
        KvCacheDtype.fp16: "float16",
        KvCacheDtype.bf16: "bfloat16",
        KvCacheDtype.fp8: "fp8",
        KvCacheDtype.int8: "int8",
    }[kv]


def head_counts(config: dict[str, Any]) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim) from an HF config.json."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return heads, kv_heads, head_dim


# ---------------------------------------------------------------------------------------------- model


def _read_config(loaded: LoadedSpec, field_path: tuple[str, ...], config_path: Path) -> dict[str, Any]:
    if not config_path.is_file():
        raise loaded.error(field_path, f"{config_path} does not exist", "give the HF model folder's config.json")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise loaded.error(field_path, f"{config_path} is not valid JSON ({exc})", "restore the model's config.json")
    if not isinstance(config, dict):
        raise loaded.error(field_path, f"{config_path} is not a JSON object", "restore the model's config.json")
    # multimodal wrappers keep the language model's fields in text_config
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    missing = [key for key in REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise loaded.error(
            field_path,
            f"{config_path} lacks {', '.join(missing)}: not a decoder LLM config trtpipe can plan",
            "point at a Llama/Mistral/Qwen2-style config.json",
        )
    return config


def _hf_cache_snapshot(repo_id: str, revision: str) -> Path | None:
    """The local HF cache folder of repo_id@revision, without touching the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:  # not cached (or huggingface_hub missing): the caller says what to do
        return None


def _resolve_model(loaded: LoadedSpec, need_weights: bool) -> tuple[Path | None, Path | None, Path, dict[str, Any]]:
    """(model_dir, tokenizer_dir, config_path, config)."""
    model = loaded.spec.model
    if model.path is not None and model.config is not None:
        raise loaded.error(
            ("model", "config"),
            "`config` is for planning when the weights are not at hand, but `path` is given",
            "remove model.config (the config.json in model.path is used)",
        )
    model_dir: Path | None = None
    config_path: Path
    config_field: tuple[str, ...]
    if model.path is not None:
        if not model.path.exists():
            raise loaded.error(("model", "path"), f"{model.path} does not exist", "give a local HF model folder")
        if not model.path.is_dir():
            raise loaded.error(("model", "path"), f"{model.path} is not a folder", "give the HF model folder")
        model_dir = model.path
        config_path, config_field = model.path / "config.json", ("model", "path")
        if not config_path.is_file():
            raise loaded.error(
                config_field, f"{model.path} has no config.json", "give the folder of a Hugging Face model"
            )
    elif model.repo_id is not None:
        assert model.revision is not None  # the spec requires it
        snapshot = _hf_cache_snapshot(model.repo_id, model.revision)
        if snapshot is not None:
            model_dir = snapshot
        if model.config is not None:
            config_path, config_field = model.config, ("model", "config")
        elif snapshot is not None:
            config_path, config_field = snapshot / "config.json", ("model", "repo_id")
        else:
            raise loaded.error(
                ("model", "repo_id"),
                f"{model.repo_id}@{model.revision[:12]} is not in the local Hugging Face cache",
                f"run `hf download {model.repo_id} --revision {model.revision}` first, "
                "or add model.config to plan offline",
            )
        if need_weights and snapshot is None:
            raise loaded.error(
                ("model", "repo_id"),
                f"{model.repo_id}@{model.revision[:12]} weights are not in the local Hugging Face cache",
                f"run `hf download {model.repo_id} --revision {model.revision}` or set model.path",
            )
    else:
        assert model.config is not None
        config_path, config_field = model.config, ("model", "config")
        if need_weights:
            raise loaded.error(
                ("model", "config"),
                "this spec gives only a config.json (planning only), so there are no weights to build from",
                "set model.path to a local HF folder or model.repo_id + revision",
            )
    config = _read_config(loaded, config_field, config_path)

    if need_weights and model_dir is not None:
        safetensors = list(model_dir.glob("*.safetensors"))
        pickled = [p for pattern in ("*.bin", "*.pt", "*.pth") for p in model_dir.glob(pattern)]
        weights_field = ("model", "path") if model.path is not None else ("model", "repo_id")
        if not safetensors and not pickled:
            raise loaded.error(weights_field, f"{model_dir} has no *.safetensors weights", "download the model's weights")
        if not safetensors and not model.allow_pickle:
            raise loaded.error(
                weights_field,
                f"{model_dir} has only pickle weights ({pickled[0].name}); pickle can run code when loaded",
                "convert them to safetensors, or set model.allow_pickle: true if you trust the source",
            )

    tokenizer_dir: Path | None = None
    if model.tokenizer is not None:
        if not model.tokenizer.is_dir() or not any((model.tokenizer / f).exists() for f in TOKENIZER_FILES):
            raise loaded.error(
                ("model", "tokenizer"),
                f"{model.tokenizer} is not a tokenizer folder (no {'/'.join(TOKENIZER_FILES)})",
                "point at the folder holding tokenizer.json or tokenizer.model",
            )
        tokenizer_dir = model.tokenizer
    elif model_dir is not None and any((model_dir / f).exists() for f in TOKENIZER_FILES):
        tokenizer_dir = model_dir
    return model_dir, tokenizer_dir, config_path, config


# ---------------------------------------------------------------------------------------------- rules


def _check_target(loaded: LoadedSpec, toolchain: Toolchain) -> GpuInfo | None:
    spec = loaded.spec
    if spec.target.is_cpu_reference:
        if spec.target.executor not in (Executor.auto, Executor.reference):
            raise loaded.error(
                ("target", "executor"),
                f"executor {spec.target.executor.value!r} builds TensorRT engines, but the target is cpu-reference",
                "use executor: reference (or auto), or target a GPU",
            )
        return None
    if spec.target.executor == Executor.reference:
        raise loaded.error(
            ("target", "executor"),
            "the reference executor only builds for target cpu-reference",
            "set target.gpu: cpu-reference, or executor: auto/local/docker",
        )
    try:
        gpu = get_gpu(spec.target.gpu, load_catalog())
    except UnknownGpu as exc:
        raise loaded.error(("target", "gpu"), exc.message, exc.fix) from None
    if not toolchain.supports_sm(gpu.sm):
        raise loaded.error(
            ("target", "gpu"),
            f"{gpu.name} is {gpu.sm_label}, outside {toolchain.name}'s supported range "
            f"SM{toolchain.sm_min}..SM{toolchain.sm_max}",
            "pick another toolchain (build_configs/toolchains.yaml) or another GPU",
        )
    return gpu


def _alternatives_below_fp8(gpu: GpuInfo) -> str:
    return (
        f"on {gpu.name} ({gpu.sm_label}) use quantization.algo int4_awq, int8_sq or none (fp16/bf16), "
        "or target an FP8-capable GPU (l40s, h100-sxm, h200, b200)"
    )


def _check_quantization(loaded: LoadedSpec, gpu: GpuInfo | None) -> None:
    spec = loaded.spec
    quant = spec.quantization
    if gpu is None:
        return  # cpu-reference: every recipe is allowed (it validates checkpoints)
    algo = quant.algo
    if algo in (QuantAlgo.fp8, QuantAlgo.w4a8_awq) and gpu.sm < FP8_MIN_SM:
        raise loaded.error(
            ("quantization", "algo"),
            f"{algo.value} needs FP8 tensor cores (SM{FP8_MIN_SM} or newer), but {gpu.name} is {gpu.sm_label}",
            _alternatives_below_fp8(gpu),
        )
    if algo == QuantAlgo.nvfp4 and gpu.sm < NVFP4_MIN_SM:
        raise loaded.error(
            ("quantization", "algo"),
            f"nvfp4 needs FP4 tensor cores (SM{NVFP4_MIN_SM}, Blackwell), but {gpu.name} is {gpu.sm_label}",
            "use fp8 (SM89+) or int4_awq, or target b200",
        )
    if quant.kv_cache == KvCacheDtype.fp8 and gpu.sm < FP8_MIN_SM:
        raise loaded.error(
            ("quantization", "kv_cache"),
            f"an FP8 KV cache needs SM{FP8_MIN_SM} or newer, but {gpu.name} is {gpu.sm_label}",
            f"use kv_cache: auto on {gpu.name}, or target l40s, h100-sxm, h200 or b200",
        )


def _check_engine(loaded: LoadedSpec, config: dict[str, Any], gpu: GpuInfo | None, toolchain: Toolchain) -> None:
    spec = loaded.spec
    engine, triton, target = spec.engine, spec.triton, spec.target
    if engine.max_num_tokens is not None and engine.max_num_tokens < engine.max_input_len:
        if not triton.enable_chunked_context:
            raise loaded.error(
                ("engine", "max_num_tokens"),
                f"max_num_tokens {engine.max_num_tokens} < max_input_len {engine.max_input_len}: "
                "a full prompt could not be processed in one step",
                f"raise max_num_tokens to at least {engine.max_input_len}, or set triton.enable_chunked_context: true",
            )
    if triton.max_batch_size is not None and triton.max_batch_size > engine.max_batch_size:
        raise loaded.error(
            ("triton", "max_batch_size"),
            f"{triton.max_batch_size} exceeds the engine's max_batch_size {engine.max_batch_size}",
            f"lower it to at most {engine.max_batch_size} or raise engine.max_batch_size",
        )
    max_positions = config.get("max_position_embeddings")
    if isinstance(max_positions, int) and engine.max_seq_len > max_positions and not config.get("rope_scaling"):
        raise loaded.error(
            ("engine", "max_seq_len"),
            f"{engine.max_seq_len} exceeds the model's max_position_embeddings {max_positions}",
            f"lower max_seq_len to at most {max_positions}",
        )

    plugins = engine.plugins
    _check_trtllm_build_rules(loaded, config, gpu, toolchain)
    if "use_paged_context_fmha" in plugins and plugin_disabled(plugins["use_paged_context_fmha"]):
        for flag in ("enable_chunked_context", "enable_kv_cache_reuse"):
            if getattr(triton, flag):
                raise loaded.error(
                    ("engine", "plugins", "use_paged_context_fmha"),
                    f"triton.{flag} needs the engine built with use_paged_context_fmha",
                    f"remove this override or set triton.{flag}: false",
                )

    heads, kv_heads, _ = head_counts(config)
    tp = target.tp
    if heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
        raise loaded.error(
            ("target", "tp"),
            f"the model's {heads} attention heads do not split evenly over tp={tp}",
            f"use a tp that divides {heads}: {', '.join(map(str, divisors[:8]))}",
        )
    if kv_heads % tp and tp % kv_heads:
        raise loaded.error(
            ("target", "tp"),
            f"the model's {kv_heads} KV heads neither split over tp={tp} nor replicate evenly",
            f"use a tp that divides {kv_heads} or is a multiple of it",
        )
    layers = int(config["num_hidden_layers"])
    if target.pp > layers:
        raise loaded.error(
            ("target", "pp"),
            f"pp={target.pp} exceeds the model's {layers} layers",
            f"use pp of at most {layers}",
        )
    quant = spec.quantization
    if quant.algo in (QuantAlgo.int4_awq, QuantAlgo.w4a8_awq):
        hidden = int(config["hidden_size"])
        inter = int(config.get("intermediate_size") or 4 * hidden)
        for what, size in (("hidden_size", hidden), ("intermediate_size / tp", inter // tp)):
            if size % quant.group_size:
                raise loaded.error(
                    ("quantization", "group_size"),
                    f"the model's {what} ({size}) is not a multiple of group_size {quant.group_size}",
                    "use group_size 64 or 32, or a smaller tp",
                )


def _check_trtllm_build_rules(
    loaded: LoadedSpec, config: dict[str, Any], gpu: GpuInfo | None, toolchain: Toolchain
) -> None:
    """The pinned trtllm-build's rules a spec alone decides (stage `spec` in rules.yaml, read, not restated)."""
    from trtpipe.engine.rules import TRTLLM_KV_CACHE_QUANT_ALGO, TRTLLM_QUANT_ALGO, BuildFacts, check_spec_settings

    spec = loaded.spec
    archs = config.get("architectures") or []
    facts = BuildFacts(
        quant_algo=TRTLLM_QUANT_ALGO.get(spec.quantization.algo.value),
        kv_cache_quant_algo=TRTLLM_KV_CACHE_QUANT_ALGO.get(spec.quantization.kv_cache.value),
        architecture=archs[0] if archs else None,
        tp_size=spec.target.tp,
        sm=gpu.sm if gpu is not None else None,
    )
    plugins = spec.engine.plugins
    for finding in check_spec_settings(toolchain.name, plugins, facts):
        keys = [key for key in plugins if key in finding.flags or key in finding.changes
                or (key == "paged_kv_cache" and "kv_cache_type" in finding.flags)]
        if keys:
            where: tuple[str, ...] = ("engine", "plugins", keys[0])
            fix = f"remove engine.plugins.{keys[0]}"
        elif facts.quant_algo is not None and "quant_algo" in finding.flags:
            where, fix = ("quantization", "algo"), "pick a quantization this GPU's TensorRT-LLM build supports"
        elif "quant_algo" in finding.flags:
            where, fix = ("quantization", "kv_cache"), "use kv_cache: auto or fp8 on this GPU"
        else:
            where, fix = ("engine", "plugins"), "change engine.plugins"
        raise loaded.error(where, finding.message, fix)


def resolve(loaded: LoadedSpec, *, need_weights: bool = True) -> ResolvedSpec:
    """Look up the toolchain, target GPU and model config; apply every cross-field rule.

    `need_weights=False` is for planning: a `model.config` (config.json only) is then enough.
    """
    spec = loaded.spec
    try:
        toolchain = get_toolchain(spec.toolchain)
    except UnknownToolchain as exc:
        raise loaded.error(("toolchain",), exc.message, exc.fix) from None
    gpu = _check_target(loaded, toolchain)
    _check_quantization(loaded, gpu)
    model_dir, tokenizer_dir, config_path, config = _resolve_model(loaded, need_weights)
    _check_engine(loaded, config, gpu, toolchain)
    return ResolvedSpec(
        spec=spec,
        spec_path=loaded.path,
        toolchain=toolchain,
        gpu=gpu,
        model_config=config,
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        config_path=config_path,
        weights_needed=need_weights,
        loaded=loaded,
    )
