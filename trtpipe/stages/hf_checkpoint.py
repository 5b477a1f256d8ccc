"""The llm-api backend's artifact stage: Hugging Face model -> ModelOpt's unified HF export plus llm_args.json
(trtpipe.checkpoint.hf_export), stored as kind `hf-checkpoint` and keyed by what determines its bytes.

Key document (`hf_checkpoint_key`): the checkpoint stage's model and recipe part unchanged (digests of the HF
config and weight files or a pinned Hub commit, the dtype, the quantization recipe with the AWQ group size and
the calibration data and settings where they apply, the ModelOpt and transformers versions that export), plus
- `llm_args`: the whole llm_args.json the artifact carries (its bytes are part of the artifact);
- `trtllm_version`: the release whose TorchLlmArgs table those arguments were checked against.
tp and pp: the unified HF export is not sharded by tensor or pipeline parallelism (TensorRT-LLM shards the
weights when it loads them), so they change no weight byte; they enter the key through llm_args
(tensor_parallel_size, pipeline_parallel_size), because llm_args.json is in the artifact and differs. The
checkpoint key's separate tp/pp entries are left out: the same weights at another tp differ only in llm_args.
Never a path, a host, a target name or where the export runs: an H100 and an H200 spec with the same arguments
share the artifact. The SM enters only where the arguments depend on the target (cuda_graph_config is set for
GPU targets and not for cpu-reference).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext
from trtpipe.stages.checkpoint import CheckpointStage, conversion_preview
from trtpipe.store.keys import StageKey, make_key

KIND = "hf-checkpoint"
# Hugging Face's weight files, not sharded by GPU: save_pretrained's model.safetensors, or its shards.
HF_WEIGHT_FILES = r"model(?:-[0-9]{5}-of-[0-9]{5})?\.safetensors"


def hf_checkpoint_key(checkpoint_document: dict[str, Any], *, llm_args: dict[str, Any], trtllm_version: str) -> StageKey:
    """Key of an LLM-API artifact from the checkpoint stage's key document (see the module doc)."""
    document = {k: v for k, v in checkpoint_document.items() if k not in ("key_schema", "kind", "tp", "pp")}
    document.update({"export": "modelopt-unified-hf", "llm_args": llm_args, "trtllm_version": trtllm_version})
    return make_key(KIND, document)


class HfCheckpointStage:
    """Export in this process for target cpu-reference (small models on a CPU), in the target's executor on the
    GPU builder otherwise (the docker executor runs it in the toolchain's Triton container, whose ModelOpt and
    transformers are the pins the key names)."""

    name = "export"
    kind = KIND
    inputs: tuple[str, ...] = ()
    weight_files = HF_WEIGHT_FILES

    def __init__(self) -> None:
        self._checkpoint = CheckpointStage(in_executor=True)

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        plan = ctx.resolved.llm_api
        assert plan is not None, "resolve derives the LLM() arguments for backend llm-api"
        try:
            checkpoint = self._checkpoint.key(ctx, inputs)
        except NoKey as no_key:
            raise NoKey(no_key.reason, outcome="would-build") from None
        return hf_checkpoint_key(checkpoint.inputs, llm_args=plan.args, trtllm_version=plan.trtllm_version)

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        from trtpipe.checkpoint.hf_export import export_hf_artifact
        from trtpipe.engine.conversion import convert_in_executor

        if ctx.resolved.is_cpu_reference:
            summary = export_hf_artifact(ctx.resolved, out_dir, show_progress=ctx.progress)
            facts = {"export": summary.model_dump(mode="json")}
            files = facts["export"]["files"]
        else:
            facts = convert_in_executor(ctx.resolved, out_dir, ctx.log_path(self.name, key.key),
                                        build_plan=ctx.build_plan, progress=ctx.progress, artifact="hf")
            files = (facts.get("convert") or {}).get("files") or []
        # The export hashed its final files (after every rewrite): those digests travel with them into the store.
        for item in files:
            ctx.written[Path(out_dir) / item["name"]] = item["sha256"]
        return facts

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        if ctx.resolved.is_cpu_reference:
            return None
        return conversion_preview(ctx, ctx.temp_dir(self.kind, key), verb="exports", artifact="hf")
