"""The llm-api backend's publish stage: LLM-API artifact -> Triton model repository in TensorRT-LLM's `llmapi`
layout (trtpipe.serving.llmapi.publish_llmapi_repository), keyed like the trtllm-build publish stage.

Key document (trtpipe.stages.publish.repository_key): the artifact's DIGEST in the place of the engine's (a
repository is a function of the artifact's bytes), the serving options, the tokenizer files' digest, the llmapi
layout's templates digest (every file under triton_repo/llmapi/: config.pbtxt and both model.py; a change to the
inflight_batcher_llm templates never republishes an llmapi repository), the trtpipe version, and the artifact's
name, target, toolchain, quantization and release gates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trtpipe
from trtpipe.serving.templates import templates_digest
from trtpipe.stages.base import InputRef, NoKey, Preview, StageContext
from trtpipe.stages.publish import repository_key, tokenizer_digest
from trtpipe.store.keys import StageKey


class LlmApiPublishStage:
    """Write the llmapi repository for the artifact (on cpu-reference its tensorrt_llm model is the reference
    runtime behind the same contract)."""

    name = "publish"
    kind = "repository"
    inputs = ("export",)

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        artifact_digest = inputs["export"].digest
        if artifact_digest is None:
            raise NoKey("key follows the artifact's digest, known once the artifact is exported")
        resolved = ctx.resolved
        spec = resolved.spec
        return repository_key(
            engine_digest=artifact_digest,
            serving={**spec.triton.model_dump(mode="json"), "layout": "llmapi"},
            tokenizer_digest=tokenizer_digest(ctx.digests, resolved.tokenizer_dir),
            templates_digest=templates_digest(layout="llmapi"),
            trtpipe_version=trtpipe.__version__,
            name=spec.artifact_name,
            target={"gpu": spec.target.gpu, "sm": resolved.sm, "tp": spec.target.tp, "pp": spec.target.pp},
            toolchain=resolved.toolchain.name,
            quant=spec.quantization.algo,
            release=spec.release.model_dump(mode="json"),
        )

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        from trtpipe.serving.llmapi import publish_llmapi_repository

        artifact = inputs["export"]
        assert artifact.digest is not None
        publish_llmapi_repository(ctx.resolved, artifact.path, artifact.digest, out_dir, repository_key=key.key)
        return {}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return None
