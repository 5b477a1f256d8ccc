"""What to run next, by error: the CLI's half of an error message.

Library errors say what went wrong and what to change (`fix`), carrying typed fields; they never
name a command or a flag. Here, and only here, an error's type and fields become a command to run.
Every hint names real commands and flags: tests/test_cli_hints.py renders each one and checks every
`trtpipe ...` in it against the typer app.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trtpipe.errors import (
    AccessDenied,
    CheckFailed,
    Conflict,
    DiskFull,
    GateRefused,
    IntegrityError,
    MissingCapability,
    NotFound,
    RemoteError,
    TimedOut,
    TrtpipeError,
    Untrusted,
    WrongAddress,
)


def _always(_err: TrtpipeError) -> bool:
    return True


@dataclass(frozen=True)
class Hint:
    """`text` for an error of type `error` (and its subclasses) when `applies(err)`. `{name}` in the text is
    filled from the error's attribute `name`; `example` gives values to render it with in tests."""

    error: type[TrtpipeError]
    text: str
    applies: Callable[[TrtpipeError], bool] = _always
    example: dict[str, str] = field(default_factory=dict)


def _what(*names: str) -> Callable[[TrtpipeError], bool]:
    return lambda err: getattr(err, "what", None) in names


def _timed_out_building(err: TrtpipeError) -> bool:
    operation = str(getattr(err, "operation", ""))
    return any(word in operation for word in ("build", "conver", "trtllm-build"))


def _server_failed(err: TrtpipeError) -> bool:
    """serve stopped a server that could not serve (trtpipe.serving.watch), under the default policy."""
    return getattr(err, "check", None) in ("stub-died", "server-exited", "probe-failed")


def _model_process_died(err: TrtpipeError) -> bool:
    """A client met a model whose backend process is dead (trtpipe.serving.client.ModelProcessDied)."""
    return bool(getattr(err, "dead_model", None))


def _server_start_timed_out(err: TrtpipeError) -> bool:
    return getattr(err, "operation", None) == "tritonserver start"


def _only_missing(err: TrtpipeError) -> bool:
    """A promotion refused only for results not recorded yet (none recorded that failed)."""
    failed = list(getattr(err, "failed", []))
    return bool(failed) and set(failed) <= set(getattr(err, "missing", []))


def _is_channel(err: TrtpipeError) -> bool:
    return str(getattr(err, "resource", "")).startswith("channel ")


# The first hint that applies is printed (after the error's own fix).
HINTS: tuple[Hint, ...] = (
    Hint(NotFound, "list the stored artifacts with `trtpipe cache ls`", _what("artifact")),
    Hint(NotFound, "list the channels with `trtpipe channels`", _what("channel")),
    Hint(NotFound, "a build prints its repository: `trtpipe build SPEC --json` (repository_path)", _what("repository")),
    Hint(NotFound, "push it first with `trtpipe cache push REF --to oci://HOST/REPOSITORY`", _what("remote artifact")),
    Hint(NotFound, "start a server with `trtpipe serve REPO`", _what("server")),
    Hint(NotFound, "or give one with `trtpipe publish SPEC --engine DIR --tokenizer DIR`", _what("tokenizer")),
    Hint(NotFound, "promote the artifact wanted with `trtpipe promote REF --to {ref}`", _what("earlier digest"),
         example={"ref": "prod"}),
    Hint(GateRefused, "`trtpipe smoke URL --parity SPEC --record REPO` (smoke and parity) and `trtpipe bench URL "
                      "--record REPO` record them, against the server serving it; `trtpipe promote {digest} --to "
                      "{channel} --force --reason TEXT` overrides", _only_missing,
         example={"digest": "sha256:" + "a" * 64, "channel": "prod"}),
    Hint(GateRefused, "`trtpipe results show {digest}` lists what was recorded; `trtpipe promote {digest} --to "
                      "{channel} --force --reason TEXT` overrides",
         example={"digest": "sha256:" + "a" * 64, "channel": "prod"}),
    Hint(Conflict, "see what moved it with `trtpipe history --channel CHANNEL` and promote again", _is_channel),
    Hint(IntegrityError, "check the store and restore damaged artifacts with `trtpipe cache verify --repair`",
         lambda err: bool(getattr(err, "in_store", False))),
    Hint(IntegrityError, "`trtpipe policy set FILE` sets the workspace's policy (recorded); `trtpipe promote REF --to "
                         "CHANNEL --no-policy` and the like run without it (recorded)",
         lambda err: str(getattr(err, "path", "") or "").endswith("/policy/policy.yaml")),
    Hint(Untrusted, "sign artifacts when pushing them: `trtpipe cache push REF --to oci://HOST/REPOSITORY --sign KEY`; "
                    "see who signed one with `trtpipe cache show REF --provenance --policy FILE`"),
    Hint(MissingCapability, "sign with a release key file instead: `trtpipe cache push REF --to oci://HOST/REPOSITORY "
                            "--sign KEY`", lambda err: "keyless sigstore" in getattr(err, "message", "")),
    Hint(MissingCapability, "see what this host can do with `trtpipe check --spec SPEC`"),
    Hint(TimedOut, "raise the executor timeout in the spec (backend.build_timeout, backend.conversion_timeout), or build on "
                   "a faster GPU host; `trtpipe doctor LOG` reads the build log", _timed_out_building,
         example={"operation": "engine build"}),
    Hint(CheckFailed, "`trtpipe serve REPO --restart on-failure` restarts the server by itself (bounded)",
         _server_failed),
    Hint(RemoteError, "restart it; `trtpipe serve REPO --restart on-failure` does so by itself", _model_process_died),
    Hint(TimedOut, "give it longer with `trtpipe serve REPO --start-timeout SECONDS`", _server_start_timed_out),
    Hint(DiskFull, "free space in the store with `trtpipe cache gc --max-size SIZE`, or keep the store on a larger "
                   "disk with `trtpipe build SPEC --store DIR`"),
    Hint(WrongAddress, "`trtpipe serve REPO --ready-file FILE` writes a server's gRPC address (grpc_url) for "
                       "CI steps to read", lambda err: not getattr(err, "grpc_address", None)),
    Hint(AccessDenied, "registry credentials: TRTPIPE_REGISTRY_USERNAME and TRTPIPE_REGISTRY_PASSWORD, or "
                       "`docker login HOST`"),
)


def hint_for(err: TrtpipeError) -> str | None:
    """The first hint that applies to `err`, its `{fields}` filled in; None when there is none."""
    for hint in HINTS:
        if isinstance(err, hint.error) and hint.applies(err):
            values = {name: str(getattr(err, name)) for name in _fields(hint.text) if hasattr(err, name)}
            try:
                return hint.text.format(**values)
            except (KeyError, IndexError):
                return None
    return None


def _fields(text: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(text) if name]
