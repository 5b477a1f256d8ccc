"""Remote build caches: the interface the pipeline, `cache push|pull`, repair and promote use, and the
registry that picks an implementation by URL scheme.

Two roles, two protocols: an `ArtifactRemote` keeps artifacts by kind/key (the build's remote cache, `cache
push|pull`, repair), a `ChannelMirror` keeps channel tags and their trails (promote, `channels --verify`).
A remote of a scheme (`RemoteCache`) is both. Its pulls go through the gate it is opened with (`PullGate`:
the release area's trust gate, or none), never one set on it later.

Today one scheme exists, `oci://HOST/REPOSITORY` (`trtpipe.store.oci`: any OCI registry). An S3 or
GCS cache is one new module implementing `RemoteCache` plus one line in `SCHEMES`. Nothing else
looks at a URL's scheme: callers ask `is_remote_url` and `open_remote`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from trtpipe.errors import AccessDenied, InvalidInput, RemoteError, TimedOut, TrtpipeError, UsageError
from trtpipe.settings import refuse_credentials, url_scheme

if TYPE_CHECKING:
    from pathlib import Path

    from trtpipe.settings import Settings
    from trtpipe.store.local import Building, Entry, Store
    from trtpipe.store.manifest import WeightFiles

Progress = Callable[[str, int], None]


class RemoteArtifact(Protocol):
    """An artifact the remote holds (its manifest checked; no file downloaded yet)."""

    @property
    def ref(self) -> Any: ...  # str() is a reference pinned to exactly this artifact
    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def artifact_digest(self) -> str: ...
    @property
    def size(self) -> int: ...  # bytes a pull downloads


class Pushed(Protocol):
    """What a push left in the remote."""

    @property
    def ref(self) -> Any: ...  # str() is a reference pinned to exactly what was pushed
    @property
    def artifact_digest(self) -> str: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def files(self) -> int: ...
    @property
    def bytes(self) -> int: ...


class TrailCopy(Protocol):
    """A channel trail as the remote keeps it."""

    @property
    def digest(self) -> str: ...  # what the tag named when read (a compare-and-swap expects it still)
    @property
    def head(self) -> bytes: ...
    @property
    def log(self) -> bytes | None: ...  # None: a head-only copy from before trails were shared


class Described(Protocol):
    """An artifact a remote reference names: its digest, its store manifest, the pinned reference."""

    @property
    def artifact_digest(self) -> str: ...
    @property
    def manifest(self) -> dict[str, Any]: ...  # the artifact's manifest.json (its key document under "inputs")
    @property
    def pinned(self) -> str: ...  # a reference that names exactly this artifact forever


class ArtifactRemote(Protocol):
    """A shared store of artifacts, keyed like the local store (kind/key), verified on every pull (and judged by
    the gate it was opened with)."""

    url: str  # the cache itself (no tag or digest), for messages and reports

    def probe(self) -> None:
        """Reach the cache and check the credentials, quickly: RemoteError (down), AccessDenied (refused)."""

    def find(self, kind: str, key: str) -> RemoteArtifact | None:
        """The artifact of `kind/key` if the remote holds it (nothing downloaded)."""

    def pull_into(self, handle: Building, *, progress: Progress | None = None) -> Entry | None:
        """Inside `store.building(kind, key)` (lock held, no entry yet): fill the handle from the remote and
        publish it; None when the remote does not hold that key."""

    def push(self, entry: Entry, *, tags: tuple[str, ...] = (), progress: Progress | None = None) -> Pushed:
        """Share a local entry (its files individually, so a pull verifies each)."""

    def resolve(self, ref: str) -> RemoteArtifact:
        """The artifact a full reference within this remote names (e.g. oci://HOST/REPO:TAG)."""

    def pull(self, ref: str | RemoteArtifact, store: Store, *, progress: Progress | None = None) -> Entry:
        """Install the artifact `ref` names (or `resolve` found) into `store`, verified."""

    def describe(self, ref: str) -> Described:
        """What `ref` names, verified against its artifact digest (for promote)."""


class ChannelMirror(Protocol):
    """Where a workspace's channels are shared: each channel's movable tag and the trail kept beside it."""

    url: str  # the mirror itself, for messages and reports

    def point_tag(self, pinned: str, tag: str) -> None:
        """Point a movable tag (a channel) at the artifact `pinned` names."""

    def get_channel_trail(self, tag: str) -> TrailCopy | None:
        """The channel trail kept under the movable `tag` (its head, its records, the manifest digest the tag
        named when read), or None."""

    def put_channel_trail(self, tag: str, head: bytes, log: bytes, *, expect: str | None) -> str:
        """Keep a channel trail under `tag`, moving the tag only if it still names `expect` (None: no tag);
        `trtpipe.errors.TagMoved` when it does not. Returns the new copy's digest."""

    def get_trail_head(self, tag: str) -> bytes | None:
        """The head kept under `tag` (a head-only copy from before trails were shared, or a trail's), or None."""


class RemoteCache(ArtifactRemote, ChannelMirror, Protocol):
    """What a scheme opens: an OCI repository keeps artifacts and channels side by side."""


# A pull's last check, between download and install: (the remote pulling, the artifact, the folder of its
# staged files, its manifest.json bytes) -> None, or raise to refuse it (nothing is installed). The release
# area's trust gate is one (trtpipe.release.trust.PullGate); the store knows none.
PullGate = Callable[[Any, RemoteArtifact, "Path", bytes], None]


RemoteMode = Literal["read-write", "read-only"]
REMOTE_MODES: tuple[str, ...] = ("read-write", "read-only")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class RemoteUse:
    """How a build uses its remote cache, as Bazel's remote cache and sccache do.

    `mode`: read-write pulls hits and pushes what it built; read-only pulls hits and never pushes (a pull
    request, a fork: it may read the shared cache, never write it). `required`: False (the default) makes a
    cache that is down or refuses the credentials a warning, and the build goes on with the local store;
    True makes it an error (a job whose point is to fill the cache)."""

    mode: RemoteMode = "read-write"
    required: bool = False

    @property
    def pushes(self) -> bool:
        return self.mode == "read-write"


def remote_use(settings: Settings, *, mode: str | None = None, required: bool = False) -> RemoteUse:
    """The RemoteUse a build runs under: its options (`mode`, `required`) over the settings
    (TRTPIPE_REMOTE_MODE, TRTPIPE_REQUIRE_REMOTE); a value that is neither is one InvalidInput line."""
    chosen = mode if mode is not None else (settings.remote_mode or "read-write")
    if chosen not in REMOTE_MODES:
        where = "--remote-mode" if mode is not None else "TRTPIPE_REMOTE_MODE"
        raise InvalidInput(f"{where}={chosen!r} is not a remote cache mode", fix=f"use one of {', '.join(REMOTE_MODES)}")
    text = (settings.require_remote or "0").strip().lower()
    if text not in _TRUE + _FALSE:
        raise InvalidInput(f"TRTPIPE_REQUIRE_REMOTE={settings.require_remote!r} is not a yes or no",
                           fix="set it to 1 (a build fails when its remote cache is away) or 0 (the default: a warning)")
    return RemoteUse(mode=chosen, required=required or text in _TRUE)  # type: ignore[arg-type]


# What a cache that is away raises: down or erroring (RemoteError), refusing the credentials or lacking them
# (AccessDenied), or too slow (TimedOut: a credential helper). A damaged or untrusted entry is none of these:
# it stays an error whatever the mode.
UNAVAILABLE: tuple[type[TrtpipeError], ...] = (RemoteError, AccessDenied, TimedOut)


def is_unavailable(err: TrtpipeError) -> bool:
    """True for an error that says the remote cache is away (not that what it holds is wrong)."""
    return isinstance(err, UNAVAILABLE)


@dataclass(frozen=True)
class RemoteKind:
    """One URL scheme: how to open a cache, which cache a full artifact reference lives in, and whether its
    pulls call the gate it is opened with (a kind that keeps no signatures has nothing for a gate to judge)."""

    open: Callable[[str, "Settings", "WeightFiles", "PullGate | None"], RemoteCache]
    base_of: Callable[[str], str]
    judges_pulls: bool = True


def _open_oci(url: str, settings: Settings, weights: WeightFiles, gate: PullGate | None) -> RemoteCache:
    from trtpipe.store.oci import OciRemote

    return OciRemote(url, settings=settings, weights=weights, gate=gate)


def _oci_base(ref: str) -> str:
    from trtpipe.store.oci import parse_oci_ref

    return parse_oci_ref(ref).base


# scheme -> its kind. A new remote (S3, GCS ...): one module implementing RemoteCache, one line here.
SCHEMES: dict[str, RemoteKind] = {
    "oci": RemoteKind(open=_open_oci, base_of=_oci_base),
}


def is_remote_url(text: str | None) -> bool:
    """True for any `scheme://...` text (a path never has one); `open_remote` says if the scheme is known."""
    return bool(text) and url_scheme(str(text)) is not None


def _kind(url: str) -> RemoteKind:
    refuse_credentials(url)
    kind = SCHEMES.get(url_scheme(url) or "")
    if kind is None:
        raise UsageError(
            f"{url!r} is not a remote trtpipe knows",
            fix=f"use one of {', '.join(s + '://' for s in SCHEMES)} (e.g. oci://HOST[:PORT]/REPOSITORY), or a local directory",
        )
    return kind


def open_remote(url: str, settings: Settings, weights: WeightFiles, *, gate: PullGate | None = None) -> RemoteCache:
    """The remote cache `url` names, with the caller's settings (credentials, insecure hosts), every pulled file's
    declared size held to `weights` (trtpipe.stages.weight_file_rule: which files of a kind hold weights), every
    pull judged by `gate` (None: only verified against its digests); a one-line UsageError for a scheme trtpipe
    has no remote for."""
    return _kind(url).open(url, settings, weights, gate)


def judges_pulls(url: str) -> bool:
    """Whether the remote `url` names (a cache or a full reference) calls its gate on every pull."""
    return _kind(url).judges_pulls


def open_remote_for_ref(ref: str, settings: Settings, weights: WeightFiles, *,
                        gate: PullGate | None = None) -> RemoteCache:
    """The remote cache that holds the artifact `ref` names (a full reference, e.g. oci://HOST/REPO:TAG)."""
    kind = _kind(ref)
    return open_remote(kind.base_of(ref), settings, weights, gate=gate)
