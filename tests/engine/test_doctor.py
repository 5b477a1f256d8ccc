"""The log doctor against the real message texts of TensorRT, TensorRT-LLM and the Triton backend."""

from __future__ import annotations

import json

import pytest

from trtpipe.cli import main
from trtpipe.engine.doctor import diagnose

# Each text as the upstream code prints it (format strings filled in as a run would).
REAL_MESSAGES = [
    (
        "tensorrt-serialization-version",
        "[TensorRT-LLM][ERROR] 1: [stdArchiveReader.cpp::StdArchiveReader::42] Error Code 1: Serialization "
        "(Serialization assertion stdVersionRead == serializationVersion failed.Version tag does not match. "
        "Note: Current Version: 232, Serialized Engine Version: 213)",
    ),
    (
        "tensorrt-serialization-version",
        "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion "
        "stdVersionRead == kSERIALIZATION_VERSION failed.Version tag does not match.)",
    ),
    (
        "tensorrt-plan-version",
        "[TRT] [E] 6: The engine plan file is not compatible with this version of TensorRT, expecting library "
        "version 10.13.3.9 got 10.11.0.33, please rebuild.",
    ),
    (
        "incompatible-device",
        "[TRT] [E] 6: The engine plan file is generated on an incompatible device, expecting compute 9.0 got "
        "compute 8.0, please rebuild.",
    ),
    (
        "missing-plugin-creator",
        "[TRT] [E] 1: [pluginV2Runner.cpp::load::303] Error Code 1: Serialization (Serialization assertion "
        "creator failed.Cannot deserialize plugin since corresponding IPluginCreator not found in Plugin Registry)",
    ),
    (
        "missing-plugin-creator",
        "[TRT] [E] 3: getPluginCreator could not find plugin: GPTAttention version: 1",
    ),
    (
        "inflight-batching-requirements",
        "E0101 00:00:00.000000 1 model.cc:1] TrtGptModelInflightBatching requires GPT attention/Mamba Conv 1d "
        "plugin with packed input and paged KV cache.",
    ),
    (
        "inflight-batching-requirements",
        "TrtGptModelInflightBatching requires GPT attention plugin with packed input and paged KV cache.",
    ),
    (
        "kv-cache-too-small",
        "[TensorRT-LLM][ERROR] Assertion failed: maxTokensInPagedKvCache (4096) must be large enough to process at "
        "least 1 sequence to completion (i.e. must be larger than beam_width (1) * tokensPerBlock (32) * "
        "maxBlocksPerSeq (256))",
    ),
    (
        "prompt-too-long",
        "[TensorRT-LLM][ERROR] Encountered an error when fetching new request: Prompt length (5000) exceeds maximum "
        "input length (4096). Set log level to info and check TRTGptModel logs for how maximum input length is set",
    ),
    (
        "prompt-too-long",
        "[TensorRT-LLM][ERROR] Prompt length (300) exceeds maximum input length (256).",
    ),
    (
        "cuda-oom-build",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.02 GiB is free.",
    ),
    (
        "cuda-oom-build",
        "[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory (Requested size was "
        "8589934592 bytes.)",
    ),
    (
        "streaming-needs-decoupled",
        "E1130 05:00:00.000 1 model_instance_state.cc:1] Streaming is only supported if model is deployed using "
        "decoupled mode.",
    ),
    # tritonserver 2.51.0 (the nvidia-pytriton wheel's) on this machine: its log when a port is taken, and
    # what a client got from it after the tensorrt_llm / preprocessing stub was SIGKILLed.
    (
        "port-in-use",
        "E1130 15:06:02.190574 1274 main.cc:245] \"failed to start GRPC service: Unavailable - Socket "
        "'127.0.0.1:18555' already in use \"",
    ),
    (
        "port-in-use",
        "E1130 15:06:13.697029 1614 main.cc:257] \"failed to start HTTP service: Unavailable - Socket "
        "'127.0.0.1:18556' already in use \"",
    ),
    (
        "port-in-use",
        "E1130 15:06:18.013771 1885 main.cc:293] \"failed to start Metrics service: Unavailable - Socket "
        "'127.0.0.1:18556' already in use \"",
    ),
    ("port-in-use", "OSError: [Errno 98] Address already in use"),
    ("python-stub-died", "in ensemble 'ensemble', Stub process 'tensorrt_llm_0_0' is not healthy."),
    ("python-stub-died", "tensorrt_llm_bls: Stub process 'preprocessing_0_0' is not healthy."),
    ("python-stub-died", "Stub process is not healthy."),
]


@pytest.mark.parametrize("pattern_id, message", REAL_MESSAGES)
def test_real_message_is_recognized(pattern_id, message):
    log = f"[TensorRT-LLM][INFO] loading\n{message}\n[TensorRT-LLM][INFO] shutting down\n"
    found = diagnose(log)
    assert [d.pattern_id for d in found] == [pattern_id]
    assert found[0].matched_line == message.strip()[:500]
    assert found[0].cause and found[0].fix


def test_message_wrapped_over_two_lines():
    log = ("TrtGptModelInflightBatching requires GPT attention/Mamba Conv 1d plugin\n"
           "with packed input and paged KV cache.\n")
    assert [d.pattern_id for d in diagnose(log)] == ["inflight-batching-requirements"]


def test_clean_log_has_no_diagnosis():
    assert diagnose("[TRT-LLM] [I] Engine generation completed in 42.1 seconds.\nTotal time of building all engines: 00:01:02\n") == []


def test_several_failures_in_order_of_appearance():
    log = "\n".join([REAL_MESSAGES[5][1], REAL_MESSAGES[0][1]])
    assert [d.pattern_id for d in diagnose(log)] == ["missing-plugin-creator", "tensorrt-serialization-version"]


def test_doctor_cli_json(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text(REAL_MESSAGES[3][1] + "\n", encoding="utf-8")
    assert main(["doctor", str(log), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["diagnoses"][0]["pattern_id"] == "incompatible-device"


def test_doctor_cli_text_and_missing_file(tmp_path, capsys):
    log = tmp_path / "build.log"
    log.write_text(REAL_MESSAGES[8][1] + "\n", encoding="utf-8")
    assert main(["doctor", str(log)]) == 0
    out = capsys.readouterr().out
    assert "kv-cache-too-small" in out and "fix:" in out
    assert main(["doctor", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
