"""The workspace a trtpipe command works in: one root, its store, the remote cache, results,
channels and the audit trail, and the settings they came from.

The CLI builds one per command (`Workspace.open(--store, settings=...)`, with the settings it read from the
environment), the way a DVC repo object owns its state, cache and remotes; nothing below the CLI decides where
these live. Every library entry point that works in a workspace (the release area's promote, rollback,
channels, report, provenance, trust checks and policy, and `build_session.build`) takes it as its first
argument.

It sits beside the store and the results (layer 3 of tests/test_layers.py), so the release area above can
take it; the channels are the release area's own (`trtpipe.release.channels.ChannelStore(workspace.root)`).

Where the root is (`trtpipe.settings.places`, the one rule):
    --store DIR               that directory
    --store SCHEME://...      a remote cache (oci://HOST/REPO); the root is then the default below
    (no --store)              the same choice from $TRTPIPE_STORE
    (neither)                 $TRTPIPE_HOME, else the user cache dir (~/.cache/trtpipe)
Under the root: the artifact store (`trtpipe.store.local` lists its layout), `results/`,
`channels/`, `audit/` and `records/`. Results and channels are keyed by artifact digest, so a
workspace is as portable as the artifacts in it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trtpipe.errors import InternalError
from trtpipe.settings import Settings, places

if TYPE_CHECKING:
    from trtpipe.results import ResultsLog
    from trtpipe.store.local import Store
    from trtpipe.store.manifest import WeightFiles
    from trtpipe.store.remote import PullGate, RemoteCache


class Workspace:
    """One command's home: opened lazily (a command that never touches the store creates nothing)."""

    def __init__(self, root: Path, *, remote_url: str | None = None, settings: Settings | None = None,
                 weights: Callable[[], WeightFiles] | None = None) -> None:
        self.root = Path(root).expanduser()
        self.remote_url = remote_url
        self.settings = settings if settings is not None else Settings()
        # Which files of each artifact kind hold weights (trtpipe.stages.weight_file_rule, a layer above): what its
        # remote cache holds a pull's declared sizes to. Asked only when the remote is opened.
        self._weights = weights
        self._store: Store | None = None
        self._remote: RemoteCache | None = None

    @classmethod
    def open(cls, store: str | Path | None = None, *, settings: Settings,
             weights: Callable[[], WeightFiles] | None = None) -> Workspace:
        """The workspace for `--store` (None: not given) under `settings` (the CLI's, read from the environment);
        `weights`: the weight-file rule its remote cache needs, when it has one."""
        root, remote_url = places(store, settings)
        return cls(root, remote_url=remote_url, settings=settings, weights=weights)

    def with_settings(self, settings: Settings) -> Workspace:
        """This workspace under other settings (a command that drops one, as promote --no-policy drops
        TRTPIPE_POLICY), sharing the store already opened."""
        other = Workspace(self.root, remote_url=self.remote_url, settings=settings, weights=self._weights)
        other._store = self._store
        return other

    @property
    def store(self) -> Store:
        """The local artifact store at the root (created on first use)."""
        if self._store is None:
            from trtpipe.store.local import Store

            self._store = Store.open(self.root)
        return self._store

    @property
    def remote(self) -> RemoteCache | None:
        """The remote cache --store or $TRTPIPE_STORE names, or None."""
        if self._remote is None and self.remote_url is not None:
            self._remote = self.cache_at(self.remote_url)
        return self._remote

    def cache_at(self, url: str) -> RemoteCache:
        """The remote cache `url` names (a repository: one naming a tag or digest in it is refused), opened with this
        workspace's settings and weight-file rule (`cache push --to URL`)."""
        from trtpipe.store.remote import open_remote

        return open_remote(url, self.settings, self._weight_files(url))

    def remote_for(self, ref: str, *, gate: PullGate | None = None) -> RemoteCache:
        """The remote cache that holds what `ref` names (oci://HOST/REPO:TAG|@DIGEST, or the cache itself), opened
        with this workspace's settings (credentials, insecure hosts) and weight-file rule, every pull judged by
        `gate` (the trust gate, `trtpipe.release.trust.PullGate`; None: verified against its digests only)."""
        from trtpipe.store.remote import open_remote_for_ref

        return open_remote_for_ref(ref, self.settings, self._weight_files(ref), gate=gate)

    def _weight_files(self, url: str) -> WeightFiles:
        if self._weights is None:
            raise InternalError(f"the workspace at {self.root} was opened without the weight-file rule its remote "
                                f"cache {url} needs", fix="report this bug")
        return self._weights()

    @property
    def results(self) -> ResultsLog:
        """The result logs, their heads signed (and checked) with the settings' release key."""
        from trtpipe.results import ResultsLog, current_user
        from trtpipe.signing_keys import release_key

        return ResultsLog(self.root, release_key(self.settings), who=current_user(self.settings))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
