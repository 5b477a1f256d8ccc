"""A GPU-target build on a host that cannot build its engine stops before converting the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.cli import main


@pytest.mark.parametrize("executor, missing", [("docker", "no Docker daemon reachable"), ("local", "TensorRT-LLM")])
def test_gpu_build_without_builder_fails_before_conversion(
    executor: str, missing: str, tiny_llama_dir: Path, trtpipe_home: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: tiny-h100\nmodel: {{path: {tiny_llama_dir}}}\n"
        f"target: {{gpu: h100-sxm, executor: {executor}}}\n"
        "engine: {max_batch_size: 4, max_input_len: 128, max_seq_len: 256}\n"
    )
    code = main(["build", str(spec)])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # progress lines go to stderr too
    assert len(errors) == 1 and missing in errors[0] and "Traceback" not in err
    # nothing was converted: the checkpoint stage refused before calling ModelOpt
    assert not any((trtpipe_home / "checkpoint").glob("*"))
