"""What a matrix build reports: one result per cell, the counts, and how it exits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

CellOutcome = Literal["built", "hit", "failed", "refused", "planned", "cancelled"]
OUTCOMES: tuple[str, ...] = ("built", "hit", "failed", "refused", "planned", "cancelled")


class Attempt(BaseModel):
    """One try of a cell's task on a node."""

    attempt: int
    node_id: str | None = None
    host: str | None = None
    outcome: str = Field(description="ok, failed, dry-run, lost (the worker or its node died), cancelled, refused")
    detail: str | None = None


class CellResult(BaseModel):
    cell: str
    outcome: CellOutcome
    detail: str | None = Field(default=None, description="The reason, error, or what happened on the way.")
    node_id: str | None = Field(default=None, description="The node of the attempt that finished it.")
    host: str | None = None
    where: str = Field(default="worker", description="head: decided on the head; worker: a task ran it.")
    attempts: list[Attempt] = Field(default_factory=list)
    keys: dict[str, str] = Field(default_factory=dict)
    artifacts: dict[str, str] = Field(default_factory=dict, description="kind -> artifact digest")
    stages: list[dict[str, Any]] = Field(default_factory=list, description="Each step's outcome (and dry-run commands).")
    waits_for: list[str] = Field(default_factory=list)
    record_path: str | None = None
    seconds: float | None = Field(default=None, description="The worker's run time.")
    queued_seconds: float | None = Field(default=None, description="Submitted until a worker started it.")
    overhead_seconds: float | None = Field(default=None, description="Submitted until the head had its result, "
                                                                     "less the worker's run time.")

    @property
    def repository(self) -> str | None:
        return self.artifacts.get("repository")


class MatrixReport(BaseModel):
    matrix: str
    file: str
    store: str
    remote: str | None = None
    ray: str | None = Field(default=None, description="The cluster the tasks ran on (None: no task was needed).")
    dry_run: bool = False
    status: Literal["ok", "failed", "interrupted"] = "ok"
    message: str | None = None
    cells: list[CellResult] = Field(default_factory=list)
    tasks: int = Field(default=0, description="Tasks submitted to the cluster (retries included).")
    decide_seconds: float = Field(default=0.0, description="Resolving, keying and looking up every cell on the head.")
    seconds: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """How many cells ended each way (in the JSON as well)."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for cell in self.cells:
            counts[cell.outcome] += 1
        return counts

    def cell(self, name: str) -> CellResult:
        return next(c for c in self.cells if c.cell == name)

    @property
    def exit_code(self) -> int:
        """0 when every cell is built, a hit or planned; 1 when any failed, was refused or cancelled."""
        bad = {"failed", "refused", "cancelled"}
        return 1 if any(c.outcome in bad for c in self.cells) else 0
