"""Matrices on a real multi-node Ray cluster (head + emulated H100 and A100 nodes) with the real test registry
as the shared store: builds across nodes with each key built once, all hits decided on the head, GPU cells
placed by accelerator type, cells no node can run refused before scheduling, a deterministic failure not
retried, a node lost in the middle."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    RayTestCluster,
    built_stages,
    builds_log,
    record_ids,
    registry_problems,
    registry_remote,
    registry_tags,
    write_matrix,
)
from trtpipe.matrix.build import build_matrix
from trtpipe.matrix.report import MatrixReport
from trtpipe.settings import Settings
from trtpipe.store.local import Store

pytestmark = pytest.mark.timeout(900)

LIMITS = "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}"

FLEET = """\
name: fleet
base:
  %(limits)s
axes:
  models:
    - {label: llama, path: %(llama)s, dtype: float16}
    - {label: qwen2, path: %(qwen2)s, dtype: float16}
  targets: [cpu-reference]
  quantizations: [none, fp8, int4_awq]
include:
  # the same checkpoint and engine as llama-cpu-reference-none (fp16 is what auto means for float16
  # weights), published under its own name: it must wait for that cell and reuse both
  - {model: llama, quantization: {label: none-kv16, algo: none, kv_cache: fp16}}
"""
CELLS = [f"{m}-cpu-reference-{q}" for m in ("llama", "qwen2") for q in ("none", "fp8", "int4_awq")]
SHARING = "llama-cpu-reference-none-kv16"


@dataclass
class Fleet:
    matrix: Path
    head: Path
    report: MatrixReport
    before: dict[str, set[str]]  # node label -> record ids in its workspace before the build
    remote: Any


def _build(matrix: Path, head: Path, remote: Any, cluster: RayTestCluster, **options: Any) -> MatrixReport:
    store = Store.open(head)
    try:
        return build_matrix(matrix, store=store, remote=remote, ray_address=cluster.address, progress=False,
                            settings=Settings.from_env(), **options)
    finally:
        store.close()


@pytest.fixture(scope="module")
def fleet(ray_cluster: RayTestCluster, registry: Any, tiny_llama_dir: Path, tiny_qwen2_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    folder = tmp_path_factory.mktemp("fleet")
    matrix = write_matrix(folder, FLEET % {"limits": LIMITS, "llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir})
    remote = registry_remote(registry, "matrix/fleet")
    before = {label: record_ids(home) for label, home in ray_cluster.homes.items()}
    report = _build(matrix, folder / "head", remote, ray_cluster)
    return Fleet(matrix=matrix, head=folder / "head", report=report, before=before, remote=remote)


def test_a_matrix_builds_across_the_nodes_each_key_once(fleet: Fleet, ray_cluster: RayTestCluster, registry: Any,
                                                        tmp_path: Path) -> None:
    report = fleet.report
    assert report.status == "ok", report.model_dump_json(indent=1)
    assert [c.cell for c in report.cells] == [*CELLS, SHARING]
    assert report.counts["built"] == 7 and report.exit_code == 0
    workers = {ray_cluster.node_id("h100"), ray_cluster.node_id("a100")}
    assert {c.node_id for c in report.cells} == workers  # both worker nodes built; the head ran nothing

    # Each unique key built once in the fleet, counted from the build records the workers wrote.
    built = []
    for label, home in ray_cluster.homes.items():
        built += built_stages(home, fleet.before[label])
    wanted = {(name, key) for cell in report.cells for name, key in cell.keys.items()}
    assert len(wanted) == 6 + 6 + 7  # six checkpoints and engines; seven repositories (one per cell)
    assert Counter(built) == Counter(wanted)

    # The sharing cell waited for the cell that built its checkpoint and engine, and reused them.
    sharing, first = report.cell(SHARING), report.cell("llama-cpu-reference-none")
    assert sharing.waits_for == ["llama-cpu-reference-none"]
    assert sharing.keys["checkpoint"] == first.keys["checkpoint"] and sharing.keys["engine"] == first.keys["engine"]
    outcomes = {s["name"]: s["outcome"] for s in sharing.stages}
    assert outcomes["checkpoint"] in ("hit", "pulled") and outcomes["engine"] in ("hit", "pulled")
    assert outcomes["publish"] == "built" and sharing.repository != first.repository

    # A build record per cell in the head's workspace, naming the matrix cell it built.
    heads = [p for p in (fleet.head / "records").glob("*.json")]
    assert len(heads) == 7
    assert {c.record_path for c in report.cells} == {str(p) for p in heads}
    assert all(f"{fleet.matrix}#" in p.read_text() for p in heads)

    # Every cell's result pulled from the registry into a fresh store and verified, by digest.
    fresh = Store.open(tmp_path / "fresh")
    for cell in report.cells:
        for kind, stage in (("engine", "engine"), ("repository", "publish")):
            found = fleet.remote.find(kind, cell.keys[stage])
            entry = fleet.remote.pull(found, fresh)
            assert entry.digest == cell.artifacts[kind]
            assert fresh.check(entry, digests=True) == []
    fresh.close()
    assert registry_problems(registry, "matrix/fleet", tmp_path / "check") == []


def test_the_same_matrix_again_is_all_hits_decided_on_the_head(fleet: Fleet, ray_cluster: RayTestCluster,
                                                               tmp_path: Path) -> None:
    logs = {label: builds_log(home) for label, home in ray_cluster.homes.items()}
    records = {label: record_ids(home) for label, home in ray_cluster.homes.items()}
    head = tmp_path / "another-head"  # a fresh head: it decides from the registry alone
    again = _build(fleet.matrix, head, fleet.remote, ray_cluster)
    assert again.status == "ok" and again.counts["hit"] == 7
    assert all(c.outcome == "hit" and c.where == "head" for c in again.cells)
    assert again.tasks == 0 and again.ray is None  # no task sent anywhere; Ray was not even asked
    for label, home in ray_cluster.homes.items():  # no worker node did anything
        assert builds_log(home) == logs[label] and record_ids(home) == records[label]
    assert {c.cell: c.artifacts for c in again.cells} == {c.cell: c.artifacts for c in fleet.report.cells}
    assert len(list((head / "records").glob("*.json"))) == 7  # a record per cell, as for single builds


GPU_DRY = """\
base:
  %(limits)s
  toolchain: trtllm-1.2.1
axes:
  # bfloat16: a checkpoint no other test builds, so every stage would run (and shows what it would run)
  models: [{label: llama, path: %(llama)s, dtype: bfloat16}]
  targets: [h100-sxm, a100-80gb, {label: h100-tp2, gpu: h100-sxm, tp: 2}]
  quantizations: [none]
"""


def test_gpu_cells_dry_run_on_the_node_with_their_accelerator(ray_cluster: RayTestCluster, registry: Any,
                                                             tiny_llama_dir: Path, tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, GPU_DRY % {"limits": LIMITS, "llama": tiny_llama_dir})
    report = _build(matrix, tmp_path / "head", registry_remote(registry, "matrix/gpu-dry"), ray_cluster,
                    dry_run=True)
    assert report.status == "ok" and report.tasks == 3, report.model_dump_json(indent=1)
    placed = {c.cell: ray_cluster.label_of(c.node_id) for c in report.cells}
    assert placed == {"llama-h100-sxm-none": "h100", "llama-a100-80gb-none": "a100", "llama-h100-tp2-none": "h100"}
    for cell in report.cells:
        assert cell.outcome == "planned" and len(cell.attempts) == 1
        engine = next(s for s in cell.stages if s["name"] == "engine")
        assert engine["command"][0] == "trtllm-build"  # the rendered command the GPU node would run
        assert "--checkpoint_dir" in engine["command"]
        checkpoint = next(s for s in cell.stages if s["name"] == "checkpoint")
        assert checkpoint["outcome"] == "would-build"
        assert checkpoint["executor"] in ("local", "docker") and checkpoint["command"]
    assert not list((tmp_path / "head" / "records").glob("*.json"))  # a dry run records no build


REFUSALS = """\
base:
  %(limits)s
  toolchain: trtllm-1.2.1
axes:
  models: [{label: llama, path: %(llama)s, dtype: float16}]
  targets: [b200, {label: h100-x4, gpu: h100-sxm, tp: 4}, {gpu: h100-sxm, executor: local}]
  quantizations: [none]
"""


def test_unrunnable_cells_are_refused_before_scheduling_and_a_build_error_is_not_retried(
        ray_cluster: RayTestCluster, registry: Any, tiny_llama_dir: Path, tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, REFUSALS % {"limits": LIMITS, "llama": tiny_llama_dir})
    report = _build(matrix, tmp_path / "head", registry_remote(registry, "matrix/refusals"), ray_cluster)
    b200, x4, h100 = (report.cell(n) for n in ("llama-b200-none", "llama-h100-x4-none", "llama-h100-sxm-none"))
    assert b200.outcome == "refused" and b200.attempts == []
    assert "needs 1 GPU of Ray accelerator type B200 (b200) on one node" in b200.detail
    assert "pending forever" in b200.detail
    assert x4.outcome == "refused" and "needs 4 GPUs of Ray accelerator type H100" in x4.detail
    # The H100 cell ran on the H100 node, where the pinned TensorRT-LLM is missing: a deterministic failure,
    # reported with its reason after one attempt.
    assert h100.outcome == "failed" and len(h100.attempts) == 1
    assert ray_cluster.label_of(h100.node_id) == "h100"
    assert h100.detail.startswith("local executor (trtllm-1.2.1) cannot run on this host: missing TensorRT-LLM 1.2.1")
    assert report.tasks == 1 and report.exit_code == 1 and report.status == "failed"
    assert h100.record_path is not None and '"status": "failed"' in Path(h100.record_path).read_text()


AUTOSCALE = """\
base:
  %(limits)s
  toolchain: trtllm-1.2.1
axes:
  models: [{label: llama, path: %(llama)s, dtype: bfloat16}]
  targets: [%(target)s]
  quantizations: [none]
"""


def test_waiting_for_nodes_an_autoscaler_adds_or_the_pending_timeout_refuses(
        ray_cluster: RayTestCluster, registry: Any, tiny_llama_dir: Path, tmp_path: Path) -> None:
    remote = registry_remote(registry, "matrix/autoscale")
    never = write_matrix(tmp_path, AUTOSCALE % {"limits": LIMITS, "llama": tiny_llama_dir, "target": "b200"}, "b200.yaml")
    report = _build(never, tmp_path / "head", remote, ray_cluster, dry_run=True, wait_for_nodes=True,
                    pending_timeout=3)
    cell = report.cells[0]
    assert cell.outcome == "refused" and report.tasks == 1  # submitted, waited, then refused
    assert "needs 1 GPU of Ray accelerator type B200 (b200) on one node; no alive node has that for" in cell.detail

    # An "autoscaler" adds an L40S node while the cell waits: the cell runs there. (The build runs in a thread:
    # Ray starts a node only from the main thread.)
    later = write_matrix(tmp_path, AUTOSCALE % {"limits": LIMITS, "llama": tiny_llama_dir, "target": "l40s"}, "l40s.yaml")
    reports: list[MatrixReport] = []
    builder = threading.Thread(target=lambda: reports.append(_build(
        later, tmp_path / "head", remote, ray_cluster, dry_run=True, wait_for_nodes=True, pending_timeout=300)))
    builder.start()
    try:
        time.sleep(1.0)  # the cell is submitted and waiting (an earlier node would only make this test weaker)
        added = ray_cluster.add_node("l40s", gpus=1, accelerator="L40S")
        builder.join(300)
    finally:
        if "l40s" in ray_cluster.nodes:
            ray_cluster.cluster.remove_node(ray_cluster.nodes.pop("l40s"))
    assert reports, "the build did not finish"
    cell = reports[0].cells[0]
    assert cell.outcome == "planned" and cell.node_id == added.node_id, reports[0].model_dump_json(indent=1)


NODE_LOSS = """\
base:
  %(limits)s
axes:
  models:
    - {label: llama, path: %(llama)s, dtype: float16}
    - {label: qwen2, path: %(qwen2)s, dtype: float16}
  targets: [cpu-reference]
  quantizations: [{label: awq-g64, algo: int4_awq, group_size: 64, calibration: {samples: 24}}]
"""


def test_a_node_lost_mid_matrix_its_cell_is_retried_elsewhere(ray_cluster: RayTestCluster, registry: Any,
                                                              tiny_llama_dir: Path, tiny_qwen2_dir: Path,
                                                              tmp_path: Path) -> None:
    matrix = write_matrix(tmp_path, NODE_LOSS % {"limits": LIMITS, "llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir})
    removed: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        # The first cell to start: remove its node at once, as if the machine died under it.
        if event["event"] == "started" and not removed:
            label = ray_cluster.label_of(event["node_id"])
            removed.update(label=label, node_id=event["node_id"], cell=event["task"])
            ray_cluster.cluster.remove_node(ray_cluster.nodes.pop(label), allow_graceful=False)

    try:
        report = _build(matrix, tmp_path / "head", registry_remote(registry, "matrix/node-loss"), ray_cluster,
                        on_event=on_event)
    finally:
        if removed:  # put a node of the same kind back for the tests after this one
            ray_cluster.add_node(removed["label"], gpus=2 if removed["label"] == "h100" else 1,
                                 accelerator="H100" if removed["label"] == "h100" else "A100")
    assert removed, "no cell started"
    assert report.status == "ok", report.model_dump_json(indent=1)
    lost = report.cell(removed["cell"])
    assert lost.outcome == "built" and len(lost.attempts) == 2
    assert lost.attempts[0].outcome == "lost" and lost.attempts[0].node_id == removed["node_id"]
    assert lost.attempts[1].outcome == "ok" and lost.node_id != removed["node_id"]
    assert "lost" in lost.detail and "retried" in lost.detail  # the summary says what happened
    assert report.tasks == 3
    # Whatever the lost worker had pushed, the registry names only complete artifacts, and has the result.
    assert registry_problems(registry, "matrix/node-loss", tmp_path / "check") == []
    tags = registry_tags(registry, "matrix/node-loss")
    for cell in report.cells:
        assert all(any(key in tag for tag in tags) for key in cell.keys.values())
