"""trtpipe llmapi tensorrt_llm for GPU targets: the pinned Triton TRT-LLM container's own llmapi model.

trtpipe does not ship a copy of TensorRT-LLM's llmapi model. The container of the pinned toolchain carries it:
tensorrtllm_backend's Dockerfile.triton.trt_llm_backend copies triton_backend/all_models to /app/all_models
(tensorrtllm_backend 98bfe1d, dockerfile/Dockerfile.triton.trt_llm_backend:170-172). This file loads that model
(the config.pbtxt parameter `upstream_model_dir`, default /app/all_models/llmapi/tensorrt_llm/1) and hands every
call to it, so the repository runs exactly the TensorRT-LLM version of the container. Upstream's model reads its
LLM() arguments from model.yaml in this folder (pb_utils.get_model_dir()), which trtpipe writes.

One thing is added in front of it: trtpipe's config.pbtxt declares every input of every upstream reading of the
contract (build_configs/triton_contracts/llmapi.yaml), so a request may carry an input the container's model
never reads (say lora_id on a model without LoRA selection). Triton would accept it and the model would ignore
it; instead, such a request is answered with an error naming the input. An input counts as read when the
upstream source names it (or, for sampling_param_<arg>, names <arg>, which upstream's helpers prefix).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import triton_python_backend_utils as pb_utils

DEFAULT_UPSTREAM_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
UPSTREAM_MODULE = "trtpipe_upstream_llmapi_model"


def _upstream_dir(model_config: dict) -> str:
    value = model_config.get("parameters", {}).get("upstream_model_dir", {}).get("string_value", "")
    return value or DEFAULT_UPSTREAM_DIR


def _load_upstream(directory: str):
    if UPSTREAM_MODULE in sys.modules:
        return sys.modules[UPSTREAM_MODULE]
    path = os.path.join(directory, "model.py")
    if not os.path.isfile(path):
        raise pb_utils.TritonModelException(
            f"the upstream llmapi model {path} is not in this container; serve the repository with the Triton "
            "TRT-LLM container its trtpipe.json names (serving_container), or set the config.pbtxt parameter "
            "upstream_model_dir to the folder holding TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1")
    if directory not in sys.path:
        sys.path.insert(0, directory)  # upstream's model.py imports its helpers.py from beside it
    spec = importlib.util.spec_from_file_location(UPSTREAM_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[UPSTREAM_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _upstream_source(directory: str) -> str:
    text = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py"):
            with open(os.path.join(directory, name), encoding="utf-8") as file:
                text.append(file.read())
    return "\n".join(text)


def unread_inputs(declared: list[str], source: str) -> list[str]:
    """The declared inputs the upstream source never names."""

    def named(word: str) -> bool:
        return f"'{word}'" in source or f'"{word}"' in source

    unread = []
    for name in declared:
        if named(name):
            continue
        if name.startswith("sampling_param_") and named(name[len("sampling_param_"):]):
            continue
        unread.append(name)
    return unread


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        upstream = _load_upstream(_upstream_dir(auto_complete_model_config.as_dict()))
        if hasattr(upstream.TritonPythonModel, "auto_complete_config"):
            return upstream.TritonPythonModel.auto_complete_config(auto_complete_model_config)
        return auto_complete_model_config

    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        directory = _upstream_dir(model_config)
        upstream = _load_upstream(directory)
        declared = [tensor["name"] for tensor in model_config.get("input", [])]
        self.unread = unread_inputs(declared, _upstream_source(directory))
        if self.unread:
            pb_utils.Logger.log_info(f"[trtpipe] inputs the upstream model in {directory} does not read (requests "
                                     f"carrying them are refused): {', '.join(self.unread)}")
        self.model = upstream.TritonPythonModel()
        self.model.initialize(args)

    def execute(self, requests):
        accepted = []
        for request in requests:
            carried = [n for n in self.unread if pb_utils.get_input_tensor_by_name(request, n) is not None]
            if carried:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"input {carried[0]} is not read by the llmapi model of this container's TensorRT-LLM; "
                        "omit it, or serve with a TensorRT-LLM version that supports it")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            accepted.append(request)
        if not accepted:
            return None
        return self.model.execute(accepted)

    def finalize(self):
        if hasattr(self, "model") and hasattr(self.model, "finalize"):
            self.model.finalize()
