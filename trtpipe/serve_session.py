"""`trtpipe serve REPO` as a library call: a `ServeRequest` in, a `ServeOutcome` (or a `PrintOutcome`) out.

`serve` serves a published repository, watched, until it is asked to stop (trtpipe.serving.watch): under a
trust policy the whole folder is judged first (`release.trust.require_trusted_folder`: a file its signed
manifest does not list is refused, and the serving directory is filled from the verified list), then the
repository's manifest chooses the server: tritonserver here (cpu-reference) or its Triton container (a GPU
target, on upstream's ports unless the request names others). `print_command` is `--print`: the container's
docker command over a kept serving directory, for someone else to run.

What the trust check said is data (`ContentCheck`), handed to `on_checked` as soon as it is known and kept in
the outcome; the caller words it (the CLI names its own options there). This module sits above serving and
beside release (tests/test_layers.py), so that a caller cannot serve a repository without the check its trust
policy asks for; the CLI loads the policy from its options and the workspace, as it does for `build`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, TextIO

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import UsageError

if TYPE_CHECKING:
    from trtpipe.release.policy import TrustPolicy
    from trtpipe.release.trust import VerifiedFolder
    from trtpipe.serving.watch import ServeEvent, ServerStopped
    from trtpipe.workspace import Workspace

# Upstream's container ports (gRPC, HTTP, metrics): what a GPU target's server listens on unless asked otherwise.
CONTAINER_PORTS = (8001, 8000, 8002)


class ServeRequest(BaseModel):
    """What `serve` was asked, every value already checked (the CLI's options, parsed): enough to run the same
    serve again in the background (`--detach`, `foreground_argv`)."""

    model_config = ConfigDict(frozen=True)

    repo: Path
    grpc_port: Optional[int] = None
    http_port: Optional[int] = None
    metrics_port: Optional[int] = None
    start_timeout: float = 120
    restart: Literal["no", "on-failure"] = "no"
    max_restarts: int = 3
    probe_interval: float = 10
    probe_timeout: float = 30
    ready_file: Optional[Path] = None
    log_file: Optional[str] = Field(default=None, description='A path, or "-" to follow the log to a stream.')
    keep_log: bool = False
    # How the caller found its trust policy and workspace: not read here (the caller passes the loaded policy
    # and the workspace), but a background serve must find the same ones.
    policy: Optional[Path] = None
    no_policy: bool = False
    store: Optional[str] = None

    def foreground_argv(self, *, ready_file: Path, log_file: Path) -> list[str]:
        """The same serve in the foreground, writing `ready_file` and logging to `log_file` (for `--detach`)."""
        argv = [sys.executable, "-m", "trtpipe.cli", "serve", str(self.repo.resolve()),
                "--start-timeout", f"{self.start_timeout:g}", "--restart", self.restart,
                "--max-restarts", str(self.max_restarts), "--probe-interval", f"{self.probe_interval:g}",
                "--probe-timeout", f"{self.probe_timeout:g}", "--ready-file", str(ready_file.resolve()),
                "--log-file", str(log_file.resolve())]
        for flag, port in (("--grpc-port", self.grpc_port), ("--http-port", self.http_port),
                           ("--metrics-port", self.metrics_port)):
            if port is not None:
                argv += [flag, str(port)]
        if self.keep_log:
            argv.append("--keep-log")
        if self.policy is not None:
            argv += ["--policy", str(self.policy.resolve())]
        if self.no_policy:
            argv.append("--no-policy")
        if self.store is not None:
            argv += ["--store", self.store]
        return argv


class ContentCheck(BaseModel):
    """What the trust check said of the repository's files, before anything of them is served."""

    repo: Path
    judged: Optional[str] = Field(default=None, description="The policy's judgement (the verified signer, never "
                                  "a claimed one); None when no trust policy is set.")
    unverified: Optional[str] = Field(default=None, description="Why no signature was verified over these files "
                                      "(no policy, or one that lets them through); None when one was.")


@dataclass(frozen=True)
class ServeOutcome:
    """A watched serve that was asked to stop (one that could not serve raises CheckFailed instead): what the
    trust check said, and the last `stopped` event (where the server's log is). A dataclass, not a model, so
    that the watch and its event types load only when a serve runs (a `--detach` parent never needs them)."""

    content: ContentCheck
    stopped: ServerStopped | None = None


class PrintOutcome(BaseModel):
    """`--print`: the docker command that serves a GPU target's repository from a kept serving directory."""

    content: ContentCheck
    command: list[str]
    serving_dir: Path


class NotAContainerTarget(UsageError):
    """A docker command was asked of a repository that is served by the CPU tritonserver here (cpu-reference)."""


def _check_content(workspace: Workspace, repo: Path,
                   trust: TrustPolicy | None) -> tuple[VerifiedFolder | None, ContentCheck]:
    """Judge the whole folder under `trust` (raises Untrusted, recorded in the workspace's audit trail, when
    refused)."""
    verified = None
    if trust is not None:
        from trtpipe.release.trust import require_trusted_folder

        # The whole folder: a file or model folder its signed manifest does not list is refused, and the
        # serving directory is filled from this verified list (nothing added after the check is served).
        verified = require_trusted_folder(workspace, repo, trust, action="serve")
    unverified = None
    if verified is None or not verified.signature_verified:
        unverified = ("no trust policy is set" if trust is None
                      else f"policy {trust.source} lets it through without a verified signature")
    judged = verified.judgement.reason() if verified is not None else None
    return verified, ContentCheck(repo=repo, judged=judged, unverified=unverified)


def _ports(request: ServeRequest, manifest: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """The ports asked for; a container's default to upstream's (here: free ports, chosen when it starts)."""
    from trtpipe.serving.server import in_container

    if not in_container(manifest):
        return request.grpc_port, request.http_port, request.metrics_port
    grpc, http, metrics = CONTAINER_PORTS
    return request.grpc_port or grpc, request.http_port or http, request.metrics_port or metrics


def print_command(workspace: Workspace, request: ServeRequest, *, trust: TrustPolicy | None,
                  on_checked: Callable[[ContentCheck], None] | None = None) -> PrintOutcome:
    """The docker command that serves `request.repo` (a GPU target), over a kept serving directory, one per
    digest (trtpipe does not own that server). Judged under `trust` first; `on_checked` hears the judgement
    before anything else is read. Raises NotAContainerTarget for a cpu-reference repository."""
    from trtpipe.serving.repository_files import read_manifest
    from trtpipe.serving.server import container_name, docker_command, in_container
    from trtpipe.serving.serving_copy import prepare

    verified, content = _check_content(workspace, request.repo, trust)
    if on_checked is not None:
        on_checked(content)
    manifest = read_manifest(request.repo)
    if not in_container(manifest):
        raise NotAContainerTarget(f"{request.repo} is a cpu-reference repository: its server is tritonserver on "
                                  "this host, which has no container command",
                                  fix="serve it here, or publish a build for a GPU target")
    grpc_port, http_port, metrics_port = _ports(request, manifest)
    serving = prepare(request.repo, kept=True, verified=verified)
    command = docker_command(serving.path, manifest, grpc_port=grpc_port, http_port=http_port,
                             metrics_port=metrics_port, name=container_name(serving.repository_digest, grpc_port))
    return PrintOutcome(content=content, command=command, serving_dir=serving.path)


def serve(workspace: Workspace, request: ServeRequest, *, trust: TrustPolicy | None,
          on_event: Callable[[ServeEvent], None], stop: threading.Event,
          on_checked: Callable[[ContentCheck], None] | None = None,
          log_stream: TextIO | None = None) -> ServeOutcome:
    """Serve `request.repo`, watched, until `stop` is set (see the module doc), in `workspace` (its audit trail,
    its settings). `trust`: the policy the folder is judged under (None: none; its content is then served
    unverified). `on_checked` hears the judgement before the server
    starts, `on_event` each of the watch's events. `log_stream`: where a request's log_file "-" follows the
    server's log (default: this process's stderr). Raises Untrusted when the policy refuses the folder,
    CheckFailed when the server cannot serve and the request allows no (more) restarts."""
    from trtpipe.serving.repository_files import read_manifest
    from trtpipe.serving.server import in_container
    from trtpipe.serving.server_log import ServerLog
    from trtpipe.serving.watch import ServerStopped, WatchPolicy, serve_watched

    verified, content = _check_content(workspace, request.repo, trust)
    if on_checked is not None:
        on_checked(content)
    manifest = read_manifest(request.repo)
    settings = workspace.settings
    launcher = None  # the CPU tritonserver here, chosen when it starts
    if in_container(manifest):
        from trtpipe.serving.container import ContainerTriton

        launcher = ContainerTriton.from_settings(manifest, settings)
    grpc_port, http_port, metrics_port = _ports(request, manifest)
    policy = WatchPolicy(probe_interval_s=request.probe_interval, probe_timeout_s=request.probe_timeout,
                         restart=request.restart, max_restarts=request.max_restarts)
    log_file = request.log_file
    server_log = ServerLog(path=None if log_file in (None, "-") else Path(log_file).resolve(),  # type: ignore[arg-type]
                           keep=request.keep_log,
                           follow=(log_stream or sys.stderr) if log_file == "-" else None)
    stopped: list[ServerStopped] = []

    def heard(event: ServeEvent) -> None:
        if isinstance(event, ServerStopped):
            stopped.append(event)
        on_event(event)

    serve_watched(request.repo, on_event=heard, stop=stop, policy=policy, grpc_port=grpc_port, http_port=http_port,
                  metrics_port=metrics_port, start_timeout=request.start_timeout, launcher=launcher,
                  ready_file=request.ready_file, server_log=server_log, verified=verified, settings=settings)
    return ServeOutcome(content=content, stopped=stopped[-1] if stopped else None)
