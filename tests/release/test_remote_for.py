"""The workspace opens every remote the release area uses (`Workspace.remote_for(ref)`, `Workspace.cache_at(url)`):
with its settings and weight-file rule and the trust gate it is given; promote, rollback and provenance ask it
instead of assembling `open_remote(...)` themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.errors import InternalError, UsageError
from trtpipe.settings import Settings
from trtpipe.workspace import Workspace

REF = "oci://127.0.0.1:1/team/engines:v1"


def _rule() -> dict:
    return {"engine": ("rank0.engine",)}


def test_remote_for_opens_the_repository_a_ref_names_with_the_workspaces_rule_and_gate(tmp_path: Path) -> None:
    def gate(*_: object) -> None:
        return None

    workspace = Workspace(tmp_path, settings=Settings(), weights=_rule)
    remote = workspace.remote_for(REF, gate=gate)
    assert remote.url == "oci://127.0.0.1:1/team/engines" and remote.gate is gate and remote.weights == _rule()
    assert workspace.remote_for("oci://127.0.0.1:1/team/engines@sha256:" + "a" * 64).gate is None
    # A cache URL names a repository: a tag in it is refused, not dropped.
    assert workspace.cache_at("oci://127.0.0.1:1/team/engines").url == "oci://127.0.0.1:1/team/engines"
    with pytest.raises(UsageError, match="names a tag or digest, not a repository"):
        workspace.cache_at(REF)


def test_a_workspace_without_the_weight_file_rule_refuses_to_open_a_remote(tmp_path: Path) -> None:
    with pytest.raises(InternalError, match=f"without the weight-file rule its remote cache {REF} needs"):
        Workspace(tmp_path, settings=Settings()).remote_for(REF)


class _Asked(Exception):
    pass


class _Recording(Workspace):
    """A workspace that records which refs the library asked it to open, and opens none."""

    asked: list[str]

    def remote_for(self, ref: str, *, gate: object = None) -> object:  # type: ignore[override]
        self.asked = [*getattr(self, "asked", []), ref]
        raise _Asked(ref)


def test_promote_and_provenance_open_a_registry_ref_through_the_workspace(tmp_path: Path) -> None:
    from trtpipe.release.promote import PromoteRequest, promote
    from trtpipe.release.trust import show_provenance

    workspace = _Recording(tmp_path, settings=Settings())
    with pytest.raises(_Asked):
        promote(workspace, PromoteRequest(ref=REF, to="prod"))
    with pytest.raises(_Asked):
        show_provenance(workspace, REF, None)
    assert workspace.asked == [REF, REF]
