"""The GPU llmapi model.py (triton_repo/llmapi/tensorrt_llm/1/model.py), run here by the real tritonserver
against a stand-in for the container's upstream model (written below by this test, not TensorRT-LLM's code):
the loader finds it through the `upstream_model_dir` parameter, hands requests to it, answers requests that
carry an input the upstream source never names with an error naming that input, and says what is missing when
the container has no upstream model. What runs on a GPU host with the real container is in test_llmapi_gpu.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtpipe.serving.llmapi_repository import publish_llmapi_repository
from trtpipe.settings import Settings

DIGEST = "sha256:" + "2" * 64

# A stand-in upstream: names text_input, streaming and (helpers-style) the sampling argument 'max_tokens'; it
# answers through the response sender like upstream's model and echoes what it read.
STAND_IN_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils
from helpers import SAMPLING_ARGS


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            prompt = prompt.decode() if isinstance(prompt, bytes) else str(prompt)
            streaming = pb_utils.get_input_tensor_by_name(request, "streaming")
            tokens = pb_utils.get_input_tensor_by_name(request, "sampling_param_" + SAMPLING_ARGS[0])
            text = f"stand-in read {prompt!r} max_tokens={tokens.as_numpy()[0] if tokens is not None else None}"
            out = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
            request.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[out]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
STAND_IN_HELPERS = "SAMPLING_ARGS = ['max_tokens']\n"


def _gpu_repository(tmp_path: Path, model_dir: Path, artifact: Path, upstream: Path) -> Path:
    """An llmapi repository published for a GPU target, made servable here: the stand-in upstream folder in
    its config.pbtxt and a manifest that lets the CPU tritonserver start it."""
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: tiny-llmapi\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    "target: {gpu: h100-sxm}\ntriton: {streaming: true}\n")
    published = publish_llmapi_repository(resolve(load_spec(spec)), artifact, DIGEST, tmp_path / "published")
    repo = tmp_path / "repo"
    shutil.copytree(published, repo)
    for path in [repo, *repo.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    config = repo / "tensorrt_llm/config.pbtxt"
    config.write_text(config.read_text().replace("/app/all_models/llmapi/tensorrt_llm/1", str(upstream)))
    manifest = json.loads((repo / "trtpipe.json").read_text())
    manifest["reference"] = True  # the CPU server refuses GPU repositories; this one runs a CPU stand-in
    (repo / "trtpipe.json").write_text(json.dumps(manifest))
    return repo


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("upstream") / "llmapi" / "tensorrt_llm" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(STAND_IN_MODEL)
    (folder / "helpers.py").write_text(STAND_IN_HELPERS)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, llmapi_artifact, stand_in: Path) -> Iterator:
    from trtpipe.serving.server import start_server

    repo = _gpu_repository(tmp_path_factory.mktemp("gpu-model"), tiny_llama_dir, llmapi_artifact("llama"), stand_in)
    with start_server(repo, start_timeout=180, validate=False, settings=Settings.from_env()) as handle:
        yield handle


def _infer(url: str, **inputs: np.ndarray) -> str:
    client = grpcclient.InferenceServerClient(url)
    kinds = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.int32): "INT32",
             np.dtype(np.uint64): "UINT64"}
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), kinds[value.dtype])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    try:
        import queue

        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer("tensorrt_llm", tensors)
        result, error = responses.get(timeout=60)
        if error is not None:
            raise RuntimeError(str(error))
        return result.as_numpy("text_output")[0].decode()
    finally:
        client.stop_stream()
        client.close()


PROMPT = np.array([b"hello"], dtype=object)


def test_requests_reach_the_upstream_model(server) -> None:
    text = _infer(server.grpc_url, text_input=PROMPT, streaming=np.array([False]),
                  sampling_param_max_tokens=np.array([5], dtype=np.int32))
    assert text == "stand-in read 'hello' max_tokens=5"


@pytest.mark.parametrize("name,value", [
    ("lora_id", np.array([3], dtype=np.uint64)),
    ("image_url", np.array([b"https://example.com/a.png"], dtype=object)),
    ("sampling_param_top_k", np.array([1], dtype=np.int32)),
])
def test_an_input_the_upstream_model_never_reads_is_refused(server, name: str, value: np.ndarray) -> None:
    with pytest.raises(RuntimeError, match=f"input {name} is not read by the llmapi model"):
        _infer(server.grpc_url, text_input=PROMPT, **{name: value})


def test_a_container_without_the_upstream_model_says_what_is_missing(tmp_path: Path, tiny_llama_dir: Path,
                                                                   llmapi_artifact) -> None:
    from trtpipe.errors import CheckFailed
    from trtpipe.serving.server import start_server

    repo = _gpu_repository(tmp_path, tiny_llama_dir, llmapi_artifact("llama"), tmp_path / "no-such-folder")
    with pytest.raises(CheckFailed) as caught:
        start_server(repo, start_timeout=120, validate=False, settings=Settings.from_env()).stop()
    log = Path(caught.value.fix.rsplit(" ", 1)[-1]).read_text()
    assert "the upstream llmapi model" in log and "is not in this container" in log
