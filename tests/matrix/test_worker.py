"""What a worker runs for one cell, called directly (no Ray): failures come back as results, a worker that keys
a cell differently from the head fails it, and what a node holds alone is pushed to the shared remote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trtpipe.matrix.worker import CellJob, WorkerResult, run_cell
from trtpipe.pipeline import run_build, stage_keys

from .conftest import registry_remote
from trtpipe.settings import Settings


def _spec(model: Path) -> dict[str, Any]:
    return {"name": "cell", "model": {"path": str(model), "dtype": "float16"}, "target": {"gpu": "cpu-reference"},
            "engine": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128}}


def test_a_worker_of_another_trtpipe_or_other_keys_fails_the_cell(tiny_llama_dir: Path, tmp_path: Path) -> None:
    text = yaml.safe_dump(_spec(tiny_llama_dir))
    job = CellJob(task="cell", attempt=1, spec_name="cell", spec_yaml=text, store_dir=str(tmp_path / "store"),
                  remote_url=None, dry_run=True, trtpipe_version="0.0.0-other")
    other = WorkerResult.model_validate(run_cell(job))
    assert other.status == "failed" and "runs trtpipe" in other.error and "the head 0.0.0-other" in other.error

    spec = tmp_path / "cell.yaml"
    spec.write_text(text)
    keys = stage_keys(spec, store=tmp_path / "store", settings=Settings.from_env())
    same = WorkerResult.model_validate(run_cell(CellJob(
        task="cell", attempt=1, spec_name="cell", spec_yaml=text, store_dir=str(tmp_path / "store"), remote_url=None,
        dry_run=True, expected_keys={"checkpoint": keys["checkpoint"]})))
    assert same.status == "dry-run" and [s["name"] for s in same.stages][:2] == ["resolve", "plan"]
    wrong = WorkerResult.model_validate(run_cell(CellJob(
        task="cell", attempt=1, spec_name="cell", spec_yaml=text, store_dir=str(tmp_path / "store"), remote_url=None,
        dry_run=True, expected_keys={"checkpoint": "0" * 64})))
    assert wrong.status == "failed" and f"keyed the checkpoint {keys['checkpoint']}, the head {'0' * 64}" in wrong.error

    broken = WorkerResult.model_validate(run_cell(CellJob(
        task="cell", attempt=1, spec_name="cell", spec_yaml="model: {path: /nonexistent}\n",
        store_dir=str(tmp_path / "store"), remote_url=None)))
    assert broken.status == "failed" and broken.exit_code == 2 and "/nonexistent does not exist" in broken.error
    assert broken.record is not None and broken.record["status"] == "failed"  # the run's own record comes back


def test_stages_a_node_held_alone_are_pushed_to_the_remote(tiny_llama_dir: Path, tmp_path: Path, registry: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    node_home = tmp_path / "node-home"
    spec = tmp_path / "cell.yaml"
    spec.write_text(yaml.safe_dump(_spec(tiny_llama_dir)))
    built = run_build(spec, store=node_home, progress=False, settings=Settings.from_env())  # this node built it before, with no remote
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRTPIPE_HOME", str(node_home))
    monkeypatch.setenv("TRTPIPE_REGISTRY_USERNAME", registry.username)
    monkeypatch.setenv("TRTPIPE_REGISTRY_PASSWORD", registry.password)
    remote = registry_remote(registry, "matrix/share-local")
    result = WorkerResult.model_validate(run_cell(CellJob(
        task="cell", attempt=1, spec_name="cell", spec_yaml=spec.read_text(), store_dir=None, remote_url=remote.url)))
    assert result.status == "ok", result.error
    assert [s["outcome"] for s in result.stages[2:]] == ["hit", "hit", "hit"]
    assert len(result.shared) == 3 and all("pushed" in note for note in result.shared)
    for kind, digest in built.artifacts.items():
        found = remote.find(kind, built.keys[{"repository": "publish"}.get(kind, kind)])
        assert found is not None and found.artifact_digest == digest
