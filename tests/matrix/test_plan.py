"""The matrix plan on the head, without a cluster: cells keyed as the runner keys them, refused cells with their
positioned reason, planning-only cells, shared stages ordered, hits read from the shared store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtpipe.cli import main
from trtpipe.matrix.expand import expand
from trtpipe.matrix.loader import load_matrix
from trtpipe.matrix.plan import plan_matrix
from trtpipe.pipeline import run_build, stage_keys
from trtpipe.store.local import Store
from trtpipe.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

MATRIX = """\
name: plan-test
base:
  engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}
  toolchain: trtllm-1.2.1
axes:
  models:
    - {label: llama, path: %(llama)s, dtype: float16}
  targets: [cpu-reference, a100-80gb]
  quantizations: [none, fp8]
exclude:
  - {target: cpu-reference, quantization: fp8}
include:
  - {model: llama, target: cpu-reference, quantization: {label: none-kv16, algo: none, kv_cache: fp16}}
  - model: {label: llama3-8b, config: %(config)s, dtype: bfloat16}
    target: h100-sxm
    quantization: fp8
"""


@pytest.fixture
def matrix(tiny_llama_dir: Path, tmp_path: Path) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(MATRIX % {"llama": tiny_llama_dir, "config": ROOT / "build_configs/models/llama-3-8b/config.json"})
    return path


def _cell_spec(matrix: Path, cell: str, folder: Path) -> Path:
    data = next(c.data for c in expand(load_matrix(matrix)) if c.name == cell)
    path = folder / f"{cell}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_then_build_one_cell_then_plan_again(matrix: Path, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    plan, _ = plan_matrix(matrix, store)
    status = {c.cell: c.status for c in plan.cells}
    assert status == {
        "llama-cpu-reference-none": "build", "llama-a100-80gb-none": "build", "llama-a100-80gb-fp8": "refused",
        "llama-cpu-reference-none-kv16": "build", "llama3-8b-h100-sxm-fp8": "planned",
    }
    assert plan.counts == {"build": 3, "hit": 0, "planned": 1, "refused": 1}

    # The refusal is the rule's own, cited at the line of the matrix that set the field.
    line = MATRIX.splitlines().index("  quantizations: [none, fp8]") + 1
    assert plan.cell("llama-a100-80gb-fp8").reason.startswith(
        f"{matrix}:{line}:25: quantization.algo: cell llama-a100-80gb-fp8: fp8 needs fp8 tensor cores")

    # Keys are the runner's (a dry run of the cell's spec keys the same checkpoint and engine).
    none = plan.cell("llama-cpu-reference-none")
    runner = stage_keys(_cell_spec(matrix, none.cell, tmp_path), store=tmp_path / "dry", settings=Settings.from_env())
    assert none.keys == {"checkpoint": runner["checkpoint"], "engine": runner["engine"]}
    assert [s.provisional for s in none.stages] == [False, False, True]  # publish follows the engine's digest

    # The same checkpoint and engine under another name: built once, by the first cell; the other waits.
    kv16 = plan.cell("llama-cpu-reference-none-kv16")
    assert kv16.stage_key("checkpoint") == none.stage_key("checkpoint")
    assert kv16.stage_key("engine") == none.stage_key("engine")
    assert kv16.stage_key("publish") != none.stage_key("publish") and kv16.waits_for == [none.cell]
    # A GPU target converts the same checkpoint (same key), so it waits for that cell as well.
    assert plan.cell("llama-a100-80gb-none").waits_for == [none.cell]

    built = run_build(_cell_spec(matrix, none.cell, tmp_path), store=store, progress=False, settings=Settings.from_env())
    again, _ = plan_matrix(matrix, store)
    hit = again.cell(none.cell)
    assert hit.status == "hit" and hit.shared == "yes" and not any(s.provisional for s in hit.stages)
    assert {s.kind: s.digest for s in hit.stages} == built.artifacts
    kv16 = again.cell("llama-cpu-reference-none-kv16")
    assert kv16.status == "build" and kv16.shared == "partly: checkpoint, engine" and kv16.waits_for == []
    # Its repository key, no longer provisional, is the one the runner gives it now that the engine exists.
    assert kv16.stage_key("publish") == stage_keys(_cell_spec(matrix, kv16.cell, tmp_path), store=store, settings=Settings.from_env())["publish"]
    store.close()


def test_matrix_plan_command(matrix: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "home"))
    assert main(["matrix", "plan", str(matrix)]) == 1  # a refused cell: not everything the file asks can be built
    # The table wraps a long cell between words (where depends on the temporary path's length): read it as words.
    out = " ".join(capsys.readouterr().out.split())
    assert "llama-a100-80gb-fp8" in out and "refused: " in out and "fp8 needs fp8 tensor cores" in out
    assert "build (after llama-cpu-reference-none, whose stages it reuses)" in out
    assert "3 build, 0 hit, 1 planned, 1 refused" in out
    assert main(["matrix", "plan", str(matrix), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["counts"]["refused"] == 1 and len(data["cells"]) == 5

    bad = tmp_path / "bad.yaml"
    bad.write_text("axes:\n  model: []\n")
    assert main(["matrix", "plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {bad}:2:3: axes.model: unknown key 'model'; did you mean 'models'?"


def test_the_shipped_sample_matrix_plans(tiny_llama_dir: Path, tiny_qwen2_dir: Path, tmp_path: Path) -> None:
    """build_configs/examples/matrices/tiny.yaml, in a checkout-like layout with the tiny models in out/."""
    matrices = tmp_path / "build_configs" / "examples" / "matrices"
    matrices.mkdir(parents=True)
    (matrices / "tiny.yaml").write_text((ROOT / "build_configs/examples/matrices/tiny.yaml").read_text())
    (tmp_path / "build_configs" / "models").symlink_to(ROOT / "build_configs" / "models")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tiny-llama").symlink_to(tiny_llama_dir)
    (tmp_path / "out" / "tiny-qwen2").symlink_to(tiny_qwen2_dir)
    store = Store.open(tmp_path / "store")
    plan, _ = plan_matrix(matrices / "tiny.yaml", store)
    store.close()
    assert plan.counts == {"build": 6, "hit": 0, "planned": 2, "refused": 0}
    assert {c.gpu for c in plan.cells if c.status == "planned"} == {"h100-sxm", "a100-80gb"}
