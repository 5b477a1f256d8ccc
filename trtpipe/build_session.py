"""A build as a user asks for it (`trtpipe build SPEC`): request -> `build` -> the build's report.

`build` wires what the request and the workspace say around the build itself: the remote cache, opened
with the trust gate every pull passes (`release.trust.open_gated`); the runner's judge of pulled entries
when a trust policy is set; the signer of what the build pushes when the workspace has a signing key; and
the choice between the resolution memo (`warm.warm_build`: nothing the last resolution read changed, no
remote, no policy) and resolving (`pipeline.run_build`). The CLI parses its options into a `BuildRequest`,
loads the trust policy (its options name the policy file), calls `build` once and renders the report;
tests call `build` as the CLI does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from trtpipe.build_report import BuildReport
    from trtpipe.release.policy import TrustPolicy
    from trtpipe.workspace import Workspace


class BuildRequest(BaseModel):
    """`trtpipe build SPEC [--dry-run] [--force STAGE] [--verify] [--remote-mode M] [--require-remote]`."""

    model_config = ConfigDict(frozen=True)

    spec: Path
    dry_run: bool = False
    force: tuple[str, ...] = ()  # stored stages to build again (checked against the spec's backend when it resolves)
    verify: bool = False  # check every reused file's sha256, not only sizes
    remote_mode: str | None = None  # read-write or read-only; None: as the settings say
    require_remote: bool = False  # a remote cache that is away fails the build


def _push_signer(workspace: Workspace, remote_url: str) -> Any:
    """What signs each entry the build pushes: the workspace's signing key (TRTPIPE_SIGNING_KEY), or None.

    A build that pushes unsigned entries fills a cache that no workspace under a trust policy can hit (issue 28,
    attack 9): so where a key is configured, a build signs what it pushes, as `cache push --sign` does. A bad
    key fails here, before anything is built."""
    from trtpipe.release.trust import push_signer, signing_key
    from trtpipe.store.remote import judges_pulls

    key = signing_key(None, workspace.settings)
    if key is None or not judges_pulls(remote_url):  # a remote that keeps no signatures has nowhere for one
        return None
    return push_signer(workspace, key)


def build(workspace: Workspace, request: BuildRequest, *, trust: TrustPolicy | None = None,
          note: Callable[[str], None] | None = None, progress: bool = True) -> BuildReport:
    """Build (or reuse) every stage of the request's spec in the workspace's store, with the remote cache its
    remote URL names (None: the local store only), judged by `trust` (None: no policy); `note` hears what the
    trust gate says of each pull. Raises TrtpipeError when a stage fails, BuildInterrupted on Ctrl-C (its report
    says what was stored)."""
    from trtpipe.store.remote import remote_use

    store, remote_url, settings = workspace.store, workspace.remote_url, workspace.settings
    use = remote_use(settings, mode=request.remote_mode, required=request.require_remote)
    remote = None
    pulled_check = None
    if trust is not None or remote_url is not None:
        from trtpipe.release.trust import PullGate, open_gated, pulled_checker

        if remote_url is not None:  # every pull from it judged by the trust gate it is opened with
            remote = open_gated(workspace, remote_url, PullGate(workspace, trust, note=note))
        if trust is not None:
            pulled_check = pulled_checker(workspace, trust)
    sign_push = _push_signer(workspace, remote_url) if remote_url is not None and use.pushes else None
    # The warm path reuses a resolution and its entries as they were; a trust policy judges them again.
    if not (request.dry_run or request.force or request.verify) and remote_url is None and trust is None:
        # Every input as at the spec's last build: reuse its resolution (trtpipe.warm), else resolve.
        from trtpipe.shipped import build_configs_dir
        from trtpipe.warm import warm_build

        report = warm_build(request.spec, store, progress=progress, configs=build_configs_dir(settings))
        if report is not None:
            return report
    from trtpipe.pipeline import run_build

    return run_build(request.spec, dry_run=request.dry_run, force=request.force, verify=request.verify, store=store,
                     remote=remote, progress=progress, pulled_check=pulled_check, remote_use=use,
                     sign_push=sign_push, settings=settings)


__all__ = ["BuildRequest", "build"]
