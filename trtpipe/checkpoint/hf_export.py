"""HF model -> the LLM-API artifact: ModelOpt's unified Hugging Face export, the tokenizer, and llm_args.json.

What the directory holds (the artifact a `llm-api` build stores, kind `hf-checkpoint`):
- the model as TensorRT-LLM's PyTorch backend loads it: for a quantized recipe, ModelOpt's own unified export
  (`modelopt.torch.export.export_hf_checkpoint` at the toolchain's pinned version): `config.json` with its
  `quantization_config`, `hf_quant_config.json`, `model*.safetensors` with HF tensor names (FP8: float8_e4m3fn
  `weight` + `weight_scale` + `input_scale`; INT4-AWQ: packed uint8 `weight` + `weight_scale` + `pre_quant_scale`;
  an FP8 KV cache adds `k_scale`/`v_scale`); for `algo: none`, the HF weights in the spec's dtype re-saved with
  `save_pretrained` (safetensors);
- the tokenizer files (`ARTIFACT_TOKENIZER_FILES`, those present);
- `llm_args.json`: the `LLM()` keyword arguments the spec implies (trtpipe.llm_api.derive), checked against the
  toolchain's TorchLlmArgs table. No path is in it: the repository writer adds `model`.

The recipe is the TRT-LLM checkpoint converter's (trtpipe.checkpoint.convert): the same ModelOpt config from the
quantization table, calibration in bfloat16 on the same windows, untouched tensors restored from the model loaded
in the export dtype. The export is not sharded: tensor and pipeline parallelism are LLM() arguments
(tensor_parallel_size, pipeline_parallel_size) that TensorRT-LLM applies when it loads the weights.
The bytes are deterministic: the same inputs give byte-identical files (tests/llm_api checks two exports).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any


from trtpipe import quant
from trtpipe.checkpoint.calibration import calibration_source, read_texts
from trtpipe.checkpoint.convert import (
    DEVICES,
    ConversionFacts,
    _check_cuda,
    _file_digests,
    _peak_rss_bytes,
    _Progress,
    _quiet_stdout,
    _threads_for,
    _torch_dtype,
    check_versions,
    load_and_calibrate,
    quant_config,
)
from trtpipe.checkpoint.hf_source import inspect_source
from trtpipe.errors import IntegrityError, InvalidInput, TrtpipeError
from trtpipe.llm_api.args import check_llm_args, load_args_table
from trtpipe.model_folder import TOKENIZER_FILES

LLM_ARGS_FILE = "llm_args.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
# The tokenizer files an artifact carries (the llmapi model's LLM() reads them from the model folder): the
# tokenizer table's, less generation_config.json, which the export writes from the model itself.
ARTIFACT_TOKENIZER_FILES = tuple(name for name in TOKENIZER_FILES if name != "generation_config.json")


class HfExportSummary(ConversionFacts):
    """What an HF export wrote and what it cost."""

    llm_args_table: str


def _rewrite_json(path: Path, change: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    os.replace(staging, path)


def _sorted_lists(data: Any) -> None:
    """ModelOpt builds exclude/ignore lists from sets: sort them so two exports write the same bytes."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("exclude_modules", "ignore") and isinstance(value, list):
                data[key] = sorted(value)
            else:
                _sorted_lists(value)


def _post_process(out_dir: Path, export_dtype: str) -> None:
    """Deterministic JSON, and config.json naming the dtype the weights were exported in."""
    def fix_config(config: dict[str, Any]) -> None:
        _sorted_lists(config)
        config.pop("torch_dtype", None)
        config["dtype"] = export_dtype

    _rewrite_json(out_dir / "config.json", fix_config)
    if (out_dir / HF_QUANT_CONFIG).is_file():
        _rewrite_json(out_dir / HF_QUANT_CONFIG, _sorted_lists)


def write_llm_args(out_dir: Path, resolved: Any) -> dict[str, Any]:
    """llm_args.json from the resolved spec's LLM-API plan, checked against the toolchain's table."""
    plan = resolved.llm_api
    if plan is None:
        raise InvalidInput("the spec does not build with backend llm-api", fix="set backend: llm-api")
    table = load_args_table(resolved.backend.args, resolved.configs)
    check_llm_args(plan.args, table, where=f"{LLM_ARGS_FILE} for {table.toolchain}")
    path = Path(out_dir) / LLM_ARGS_FILE
    staging = path.with_name(f".{LLM_ARGS_FILE}.tmp")
    staging.write_text(json.dumps(plan.args, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staging, path)
    return plan.args


def copy_tokenizer(tokenizer_dir: Path, out_dir: Path) -> list[str]:
    copied = []
    for name in ARTIFACT_TOKENIZER_FILES:
        source = Path(tokenizer_dir) / name
        if source.is_file():
            shutil.copyfile(source, Path(out_dir) / name)
            copied.append(name)
    if "tokenizer.json" not in copied:
        raise InvalidInput(f"{tokenizer_dir} has no tokenizer.json", fix="set model.tokenizer to a folder holding it")
    return copied


def validate_hf_artifact(out_dir: Path, resolved: Any) -> None:
    """The exported folder against the spec: the files the PyTorch backend reads, the quantization it declares,
    the llm_args.json the toolchain's table takes. Raises IntegrityError naming the file."""
    out_dir = Path(out_dir)
    spec = resolved.spec
    for name in ("config.json", LLM_ARGS_FILE, "tokenizer.json"):
        if not (out_dir / name).is_file():
            raise IntegrityError(f"{out_dir}: the export wrote no {name}", path=str(out_dir / name),
                                 fix="rebuild the artifact; report this if it repeats")
    if not list(out_dir.glob("model*.safetensors")):
        raise IntegrityError(f"{out_dir}: the export wrote no model*.safetensors", path=str(out_dir),
                             fix="rebuild the artifact; report this if it repeats")
    config = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    fmt, kv = quant.FORMATS[spec.quantization.algo], quant.KV_CACHES[spec.quantization.kv_cache]
    declared = config.get("quantization_config") or {}
    if declared.get("quant_algo") != fmt.checkpoint_algo:
        raise IntegrityError(
            f"{out_dir / 'config.json'}: quantization_config.quant_algo is {declared.get('quant_algo')!r}, but the spec "
            f"asks for {spec.quantization.algo} ({fmt.checkpoint_algo})", path=str(out_dir / "config.json"),
            fix="rebuild the artifact with the toolchain's pinned ModelOpt")
    if fmt.checkpoint_algo is not None:
        hf_quant = json.loads((out_dir / HF_QUANT_CONFIG).read_text(encoding="utf-8")).get("quantization") or {}
        if hf_quant.get("kv_cache_quant_algo") != kv.checkpoint_algo:
            raise IntegrityError(
                f"{out_dir / HF_QUANT_CONFIG}: kv_cache_quant_algo is {hf_quant.get('kv_cache_quant_algo')!r}, but the "
                f"spec asks for a {spec.quantization.kv_cache} KV cache", path=str(out_dir / HF_QUANT_CONFIG),
                fix="rebuild the artifact with the toolchain's pinned ModelOpt")
        if fmt.grouped and hf_quant.get("group_size") != spec.quantization.group_size:
            raise IntegrityError(
                f"{out_dir / HF_QUANT_CONFIG}: group_size is {hf_quant.get('group_size')!r}, not the spec's "
                f"{spec.quantization.group_size}", path=str(out_dir / HF_QUANT_CONFIG),
                fix="rebuild the artifact with the toolchain's pinned ModelOpt")
    args = json.loads((out_dir / LLM_ARGS_FILE).read_text(encoding="utf-8"))
    check_llm_args(args, load_args_table(resolved.backend.args, resolved.configs), where=str(out_dir / LLM_ARGS_FILE))


def _save_unquantized(model: Any, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)


def _export_quantized(model: Any, out_dir: Path, dtype: str) -> None:
    from modelopt.torch.export import export_hf_checkpoint

    try:
        export_hf_checkpoint(model, dtype=_torch_dtype(dtype), export_dir=out_dir)
    except (AssertionError, ValueError, NotImplementedError, RuntimeError, KeyError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtpipeError(f"ModelOpt unified HF export failed: {message}",
                           fix="report this with the spec attached") from None


def export_hf_artifact(
    resolved: Any,
    out_dir: Path,
    *,
    show_progress: bool = False,
    progress_lines: bool = False,
    device: str = "cpu",
) -> HfExportSummary:
    """Write the resolved llm-api spec's artifact into the existing, empty `out_dir` (see the module doc).

    `device` "cuda" calibrates on the visible GPUs (an executor on the GPU builder), with the same recipe."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    started = time.monotonic()
    spec = resolved.spec
    requested = spec.quantization
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise InvalidInput(f"{out_dir} is not a directory", fix="create it first")
    if resolved.model_dir is None:
        raise InvalidInput("the spec gives no model weights to export", fix="set model.path to a local HF folder")
    warn = lambda message: print(f"warning: {message}", file=sys.stderr)  # noqa: E731
    modelopt_version, transformers_version = check_versions(resolved.toolchain, warn=warn)
    source = inspect_source(Path(resolved.model_dir), resolved.tokenizer_dir, allow_pickle=spec.model.allow_pickle)
    export_dtype = resolved.weight_dtype
    recipe = quant_config(requested.algo, requested.kv_cache, requested.group_size)
    if recipe is not None:
        read_texts(calibration_source(spec), requested.calibration.text_field)
    if device == "cuda":
        _check_cuda()
    with _quiet_stdout(), _threads_for(source.config), _Progress(show_progress, lines=progress_lines) as progress:
        # The unified export runs the layers once more (it looks for GEMMs that share an input), so the whole
        # model must be in one dtype: it goes back to the export dtype after calibration (the quantized GEMM
        # weights: bf16 -> fp16 is exact in fp16's range; the quantizers' amax buffers round to it, 2^-11 relative
        # at most in fp16, far below an FP8 or INT4 step), and the untouched tensors are restored bit for bit.
        model, calibration = load_and_calibrate(spec, source, export_dtype, device, progress,
                                                back_to_export_dtype=True)
        advance = progress.task("exporting (unified HF)", 1)
        if recipe is None:
            _save_unquantized(model, out_dir)
        else:
            _export_quantized(model, out_dir, export_dtype)
        advance(1)
        del model
    _post_process(out_dir, export_dtype)
    copy_tokenizer(source.tokenizer_dir, out_dir)
    write_llm_args(out_dir, resolved)
    validate_hf_artifact(out_dir, resolved)
    files = _file_digests(out_dir)
    declared = json.loads((out_dir / "config.json").read_text(encoding="utf-8")).get("quantization_config") or {}
    kv = quant.KV_CACHES[requested.kv_cache]
    return HfExportSummary(
        out_dir=str(out_dir),
        architecture=source.architecture,
        dtype=export_dtype,
        quant_algo=declared.get("quant_algo"),
        kv_cache_quant_algo=kv.checkpoint_algo if recipe is not None else None,
        group_size=requested.group_size if quant.FORMATS[requested.algo].grouped else None,
        tp=spec.target.tp,
        pp=spec.target.pp,
        files=files,
        total_bytes=sum(f.bytes for f in files),
        seconds=round(time.monotonic() - started, 3),
        peak_rss_bytes=_peak_rss_bytes(),
        modelopt_version=modelopt_version,
        transformers_version=transformers_version,
        calibration=calibration,
        llm_args_table=resolved.backend.args,
    )
