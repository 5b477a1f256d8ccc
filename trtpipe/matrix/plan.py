"""The matrix plan, made on the head: every cell resolved, planned and keyed, and what is already shared.

For each cell: its spec is checked by `trtpipe.resolve` (every rule; a refused cell gets the one-line,
positioned reason), its memory plan says whether it fits, and its backend's declared stages are keyed
exactly as the runner keys them (`StoredStage.key`, the same digest cache). Each key is looked up in the
shared store: the remote cache when there is one (`RemoteCache.find`: only a manifest is fetched), else the
local store that every worker of a one-machine cluster uses. A cell whose every stage is there is a hit,
decided here: no task is sent for it.

A stage whose key follows an input's digest (the repository follows its engine's bytes) cannot be keyed
before that input exists. It is keyed provisionally, with a stand-in digest derived from the input's key:
since a key is built once and then reused, two cells have the same provisional key exactly when they will
have the same key. That is what merging reads: a stage key several cells share (the checkpoint of the same
model and recipe under two engine profiles, an engine published under two names) is built by the first
cell that needs it, and the others wait for that cell and reuse it: each key is built once in the fleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from trtpipe.errors import SpecError, TrtpipeError
from trtpipe.matrix.accelerators import Request, request_for
from trtpipe.matrix.expand import Cell, expand, in_cell, load_cell
from trtpipe.matrix.loader import MatrixFile, load_matrix
from trtpipe.plan import memory_plan
from trtpipe.resolve import ResolvedSpec, resolve
from trtpipe.stage_plan import entry_dirs, plan_stages
from trtpipe.stages import BACKEND_STAGES, StageContext
from trtpipe.store.local import Store

CellStatus = Literal["build", "hit", "planned", "refused"]
Lookup = Callable[[str, str], "str | None"]


class StageState(BaseModel):
    """One stored stage of a cell as the head sees it."""

    name: str
    kind: str
    key: str
    provisional: bool = Field(default=False, description="Keyed with a stand-in for an input not built yet.")
    present: bool = Field(default=False, description="In the shared store now.")
    digest: str | None = None


class CellPlan(BaseModel):
    """A cell of the matrix, resolved and keyed on the head."""

    cell: str
    labels: dict[str, str]
    origin: str
    gpu: str | None = None  # the catalog name, or cpu-reference
    tp: int = 1
    pp: int = 1
    quantization: str | None = None
    toolchain: str | None = None
    backend: str | None = None
    status: CellStatus
    reason: str | None = None
    fits: bool | None = None
    request: str | None = Field(default=None, description="What its task asks the cluster for.")
    stages: list[StageState] = Field(default_factory=list)
    waits_for: list[str] = Field(default_factory=list, description="Cells that first build a stage this one "
                                                                   "shares: it runs after them and reuses it.")

    @property
    def keys(self) -> dict[str, str]:
        return {s.name: s.key for s in self.stages if not s.provisional}

    def stage_key(self, name: str) -> str | None:
        return next((s.key for s in self.stages if s.name == name), None)

    @property
    def missing(self) -> list[tuple[str, str]]:
        return [(s.kind, s.key) for s in self.stages if not s.present]

    @property
    def shared(self) -> str:
        """What of it the shared store holds: all, none, or which stages."""
        if not self.stages:
            return "-"
        present = [s.name for s in self.stages if s.present]
        if len(present) == len(self.stages):
            return "yes"
        return "no" if not present else "partly: " + ", ".join(present)


class MatrixPlan(BaseModel):
    matrix: str
    file: str
    store: str
    remote: str | None = None
    cells: list[CellPlan]

    def cell(self, name: str) -> CellPlan:
        return next(c for c in self.cells if c.cell == name)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """How many cells are to build, hits, planned, refused (in the JSON as well)."""
        counts = {status: 0 for status in ("build", "hit", "planned", "refused")}
        for cell in self.cells:
            counts[cell.status] += 1
        return counts


@dataclass
class PlannedCell:
    """A cell's plan with what scheduling it needs (not part of the JSON)."""

    cell: Cell
    plan: CellPlan
    resolved: ResolvedSpec | None = None
    request: Request | None = None
    memory_plan: dict[str, Any] | None = None


def shared_lookup(store: Store, remote: Any) -> Lookup:
    """kind, key -> the artifact digest the shared store holds, or None (memoised for one plan)."""
    seen: dict[tuple[str, str], str | None] = {}

    def lookup(kind: str, key: str) -> str | None:
        if (kind, key) not in seen:
            if remote is not None:
                found = remote.find(kind, key)
                seen[(kind, key)] = found.artifact_digest if found is not None else None
            else:
                entry = store.peek(kind, key)
                usable = entry is not None and entry.current and not store.check(entry, digests=False)
                seen[(kind, key)] = entry.digest if usable and entry is not None else None
        return seen[(kind, key)]

    return lookup


def key_stages(resolved: ResolvedSpec, store: Store, lookup: Lookup) -> list[StageState] | None:
    """The cell's stage plan (trtpipe.stage_plan), keyed as the runner keys it, a stage that waits on an input's
    digest keyed provisionally; None for a planning-only spec (no weights)."""
    backend = BACKEND_STAGES[resolved.backend_kind]
    ctx = StageContext(resolved=resolved, build_plan=backend.plan(resolved), digests=store.digests,
                       store_root=store.root, progress=False, dry_run=True)
    plan = plan_stages(backend.stages, ctx, entry_dir=entry_dirs(store), provisional=True,
                       lookup=lambda name, kind, key: lookup(kind, key))
    if any(stage.key is None for stage in plan.stages):
        return None
    return [StageState(name=s.name, kind=s.kind, key=s.key, provisional=s.provisional, present=s.digest is not None,
                       digest=s.digest) for s in plan.stages if s.key is not None]


def _planning_only(cell: Cell) -> bool:
    model = cell.data.get("model")
    return isinstance(model, dict) and model.get("path") is None and model.get("repo_id") is None


def plan_cell(matrix: MatrixFile, cell: Cell, store: Store, lookup: Lookup, configs: Path | None = None) -> PlannedCell:
    """Resolve, plan and key one cell; a cell the rules refuse is a refused plan with the one-line reason."""
    plan = CellPlan(cell=cell.name, labels=cell.labels, origin=cell.origin, status="refused")
    planned = PlannedCell(cell=cell, plan=plan)
    try:
        loaded = load_cell(matrix, cell)
        spec = loaded.spec
        plan.gpu, plan.tp, plan.pp = spec.target.gpu, spec.target.tp, spec.target.pp
        plan.quantization, plan.toolchain = spec.quantization.algo, spec.toolchain
        resolved = resolve(loaded, need_weights=not _planning_only(cell), configs=configs)
        planned.resolved = resolved
        plan.gpu = resolved.gpu.name if resolved.gpu is not None else spec.target.gpu
        plan.toolchain, plan.backend = resolved.toolchain.name, resolved.backend_kind
        figures = memory_plan(resolved)
        planned.memory_plan = figures.model_dump(mode="json")
        plan.fits = figures.fits
        planned.request = request_for(plan.gpu, spec.target.world_size)
        plan.request = planned.request.describe()
        stages = key_stages(resolved, store, lookup)
    except SpecError as err:
        plan.reason = in_cell(err, cell.name).one_line()
        return planned
    except TrtpipeError as err:
        plan.reason = f"cell {cell.name}: {err.one_line()}"
        return planned
    if stages is None:
        plan.status = "planned"
        plan.reason = "planning only (model.config, no weights): the dry run shows what would run"
        return planned
    plan.stages = stages
    plan.status = "hit" if all(s.present for s in stages) else "build"
    return planned


def link_cells(planned: list[PlannedCell]) -> None:
    """Each stage key missing from the shared store is built by the first cell (in file order) that needs it;
    a later cell that needs it too waits for that cell. (Cells never share every key: each cell is its own
    artifact, named after its labels, so its repository key is its own.)"""
    owner: dict[tuple[str, str], str] = {}
    for item in planned:
        plan = item.plan
        if plan.status != "build":
            continue
        waits = []
        for missing in plan.missing:
            builder = owner.setdefault(missing, plan.cell)
            if builder != plan.cell and builder not in waits:
                waits.append(builder)
        plan.waits_for = waits


def plan_matrix(matrix_path: Path | str, store: Store, remote: Any = None, *,
                configs: Path | None = None) -> tuple[MatrixPlan, list[PlannedCell]]:
    """Expand, resolve, plan and key every cell of a matrix file against the shared store.

    `store`: the head's local store (its digest cache; the shared store itself when there is no remote);
    `remote`: the shared remote cache, or None; `configs`: the head's build_configs/ folder (None: the shipped
    one; a worker resolves with its own node's)."""
    matrix = load_matrix(matrix_path)
    lookup = shared_lookup(store, remote)
    planned = [plan_cell(matrix, cell, store, lookup, configs) for cell in expand(matrix)]
    link_cells(planned)
    plan = MatrixPlan(matrix=matrix.name, file=matrix.display_path, store=str(store.root),
                      remote=str(remote) if remote is not None else None, cells=[p.plan for p in planned])
    return plan, planned
