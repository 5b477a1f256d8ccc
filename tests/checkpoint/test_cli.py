"""`trtpipe example-model` and `trtpipe convert` from the command line: atomic output, refusals, --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpipe.cli import main

pytestmark = pytest.mark.timeout(300)


def _spec(tmp_path: Path, model: Path, algo: str = "none") -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: tiny\nmodel:\n  path: {json.dumps(str(model))}\ntarget:\n  gpu: cpu-reference\n"
        f"quantization:\n  algo: {algo}\n  calibration:\n    samples: 2\n    max_seq_len: 32\n"
    )
    return spec


def test_convert_json_summary_and_atomic_placement(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ckpt"
    assert main(["convert", str(_spec(tmp_path, tiny_llama_dir, "fp8")), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # stdout is pure JSON: ModelOpt's chatter is kept off it
    assert summary["out_dir"] == str(out)
    assert summary["quant_algo"] == "FP8"
    assert {f["name"] for f in summary["files"]} == {"config.json", "rank0.safetensors"}
    assert summary["total_bytes"] == sum(p.stat().st_size for p in out.iterdir())
    assert summary["peak_rss_bytes"] > 0 and summary["seconds"] > 0
    assert len(summary["files"][1]["sha256"]) == 64
    assert summary["calibration"]["samples_used"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    # a non-empty --out is refused (exit 2, one line), --force replaces it
    assert main(["convert", str(_spec(tmp_path, tiny_llama_dir, "fp8")), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["convert", str(_spec(tmp_path, tiny_llama_dir, "none")), "--out", str(out), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quant_algo"] is None
    assert json.loads((out / "config.json").read_text())["quantization"]["quant_algo"] is None


def test_convert_refusal_is_one_line(tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ckpt"
    # Exit 2 (an invalid spec, refused by resolve at quantization.algo) since issue 13; the converter
    # refused it after resolving, with exit 1, before.
    assert main(["convert", str(_spec(tmp_path, tiny_llama_dir, "int8_wo")), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "INT8 weight-only" in err and "\n" not in err
    assert not out.exists()


def test_example_model_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_llama_dir: Path) -> None:
    target = tmp_path / "m"
    assert main(["example-model", str(target), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["arch"] == "llama" and {f["name"] for f in report["files"]} >= {"config.json", "model.safetensors"}
    assert (target / "model.safetensors").read_bytes() == (tiny_llama_dir / "model.safetensors").read_bytes()
    assert main(["example-model", str(target)]) == 2  # not empty
    assert main(["example-model", str(tmp_path / "x"), "--arch", "gpt2"]) == 2
