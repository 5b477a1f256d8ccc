"""The checkpoint stage: Hugging Face model -> TensorRT-LLM checkpoint, keyed by what determines its bytes.

Key document (`checkpoint_key`): the digests of the HF config and weight files (or a pinned Hub
commit), the dtype, the quantization recipe - format, KV cache, the AWQ group size where the format
is grouped, the calibration data and settings where the recipe is calibrated (trtpipe.quant says
which) - tp, pp, and the ModelOpt and transformers versions that convert. Never a path, a host or
where the conversion runs: the same checkpoint converted in-process or in the engine's executor has
one key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trtpipe import quant
from trtpipe.checkpoint.calibration import calibration_source
from trtpipe.errors import InvalidInput
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext
from trtpipe.store.keys import StageKey, make_key
from trtpipe.versions import installed_version

# HF files that determine a converted checkpoint (tokenizer files enter the repository key instead).
_WEIGHT_SUFFIXES = (".safetensors",)
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")


def weight_files(model_dir: Path, *, allow_pickle: bool = False) -> list[Path]:
    """The HF files whose content determines a converted checkpoint (besides config.json)."""
    suffixes = _WEIGHT_SUFFIXES + _INDEX_SUFFIXES + (_PICKLE_SUFFIXES if allow_pickle else ())
    return sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(suffixes))


def checkpoint_key(
    *,
    config_digest: str,
    weight_digests: Iterable[str] | None,
    dtype: str,
    algo: str,
    kv_cache: str,
    group_size: int,
    calibration_digest: str | None,
    calibration_samples: int,
    calibration_max_seq_len: int,
    calibration_seed: int,
    calibration_text_field: str = "text",
    tp: int,
    pp: int,
    modelopt_version: str,
    transformers_version: str,
    hf_source: Mapping[str, str] | None = None,
) -> StageKey:
    """Key of a TRT-LLM checkpoint.

    `weight_digests`: sha256 of each HF weight file (order does not matter). When the weights are not
    local, `hf_source` = {"repo_id", "revision"} (a pinned commit is content-addressed). `kv_cache` is the
    KV cache dtype the engine stores (float16, bfloat16, fp8, int8)."""
    if weight_digests is None and not hf_source:
        raise ValueError("checkpoint_key needs weight digests or a pinned hf_source")
    recipe: dict[str, Any] = {"algo": algo, "kv_cache": kv_cache}
    if quant.FORMATS[algo].grouped:
        recipe["group_size"] = int(group_size)
    if quant.needs_calibration(algo, kv_cache):
        if calibration_digest is None:
            raise ValueError(f"quantization {algo}/{kv_cache} needs calibration data, but no digest was given")
        recipe["calibration"] = {
            "digest": calibration_digest,
            "samples": int(calibration_samples),
            "max_seq_len": int(calibration_max_seq_len),
            "seed": int(calibration_seed),
            "text_field": calibration_text_field,
        }
    return make_key("checkpoint", {
        "model": {
            "config": config_digest,
            "weights": sorted(weight_digests) if weight_digests is not None else None,
            "hf_source": dict(hf_source) if hf_source else None,
        },
        "dtype": dtype,
        "quant": recipe,
        "tp": int(tp),
        "pp": int(pp),
        "modelopt_version": modelopt_version,
        "transformers_version": transformers_version,
    })


class CheckpointStage:
    """Convert in this process (the reference backend: small models on a CPU), or in the engine's executor
    on the GPU builder (`in_executor`: trtllm-build, whose checkpoints are too big to convert here)."""

    name = "checkpoint"
    kind = "checkpoint"
    inputs: tuple[str, ...] = ()
    # TensorRT-LLM's checkpoint: one rank file per GPU (trtpipe.checkpoint.writer).
    weight_files = r"rank[0-9]{1,5}\.safetensors"

    def __init__(self, *, in_executor: bool) -> None:
        self.in_executor = in_executor

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        resolved = ctx.resolved
        spec = resolved.spec
        hf_source = None
        weights: list[str] | None = None
        if resolved.model_dir is not None:
            files = weight_files(Path(resolved.model_dir), allow_pickle=spec.model.allow_pickle)
            if not files:
                raise InvalidInput(
                    f"{resolved.model_dir}: no .safetensors weight files",
                    fix="point model.path at a Hugging Face directory saved with safe_serialization=True",
                )
            weights = [ctx.digests.digest(f) for f in files]
        elif spec.model.repo_id and spec.model.revision:
            hf_source = {"repo_id": spec.model.repo_id, "revision": spec.model.revision}
        else:
            raise NoKey("planning-only spec (model.config): no weights, so no key; set model.path or "
                        "model.repo_id + revision to build", outcome="would-build" if self.in_executor else "skipped")
        q = spec.quantization
        kv = resolved.kv_cache_dtype
        calibration_digest = None
        if quant.needs_calibration(q.algo, kv):
            calibration_digest = ctx.digests.digest(Path(calibration_source(spec)))
        toolchain = resolved.toolchain
        return checkpoint_key(
            config_digest=ctx.digests.digest(Path(resolved.config_path)),
            weight_digests=weights,
            hf_source=hf_source,
            dtype=resolved.weight_dtype,
            algo=q.algo,
            kv_cache=kv,
            group_size=q.group_size,
            calibration_digest=calibration_digest,
            calibration_samples=q.calibration.samples,
            calibration_max_seq_len=q.calibration.max_seq_len,
            calibration_seed=q.calibration.seed,
            calibration_text_field=q.calibration.text_field,
            tp=spec.target.tp,
            pp=spec.target.pp,
            # A toolchain that pins no version converts with the installed one: key that one.
            modelopt_version=toolchain.modelopt_version or installed_version("nvidia-modelopt") or "not-installed",
            transformers_version=toolchain.transformers_version or installed_version("transformers") or "not-installed",
        )

    def expected_bytes(self, ctx: StageContext) -> int | None:
        """About what the checkpoint holds: the memory plan's weight bytes at the checkpoint's precision."""
        from trtpipe.plan import memory_plan

        return memory_plan(ctx.resolved).weight_bytes_total

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        # The converters load only when the stage builds (and they load torch, transformers and ModelOpt only
        # when they run): a warm build imports none of them.
        from trtpipe.checkpoint.convert import convert_checkpoint
        from trtpipe.engine.conversion import convert_in_executor

        if self.in_executor:
            # Checks first, in under a second: a host that cannot convert or build there fails before any
            # (possibly hours-long) work.
            facts = convert_in_executor(ctx.resolved, out_dir, ctx.log_path("checkpoint", key.key),
                                        build_plan=ctx.build_plan, progress=ctx.progress)
        else:
            facts = {"convert": convert_checkpoint(ctx.resolved, out_dir, show_progress=ctx.progress).model_dump(mode="json")}
        # The converter hashed what it wrote: those digests travel with the files into the store.
        for item in (facts.get("convert") or {}).get("files") or []:
            ctx.written[Path(out_dir) / item["name"]] = item["sha256"]
        return facts

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        if not self.in_executor:
            return None
        return conversion_preview(ctx, ctx.temp_dir("checkpoint", key), verb="converts")


def conversion_preview(ctx: StageContext, out_dir: Path, *, verb: str, artifact: str = "trtllm") -> Preview:
    """What a dry run shows of a conversion in the engine's executor: where it runs, and its container or command
    (`artifact`: the TRT-LLM checkpoint, or "hf" for the LLM-API export)."""
    from trtpipe.engine.conversion import preview_conversion

    conversion = preview_conversion(ctx.resolved, out_dir, artifact=artifact)
    notes = [f"{verb} in the {conversion.where}"]
    docker_run = (conversion.container or {}).get("docker_run")
    if docker_run:
        notes.append("container: " + " ".join(str(a) for a in docker_run))
    elif conversion.command:
        notes.append("command: " + " ".join(conversion.command))
    return Preview(executor=conversion.executor, command=conversion.command, container=conversion.container,
                   notes=notes)
