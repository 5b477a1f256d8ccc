"""`trtpipe build --dry-run` of the GPU examples: the exact trtllm-build command and container spec, pinned.

The examples are planning-only specs (model.config, no weights), so there are no stage keys; the engine
stage still renders the command the pinned toolchain would run, natively and in its NGC container.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.cli import main

from .test_plan import A100_INT4_AWQ_COMMAND, H100_FP8_COMMAND

EXAMPLES = Path(__file__).resolve().parents[2] / "build_configs" / "examples"


def _dry_run(example: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["build", str(EXAMPLES / f"{example}.yaml"), "--dry-run", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


@pytest.mark.parametrize(
    "example, pinned, gpus",
    [("llama3-8b-fp8-h100", H100_FP8_COMMAND, 1), ("llama3-8b-int4awq-a100", A100_INT4_AWQ_COMMAND, 1)],
)
def test_dry_run_prints_the_pinned_command_and_container(example, pinned, gpus, trtpipe_home, capsys):
    report = _dry_run(example, capsys)
    assert report["status"] == "dry-run"
    outcomes = {s["name"]: s["outcome"] for s in report["stages"]}
    # The checkpoint of a GPU target would be converted by the engine's executor (shown below the
    # engine's checks in test_dry_run_shows_the_conversion_in_the_executor); it was "skipped" before
    # conversion moved into the executor, when a dry run showed no conversion at all.
    assert outcomes == {"resolve": "ran", "plan": "ran", "checkpoint": "would-build", "engine": "would-build",
                        "publish": "would-build"}
    engine = next(s for s in report["stages"] if s["name"] == "engine")
    checkpoint_dir = str(trtpipe_home / "checkpoint" / "CHECKPOINT-KEY")
    # Where the store would have trtllm-build write: named like every stage's temporary folder
    # (`<kind>-<key>-XXXXXXXX`), with a placeholder for the key a planning-only spec cannot have.
    output_dir = str(trtpipe_home / "tmp" / "engine-ENGINE-KEY-XXXXXXXX")
    expected = pinned.replace("/ckpt", checkpoint_dir).replace("/engine", output_dir)
    assert " ".join(engine["command"]) == expected

    container = engine["container"]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"  # trtllm-1.2.1's container
    assert container["gpu_count"] == gpus
    assert {(m["source"], m["target"], m["read_only"]) for m in container["mounts"]} == {
        (checkpoint_dir, "/trtpipe/checkpoint", True),
        (output_dir, "/trtpipe/engine", False),
    }
    inside = pinned.replace("/ckpt", "/trtpipe/checkpoint").replace("/engine", "/trtpipe/engine")
    assert " ".join(container["command"]) == inside
    assert {u["name"] for u in container["ulimits"]} == {"memlock", "stack"}
    assert container["docker_run"][-len(container["command"]):] == container["command"]
    # nothing was built or recorded
    assert not any((trtpipe_home / "engine").glob("*")) and not any((trtpipe_home / "records").glob("*"))


def test_dry_run_of_a_planning_only_spec_says_why_there_is_no_key(trtpipe_home, capsys):
    report = _dry_run("llama2-13b-fp16-a100", capsys)
    checkpoint = next(s for s in report["stages"] if s["name"] == "checkpoint")
    assert checkpoint["key"] is None and "model.path" in checkpoint["detail"]


def test_real_build_of_a_planning_only_spec_is_refused_in_one_line(trtpipe_home, capsys):
    code = main(["build", str(EXAMPLES / "llama3-8b-fp8-h100.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "model.config" in err


@pytest.mark.parametrize("example, gpus", [("llama3-8b-fp8-h100", 1), ("llama3-70b-fp8-4xh100", 4)])
def test_dry_run_shows_the_conversion_in_the_executor(example, gpus, trtpipe_home, capsys):
    """--json: the checkpoint stage names its executor and the exact container that converts (on the
    target's GPUs, the model read-only, only the job and output folders writable), not this host."""
    import trtpipe

    report = _dry_run(example, capsys)
    checkpoint = next(s for s in report["stages"] if s["name"] == "checkpoint")
    assert checkpoint["executor"] == "docker"  # auto, and this host has no TensorRT-LLM
    container = checkpoint["container"]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    assert container["device_requests"] == [{"Driver": "nvidia", "Capabilities": [["gpu"]], "Count": gpus}]
    out_dir = str(trtpipe_home / "tmp" / "checkpoint-CHECKPOINT-KEY-XXXXXXXX")
    job_dir = str(trtpipe_home / "tmp" / ".checkpoint-CHECKPOINT-KEY-XXXXXXXX-job")
    assert container["command"] == checkpoint["command"] == [
        "python3", "-m", "trtpipe.engine.convert_entry", "--spec", f"{job_dir}/spec.json", "--out", out_dir,
        "--summary", f"{job_dir}/summary.json", "--device", "cuda"]
    package = Path(trtpipe.__file__).resolve().parent
    assert [(m["source"], m["target"], m["read_only"]) for m in container["mounts"]] == [
        ("<model.path>", "<model.path>", True),  # a planning-only spec: its weights are not at hand
        (job_dir, job_dir, False),
        (out_dir, out_dir, False),
        (str(package), "/opt/trtpipe-src/trtpipe", True),
        (str(package.parent / "build_configs"), "/opt/trtpipe-src/build_configs", True),
    ]
    assert container["environment"]["PYTHONPATH"] == "/opt/trtpipe-src"
    assert container["labels"]["org.trtpipe.stage"] == "checkpoint"


def test_dry_run_human_output_shows_where_the_conversion_runs(trtpipe_home, capsys):
    code = main(["build", str(EXAMPLES / "llama3-8b-int4awq-a100.yaml"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("checkpoint"))
    assert "converts in the docker executor: the container nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3 " \
           "on 1 GPU(s), not on this host" in lines[at + 1]
    assert lines[at + 2].lstrip().startswith("container: docker run --rm --gpus 1 ")
    assert "python3 -m trtpipe.engine.convert_entry --spec " in lines[at + 2] and "--device cuda" in lines[at + 2]
