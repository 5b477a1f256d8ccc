"""Resolve a loaded spec against the toolchain table, the GPU catalog, the quantization table and the
model's config.json, and apply every cross-field rule: one rules pass.

Every rule a spec alone decides lives here (or, where it is a table, is read from here): the target,
the backend the toolchain offers, the quantization a GPU and the pinned converter can do, the model's
shape against tp/pp and the AWQ group size, the complete trtllm-build configuration with the pinned
trtllm-build's own rules (trtpipe.trtllm_build.config), the serving options, and the names release
will use. Each fails with a SpecError citing the YAML position of the field to change. If `spec-check`
accepts a spec, no later stage refuses it for a reason this module could have known. Nothing here
touches a GPU, TensorRT or the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpipe import model_semantics, quant
from trtpipe.config_json import read_model_config
from trtpipe.errors import InvalidInput
from trtpipe.gpu import GpuInfo, UnknownGpu, get_gpu, load_catalog
from trtpipe.llm_api.derive import LlmApiPlan, LlmApiRuleViolation, derive_llm_args
from trtpipe.model_folder import (
    SERVING_TOKENIZER_FILE,
    TOKENIZER_MARKERS,
    check_tokenizer,
    escapes,
    folder_roots,
    resolves_inside,
    shard_problems,
)
from trtpipe.names import name_fix, name_problem
from trtpipe.shipped import configs_dir
from trtpipe.spec import BuildSpec, Executor
from trtpipe.spec_loader import LoadedSpec
from trtpipe.toolchain import (
    BACKEND_KINDS,
    Backend,
    Toolchain,
    UnknownToolchain,
    backend_facts,
    get_toolchain,
    load_toolchains,
    newest_toolchain,
    version_tuple,
)
from trtpipe.trtllm_build.config import EngineConfig, RuleViolation, derive_engine_config
from trtpipe.versions import versions_match

# HF architecture -> the decoder layout trtpipe's converter exports it as (trtpipe.checkpoint.convert).
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


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
    loaded: LoadedSpec | None = field(default=None, repr=False)  # for positioned errors downstream
    backend: Backend | None = None  # the toolchain's backend that builds it
    llm_api: LlmApiPlan | None = None  # backend llm-api: the LLM() arguments the spec implies
    # The build_configs/ folder its tables were read from (the caller's TRTPIPE_BUILD_CONFIGS, else the shipped
    # one): every later table read for this build (flag contracts, rules, LLM-API args, serving tables) uses it.
    configs: Path = field(default_factory=lambda: configs_dir(None))
    # The trtllm-build configuration resolve derived while checking, with what it was derived from (not an init
    # field: a copy made with dataclasses.replace, e.g. with another toolchain, derives its own).
    _engine_config: tuple[tuple[str, str, str], EngineConfig] | None = field(default=None, init=False, repr=False,
                                                                          compare=False)

    def _engine_inputs(self) -> tuple[str, str, str]:
        # The spec is a mutable model (tests set a field after resolving): the cache holds only for the same one.
        return self.spec.model_dump_json(), self.toolchain.name, self.gpu.name if self.gpu is not None else "-"

    def engine_config(self) -> EngineConfig:
        """The complete trtllm-build configuration (trtpipe.trtllm_build.config), derived once for a resolution
        (resolve's check, the build plan and the memory plan share it); raises RuleViolation for a spec that
        no longer follows the rules."""
        inputs = self._engine_inputs()
        if self._engine_config is None or self._engine_config[0] != inputs:
            config = derive_engine_config(self.spec, self.toolchain, self.gpu, self.model_config or {},
                                          configs=self.configs)
            self._engine_config = (inputs, config)
        return self._engine_config[1]

    @property
    def notes(self) -> list[str]:
        """What a build and spec-check say about the spec beside its facts: the earlier shape it is written in
        (trtpipe.spec_shape), and the LLM-API plan's notes."""
        shape = [self.loaded.shape_note] if self.loaded is not None and self.loaded.shape_note else []
        return shape + (list(self.llm_api.notes) if self.llm_api is not None else [])

    @property
    def backend_kind(self) -> str:
        return self.backend.kind if self.backend is not None else self.spec.backend_kind

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
        return quant.kv_dtype(self.spec.quantization.kv_cache, self.weight_dtype)

    def error(self, field_path: tuple[str | int, ...], message: str, fix: str | None = None) -> InvalidInput:
        """A positioned SpecError when the YAML is known, else an InvalidInput naming the field (specs built in code)."""
        if self.loaded is not None:
            return self.loaded.error(field_path, message, fix)
        return InvalidInput(f"{'.'.join(map(str, field_path))}: {message}", fix=fix)


def resolve_dtype(spec: BuildSpec, config: dict[str, Any]) -> str:
    if spec.model.dtype.value != "auto":
        return spec.model.dtype.value
    declared = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    return "bfloat16" if declared == "bfloat16" else "float16"


def head_counts(config: dict[str, Any]) -> tuple[int, int, int]:
    """(attention heads, KV heads, head_dim) from an HF config.json."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return heads, kv_heads, head_dim


def intermediate_size(config: dict[str, Any]) -> int:
    return int(config.get("intermediate_size") or 4 * int(config["hidden_size"]))


def gemm_input_widths(config: dict[str, Any], tp: int) -> dict[str, int]:
    """Per-rank input width of every quantized GEMM: what an AWQ group must divide."""
    heads, _, head_dim = head_counts(config)
    hidden, inter = int(config["hidden_size"]), intermediate_size(config)
    return {
        "attention.qkv (hidden_size)": hidden,
        "mlp.fc/mlp.gate (hidden_size)": hidden,
        f"attention.dense (heads*head_dim/tp = {heads}*{head_dim}/{tp})": heads * head_dim // tp,
        f"mlp.proj (intermediate_size/tp = {inter}/{tp})": inter // tp,
    }


def converter_supports(toolchain: Toolchain) -> bool:
    """Whether trtpipe's converter is written for the toolchain's ModelOpt and transformers pins."""
    modelopt, transformers = toolchain.modelopt_version, toolchain.transformers_version
    return bool(modelopt and transformers and versions_match(str(modelopt), quant.CONVERTER_MODELOPT)
                and version_tuple(str(transformers))[:2] >= quant.CONVERTER_MIN_TRANSFORMERS)


# ---------------------------------------------------------------------------------------------- model


def _read_config(loaded: LoadedSpec, field_path: tuple[str, ...], config_path: Path) -> dict[str, Any]:
    """The model's config.json, read and checked against sane bounds (trtpipe.config_json: the one check plan,
    convert and the reference runtime share), cited at the spec field that named it."""
    if not config_path.is_file():
        raise loaded.error(field_path, f"{config_path} does not exist", "give the HF model folder's config.json")
    try:
        return read_model_config(config_path)
    except InvalidInput as exc:
        raise loaded.error(field_path, exc.message, exc.fix) from None


def _hf_cache_snapshot(repo_id: str, revision: str) -> Path | None:
    """The local HF cache folder of repo_id@revision, without touching the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:  # not cached (or huggingface_hub missing): the caller says what to do
        return None


def _resolve_model(
    loaded: LoadedSpec, need_weights: bool
) -> tuple[Path | None, Path | None, Path, tuple[str, ...], dict[str, Any]]:
    """(model_dir, tokenizer_dir, config_path, the spec field that named config.json, config)."""
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
    weights_field = ("model", "path") if model.path is not None else ("model", "repo_id")
    if model_dir is not None and config_path.parent == model_dir and not model.allow_external_links:
        for escape in escapes(model_dir, ["config.json"]):  # before a byte of it is read
            raise loaded.error(weights_field, escape.describe("model folder"), _LINK_FIX)
    config = _read_config(loaded, config_field, config_path)

    if need_weights and model_dir is not None:
        safetensors = list(model_dir.glob("*.safetensors"))
        pickled = [p for pattern in ("*.bin", "*.pt", "*.pth") for p in model_dir.glob(pattern)]
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
        if not model.tokenizer.is_dir() or not any((model.tokenizer / f).exists() for f in TOKENIZER_MARKERS):
            raise loaded.error(
                ("model", "tokenizer"),
                f"{model.tokenizer} is not a tokenizer folder (no {'/'.join(TOKENIZER_MARKERS)})",
                "point at the folder holding tokenizer.json",
            )
        tokenizer_dir = model.tokenizer
    elif model_dir is not None and any((model_dir / f).exists() for f in TOKENIZER_MARKERS):
        tokenizer_dir = model_dir
    if need_weights and model_dir is not None:
        # Conversion calibrates with the tokenizer; the published repository's models read tokenizer.json.
        where = ("model", "tokenizer") if model.tokenizer is not None else weights_field
        folder = tokenizer_dir or model_dir
        if not (folder / SERVING_TOKENIZER_FILE).is_file() and not _is_link_out(loaded, folder / SERVING_TOKENIZER_FILE):
            raise loaded.error(
                where, f"{folder} has no tokenizer ({SERVING_TOKENIZER_FILE}), which calibration and the "
                "published repository's models read",
                "copy the model's tokenizer files there (tokenizer.save_pretrained writes them), or set "
                "model.tokenizer to a folder holding tokenizer.json",
            )
    if model_dir is not None and (need_weights or config_path.parent == model_dir):
        _check_model_files(loaded, model_dir, tokenizer_dir, weights_field, need_weights)
    if need_weights and model_dir is not None:
        where = ("model", "tokenizer") if model.tokenizer is not None else weights_field
        try:
            check_tokenizer(tokenizer_dir or model_dir)
        except InvalidInput as exc:
            raise loaded.error(where, exc.message, exc.fix) from None
    return model_dir, tokenizer_dir, config_path, config_field, config


_LINK_FIX = ("copy the file into the folder, or set model.allow_external_links: true in the spec if you trust "
             "where it points")


def _is_link_out(loaded: LoadedSpec, path: Path) -> bool:
    """A symlink (maybe dangling) that the confinement check below will name: let it speak first."""
    return path.is_symlink() and not loaded.spec.model.allow_external_links


def _check_model_files(loaded: LoadedSpec, model_dir: Path, tokenizer_dir: Path | None,
                       weights_field: tuple[str, ...], need_weights: bool) -> None:
    """The model folder is a boundary (trtpipe.model_folder): the files read from it - config.json when planning;
    every top-level file, the shards its weight index names, the tokenizer folder's files and a calibration file
    written inside the folder when building - must resolve inside it, unless model.allow_external_links."""
    model = loaded.spec.model
    external_ok = model.allow_external_links
    if need_weights:
        for problem in shard_problems(model_dir):
            raise loaded.error(weights_field, problem, "restore the model's index file (shards are files of the folder)")
    if external_ok:
        return
    for escape in escapes(model_dir, None if need_weights else ["config.json"]):
        raise loaded.error(weights_field, escape.describe("model folder"), _LINK_FIX)
    if not need_weights:
        return
    if tokenizer_dir is not None and tokenizer_dir != model_dir:
        for escape in escapes(tokenizer_dir):
            raise loaded.error(("model", "tokenizer"), escape.describe("tokenizer folder"), _LINK_FIX)
    dataset_field = ("quantization", "calibration", "dataset")
    dataset = loaded.written_paths.get(dataset_field)
    folders = {model_dir, loaded.written_paths.get(("model", "path"), model_dir)}
    if dataset is not None and any(f == dataset.parent or f in dataset.parents for f in folders):
        if resolves_inside(dataset, folder_roots(model_dir)) is None:
            raise loaded.error(dataset_field, f"{dataset} is in the model folder but resolves to "
                               f"{dataset.resolve()}, outside it", _LINK_FIX)


# ---------------------------------------------------------------------------------------------- rules


def _backends_for(target: str) -> str:
    """The backends that build for a `target` ("gpu" or "cpu"), as a spec would name them."""
    return " or ".join(kind for kind in BACKEND_KINDS if backend_facts(kind).runs_on in (target, "any"))


def _check_toolchain(loaded: LoadedSpec, configs: Path) -> tuple[Toolchain, Backend]:
    """The pinned toolchain, the backend of it that builds the spec, and a converter written for its pins."""
    spec = loaded.spec
    try:
        toolchain = get_toolchain(spec.toolchain, configs=configs)
    except UnknownToolchain as exc:
        raise loaded.error(("toolchain",), exc.message, exc.fix) from None
    if toolchain.preview is not None and not spec.allow_preview:
        raise loaded.error(
            ("toolchain",), f"{toolchain.name} is a preview line: {toolchain.preview}",
            f"set allow_preview: true to trial it knowingly, or use the stable {newest_toolchain(load_toolchains(configs=configs)).name}")
    kind = spec.backend_kind
    backend = toolchain.backend(kind)
    if backend is None:
        offered = ", ".join(b.kind for b in toolchain.backends) or "none"
        where = ("backend", "kind") if loaded.position(("backend", "kind")) is not None else ("toolchain",)
        removed = toolchain.removed_backends.get(kind)
        if removed:
            raise loaded.error(
                where, f"toolchain {toolchain.name} has no {kind} backend: {removed}",
                "set backend: llm-api (the same spec through TensorRT-LLM's PyTorch backend), or pick a toolchain "
                "up to trtllm-1.2.1")
        raise loaded.error(
            where,
            f"toolchain {toolchain.name} offers no {kind} backend (it offers: {offered})",
            "pick a backend it offers, or a toolchain that offers this one (build_configs/toolchains.yaml)",
        )
    runs_on = backend.facts.runs_on
    if runs_on == "cpu" and not spec.target.is_cpu_reference:
        raise loaded.error(("backend",), f"the {kind} backend runs on the CPU, but the target is {spec.target.gpu}",
                           f"set target.gpu: cpu-reference, or backend: {_backends_for('gpu')}")
    if runs_on == "gpu" and spec.target.is_cpu_reference:
        raise loaded.error(("backend",), f"the {kind} backend builds for a GPU, but the target is cpu-reference",
                           f"target a GPU, or use backend: {_backends_for('cpu')}")
    if toolchain.preview is not None and not spec.target.is_cpu_reference:
        raise loaded.error(
            ("target", "gpu"), f"the preview line {toolchain.name} builds for target cpu-reference only: no Triton "
            "container carries it and its pins are unknown, so a GPU host could neither convert with known versions "
            "nor serve it", f"set target.gpu: cpu-reference, or toolchain: {newest_toolchain(load_toolchains(configs=configs)).name}")
    if toolchain.preview is not None:
        # A preview line pins no ModelOpt: its artifact is exported here with trtpipe's converter pins, which the
        # key records as installed (trtpipe.stages.hf_checkpoint).
        return toolchain, backend
    # Every backend converts the checkpoint with trtpipe's converter, under the toolchain's pins (the
    # checkpoint key names them): a converter not written for them would be refused when it runs.
    modelopt, transformers = toolchain.modelopt_version, toolchain.transformers_version
    if not modelopt or not transformers:
        unpinned = " and ".join(n for n, v in (("nvidia-modelopt", modelopt), ("transformers", transformers)) if not v)
        raise loaded.error(
            ("toolchain",),
            f"toolchain {toolchain.name} pins no {unpinned} version, so the checkpoint key cannot name what "
            "its conversion would run with",
            "pin it in build_configs/toolchains.yaml (from the TensorRT-LLM release's requirements)",
        )
    if not converter_supports(toolchain):
        usable = [t.name for t in load_toolchains(configs=configs).values() if converter_supports(t)]
        raise loaded.error(
            ("toolchain",),
            f"toolchain {toolchain.name} converts with nvidia-modelopt {modelopt} and transformers {transformers}, "
            f"but trtpipe's converter is written for nvidia-modelopt {quant.CONVERTER_MODELOPT} with transformers >= "
            f"{'.'.join(map(str, quant.CONVERTER_MIN_TRANSFORMERS))}",
            f"use toolchain {' or '.join(usable)}" if usable else "pin a toolchain whose ModelOpt is 0.37",
        )
    return toolchain, backend


def _check_target(loaded: LoadedSpec, toolchain: Toolchain, configs: Path) -> GpuInfo | None:
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
        gpu = get_gpu(spec.target.gpu, load_catalog(configs=configs))
    except UnknownGpu as exc:
        raise loaded.error(("target", "gpu"), exc.message, exc.fix) from None
    if not toolchain.triton_container:
        # The published repository names the container that serves the engine (serving/validate refuses one
        # without), and the docker executor builds in it.
        raise loaded.error(
            ("toolchain",) if loaded.position(("toolchain",)) else ("target", "gpu"),
            f"toolchain {toolchain.name} pins no triton_container, the Triton container that serves (and, with the "
            "docker executor, builds) a GPU target's engine",
            "add the NGC image to build_configs/toolchains.yaml, or pick a toolchain that pins one",
        )
    if not toolchain.supports_sm(gpu.sm):
        raise loaded.error(
            ("target", "gpu"),
            f"{gpu.name} is {gpu.sm_label}, outside {toolchain.name}'s supported range "
            f"SM{toolchain.sm_min}..SM{toolchain.sm_max}",
            "pick another toolchain (build_configs/toolchains.yaml) or another GPU",
        )
    return gpu


def _gpus_with(precision: str, configs: Path) -> str:
    """'SM89 and newer: l4, l40s, ...' for the catalog GPUs whose tensor cores run `precision`."""
    having = sorted((g for g in load_catalog(configs=configs).values() if g.has_precision(precision)), key=lambda g: g.sm)
    if not having:
        return "no GPU in the catalog"
    return f"SM{having[0].sm} and newer in the catalog: {', '.join(g.name for g in having)}"


def _check_quantization(loaded: LoadedSpec, gpu: GpuInfo | None, configs: Path) -> None:
    """The format and KV cache against the GPU's tensor cores, and what the pinned converter can produce."""
    spec = loaded.spec
    q = spec.quantization
    fmt, kv = quant.FORMATS[q.algo], quant.KV_CACHES[q.kv_cache]
    if gpu is not None:
        if not gpu.has_precision(fmt.precision):
            runnable = [f.name for f in quant.FORMATS.values() if f.refused is None and gpu.has_precision(f.precision)]
            raise loaded.error(
                ("quantization", "algo"),
                f"{q.algo} needs {fmt.precision} tensor cores ({_gpus_with(str(fmt.precision), configs)}), but {gpu.name} "
                f"({gpu.sm_label}, {gpu.architecture}) has {', '.join(gpu.precisions)}",
                f"on {gpu.name} use quantization.algo {', '.join(runnable)}, or target a GPU with "
                f"{fmt.precision} tensor cores",
            )
        # Some backends' own hardware rules decide the KV cache (llm-api: trtpipe.llm_api.derive).
        if not gpu.has_precision(kv.precision) and backend_facts(spec.backend_kind).kv_cache_needs_catalog_precision:
            raise loaded.error(
                ("quantization", "kv_cache"),
                f"a {q.kv_cache} KV cache needs {kv.precision} tensor cores ({_gpus_with(str(kv.precision), configs)}), but "
                f"{gpu.name} is {gpu.sm_label}",
                f"use kv_cache: auto on {gpu.name}, or target a GPU with {kv.precision} tensor cores",
            )
    if fmt.refused:
        raise loaded.error(("quantization", "algo"), f"quantization.algo {q.algo}: {fmt.refused}",
                           f"{fmt.alternatives}; trtpipe never exports a different format silently")
    if kv.refused:
        raise loaded.error(("quantization", "kv_cache"), f"quantization.kv_cache {q.kv_cache}: {kv.refused}",
                           kv.alternatives)
    if kv.checkpoint_algo is not None and kv.name not in fmt.kv_caches:
        offered = [f.name for f in quant.FORMATS.values() if kv.name in f.kv_caches]
        raise loaded.error(
            ("quantization", "kv_cache"),
            f"quantization.kv_cache {kv.name} is offered on top of {', '.join(offered)}, not {q.algo}",
            f"set quantization.algo to one of {', '.join(offered)}, or kv_cache: auto",
        )
    dataset = q.calibration.dataset
    if dataset is not None and not dataset.is_file():
        raise loaded.error(
            ("quantization", "calibration", "dataset"),
            f"{dataset} does not exist" if not dataset.exists() else f"{dataset} is not a file",
            "give a .txt (paragraphs) or .jsonl (one JSON object per line) calibration file",
        )


def _check_shape(loaded: LoadedSpec, config_field: tuple[str, ...], config: dict[str, Any]) -> None:
    """The model against tp, pp and the AWQ group size: what the converter and TRT-LLM split and quantize."""
    spec = loaded.spec
    target = spec.target
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise loaded.error(
            config_field,
            f"architecture {arch or '(none given in config.json)'} is not supported by trtpipe's converter",
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
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
    inter = intermediate_size(config)
    if inter % tp:
        raise loaded.error(("target", "tp"), f"the model's intermediate_size {inter} does not split evenly over tp={tp}",
                           f"use a tp that divides {inter}")
    layers = int(config["num_hidden_layers"])
    if layers % target.pp:
        divisors = [d for d in range(1, layers + 1) if layers % d == 0 and d <= 64]
        raise loaded.error(
            ("target", "pp"),
            f"the model's {layers} layers do not split evenly into pp={target.pp} pipeline stages",
            f"use a pp that divides {layers}: {', '.join(map(str, divisors[:8]))}",
        )
    group = spec.quantization.group_size
    if quant.FORMATS[spec.quantization.algo].grouped:
        for label, width in gemm_input_widths(config, tp).items():
            if width % group:
                usable = [g for g in quant.GROUP_SIZES if all(w % g == 0 for w in gemm_input_widths(config, tp).values())]
                raise loaded.error(
                    ("quantization", "group_size"),
                    f"quantization.group_size {group} does not divide the input width {width} of {label}",
                    f"use group_size {' or '.join(map(str, usable))}, or a smaller tp" if usable
                    else "use a smaller tp",
                )


def _check_semantics(loaded: LoadedSpec, config_field: tuple[str, ...], config: dict[str, Any], runtime: str, *,
                     on_cpu: bool) -> None:
    """What the model computes must survive: a config field the runtime serving it cannot honour
    (trtpipe.model_semantics) is refused, naming it, rather than converted into a checkpoint that serves another
    function."""
    for refusal in model_semantics.refusals(config, runtime, on_cpu=on_cpu):
        raise loaded.error(config_field, f"config.json {refusal.field}: {refusal.message}", refusal.fix)


def _check_engine(loaded: LoadedSpec, config: dict[str, Any], gpu: GpuInfo | None,
                  toolchain: Toolchain, configs: Path) -> EngineConfig | None:
    spec = loaded.spec
    limits = spec.limits
    triton = getattr(spec.backend, "triton", None)  # an engine backend's Triton options
    if triton is not None and triton.max_batch_size is not None and triton.max_batch_size > limits.max_batch_size:
        raise loaded.error(
            ("backend", "triton", "max_batch_size"),
            f"{triton.max_batch_size} exceeds the engine's max_batch_size {limits.max_batch_size}",
            f"lower it to at most {limits.max_batch_size} or raise limits.max_batch_size",
        )
    max_positions = config.get("max_position_embeddings")
    if isinstance(max_positions, int) and limits.max_seq_len > max_positions and not config.get("rope_scaling"):
        raise loaded.error(
            ("limits", "max_seq_len"),
            f"{limits.max_seq_len} exceeds the model's max_position_embeddings {max_positions}",
            f"lower max_seq_len to at most {max_positions}",
        )
    if backend_facts(spec.backend_kind).derives != "engine-config":
        return None  # the LLM() arguments and their rules: _check_llm_api
    # The complete trtllm-build configuration, with the pinned trtllm-build's own rules, the in-flight
    # batching requirements, backend.plugins against the flag table and max_num_tokens: derived here once,
    # so a spec that resolves has an engine plan (trtpipe.engine.plan renders the same derivation).
    try:
        return derive_engine_config(spec, toolchain, gpu, config, configs=configs)
    except RuleViolation as violation:
        raise loaded.error(violation.field_path, violation.message, violation.fix) from None


def _check_llm_api(loaded: LoadedSpec, config: dict[str, Any], gpu: GpuInfo | None, toolchain: Toolchain,
                   backend: Any, configs: Path) -> LlmApiPlan:
    """The LLM() arguments the spec implies on the toolchain's PyTorch backend, with that backend's rules
    (quantization per GPU family and model, KV cache dtype, settings with no equivalent): trtpipe.llm_api.derive."""
    spec = loaded.spec
    try:
        return derive_llm_args(spec, toolchain, gpu, config, weight_dtype=resolve_dtype(spec, config),
                               args_table=backend.args, configs=configs)
    except LlmApiRuleViolation as violation:
        raise loaded.error(violation.field_path, violation.message, violation.fix) from None


def _check_names(loaded: LoadedSpec) -> None:
    """The names release uses: the artifact's, and the channels its gates are for (trtpipe.names)."""
    spec = loaded.spec
    if spec.name is None:
        problem = name_problem("name", spec.artifact_name)
        if problem:
            source = ("model", "path") if spec.model.path else ("model", "repo_id") if spec.model.repo_id else (
                "model", "config")
            raise loaded.error(source, f"the artifact name defaults to {spec.artifact_name!r}, which is not a plain name",
                               f"set name: ({name_fix('artifact name')})")
    for channel in spec.release.gates:
        problem = name_problem("channel", channel)
        if problem:
            raise loaded.error(("release", "gates", channel), problem, name_fix("channel"))


def resolve(loaded: LoadedSpec, *, need_weights: bool = True, configs: Path | None = None) -> ResolvedSpec:
    """Look up the toolchain, target GPU and model config; apply every cross-field rule.

    `need_weights=False` is for planning: a `model.config` (config.json only) is then enough. `configs`: the
    build_configs/ folder to read the tables from (the caller's settings decide: trtpipe.shipped.build_configs_dir;
    None: the shipped one).
    """
    spec = loaded.spec
    configs = configs_dir(configs)
    toolchain, backend = _check_toolchain(loaded, configs)
    gpu = _check_target(loaded, toolchain, configs)
    _check_quantization(loaded, gpu, configs)
    _check_names(loaded)
    model_dir, tokenizer_dir, config_path, config_field, config = _resolve_model(loaded, need_weights)
    _check_shape(loaded, config_field, config)
    _check_semantics(loaded, config_field, config, backend.facts.runtime, on_cpu=gpu is None)
    engine_config = _check_engine(loaded, config, gpu, toolchain, configs)
    llm_api = (_check_llm_api(loaded, config, gpu, toolchain, backend, configs) if backend.facts.derives == "llm-args"
               else None)
    resolved = ResolvedSpec(
        spec=spec,
        spec_path=loaded.path,
        toolchain=toolchain,
        gpu=gpu,
        model_config=config,
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        config_path=config_path,
        loaded=loaded,
        backend=backend,
        llm_api=llm_api,
        configs=configs,
    )
    if engine_config is not None:
        resolved._engine_config = (resolved._engine_inputs(), engine_config)
    return resolved
