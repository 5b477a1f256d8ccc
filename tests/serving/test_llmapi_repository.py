"""The llmapi repository (trtpipe.serving.llmapi_repository): what publish writes, and what validation refuses.

Artifacts are real ModelOpt exports of the tiny Llama (the `llmapi_artifact` fixture); the specs are resolved
for real (cpu-reference, and an H100 target for the GPU layout, which plans offline)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from trtpipe.errors import IntegrityError, InvalidInput, UsageError
from trtpipe.serving.contract import contract_for
from trtpipe.serving.layouts import LLMAPI
from trtpipe.serving.llmapi_repository import ARTIFACT_DIR, publish_llmapi_repository
from trtpipe.serving.templates import templates_digest
from trtpipe.serving.validate import errors_only, validate_repository

DIGEST = "sha256:" + "0" * 64


def resolved_spec(tmp_path: Path, model_dir: Path, *, gpu: str = "cpu-reference", streaming: bool = True):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    spec = tmp_path / f"spec-{gpu}-{streaming}.yaml"
    spec.write_text(f"name: tiny-llmapi\nmodel: {{path: {json.dumps(str(model_dir))}, dtype: float16}}\n"
                    f"target: {{gpu: {gpu}}}\ntriton: {{streaming: {'true' if streaming else 'false'}}}\n")
    return resolve(load_spec(spec))


@pytest.fixture(scope="module")
def artifact(llmapi_artifact) -> Path:
    return llmapi_artifact("llama", "fp8", "auto")


@pytest.fixture
def published(tmp_path: Path, tiny_llama_dir: Path, artifact: Path) -> Path:
    return publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir), artifact, DIGEST, tmp_path / "repo")


def writable_copy(repo: Path, dest: Path) -> Path:
    shutil.copytree(repo, dest)  # copies, not links: the stored artifact stays untouched
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dest


def test_cpu_reference_layout(published: Path, artifact: Path) -> None:
    assert sorted(p.name for p in published.iterdir()) == ["tensorrt_llm", "trtpipe.json"]
    settings = yaml.safe_load((published / "tensorrt_llm/1/model.yaml").read_text())
    llm_args = json.loads((artifact / "llm_args.json").read_text())
    assert settings == {"model": "checkpoint", **llm_args, "triton_config": {"max_batch_size": 0, "decoupled": True}}
    manifest = json.loads((published / "trtpipe.json").read_text())
    assert manifest["layout"] == "llmapi" and manifest["reference"] is True
    assert manifest["artifact"]["digest"] == DIGEST and manifest["artifact"]["quant_algo"] == "FP8"
    # The weights are the stored artifact's inodes, not copies.
    weights = published / ARTIFACT_DIR / "model.safetensors"
    assert os.stat(weights).st_ino == os.stat(artifact / "model.safetensors").st_ino
    assert "trtpipe.reference" in (published / "tensorrt_llm/1/model.py").read_text()
    assert validate_repository(published) == []


def test_every_contract_tensor_is_declared(published: Path) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse((published / "tensorrt_llm/config.pbtxt").read_text(), mc.ModelConfig())
    contract = contract_for("trtllm-1.2.1", layout=LLMAPI).models["tensorrt_llm"]
    assert {t.name for t in config.input} == {t.name for t in contract.inputs}
    assert {t.name for t in config.output} == {t.name for t in contract.outputs}
    assert config.max_batch_size == 0 and config.backend == "python"
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["trtpipe_engine_digest"] == DIGEST


def test_unary_deployment_is_not_decoupled(tmp_path: Path, tiny_llama_dir: Path, artifact: Path) -> None:
    repo = publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir, streaming=False), artifact, DIGEST,
                                     tmp_path / "repo")
    assert "decoupled: false" in (repo / "tensorrt_llm/config.pbtxt").read_text()
    assert yaml.safe_load((repo / "tensorrt_llm/1/model.yaml").read_text())["triton_config"]["decoupled"] is False
    assert errors_only(validate_repository(repo)) == []


def test_gpu_layout_points_at_the_container(tmp_path: Path, tiny_llama_dir: Path, artifact: Path) -> None:
    from trtpipe.serving.server import docker_command

    repo = publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir, gpu="h100-sxm"), artifact, DIGEST,
                                     tmp_path / "repo")
    settings = yaml.safe_load((repo / "tensorrt_llm/1/model.yaml").read_text())
    assert settings["model"] == "/trtpipe/repo/tensorrt_llm/1/checkpoint"
    code = (repo / "tensorrt_llm/1/model.py").read_text()
    assert "/app/all_models/llmapi/tensorrt_llm/1" in code and "trtpipe.reference" not in code
    assert errors_only(validate_repository(repo)) == []
    manifest = json.loads((repo / "trtpipe.json").read_text())
    argv = docker_command(repo, manifest, grpc_port=9001)
    image = manifest["serving_container"]
    assert argv[argv.index(image) + 1:argv.index(image) + 5] == ["mpirun", "--allow-run-as-root", "-n", "1"]
    assert "/opt/tritonserver/bin/tritonserver" in argv and "--grpc-port=9001" in argv
    assert "--disable-auto-complete-config" in argv and f"{repo.resolve()}:/trtpipe/repo:ro" in argv
    assert '--gpus="device=0"' in argv  # tp x pp = 1


def test_serve_print_gives_the_container_command(tmp_path: Path, tiny_llama_dir: Path, artifact: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import shlex

    from trtpipe.cli import main

    repo = publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir, gpu="h100-sxm"), artifact, DIGEST,
                                     tmp_path / "repo")
    assert main(["serve", str(repo), "--print", "--grpc-port", "8201"]) == 0
    printed = shlex.split(capsys.readouterr().out.strip())
    assert printed[:2] == ["docker", "run"] and "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in printed
    assert "127.0.0.1:8201:8201" in printed and printed.count("/opt/tritonserver/bin/tritonserver") == 1


@pytest.mark.parametrize("edit,field", [
    (lambda c, y: (c.replace('  { name: "stop" data_type: TYPE_BOOL dims: [ 1 ] optional: true },\n', ""), y),
     "input[stop]"),
    (lambda c, y: (c.replace("max_batch_size: 0", "max_batch_size: 4"), y), "max_batch_size"),
    (lambda c, y: (c.replace("kind: KIND_CPU", "kind: KIND_GPU"), y), "instance_group[0].kind"),
    (lambda c, y: (c, y.replace("decoupled: true", "decoupled: false")), "1/model.yaml:triton_config.decoupled"),
    (lambda c, y: (c, y.replace("model: checkpoint", "model: ../../elsewhere")), "1/model.yaml:model"),
    (lambda c, y: (c, y.replace("triton_config:\n", "triton_config:\n  max_queue_size: 3\n")),
     "1/model.yaml:triton_config.max_queue_size"),
    (lambda c, y: (c.replace('name: "text_output" data_type: TYPE_STRING', 'name: "text_output" data_type: TYPE_FP32'),
                   y), "output[text_output]"),
])
def test_validation_names_the_broken_field(published: Path, tmp_path: Path, edit, field: str) -> None:
    repo = writable_copy(published, tmp_path / "broken")
    config, settings = repo / "tensorrt_llm/config.pbtxt", repo / "tensorrt_llm/1/model.yaml"
    new_config, new_settings = edit(config.read_text(), settings.read_text())
    assert (new_config, new_settings) != (config.read_text(), settings.read_text())
    config.write_text(new_config)
    settings.write_text(new_settings)
    fields = [i.field for i in errors_only(validate_repository(repo))]
    assert field in fields, fields


def test_missing_weights_and_manifest_are_errors(published: Path, tmp_path: Path) -> None:
    repo = writable_copy(published, tmp_path / "broken")
    (repo / ARTIFACT_DIR / "model.safetensors").unlink()
    fields = [i.field for i in errors_only(validate_repository(repo))]
    assert "1/checkpoint/model.safetensors" in fields and "1/model.yaml:model" in fields


def _artifact_copy(artifact: Path, dest: Path) -> Path:
    shutil.copytree(artifact, dest)
    return dest


@pytest.mark.parametrize("damage,error,match", [
    (lambda a: (a / "llm_args.json").unlink(), IntegrityError, "llm_args.json not found"),
    (lambda a: (a / "llm_args.json").write_text('{"model": "x"}'), IntegrityError, "sets 'model'"),
    (lambda a: (a / "tokenizer.json").unlink(), InvalidInput, "no tokenizer.json"),
    (lambda a: (a / "model.safetensors").unlink(), IntegrityError, "no .safetensors"),
    (lambda a: (a / "config.json").write_text('{"architecture": "LlamaForCausalLM"}'), IntegrityError,
     "not a Hugging Face model config"),
])
def test_publish_refuses_an_incomplete_artifact(tmp_path: Path, tiny_llama_dir: Path, artifact: Path, damage, error,
                                                match: str) -> None:
    broken = _artifact_copy(artifact, tmp_path / "artifact")
    damage(broken)
    with pytest.raises(error, match=match):
        publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir), broken, DIGEST, tmp_path / "repo")
    assert not (tmp_path / "repo").exists() and not list(tmp_path.glob(".repo.*"))


def test_publish_refuses_a_non_empty_destination(tmp_path: Path, tiny_llama_dir: Path, artifact: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "x").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        publish_llmapi_repository(resolved_spec(tmp_path, tiny_llama_dir), artifact, DIGEST, tmp_path / "repo")


def test_publishing_twice_gives_the_same_bytes(tmp_path: Path, tiny_llama_dir: Path, artifact: Path) -> None:
    resolved = resolved_spec(tmp_path, tiny_llama_dir)
    a = publish_llmapi_repository(resolved, artifact, DIGEST, tmp_path / "a")
    b = publish_llmapi_repository(resolved, artifact, DIGEST, tmp_path / "b")
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_each_layout_has_its_own_templates_digest(tmp_path: Path) -> None:
    from trtpipe.serving.templates import TEMPLATE_ROOT

    copy = tmp_path / "triton_repo"
    shutil.copytree(TEMPLATE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = (templates_digest(copy), templates_digest(copy, layout="llmapi"))
    assert before[0] != before[1]
    with open(copy / "llmapi/tensorrt_llm_reference/1/model.py", "a") as file:
        file.write("\n# edited\n")
    after = (templates_digest(copy), templates_digest(copy, layout="llmapi"))
    assert after[0] == before[0] and after[1] != before[1]
    with open(copy / "ensemble/config.pbtxt", "a") as file:
        file.write("\n# edited\n")
    assert templates_digest(copy) != before[0] and templates_digest(copy, layout="llmapi") == after[1]
