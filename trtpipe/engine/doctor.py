"""Recognize known TensorRT / TensorRT-LLM / Triton failure messages in a log and say cause and fix.

The patterns match the texts those projects actually print (TensorRT's runtime, TRT-LLM's C++
runtime and executor, the tensorrtllm_backend); each one is tested against its real message.
The build executors call `diagnose` on a failed build; the serve path can call it on a server log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel


class Diagnosis(BaseModel):
    pattern_id: str
    cause: str
    fix: str
    matched_line: str


@dataclass(frozen=True)
class KnownFailure:
    pattern_id: str
    regex: re.Pattern[str]
    cause: str
    fix: str


def _p(text: str) -> re.Pattern[str]:
    return re.compile(text, re.IGNORECASE)


KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        "tensorrt-serialization-version",
        _p(r"Serialization assertion stdVersionRead == (?:kSERIALIZATION_VERSION|serializationVersion) failed"),
        "the engine was serialized by a different TensorRT version than the one loading it",
        "rebuild the engine with the toolchain the server runs (a build pins TensorRT per toolchain), "
        "or serve it with the container of the toolchain it was built with",
    ),
    KnownFailure(
        "tensorrt-plan-version",
        _p(r"engine plan file is (?:not compatible with|incompatible with) this version of TensorRT"),
        "the engine plan was built by another TensorRT library version",
        "rebuild the engine with the toolchain's TensorRT, or run the server from the same toolchain container",
    ),
    KnownFailure(
        "incompatible-device",
        _p(r"engine plan file is generated on an incompatible device, expecting compute \S+ got compute \S+"),
        "the engine was built for another GPU architecture (compute capability) than the one loading it",
        "build a separate engine for this GPU: set target.gpu to this GPU's class and rebuild",
    ),
    KnownFailure(
        "missing-plugin-creator",
        _p(
            r"(?:getPluginCreator could not find plugin"
            r"|IPluginCreator not found in Plugin Registry"
            r"|Plugin creator .* not found"
            r"|Cannot find plugin creator)"
        ),
        "the engine uses TensorRT-LLM plugins that are not registered in the loading process",
        "load the TRT-LLM plugin library of the same version (the tensorrtllm backend does; for trtexec pass "
        "--staticPlugins libnvinfer_plugin_tensorrt_llm.so) and serve with the toolchain the engine was built by",
    ),
    KnownFailure(
        "inflight-batching-requirements",
        _p(r"TrtGptModelInflightBatching requires GPT attention(?:/Mamba Conv 1d)? plugin with\s+packed input and paged KV cache"),
        "the engine was built without the GPT attention plugin, packed input or a paged KV cache",
        "rebuild with gpt_attention_plugin on, remove_input_padding on and kv_cache_type paged "
        "(trtpipe plans always enforce these; remove backend.plugins overrides that disable them)",
    ),
    KnownFailure(
        "kv-cache-too-small",
        _p(r"maxTokensInPagedKvCache \(\d+\) must be large enough to process at least 1 sequence"),
        "the KV cache memory left after loading the engine cannot hold one sequence of max_seq_len",
        "raise runtime.kv_cache_free_fraction, lower limits.max_seq_len / max_beam_width, quantize the "
        "KV cache (quantization.kv_cache: fp8) or use more GPUs (tp)",
    ),
    KnownFailure(
        "prompt-too-long",
        _p(
            r"(?:Prompt length(?: \+ number of draft tokens)? \(\d+(?: \+ \d+)?\) exceeds maximum input length"
            r"|exceeds maximum sequence length"
            r"|should not exceed max_num_tokens)"
        ),
        "a request's prompt (plus requested output) is longer than the engine's max_input_len / max_seq_len",
        "truncate the prompt or rebuild with larger limits.max_input_len and max_seq_len (and max_num_tokens, "
        "or enable chunked context)",
    ),
    KnownFailure(
        "cuda-oom-build",
        _p(
            r"(?:CUDA out of memory"
            r"|OutOfMemoryError"
            r"|Error Code 2: OutOfMemory"
            r"|Cuda Runtime \(out of memory\)"
            r"|CUDA_ERROR_OUT_OF_MEMORY"
            r"|cudaErrorMemoryAllocation)"
        ),
        "the GPU ran out of memory (during engine build, weight loading or KV cache allocation)",
        "free the GPU (nothing else running), lower limits.max_batch_size / max_num_tokens / max_seq_len, "
        "quantize (fp8 / int4_awq), or build with more GPUs (tp)",
    ),
    KnownFailure(
        "streaming-needs-decoupled",
        _p(r"Streaming is only supported if model is\s*deployed using decoupled mode"),
        "a streaming request reached a tensorrt_llm model that is not deployed in decoupled mode",
        "set runtime.streaming: true in the spec and republish (decoupled transaction policy), or call without streaming",
    ),
    KnownFailure(
        # tritonserver r24.10 (e0f0734d): src/main.cc:245/257/293 "failed to start {GRPC,HTTP,Metrics} service" with
        # src/grpc/grpc_server.cc:2546 / src/http_server.cc:221 "Socket 'HOST:PORT' already in use"; the OS's
        # own text (EADDRINUSE) where another tool reports it.
        "port-in-use",
        _p(r"(?:Socket '[^']*' already in use|address already in use)"),
        "another process already listens on a port the server needs (the server exits at start)",
        "stop the other process (a server left running?), or serve on other ports (or let free ones be picked)",
    ),
    KnownFailure(
        # python_backend r24.10 (01d0ad82): src/stub_launcher.cc:771-773 "Stub process '<instance>' is not
        # healthy." (src/python_be.cc:1060 without the name): a request reached a model whose Python-backend
        # process is dead, while the server still reports the model ready.
        "python-stub-died",
        _p(r"Stub process (?:'[^']*' )?is not healthy"),
        "the Python backend process of the model named in the message (instance <model>_<group>_<n>) died "
        "(killed, or out of memory); the server keeps reporting it ready but every request to it fails",
        "restart the server (Triton does not restart the process); if it was killed for memory (the kernel log "
        "names OOM kills), give the host more memory or run fewer model instances",
    ),
    KnownFailure(
        "container-oom-killed",
        _p(r"\[trtpipe\] container was OOM-killed"),
        "the build container exceeded host memory and the kernel killed it",
        "give the build host more RAM (or swap), or build fewer ranks at once (trtllm-build's workers); a 70B build "
        "needs well over 100 GB host RAM",
    ),
    KnownFailure(
        "build-timeout",
        _p(r"\[trtpipe\] killed after timeout"),
        "the build took longer than the executor's timeout",
        "raise backend.build_timeout in the spec (backend.conversion_timeout for a conversion), or build on a "
        "faster/larger GPU host",
    ),
)


def _first_match(regex: re.Pattern[str], lines: list[str]) -> tuple[int, str] | None:
    """The first line matching regex; failing that, the first pair of lines it matches across
    (some loggers wrap a long message over two lines)."""
    for index, line in enumerate(lines):
        if regex.search(line):
            return index, line
    for index in range(len(lines) - 1):
        window = f"{lines[index].rstrip()} {lines[index + 1].strip()}"
        if regex.search(window):
            return index, window
    return None


def diagnose(text: str) -> list[Diagnosis]:
    """Every known failure in `text`, in order of first appearance, one diagnosis per pattern."""
    lines = text.splitlines()
    found: list[tuple[int, Diagnosis]] = []
    for failure in KNOWN_FAILURES:
        hit = _first_match(failure.regex, lines)
        if hit is not None:
            index, matched = hit
            found.append(
                (index, Diagnosis(pattern_id=failure.pattern_id, cause=failure.cause, fix=failure.fix,
                                  matched_line=matched.strip()[:500]))
            )
    found.sort(key=lambda item: item[0])
    return [d for _, d in found]
