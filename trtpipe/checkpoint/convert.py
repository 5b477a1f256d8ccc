"""HF model -> TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) with NVIDIA ModelOpt.

The quantizer and exporter are ModelOpt's own (`mtq.quantize` + `export_tensorrt_llm_checkpoint`) at exactly the
version the spec's toolchain pins; a different installed version is refused, because a checkpoint's layout and
scales are only as trustworthy as the exporter the engine builder was tested with.

Formats: each spec `quantization.algo` names its ModelOpt 0.37 config and the checkpoint `quant_algo` it
exports in the quantization table (trtpipe.quant), with the group size (AWQ: block_sizes[-1]) and the KV
caches offered on top (FP8: FP8_KV_CFG's `*[kv]_bmm_quantizer` entry added). What the pinned ModelOpt cannot
produce (int8_wo: no INT8 weight-only config, and its exporter writes every 8-bit weight as
W8A8_SQ_PER_CHANNEL; nvfp4: calibration needs CUDA kernels; an INT8 KV cache) is refused by trtpipe.resolve
with the table's reason, before any conversion: this module converts only what resolve accepted.

CPU practice: calibration runs in bfloat16 (fp16 matmul is ~12x slower on CPU). Tensors that no quantizer
touches (embedding, norms, lm_head, biases) are put back from the model loaded in the export dtype before
export, so a bf16 round trip never degrades them; the quantized GEMM weights are quantized from their bf16
copy, whose rounding (at most 2^-8 relative: bf16 keeps 8 significant bits) is far below any quantization
step except int8's, where it is of the order of half a step at most for the largest values.

Qwen2: ModelOpt 0.37's `decoder_type="qwen"` export needs `tensorrt_llm` importable (NotImplementedError
otherwise), which it never is on a CPU host. The llama layout writes the same tensor names TRT-LLM's
QWenForCausalLM declares (`transformer.layers.N.attention.qkv.{weight,bias}`, `attention.dense`, `mlp.fc` =
gate_proj, `mlp.gate` = up_proj, `mlp.proj`, `input_layernorm`, `post_layernorm`, `transformer.ln_f`,
`lm_head`), QKV bias included. `config.json` is then rewritten with the fields TRT-LLM's `QWenConfig`
(tensorrt_llm/models/qwen/config.py) reads and `QWenForCausalLM` (model.py) needs: architecture
Qwen2ForCausalLM, qwen_type qwen2, attn_bias true, mlp_bias false, rotary_base, rotary_scaling,
use_logn_attn false, seq_length, moe_intermediate_size 0, moe_shared_expert_intermediate_size 0,
disable_weight_only_quant_plugin false, num_labels 1, tie_word_embeddings.
What was verified, and how: the field names and defaults against the stored TensorRT-LLM sources
(tensorrt_llm/models/qwen/config.py at commit 0428c188, qwen/model.py at 04a2cacb, modeling_utils.py at
01ea6d79: PretrainedConfig.from_dict picks the class by `architecture`, sets unknown keys as attributes,
`load` refuses missing tensors and only warns on extra ones); that commit-to-release mapping (1.2.x) could
not be confirmed with the search tools. Locally, tests check every tensor name, dtype and shape per rank
(schema.py) and the config fields. Only a GPU host with TRT-LLM 1.2 can confirm that
`QWenForCausalLM.from_checkpoint` and `trtllm-build` accept it (tests/checkpoint: the `gpu`-marked test).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import resource
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import quant
from trtpipe.checkpoint.calibration import CalibrationInfo, calibration_source, prepare_calibration, read_texts
from trtpipe.checkpoint.hf_source import HfSource, dims, inspect_source, load_model
from trtpipe.checkpoint.schema import validate_checkpoint
from trtpipe.errors import InvalidInput, MissingCapability, TrtpipeError
from trtpipe.spec import BuildSpec
from trtpipe.versions import installed_version, versions_match


class FileDigest(BaseModel):
    name: str
    bytes: int
    sha256: str


class ConversionFacts(BaseModel):
    """What a conversion or an HF export wrote and what it cost (the build record keeps it; the artifact never does)."""

    out_dir: str
    architecture: str
    dtype: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    group_size: int | None
    tp: int
    pp: int
    files: list[FileDigest]
    total_bytes: int
    seconds: float
    peak_rss_bytes: int
    modelopt_version: str
    transformers_version: str
    calibration: CalibrationInfo | None
    notes: list[str] = []  # facts a user should know about what was written (e.g. KV-cache scales at their floor)


def kv_scale_notes(out_dir: Path) -> list[str]:
    """What the FP8 KV-cache scales of a TRT-LLM checkpoint say: ModelOpt 0.37 floors each calibrated K/V scale at
    1.0, so a small model's calibration lands on the default range, and its FP8 KV cache is then the uncalibrated
    one (a user who asked for calibration should know)."""
    from safetensors import safe_open

    scales: list[float] = []
    for path in sorted(out_dir.glob("rank*.safetensors")):
        with safe_open(str(path), framework="pt") as tensors:
            for name in tensors.keys():
                if name.endswith("kv_cache_scaling_factor"):
                    scales.extend(float(x) for x in tensors.get_tensor(name).float().reshape(-1))
    if scales and all(x == 1.0 for x in scales):
        return [f"calibrated FP8 KV-cache scales all 1.0 ({len(scales)} layers): ModelOpt floors them at 1.0, so the "
                "FP8 KV cache uses the default range"]
    return []


class ConvertSummary(ConversionFacts):
    """What a conversion to a TRT-LLM checkpoint wrote and what it cost (the `--json` output of `trtpipe convert`)."""

    path: str = "modelopt"  # streaming, layerwise or modelopt (see `choose_path`)
    path_reason: str = ""  # why this path was taken
    bytes_read: int | None = None  # HF weight bytes this conversion read (None: not counted, ModelOpt's loader)
    activation_bytes: int | None = None  # calibration activations held at once (layerwise)


# ------------------------------------------------------------------------------------------------ checks


def check_versions(toolchain: Any, *, warn: Callable[[str], None]) -> tuple[str, str]:
    """Refuse a ModelOpt/transformers that differs from the toolchain's pins; warn when a pin is unknown.

    Reads the installed distributions' metadata: importing ModelOpt costs seconds and ~200 MB, which a
    streamed conversion never needs."""
    installed = {"nvidia-modelopt": installed_version("nvidia-modelopt"), "transformers": installed_version("transformers")}
    for package, version in installed.items():
        if version is None:
            raise MissingCapability(f"{package} is not installed", fix=f"pip install {package}")
    pins = {
        "nvidia-modelopt": getattr(toolchain, "modelopt_version", None),
        "transformers": getattr(toolchain, "transformers_version", None),
    }
    name = getattr(toolchain, "name", "the toolchain")
    for package, pinned in pins.items():
        if not pinned or str(pinned).lower() == "unknown":
            warn(f"toolchain {name} does not pin {package}; using the installed {installed[package]}")
            continue
        if not versions_match(str(installed[package]), str(pinned)):
            raise MissingCapability(
                f"{package} {installed[package]} is installed but toolchain {name} pins {pinned}",
                fix=f"pip install {package}=={pinned} (or choose the toolchain that matches)",
            )
    return str(installed["nvidia-modelopt"]), str(installed["transformers"])


def quant_config(algo: str, kv_cache: str, group_size: int) -> dict[str, Any] | None:
    """The ModelOpt 0.37 quantization config of a spec recipe, named by the quantization table (a deep copy:
    the library's dicts stay intact)."""
    import modelopt.torch.quantization as mtq

    fmt, kv = quant.FORMATS[algo], quant.KV_CACHES[kv_cache]
    assert fmt.refused is None and kv.refused is None, "trtpipe.resolve refuses what the converter cannot make"
    if fmt.modelopt_config is None:
        return None
    config = copy.deepcopy(getattr(mtq, fmt.modelopt_config))
    if fmt.grouped:
        weight = config["quant_cfg"]["*weight_quantizer"]
        first = weight[0] if isinstance(weight, list) else weight
        first["block_sizes"][-1] = group_size
    if kv.modelopt_config is not None:
        kv_entry = getattr(mtq, kv.modelopt_config)["quant_cfg"]["*[kv]_bmm_quantizer"]
        config["quant_cfg"]["*[kv]_bmm_quantizer"] = copy.deepcopy(kv_entry)
    return config


# ------------------------------------------------------------------------------------------------ progress


class _Progress:
    """A rich progress display when asked for, else nothing (library callers and tests stay quiet).

    `lines=True` prints plain progress lines on stderr instead (a few per task): a conversion run by an
    executor writes into a log file, where a live display would show nothing until the end, and the
    executor's status line shows the last line it read.
    """

    LINE_EVERY_S = 10.0

    def __init__(self, enabled: bool, *, lines: bool = False) -> None:
        self._progress = None
        self._lines = enabled and lines
        if enabled and not lines:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )

    def __enter__(self) -> _Progress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def task(self, description: str, total: int | None) -> Callable[[int], None]:
        if self._lines:
            return self._line_task(description, total)
        if self._progress is None:
            return lambda advance=1: None
        task_id = self._progress.add_task(description, total=total)
        progress = self._progress
        return lambda advance=1: progress.advance(task_id, advance)

    def _line_task(self, description: str, total: int | None) -> Callable[[int], None]:
        """Print `[trtpipe] description done/total` at the start, every tenth or LINE_EVERY_S, and at the end."""
        state = {"done": 0, "printed_at": time.monotonic(), "printed_done": 0}
        step = max(1, (total or 0) // 10)

        def emit() -> None:
            count = f"{state['done']}/{total}" if total else str(state["done"])
            print(f"[trtpipe] {description}: {count}", file=sys.stderr, flush=True)
            state["printed_at"], state["printed_done"] = time.monotonic(), state["done"]

        emit()

        def advance(amount: int = 1) -> None:
            state["done"] += amount
            finished = total is not None and state["done"] >= total
            if (finished or state["done"] - state["printed_done"] >= step
                    or time.monotonic() - state["printed_at"] >= self.LINE_EVERY_S):
                emit()

        return advance


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """ModelOpt prints chatter ("Inserted 51 quantizers"); stdout belongs to the command's (JSON) output."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------------------------------------ convert


SMALL_MODEL_PARAMS = 200_000_000


@contextlib.contextmanager
def _threads_for(config: dict[str, Any]) -> Iterator[None]:
    """One torch thread for small models: their GEMMs are too small to split, and on a busy host a second
    OpenMP thread that gets descheduled stalls every op (measured 80x slower on a loaded 2-core CI box).
    Large models keep torch's default. Same model -> same thread count -> same bytes."""
    import torch

    d = dims(config)
    approx_params = d["layers"] * (4 * d["hidden"] ** 2 + 3 * d["hidden"] * d["intermediate"]) + 2 * d["vocab"] * d["hidden"]
    previous = torch.get_num_threads()
    if approx_params < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _untouched_parameters(model: Any) -> list[tuple[Any, str, Any]]:
    """Parameters no quantizer will change, as (module, attribute, original data): everything outside the
    decoder's Linear layers, plus their biases.

    A parameter shared by two modules (tied embeddings: `lm_head.weight` is `embed_tokens.weight`) is
    recorded once, under its first owner: `named_parameters()` lists a shared tensor once, so looking
    it up by its second name fails, and restoring one owner restores both."""
    import torch

    keep: list[tuple[Any, str, Any]] = []
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        is_decoder_linear = isinstance(module, torch.nn.Linear) and ".layers." in f".{module_name}"
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen or (is_decoder_linear and param_name != "bias"):
                continue
            seen.add(id(param))
            keep.append((module, param_name, param.data))
    return keep


def _restore_parameters(originals: list[tuple[Any, str, Any]]) -> None:
    for module, param_name, data in originals:
        getattr(module, param_name).data = data


def _calibrate_and_quantize(
    model: Any, config: dict[str, Any], windows: list[list[int]], progress: _Progress
) -> None:
    import modelopt.torch.quantization as mtq
    import torch

    passes = {"n": 0}
    # The token ids go where the embedding is (the CPU, or the first GPU of a model spread over several).
    input_device = model.get_input_embeddings().weight.device

    def forward_loop(m: Any) -> None:
        passes["n"] += 1
        advance = progress.task(f"calibrating (pass {passes['n']})", len(windows))
        with torch.no_grad():
            for window in windows:
                m(input_ids=torch.tensor([window], dtype=torch.long, device=input_device))
                advance(1)

    mtq.quantize(model, config, forward_loop)


def _post_process_config(out_dir: Path, source: HfSource, spec: BuildSpec) -> None:
    """Make config.json deterministic and complete for TRT-LLM 1.2's loaders (see the module docstring)."""
    path = out_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    mixed = out_dir / "quant_cfg.json"
    if mixed.is_file() and not json.loads(mixed.read_text(encoding="utf-8")).get("quantized_layers"):
        # With pp > 1 and no quantization ModelOpt writes an empty per-layer table; it means "none".
        mixed.unlink()
    hf = source.config
    quantization = config.get("quantization") or {}
    if isinstance(quantization.get("exclude_modules"), list):
        # ModelOpt builds this list from a set: its order would change between runs.
        quantization["exclude_modules"] = sorted(quantization["exclude_modules"])
    config["architecture"] = source.architecture
    if source.family == "qwen2":
        config.update(
            {
                "qwen_type": "qwen2",
                "attn_bias": True,
                "mlp_bias": False,
                "rotary_base": float(hf.get("rope_theta", 100000.0)),  # 1e5: QWenConfig's default
                "rotary_scaling": copy.deepcopy(hf.get("rope_scaling")),
                "use_logn_attn": False,
                "seq_length": int(hf.get("seq_length", 8192)),
                "moe_intermediate_size": 0,
                "moe_shared_expert_intermediate_size": 0,
                "disable_weight_only_quant_plugin": False,
                "num_labels": 1,
                "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
            }
        )
    scaling = config.get("rotary_scaling")
    if isinstance(scaling, dict):
        # TRT-LLM reads "type"; HF >= 4.45 writes "rope_type": carry both.
        kind = scaling.get("type") or scaling.get("rope_type")
        if kind:
            scaling.setdefault("type", kind)
            scaling.setdefault("rope_type", kind)
    staging = path.with_name(".config.json.tmp")
    staging.write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    os.replace(staging, path)


def _peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM (ru_maxrss would include a forking parent's peak: it survives exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _file_digests(out_dir: Path) -> list[FileDigest]:
    digests = []
    for path in sorted(out_dir.iterdir()):
        if path.is_file():
            sha = hashlib.sha256()
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    sha.update(block)
            digests.append(FileDigest(name=path.name, bytes=path.stat().st_size, sha256=sha.hexdigest()))
    return digests


DEVICES = ("cpu", "cuda")


def _check_cuda() -> None:
    """GPU calibration needs torch to see a CUDA device; say so in one line before loading anything."""
    import torch

    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise MissingCapability(
            f"checkpoint conversion on the GPU: torch {torch.__version__} sees no CUDA device{where}",
            fix="run it where the target's GPUs are visible (docker: the NVIDIA container toolkit; "
            "local: the NVIDIA driver), or build for target.gpu: cpu-reference",
        )
    # PyTorch's reproducibility notes: cuBLAS repeats its results run to run only with a fixed
    # workspace configuration, read when its first handle is made (an executor sets it already).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _check_on_gpus(model: Any) -> None:
    """Calibration on the GPU holds the whole model in GPU memory: refuse a model accelerate spilled."""
    import torch

    placed = {str(device) for device in (getattr(model, "hf_device_map", None) or {}).values()}
    spilled = sorted(placed & {"cpu", "disk"})
    if spilled:
        raise MissingCapability(
            f"the model does not fit in the memory of the {torch.cuda.device_count()} visible GPU(s): "
            f"part of it was placed on {' and '.join(spilled)}",
            fix="convert on GPUs with more memory in total (target.gpu_count), or quantize a smaller model",
        )


PATHS = ("streaming", "layerwise", "modelopt")


def choose_path(spec: BuildSpec, source: HfSource, hf_config: dict[str, Any], device: str) -> tuple[str, str]:
    """Which way to convert, and why. The three give the same bytes where they apply (tests/checkpoint
    compare them); they differ in what is in memory at once.

    - "streaming": nothing to calibrate (quantization.algo none; no calibrated KV cache): the HF tensors
      are re-arranged block by block (trtpipe.checkpoint.streaming). Any device: no arithmetic runs.
    - "layerwise": a format the quantization table marks `layerwise` (FP8 and INT4-AWQ, with or without the
      FP8 KV cache), calibrated on the CPU: one decoder layer at a time (trtpipe.checkpoint.layerwise).
    - "modelopt": everything else, and whatever the other two do not reproduce (`streaming_refusal`), and
      `quantization.converter: modelopt`: the whole model loaded, quantized and exported by ModelOpt.
      Calibration on GPUs (device "cuda") stays here: the model is spread over the GPUs by accelerate.
    """
    from trtpipe.checkpoint.streaming import streaming_refusal

    q = spec.quantization
    fmt, kv = quant.FORMATS[q.algo], quant.KV_CACHES[q.kv_cache]
    if q.converter == "modelopt":
        return "modelopt", "quantization.converter: modelopt"
    if spec.model.trust_remote_code:
        return "modelopt", "model.trust_remote_code: the model's own code may differ from the llama layout"
    calibrated = fmt.modelopt_config is not None or kv.calibrated
    if calibrated and not fmt.layerwise:
        return "modelopt", f"quantization.algo {q.algo} has no layer-wise calibration here"
    if calibrated and device != "cpu":
        return "modelopt", "calibration on the GPU loads the whole model onto the GPUs"
    refusal = streaming_refusal(source, hf_config, spec.target.tp, spec.target.pp)
    if refusal is not None:
        return "modelopt", refusal
    if not calibrated:
        return "streaming", "nothing to calibrate: tensor by tensor from the safetensors files"
    return "layerwise", "calibrated one decoder layer at a time"


def convert_checkpoint(
    resolved: Any,
    out_dir: Path,
    *,
    show_progress: bool = False,
    progress_lines: bool = False,
    device: str = "cpu",
) -> ConvertSummary:
    """Convert the resolved spec's HF model into a validated TRT-LLM checkpoint written into `out_dir`.

    `out_dir` must exist (the caller created it, typically a temp dir it renames into place afterwards).
    The way (`choose_path`) is chosen from the recipe and the model; all give ModelOpt's bytes.
    `device` "cuda" calibrates on the visible GPUs (the model spread over them by accelerate) with the
    same recipe as on the CPU (bfloat16 calibration, untouched tensors restored, same export); an
    executor on the GPU builder uses it. `progress_lines` prints progress as plain lines (for a log).
    """
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {DEVICES}")

    started = time.monotonic()
    spec: BuildSpec = resolved.spec
    requested = spec.quantization
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise InvalidInput(f"{out_dir} is not a directory", fix="create it first")
    warn = lambda message: print(f"warning: {message}", file=sys.stderr)  # noqa: E731
    modelopt_version, transformers_version = check_versions(resolved.toolchain, warn=warn)
    if resolved.model_dir is None:
        raise InvalidInput("the spec gives no model weights to convert", fix="set model.path to a local HF folder")
    # tp/pp against the model's shape, the AWQ group size and the recipe itself were checked by resolve.
    source = inspect_source(Path(resolved.model_dir), resolved.tokenizer_dir, allow_pickle=spec.model.allow_pickle)
    tp, pp = spec.target.tp, spec.target.pp

    export_dtype = resolved.weight_dtype
    calibrated = quant.needs_calibration(requested.algo, requested.kv_cache)
    if calibrated:  # a missing or malformed dataset fails now, not after loading the model
        read_texts(calibration_source(spec), requested.calibration.text_field)

    if device == "cuda":
        _check_cuda()

    hf_config = _hf_config(source, spec)
    path, reason = choose_path(spec, source, hf_config, device)
    facts: dict[str, Any] = {}
    with _quiet_stdout(), _threads_for(source.config), _Progress(show_progress, lines=progress_lines) as progress:
        if path == "streaming":
            facts = _convert_streaming(source, hf_config, out_dir, export_dtype, tp, pp, modelopt_version, progress)
        elif path == "layerwise":
            from trtpipe.checkpoint.layerwise import convert_layerwise

            recipe = quant_config(requested.algo, requested.kv_cache, requested.group_size)
            assert recipe is not None
            facts = convert_layerwise(resolved, source, hf_config, out_dir, recipe=recipe, dtype=export_dtype,
                                      task=progress.task)
        else:
            facts = _convert_modelopt(resolved, source, out_dir, export_dtype, device, progress)
    _post_process_config(out_dir, source, spec)
    validate_checkpoint(out_dir, spec)
    files = _file_digests(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    quantization = config.get("quantization") or {}
    return ConvertSummary(
        out_dir=str(out_dir),
        architecture=config["architecture"],
        dtype=config["dtype"],
        quant_algo=quantization.get("quant_algo"),
        kv_cache_quant_algo=quantization.get("kv_cache_quant_algo"),
        group_size=requested.group_size if quant.FORMATS[requested.algo].grouped else None,
        tp=tp,
        pp=pp,
        files=files,
        total_bytes=sum(f.bytes for f in files),
        seconds=round(time.monotonic() - started, 3),
        peak_rss_bytes=_peak_rss_bytes(),
        modelopt_version=modelopt_version,
        transformers_version=transformers_version,
        calibration=facts.get("calibration"),
        notes=kv_scale_notes(out_dir) if quantization.get("kv_cache_quant_algo") == "FP8" else [],
        path=path,
        path_reason=reason,
        bytes_read=facts.get("bytes_read"),
        activation_bytes=facts.get("activation_bytes"),
    )


def _hf_config(source: HfSource, spec: BuildSpec) -> dict[str, Any]:
    """The HF config as transformers fills it in; the raw config.json when transformers cannot read it
    (the ModelOpt path then reports the real error while loading)."""
    from trtpipe.checkpoint.streaming import load_hf_config

    try:
        return load_hf_config(source)
    except (OSError, ValueError, KeyError):
        return dict(source.config)


def _convert_streaming(source: HfSource, hf_config: dict[str, Any], out_dir: Path, dtype: str, tp: int, pp: int,
                       modelopt_version: str, progress: _Progress) -> dict[str, Any]:
    from trtpipe.checkpoint import streaming

    g = streaming.geometry(source, tp, pp)
    advance = progress.task("streaming tensors", g.layers + 2)
    facts = streaming.stream_unquantized(source, hf_config, out_dir, dtype=dtype, tp=tp, pp=pp, advance=advance)
    config = streaming.trtllm_config(source, hf_config, g, dtype=dtype, modelopt_version=modelopt_version)
    (out_dir / "config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    return facts


def _convert_modelopt(resolved: Any, source: HfSource, out_dir: Path, export_dtype: str, device: str,
                      progress: _Progress) -> dict[str, Any]:
    """ModelOpt's full-model path: load, calibrate in bfloat16, restore the untouched tensors, export."""
    spec: BuildSpec = resolved.spec
    model, calibration = load_and_calibrate(spec, source, export_dtype, device, progress)
    advance = progress.task("exporting", 1)
    _export(model, out_dir, export_dtype, spec.target.tp, spec.target.pp)
    advance(1)
    del model
    return {"calibration": calibration}


def load_and_calibrate(spec: BuildSpec, source: HfSource, export_dtype: str, device: str, progress: _Progress, *,
                       back_to_export_dtype: bool = False) -> tuple[Any, CalibrationInfo | None]:
    """The whole HF model, loaded in the export dtype and, when the spec quantizes, calibrated in bfloat16 with
    the spec's ModelOpt recipe; the tensors no quantizer changes are restored bit for bit afterwards.

    `back_to_export_dtype`: the quantized model goes back to the export dtype before the restore (an exporter
    that runs the layers again needs one dtype throughout)."""
    import torch

    requested = spec.quantization
    recipe = quant_config(requested.algo, requested.kv_cache, requested.group_size)
    calibration: CalibrationInfo | None = None
    torch.manual_seed(requested.calibration.seed)
    advance = progress.task("loading model", 1)
    model = load_model(source, _torch_dtype(export_dtype), trust_remote_code=spec.model.trust_remote_code,
                       device_map="auto" if device == "cuda" else None)
    advance(1)
    if device == "cuda":
        _check_on_gpus(model)
    if recipe is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source.tokenizer_dir, trust_remote_code=spec.model.trust_remote_code)
        windows, calibration = prepare_calibration(spec, tokenizer)
        originals = _untouched_parameters(model)
        model = model.to(torch.bfloat16)
        _calibrate_and_quantize(model, recipe, windows, progress)
        if back_to_export_dtype:
            model = model.to(_torch_dtype(export_dtype))
        _restore_parameters(originals)
    return model, calibration


def _export(model: Any, out_dir: Path, dtype: str, tp: int, pp: int) -> None:
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    try:
        # decoder_type "llama" for every supported family: see the module docstring for Qwen2.
        export_tensorrt_llm_checkpoint(
            model,
            decoder_type="llama",
            dtype=_torch_dtype(dtype),
            export_dir=out_dir,
            inference_tensor_parallel=tp,
            inference_pipeline_parallel=pp,
        )
    except (AssertionError, ValueError, NotImplementedError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtpipeError(f"ModelOpt export failed: {message}", fix="report this with the spec attached") from None
