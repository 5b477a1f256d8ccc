"""trtpipe's settings from the environment: the one module that reads environment variables.

Every variable trtpipe honours is listed in `VARIABLES` (docs/cli.md's table is checked against it).

The rule: nothing below the CLI reads the environment. `Settings.from_env()` is called by the shell only
(trtpipe/cli.py and trtpipe/commands/: `commands.output.open_workspace`), once per command; the
workspace carries the result (`Workspace.settings`) and every library function that needs a setting takes
a `Settings` (or the workspace) from its caller as a required parameter, never `os.environ` and never a
`None -> from_env()` fallback. The other process entries read their own settings once, as the CLI does: a
matrix worker's Ray task (`trtpipe.matrix.worker.run_cell`: its node's, so a node's TRTPIPE_HOME and registry
credentials stay on it), and a conversion child (`trtpipe.engine.convert_entry`, whose executor sets
TRTPIPE_BUILD_CONFIGS to the tables the build resolved with). TRTPIPE_BUILD_CONFIGS reaches the table readers
as a folder their caller hands down (`trtpipe.shipped.build_configs_dir(settings)`, kept on the resolved spec).
tests/test_environment_reads.py checks the rule over the package's source, with its few exceptions listed there
(reads that are not trtpipe settings, and the process entries). Variables other tools define for themselves or
their children (CUDA_VISIBLE_DEVICES, DOCKER_HOST ...) are theirs, not trtpipe settings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

_URL_RE = re.compile(r"^([a-z][a-z0-9+.-]*)://")

# name -> what it sets (one line each; docs/cli.md lists them).
VARIABLES: dict[str, str] = {
    "TRTPIPE_HOME": "the workspace: artifact store, results, channels, audit trail, build records "
                    "(default: the user cache dir, e.g. ~/.cache/trtpipe)",
    "TRTPIPE_STORE": "the default for --store: a store directory, or a remote build cache URL (oci://HOST/REPO)",
    "TRTPIPE_REMOTE_MODE": "how a build uses its remote cache when --remote-mode is not given: read-write (pull hits, "
                           "push what it built; the default) or read-only (pull hits, never push: pull requests, forks)",
    "TRTPIPE_REQUIRE_REMOTE": "1: a build fails when its remote cache is down or refuses the credentials (default 0: "
                              "a warning, and the build goes on locally), as --require-remote",
    "TRTPIPE_BUILD_CONFIGS": "the build_configs/ folder to read (default: the one trtpipe ships; trtpipe --version "
                             "names the folder in use)",
    "TRTPIPE_REGISTRY_USERNAME": "registry user name (with TRTPIPE_REGISTRY_PASSWORD; else the Docker config)",
    "TRTPIPE_REGISTRY_PASSWORD": "registry password or token",
    "TRTPIPE_REGISTRY_INSECURE": "comma-separated registry hosts reached over plain HTTP (loopback always is)",
    "DOCKER_CONFIG": "folder of the Docker config.json whose auths entries give registry credentials",
    "TRTPIPE_USER": "who is acting, in results and the audit trail (else GITHUB_ACTOR, GITLAB_USER_LOGIN, the login name)",
    "GITHUB_ACTOR": "who is acting, in GitHub Actions",
    "GITLAB_USER_LOGIN": "who is acting, in GitLab CI",
    "TRTPIPE_SIGNING_KEY": "the release key pushes sign with when --sign is not given: a PEM EC P-256 private key "
                           "file, or the PEM text itself (a CI secret)",
    "TRTPIPE_POLICY": "the trust policy file (YAML) pull, serve, build, promote and rollback enforce when --policy is "
                      "not given and the workspace has none of its own (trtpipe policy set)",
    "TRTPIPE_DOCKER": "the container runtime executable GPU serve runs the Triton container with (default: docker on "
                      "PATH)",
    "COLUMNS": "the width tables wrap to when stdout is not a terminal (a pipe, a CI log): at least 120 columns",
    "TRTPIPE_MIN_BENCH_RUNS": "the fewest recorded bench runs of a digest a bench gate judges (default 3; every run "
                              "counts)",
}


# Variables that carry secrets: never handed to a child process (tritonserver and its Python stubs run
# repository code; converters and trtllm-build need no registry), never printed.
SECRET_VARIABLES: tuple[str, ...] = (
    "TRTPIPE_REGISTRY_USERNAME", "TRTPIPE_REGISTRY_PASSWORD", "TRTPIPE_SIGNING_KEY",
    "ORAS_USER", "ORAS_PASS", "DOCKER_AUTH_CONFIG",
)
_USERINFO_RE = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/@]*)@")


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment (or `environ`) without the secret variables: what a child gets."""
    env = dict(os.environ if environ is None else environ)
    for name in SECRET_VARIABLES:
        env.pop(name, None)
    return env


def has_credentials(url: str | None) -> bool:
    """True for `scheme://user[:password]@host/...` (credentials in a reference)."""
    return bool(url) and _USERINFO_RE.match(str(url)) is not None


def redact_credentials(url: str) -> str:
    """`oci://alice:secret@host/repo` -> `oci://***@host/repo` (for messages that must name a reference)."""
    return _USERINFO_RE.sub(lambda m: m.group(1) + "***@", url, count=1)


def refuse_credentials(url: str | None) -> None:
    """A reference never carries credentials: they would be echoed, recorded in the audit trail and the
    channel files, and sent to whoever the reference names. Refused without repeating them."""
    from trtpipe.errors import InvalidInput

    if url and has_credentials(url):
        raise InvalidInput(
            f"{redact_credentials(url)}: a registry reference must not carry credentials (user:password@); "
            "nothing was sent or recorded",
            fix="remove them from the reference and pass them as TRTPIPE_REGISTRY_USERNAME and "
                "TRTPIPE_REGISTRY_PASSWORD (a CI secret), or through a Docker config.json (docker login)",
        )


@dataclass(frozen=True)
class Settings:
    """What the environment sets (None: not set). Built once per command; a plain dataclass, so the CLI's
    start-up does not pay for pydantic before a command needs it."""

    home: Path | None = None
    store: str | None = None
    build_configs: Path | None = None
    registry_username: str | None = None
    registry_password: str | None = field(default=None, repr=False)  # never in a repr, a log or an error
    registry_insecure: tuple[str, ...] = ()
    docker_config: Path | None = None
    actor: str | None = None
    signing_key: str | None = field(default=None, repr=False)  # a path or PEM text: never in a repr or a log
    policy: Path | None = None
    docker: str | None = None  # the container runtime's executable (a name on PATH or a path)
    columns: int | None = None  # the shell's COLUMNS: how wide a table may be outside a terminal (None: not set)
    min_bench_runs_text: str | None = None  # as set; `min_bench_runs()` checks it where a gate needs it
    # As written; trtpipe.store.remote.remote_use checks them (a bad value is an error where a build uses them).
    remote_mode: str | None = None
    require_remote: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get(name)
            return value if value else None

        def path(name: str) -> Path | None:
            value = text(name)
            return Path(value).expanduser() if value is not None else None

        password = env.get("TRTPIPE_REGISTRY_PASSWORD")
        return cls(
            home=path("TRTPIPE_HOME"),
            store=text("TRTPIPE_STORE"),
            build_configs=path("TRTPIPE_BUILD_CONFIGS"),
            registry_username=text("TRTPIPE_REGISTRY_USERNAME"),
            # An empty password is a password (a token registry may take any), so only unset is None.
            registry_password=password,
            registry_insecure=tuple(h.strip() for h in (text("TRTPIPE_REGISTRY_INSECURE") or "").split(",") if h.strip()),
            docker_config=path("DOCKER_CONFIG"),
            actor=text("TRTPIPE_USER") or text("GITHUB_ACTOR") or text("GITLAB_USER_LOGIN"),
            signing_key=text("TRTPIPE_SIGNING_KEY"),
            policy=path("TRTPIPE_POLICY"),
            docker=text("TRTPIPE_DOCKER"),
            columns=_positive_int(text("COLUMNS")),
            min_bench_runs_text=text("TRTPIPE_MIN_BENCH_RUNS"),
            remote_mode=text("TRTPIPE_REMOTE_MODE"),
            require_remote=text("TRTPIPE_REQUIRE_REMOTE"),
        )

    def min_bench_runs(self) -> int:
        """TRTPIPE_MIN_BENCH_RUNS as a whole number >= 1 (default 3); a UsageError naming it otherwise.
        Checked where a gate needs it, so a bad value does not stop commands that judge no gate."""
        from trtpipe.errors import UsageError

        if self.min_bench_runs_text is None:
            return 3
        text = self.min_bench_runs_text.strip()
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"TRTPIPE_MIN_BENCH_RUNS={self.min_bench_runs_text!r} is not a whole number of runs >= 1",
                             fix="set it to 3 or more (a regression can be decided from 3 runs of each digest), or unset it")
        return int(text)

    def default_home(self) -> Path:
        """Where the workspace lives when nothing else says: $TRTPIPE_HOME, else the user cache dir."""
        if self.home is not None:
            return self.home
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("trtpipe"))

    def docker_config_file(self) -> Path:
        base = self.docker_config
        return base / "config.json" if base is not None else Path.home() / ".docker" / "config.json"


def _positive_int(value: str | None) -> int | None:
    """An integer above 0, else None (a shell's COLUMNS can be anything; a bad one is as good as unset)."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def url_scheme(text: str | None) -> str | None:
    """`oci` for `oci://...`; None for a path (a path never starts with `scheme://`)."""
    match = _URL_RE.match(str(text or ""))
    return match.group(1) if match else None


class Places(NamedTuple):
    """Where a command's workspace is: its local root, and the remote cache URL if one is named."""

    root: Path
    remote_url: str | None


def places(store: str | Path | None, settings: Settings) -> Places:
    """The one rule for where things live (`trtpipe.workspace` documents it):
    --store DIR, else $TRTPIPE_STORE as a directory, else $TRTPIPE_HOME, else the user cache dir;
    a `scheme://` value names a remote cache instead, and the root is then the default."""
    chosen = str(store) if store is not None and str(store) != "" else settings.store
    refuse_credentials(chosen)
    if chosen and url_scheme(chosen) is not None:
        return Places(settings.default_home(), chosen)
    if chosen:
        return Places(Path(chosen).expanduser(), None)
    return Places(settings.default_home(), None)
