"""The Ray cluster a matrix runs on: an embedded local instance by default, or an existing cluster.

Ray is an optional dependency (the `matrix` extra): it is imported here, and only when a matrix has work
to send (a matrix whose every cell is a hit never starts or joins a cluster). The embedded instance is
small on purpose (a 200 MB object store, no dashboard): results are a few kilobytes; artifacts travel
through the shared store, never through Ray.

Feasibility is read from the nodes' total resources (`ray.nodes()`): Ray itself leaves a task that no
node can run pending forever, without an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from trtpipe.errors import MissingCapability, RemoteError

EMBEDDED_OBJECT_STORE_BYTES = 200 * 1024 * 1024
NAMESPACE = "trtpipe"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingCapability(
            "building a matrix needs Ray, which is not installed",
            fix="install the matrix extra: pip install 'trtpipe[matrix]' (ray==2.60.0)") from None
    return ray


@dataclass(frozen=True)
class Node:
    node_id: str
    host: str
    resources: dict[str, float]

    def describe(self) -> str:
        gpus = int(self.resources.get("GPU", 0))
        types = sorted(k.split(":", 1)[1] for k in self.resources if k.startswith("accelerator_type:"))
        cpus = self.resources.get("CPU", 0)
        what = f"{gpus} GPU {'/'.join(types) or '(no accelerator type)'}" if gpus else "no GPU"
        return f"{self.host} {self.node_id[:8]} ({what}, {cpus:g} CPU)"


class ProgressBoard:
    """An actor on the head's node that workers post progress events to, and the head drains."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def post(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def drain(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events


class RayCluster:
    """A connection to Ray for one matrix run (a context manager).

    `address` None starts an embedded local instance (stopped at the end); an address (`auto`,
    `HOST:PORT`, `ray://HOST:10001`) joins an existing cluster. A process already connected (a test, a
    notebook) is used as it is and left connected."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self.ray: Any = None
        self._owned = False

    def __enter__(self) -> RayCluster:
        ray = self.ray = import_ray()
        if ray.is_initialized():
            return self
        common = {"log_to_driver": False, "logging_level": logging.ERROR, "namespace": NAMESPACE}
        try:
            if self.address is None:
                # "local": always a new instance. Without an address Ray would join the last cluster started on
                # this machine (/tmp/ray/ray_current_cluster, or RAY_ADDRESS), which is not the embedded default.
                ray.init(address="local", object_store_memory=EMBEDDED_OBJECT_STORE_BYTES, include_dashboard=False,
                         **common)
            else:
                ray.init(address=self.address, **common)
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = self.address or "an embedded local instance"
            raise RemoteError(f"cannot start or join Ray ({where}): {' '.join(str(err).split())[:300]}",
                              remote=where,
                              fix="check the address (`ray status` on the cluster's head prints it) and that this "
                                  "machine reaches it, or leave it out to run on this machine") from None
        self._owned = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self.ray.shutdown()
            self._owned = False

    @property
    def where(self) -> str:
        return self.address or "embedded local Ray"

    def nodes(self) -> list[Node]:
        """The alive nodes and their total resources."""
        found = []
        for node in self.ray.nodes():
            if not node.get("Alive"):
                continue
            host = str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "?")
            found.append(Node(node_id=str(node["NodeID"]), host=host,
                              resources={k: float(v) for k, v in (node.get("Resources") or {}).items()}))
        return found

    def driver_node(self) -> str | None:
        try:
            return str(self.ray.get_runtime_context().get_node_id())
        except Exception:  # a Ray client connection has no local node
            return None

    def board(self) -> Any:
        """A ProgressBoard actor, placed on the driver's node when there is one (it outlives worker nodes)."""
        options: dict[str, Any] = {"num_cpus": 0}
        driver = self.driver_node()
        if driver is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=driver, soft=True)
        return self.ray.remote(ProgressBoard).options(**options).remote()
