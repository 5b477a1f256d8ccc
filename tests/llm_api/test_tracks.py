"""The same spec with only `backend` changed: two tracks, two artifacts with different keys; the llm-api track's
stages, its key's contents, and where its export runs for a GPU target."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtpipe.pipeline import run_build
from trtpipe.serving.validate import validate_repository
from trtpipe.store.local import Store
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(900)


def _flip(spec: Path, backend: str) -> Path:
    other = spec.with_name(f"{spec.stem}-{backend}.yaml")
    other.write_text(spec.read_text().replace("backend: llm-api", f"backend: {backend}"))
    return other


def test_only_the_backend_differs_and_the_keys_differ(tiny_spec, tmp_path) -> None:
    llm_api = tiny_spec()
    reference = _flip(llm_api, "reference")
    a = run_build(llm_api, dry_run=True, store=tmp_path / "store", progress=False, settings=Settings.from_env())
    b = run_build(reference, dry_run=True, store=tmp_path / "store", progress=False, settings=Settings.from_env())
    assert [s.name for s in a.stages] == ["resolve", "plan", "export", "publish"]
    assert [s.name for s in b.stages] == ["resolve", "plan", "checkpoint", "engine", "publish"]
    assert a.backend == "llm-api" and b.backend == "reference"
    assert a.keys["export"] != b.keys["checkpoint"]


def test_the_artifact_key_names_the_weights_recipe_llm_args_and_versions(tiny_spec, tmp_path) -> None:
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec
    from trtpipe.stages.base import StageContext
    from trtpipe.stages.hf_checkpoint import HfCheckpointStage

    def key(spec: Path):
        resolved = resolve(load_spec(spec))
        store = Store(tmp_path / "store")
        ctx = StageContext(resolved=resolved, build_plan=resolved.llm_api, digests=store.digests,
                           store_root=store.root, progress=False, dry_run=True)
        return HfCheckpointStage().key(ctx, {})

    base = key(tiny_spec(algo="fp8", kv_cache="fp8"))
    doc = base.inputs
    assert doc["kind"] == "hf-checkpoint" and doc["export"] == "modelopt-unified-hf"
    assert doc["quant"]["algo"] == "fp8" and doc["quant"]["calibration"]["samples"] == 4
    assert doc["llm_args"]["kv_cache_config"]["dtype"] == "fp8" and doc["trtllm_version"] == "1.2.1"
    assert doc["modelopt_version"] == "0.37" and doc["model"]["weights"]
    assert "tp" not in doc and "pp" not in doc  # they are in llm_args (the weights do not depend on them)
    text = json.dumps(doc)
    assert str(tmp_path) not in text and "/tmp" not in text  # no path in a key
    assert key(tiny_spec(algo="fp8", kv_cache="fp8", tp=2)).key != base.key
    assert key(tiny_spec(algo="fp8", kv_cache="fp8")).key == base.key


def test_a_gpu_target_exports_in_the_executor(gpu_spec, tmp_path) -> None:
    """A planning-only GPU spec's dry run: the export would run in the toolchain's container, with --artifact hf."""
    spec = gpu_spec(quantization={"algo": "fp8"}, target={"gpu": "h100-sxm", "executor": "docker"})
    report = run_build(spec, dry_run=True, store=tmp_path / "store", progress=False, settings=Settings.from_env())
    export = report.stage("export")
    assert export.outcome == "would-build" and export.executor == "docker"
    assert export.command[-2:] == ["--artifact", "hf"]
    assert export.container["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


def test_both_tracks_build_from_the_same_spec(tiny_spec, tmp_path) -> None:
    llm_api = tiny_spec()
    a = run_build(llm_api, store=tmp_path / "store", progress=False, settings=Settings.from_env())
    b = run_build(_flip(llm_api, "reference"), store=tmp_path / "store", progress=False, settings=Settings.from_env())
    assert a.status == b.status == "ok"
    assert set(a.artifacts) == {"hf-checkpoint", "repository"}
    assert set(b.artifacts) == {"checkpoint", "engine", "repository"}
    assert a.artifacts["repository"] != b.artifacts["repository"]
    repo = Path(a.repository_path)
    assert json.loads((repo / "trtpipe.json").read_text())["layout"] == "llmapi"
    assert validate_repository(repo) == []
    assert (repo / "tensorrt_llm" / "1" / "checkpoint" / "llm_args.json").is_file()
    again = run_build(llm_api, store=tmp_path / "store", progress=False, settings=Settings.from_env())
    assert {s.name: s.outcome for s in again.stages if s.name in ("export", "publish")} == {"export": "hit",
                                                                                            "publish": "hit"}


def test_the_llmapi_repository_key_covers_the_llmapi_templates(tiny_spec, tmp_path) -> None:
    """The llm-api publish key carries the llmapi layout's templates digest (triton_repo/llmapi/), not the
    inflight_batcher_llm one: an edit to the llmapi model.py republishes, an edit to the ensemble's does not."""
    from trtpipe.resolve import resolve
    from trtpipe.serving.templates import templates_digest
    from trtpipe.spec_loader import load_spec
    from trtpipe.stages.base import InputRef, StageContext
    from trtpipe.stages import BACKEND_STAGES

    resolved = resolve(load_spec(tiny_spec()))
    store = Store(tmp_path / "store")
    ctx = StageContext(resolved=resolved, build_plan=resolved.llm_api, digests=store.digests,
                       store_root=store.root, progress=False, dry_run=True)
    publish = BACKEND_STAGES["llm-api"].stages[-1]
    key = publish.key(ctx, {"export": InputRef(key=None, digest="sha256:" + "a" * 64, path=tmp_path)})
    assert key.inputs["templates"] == templates_digest(layout="llmapi")
    assert key.inputs["templates"] != templates_digest()


def test_force_names_only_a_stage_of_the_specs_own_backend(tiny_spec, tmp_path) -> None:
    """`--force export` on a reference spec, `--force engine` on an llm-api spec: each backend has no such stage,
    so the build would force nothing; it is refused with one line (exit 2), before any stage runs."""
    import subprocess
    import sys

    llm_api = tiny_spec()
    reference = _flip(llm_api, "reference")
    env = {**os.environ, "TRTPIPE_HOME": str(tmp_path / "home")}
    for spec, stage, own in ((reference, "export", "checkpoint, engine, publish"), (llm_api, "engine", "export, publish")):
        for json_flag in ((), ("--json",)):
            done = subprocess.run([sys.executable, "-m", "trtpipe.cli", "build", str(spec), "--force", stage, *json_flag],
                                  capture_output=True, text=True, env=env, timeout=300)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2, done.stderr
            assert len(lines) == 1 and f"--force {stage}" in lines[0] and f"use one of {own} or all" in lines[0], lines
            assert "Traceback" not in done.stderr
            if json_flag:
                outcome = json.loads(done.stdout)
                assert outcome["ok"] is False and f"no {stage} stage" in outcome["error"]["message"]
    # Nothing was built: no stage ran before the refusal.
    store = tmp_path / "home"
    assert not any((store / kind).is_dir() and any((store / kind).iterdir()) for kind in ("checkpoint", "export", "engine", "repository"))
    # A stage of the spec's own backend, and all, are taken (a dry run: keys only).
    for spec, stage in ((reference, "engine"), (llm_api, "export"), (llm_api, "all")):
        assert run_build(spec, dry_run=True, force=[stage], store=store, progress=False, settings=Settings.from_env()).status == "dry-run"
