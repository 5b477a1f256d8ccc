"""Fixtures of the matrix tests: a real multi-node Ray cluster on this machine, and matrix files.

The cluster is Ray's own test utility (`ray.cluster_utils.Cluster`): a head that runs no task
(num_cpus=0: a task seen anywhere ran on a worker node), a node emulating an H100 host (2 GPUs,
`accelerator_type:H100`) and one emulating an A100 host (1 GPU, `accelerator_type:A100`), each with
one CPU slot. Each worker node has its own workspace (TRTPIPE_HOME through the raylet's environment), as
separate machines would: they share artifacts only through the test registry. HOME points at an empty
folder, so no user Docker config can lend credentials; the registry's come from the environment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SMALL_OBJECT_STORE = 80 * 1024 * 1024


@dataclass
class RayTestCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    address: str
    nodes: dict[str, Any]  # "h100" / "a100" -> ray._private.node.Node
    homes: dict[str, Path]  # node label -> that node's TRTPIPE_HOME
    env: dict[str, str]  # what every worker node's raylet runs with

    def node_id(self, label: str) -> str:
        return self.nodes[label].node_id

    def label_of(self, node_id: str | None) -> str | None:
        return next((label for label, node in self.nodes.items() if node.node_id == node_id), None)

    def add_node(self, label: str, *, gpus: int, accelerator: str | None) -> Any:
        home = self.homes.setdefault(label, self.homes["h100"].parent / f"{label}-home")
        home.mkdir(parents=True, exist_ok=True)
        resources = {f"accelerator_type:{accelerator}": 1} if accelerator else {}
        node = self.cluster.add_node(num_cpus=1, num_gpus=gpus, resources=resources,
                                     object_store_memory=SMALL_OBJECT_STORE,
                                     env_vars={**self.env, "TRTPIPE_HOME": str(home)})
        self.nodes[label] = node
        return node


@pytest.fixture(scope="session")
def ray_cluster(registry: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayTestCluster]:
    import ray
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray-cluster")
    (base / "home").mkdir()
    (base / "docker").mkdir()
    env = {"HOME": str(base / "home"), "DOCKER_CONFIG": str(base / "docker"),
           "TRTPIPE_REGISTRY_USERNAME": registry.username, "TRTPIPE_REGISTRY_PASSWORD": registry.password,
           "OMP_NUM_THREADS": "1"}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": SMALL_OBJECT_STORE, "include_dashboard": False})
    handle = RayTestCluster(cluster=cluster, address=cluster.address, nodes={}, homes={"h100": base / "h100-home"},
                            env=env)
    try:
        handle.add_node("h100", gpus=2, accelerator="H100")
        handle.add_node("a100", gpus=1, accelerator="A100")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, namespace="trtpipe")
        yield handle
    finally:
        ray.shutdown()
        cluster.shutdown()


def registry_remote(registry: Any, repository: str) -> Any:
    """The test registry's repository as the matrix's shared remote cache (credentials given in code)."""
    from trtpipe.settings import Settings
    from trtpipe.stages import weight_file_rule
    from trtpipe.store.remote import open_remote

    settings = Settings(registry_username=registry.username, registry_password=registry.password)
    return open_remote(registry.url(repository), settings, weight_file_rule())


def built_stages(records_root: Path, since_ids: set[str] = frozenset()) -> list[tuple[str, str]]:
    """(stage, key) of every stage a build record under `records_root` says was built (records in
    `since_ids` skipped)."""
    found = []
    for path in sorted((records_root / "records").glob("*.json")):
        record = json.loads(path.read_text())
        if record["id"] in since_ids:
            continue
        found += [(s["name"], s["key"]) for s in record["stages"] if s["outcome"] == "built"]
    return found


def record_ids(root: Path) -> set[str]:
    return {json.loads(p.read_text())["id"] for p in (root / "records").glob("*.json")} if (root / "records").is_dir() else set()


def builds_log(root: Path) -> list[dict[str, Any]]:
    log = root / "builds.log"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def write_matrix(folder: Path, text: str, name: str = "matrix.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture
def head_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The head's workspace, with HOME isolated (no user Docker config)."""
    home = tmp_path / "head-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRTPIPE_HOME", str(home))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    monkeypatch.delenv("TRTPIPE_STORE", raising=False)
    return home



def registry_tags(registry: Any, repository: str) -> list[str]:
    import requests

    answer = requests.get(f"http://{registry.host}/v2/{repository}/tags/list",
                          auth=(registry.username, registry.password), timeout=10)
    if answer.status_code == 404:
        return []
    answer.raise_for_status()
    return sorted(answer.json().get("tags") or [])


def registry_problems(registry: Any, repository: str, scratch: Path) -> list[str]:
    """Every tag of `repository` pulled into a fresh store and every file verified: what is wrong, if anything.
    (A partial push would show as a tag whose blobs are missing or do not match.)"""
    from trtpipe.errors import TrtpipeError
    from trtpipe.store.local import Store

    remote = registry_remote(registry, repository)
    problems: list[str] = []
    for index, tag in enumerate(registry_tags(registry, repository)):
        store = Store.open(scratch / f"pull-{index}")
        try:
            entry = remote.pull(f"{remote.url}:{tag}", store)
            problems += [f"{tag}: {p.file}: {p.reason}" for p in store.check(entry, digests=True)]
        except TrtpipeError as err:
            problems.append(f"{tag}: {err.one_line()}")
        finally:
            store.close()
    return problems
