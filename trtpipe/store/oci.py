"""OCI registry backend: push and pull store entries as OCI artifacts, move channel tags.

An entry (engine, repository or checkpoint directory with its `manifest.json`) becomes one OCI
image manifest:
  - config: the entry's `manifest.json` bytes, media type `application/vnd.trtpipe.<kind>.manifest.v1+json`;
  - one layer per file (no tar: a tar carries owner, mode and mtime, so its digest changes across
    machines), media type `application/vnd.trtpipe.file.v1`, the relative path in
    `org.opencontainers.image.title`;
  - annotations naming the kind, key, artifact digest, model, target GPU and SM, toolchain and quant.
No timestamp goes into the manifest, so the same entry pushed from two machines has one OCI digest.

The oras SDK (oras-py) carries the HTTP; its traps (see shared/notes/oci-registry.md) are handled
here: credentials are set as a header up front and never through `login()` (which writes the
user's Docker config), every request has a timeout and the registry is probed with a short one
first, blobs are pushed chunked, and every pulled byte is verified against its descriptor before
anything is used, because neither the SDK nor the registry verifies digests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import requests

from trtpipe.errors import (
    AccessDenied,
    Conflict,
    IntegrityError,
    InvalidInput,
    MissingCapability,
    NotFound,
    RemoteError,
    TagMoved,
    TimedOut,
    Untrusted,
    UsageError,
)
from trtpipe.settings import Settings, refuse_credentials
from trtpipe.store import signatures
from trtpipe.store.manifest import (
    KINDS,
    MANIFEST_VERSION,
    MAX_FILES,
    WeightFiles,
    entry_path_problem,
    parse_manifest,
    size_cap,
)

if TYPE_CHECKING:
    from trtpipe.store.remote import PullGate

OCI_MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
FILE_MEDIA_TYPE = "application/vnd.trtpipe.file.v1"
TITLE_ANNOTATION = "org.opencontainers.image.title"
ANNOTATION_PREFIX = "org.trtpipe."
ARTIFACT_DIGEST_ANNOTATION = "org.trtpipe.artifact.digest"
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# The registry's own cap on a manifest (distribution refuses larger ones); a config is a store manifest.json.
MAX_OCI_MANIFEST_BYTES = 4 * 2**20
MAX_CONFIG_BYTES = 64 * 2**20
PROBE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = (10.0, 300.0)  # (connect, read between bytes)
CHUNK_SIZE = 16 * 1024 * 1024

_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def config_media_type(kind: str) -> str:
    return f"application/vnd.trtpipe.{kind}.manifest.v1+json"


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class OciRef:
    """`oci://host[:port]/repo/path[:tag|@sha256:...]` split into its parts."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str | None:
        return self.digest or self.tag

    @property
    def base(self) -> str:
        return f"oci://{self.host}/{self.repository}"

    def with_tag(self, tag: str) -> OciRef:
        return OciRef(self.host, self.repository, tag=tag)

    def with_digest(self, digest: str) -> OciRef:
        return OciRef(self.host, self.repository, digest=digest)

    def __str__(self) -> str:
        if self.digest:
            return f"{self.base}@{self.digest}"
        if self.tag:
            return f"{self.base}:{self.tag}"
        return self.base


TRAIL_HEAD_MEDIA_TYPE = "application/vnd.trtpipe.trail-head.v1+json"  # a workspace trail's head alone (before shared trails)
MAX_TRAIL_HEAD_BYTES = 64 * 1024
# A channel's shared trail: the config blob is its (signed) head, the one layer the JSONL records.
CHANNEL_TRAIL_HEAD_MEDIA_TYPE = "application/vnd.trtpipe.channel-trail-head.v1+json"
CHANNEL_TRAIL_MEDIA_TYPE = "application/vnd.trtpipe.channel-trail.v1+jsonl"
MAX_CHANNEL_TRAIL_BYTES = 64 * 2**20


def parse_oci_ref(text: str) -> OciRef:
    """Parse `oci://host/repo[:tag|@digest]`; raise a UsageError naming what is wrong (credentials in
    the reference are refused without being repeated)."""
    refuse_credentials(text)
    if not text.startswith("oci://"):
        raise UsageError(f"{text!r} is not an OCI reference", fix="write it as oci://HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST]")
    rest = text[len("oci://") :]
    if "/" not in rest:
        raise UsageError(f"{text!r} has no repository", fix="write it as oci://HOST[:PORT]/REPOSITORY, e.g. oci://127.0.0.1:5000/engines")
    host, path = rest.split("/", 1)
    digest = tag = None
    if "@" in path:
        path, digest = path.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise UsageError(f"{text!r}: {digest!r} is not a sha256 digest", fix="use @sha256:<64 lowercase hex digits>")
    else:
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG_RE.match(tag):
                raise UsageError(f"{text!r}: tag {tag!r} is invalid", fix="tags are [A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
    if not host or not _REPO_RE.match(path):
        raise UsageError(f"{text!r}: repository {path!r} is invalid", fix="use lowercase names separated by '/', e.g. oci://HOST/team/engines")
    return OciRef(host=host, repository=path, tag=tag, digest=digest)


def sanitize_tag(text: str) -> str:
    """Make a valid OCI tag out of free text (model and target names)."""
    tag = re.sub(r"[^A-Za-z0-9._-]", "-", text)
    if not tag or not re.match(r"[A-Za-z0-9_]", tag[0]):
        tag = "_" + tag
    return tag[:128]


def key_tag(kind: str, key: str) -> str:
    """The immutable tag an entry is pushed under, so `find(kind, key)` and `pull_into` can find it."""
    return sanitize_tag(f"{kind}-{key}")


# --------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    source: str  # where they came from, for error messages (never the secret itself)

    def __repr__(self) -> str:  # never let a password reach a log through repr()
        return f"Credentials(username={self.username!r}, source={self.source!r})"


def resolve_credentials(host: str, settings: Settings) -> Credentials | None:
    """Credentials for `host`: $TRTPIPE_REGISTRY_USERNAME/PASSWORD, else the Docker config's `auths` (both as
    the caller's `settings` say: nothing here reads the environment)."""
    user, password = settings.registry_username, settings.registry_password
    if user and password is not None:
        return Credentials(user, password, "TRTPIPE_REGISTRY_USERNAME/TRTPIPE_REGISTRY_PASSWORD")
    path = settings.docker_config_file()
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InvalidInput(f"{path} is not valid JSON", fix="repair it or set TRTPIPE_REGISTRY_USERNAME/PASSWORD") from None
    auths = config.get("auths", {}) if isinstance(config, dict) else {}
    helper = (config.get("credHelpers") or {}).get(host) or config.get("credsStore")
    for name in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"):
        entry = auths.get(name)
        if not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(entry["auth"]).decode("utf-8")
                u, p = decoded.split(":", 1)
            except (ValueError, UnicodeDecodeError):
                raise InvalidInput(f"{path}: auths.{name}.auth is not base64 of user:password", fix="run `docker login` again") from None
            return Credentials(u, p, str(path))
        if entry.get("username") and entry.get("password") is not None:
            return Credentials(entry["username"], entry["password"], str(path))
    if helper:
        return _from_credential_helper(str(helper), host)
    return None


def _from_credential_helper(helper: str, host: str) -> Credentials | None:
    """`docker-credential-<helper> get` (what `docker login` uses with a credsStore or credHelpers)."""
    import subprocess

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", helper):
        raise InvalidInput(f"the Docker config names an invalid credential helper {helper!r}",
                           fix="name a docker-credential-* helper in credsStore/credHelpers")
    binary = shutil.which(f"docker-credential-{helper}")
    if binary is None:
        raise MissingCapability(
            f"the Docker config uses credential helper {helper!r} but docker-credential-{helper} is not on PATH",
            fix="install it, or set TRTPIPE_REGISTRY_USERNAME and TRTPIPE_REGISTRY_PASSWORD",
        )
    try:
        proc = subprocess.run([binary, "get"], input=host, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise TimedOut(f"docker-credential-{helper} did not answer within 30 s", operation=f"docker-credential-{helper} get",
                       seconds=30, fix="check the credential helper, or set TRTPIPE_REGISTRY_USERNAME/PASSWORD") from None
    if proc.returncode != 0:
        return None  # the helper holds nothing for this host
    try:
        data = json.loads(proc.stdout)
        return Credentials(str(data["Username"]), str(data["Secret"]), f"docker-credential-{helper}")
    except (ValueError, KeyError, TypeError):
        raise InvalidInput(f"docker-credential-{helper} returned an unreadable answer",
                           fix="check the credential helper, or set TRTPIPE_REGISTRY_USERNAME/PASSWORD") from None


def _insecure(host: str, settings: Settings) -> bool:
    """Plain HTTP for loopback registries or when the user says so; TLS everywhere else."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    if name in ("localhost", "127.0.0.1", "[::1]"):
        return True
    allowed = settings.registry_insecure
    return host in allowed or "*" in allowed


# --------------------------------------------------------------------------- client


class _BoundedSession(requests.Session):
    """A requests session whose every call has a timeout (oras-py sets none)."""

    def __init__(self, timeout: float | tuple[float, float]) -> None:
        super().__init__()
        self.default_timeout = timeout

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", self.default_timeout)
        return super().request(method, url, *args, **kwargs)


class OciClient:
    """A thin, bounded, verifying client for one registry host, over oras-py."""

    def __init__(self, host: str, credentials: Credentials | None = None, *, timeout: float | tuple[float, float] = REQUEST_TIMEOUT_S,
                 settings: Settings) -> None:
        import oras.provider
        from http.cookiejar import DefaultCookiePolicy

        self.host = host
        self.insecure = _insecure(host, settings)
        self.scheme = "http" if self.insecure else "https"
        self.credentials = credentials if credentials is not None else resolve_credentials(host, settings)
        self._docker_config = settings.docker_config_file()
        # oras' "basic" backend (its token backend fails against htpasswd registries). Registries that
        # answer with a Bearer challenge (GHCR, ECR, Docker Hub, Harbor with token auth) get the
        # standard token exchange below, done by us so it too is bounded and never logs a secret.
        self.reg = oras.provider.Registry(hostname=host, insecure=self.insecure, auth_backend="basic")
        session = _BoundedSession(timeout)
        session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
        self.reg.session = session
        self.reg.auth.session = session
        self._basic: str | None = None
        if self.credentials is not None:
            self.reg.auth.set_basic_auth(self.credentials.username, self.credentials.password)
            self._basic = "Basic " + base64.b64encode(f"{self.credentials.username}:{self.credentials.password}".encode()).decode()
        self._bearer_challenge: dict[str, str] | None = None  # set by probe() when the registry wants tokens
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._probed = False

    # -- errors -------------------------------------------------------------------------
    def _fail(self, what: str, reason: str) -> RemoteError:
        reason = " ".join(reason.split())
        secrets = [self.credentials.password] if self.credentials is not None and self.credentials.password else []
        secrets += [v for v in (self._basic, *self._tokens.values()) if v]
        for secret in secrets:
            reason = reason.replace(secret, "***")
        return RemoteError(f"registry {self.host}: {what}: {reason}", remote=self.host,
                           fix="check that the registry is up and accepts this request")

    def _unauthorized(self, what: str = "") -> AccessDenied:
        if self.credentials is None:
            return AccessDenied(
                f"registry {self.host} requires credentials and none were found", resource=self.host,
                fix=f"set TRTPIPE_REGISTRY_USERNAME and TRTPIPE_REGISTRY_PASSWORD, or add an auths entry for {self.host} to {self._docker_config} (docker login {self.host})",
            )
        return AccessDenied(
            f"registry {self.host} rejected the credentials of user {self.credentials.username!r} (401 Unauthorized; from {self.credentials.source})",
            resource=self.host,
            fix="check the username and password (or token) for this registry" + (f"; and that it may {what}" if what else ""),
        )

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}{path}"

    # -- auth ---------------------------------------------------------------------------
    def _token(self, scope: str | None) -> str:
        """A bearer token from the registry's token service for `scope` (cached)."""
        key = scope or ""
        if key in self._tokens:
            return self._tokens[key]
        challenge = self._bearer_challenge or {}
        realm = challenge.get("realm")
        if not realm:
            raise self._fail("token auth", "the Bearer challenge names no realm")
        params = {"service": challenge["service"]} if challenge.get("service") else {}
        if scope:
            params["scope"] = scope
        headers = {"Authorization": self._basic} if self._basic else {}
        try:
            response = self.reg.session.request("GET", realm, params=params, headers=headers, timeout=PROBE_TIMEOUT_S * 3)
        except requests.RequestException as exc:
            raise self._fail("token service unreachable", type(exc).__name__) from None
        if response.status_code in (401, 403):
            raise self._unauthorized()
        if response.status_code != 200:
            raise self._fail("token service", f"HTTP {response.status_code} {response.reason}")
        try:
            body = response.json()
            token = str(body.get("token") or body.get("access_token"))
        except (ValueError, AttributeError):
            raise self._fail("token service", "the answer is not JSON") from None
        if not token or token == "None":
            raise self._fail("token service", "the answer holds no token")
        self._tokens[key] = token
        return token

    def _auth_for(self, repository: str | None, write: bool) -> dict[str, str]:
        if self._bearer_challenge is not None:
            scope = f"repository:{repository}:{'pull,push' if write else 'pull'}" if repository else None
            return {"Authorization": "Bearer " + self._token(scope)}
        return {"Authorization": self._basic} if self._basic else {}

    def _request(self, method: str, path: str, *, what: str, repository: str | None = None, headers: dict[str, str] | None = None,
                 data: bytes | None = None, stream: bool = False) -> requests.Response:
        self.probe()
        write = method not in ("GET", "HEAD")
        all_headers = self._auth_for(repository, write)
        all_headers.update(headers or {})
        try:
            response = self.reg.session.request(method, self._url(path), headers=all_headers, data=data, stream=stream, verify=not self.insecure)
        except requests.RequestException as exc:
            raise self._fail(what, type(exc).__name__) from None
        if response.status_code == 401:
            raise self._unauthorized("pull" if not write else "push")
        if response.status_code == 403:
            raise AccessDenied(f"registry {self.host}: {what}: access denied (403)", resource=self.host,
                               fix="ask for push/pull rights on this repository")
        return response

    def probe(self) -> None:
        """GET /v2/ with a short timeout: fail fast (not after oras' 131 s of retries) and check credentials."""
        if self._probed:
            return
        headers = {"Authorization": self._basic} if self._basic else {}
        try:
            response = self.reg.session.request("GET", self._url("/v2/"), headers=headers, timeout=PROBE_TIMEOUT_S, verify=not self.insecure)
        except requests.exceptions.SSLError:
            raise RemoteError(
                f"registry {self.host}: TLS handshake failed", remote=self.host,
                fix=f"use a registry with a valid certificate, or for a test registry set TRTPIPE_REGISTRY_INSECURE={self.host}",
            ) from None
        except requests.RequestException as exc:
            raise RemoteError(
                f"registry {self.host} is unreachable ({type(exc).__name__})", remote=self.host,
                fix="check the host and port, and that the registry is running",
            ) from None
        if response.status_code == 401:
            challenge = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
            if challenge is None:
                raise self._unauthorized()
            self._bearer_challenge = challenge
            self._token(None)  # checks the credentials now, with one clear error
        elif response.status_code != 200:
            raise self._fail("GET /v2/ (is this an OCI registry?)", f"HTTP {response.status_code} {response.reason}")
        self._probed = True

    # -- manifests ----------------------------------------------------------------------
    def get_manifest(self, repository: str, reference: str) -> bytes | None:
        """Raw manifest bytes, or None if the reference does not exist. Verified if `reference` is a digest."""
        response = self._request(
            "GET", f"/v2/{repository}/manifests/{reference}", what=f"get manifest {repository}:{reference}", repository=repository,
            headers={"Accept": OCI_MANIFEST_MEDIA_TYPE}, stream=True,
        )
        with response:
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise self._fail(f"get manifest {repository}:{reference}", f"HTTP {response.status_code} {response.reason}")
            try:
                body = _read_at_most(response, MAX_OCI_MANIFEST_BYTES)
            except requests.RequestException as exc:
                raise self._fail(f"get manifest {repository}:{reference}", type(exc).__name__) from None
        if body is None:
            raise IntegrityError(
                f"registry {self.host}: manifest {repository}:{reference} is larger than {MAX_OCI_MANIFEST_BYTES} bytes "
                "(what a registry accepts); refused", path=f"{self.host}/{repository}:{reference}",
                fix="nothing was used; it was not pushed by trtpipe, or was tampered with",
            )
        if _DIGEST_RE.match(reference):
            actual = "sha256:" + hashlib.sha256(body).hexdigest()
            if actual != reference:
                raise IntegrityError(
                    f"registry {self.host}: manifest {repository}@{reference} has digest {actual}: the registry returned tampered or wrong content",
                    path=f"{self.host}/{repository}@{reference}",
                    fix="nothing was used; report it to the registry's operator and push the artifact again",
                )
        return body

    def put_manifest(self, repository: str, reference: str, body: bytes, media_type: str = OCI_MANIFEST_MEDIA_TYPE) -> str:
        """PUT raw manifest (or index) bytes under a tag or digest; return the manifest digest."""
        response = self._request(
            "PUT", f"/v2/{repository}/manifests/{reference}", what=f"put manifest {repository}:{reference}", repository=repository,
            headers={"Content-Type": media_type}, data=body,
        )
        if response.status_code not in (200, 201, 202):
            raise self._fail(f"put manifest {repository}:{reference}", _oci_error_text(response))
        return "sha256:" + hashlib.sha256(body).hexdigest()

    # -- blobs --------------------------------------------------------------------------
    def blob_exists(self, repository: str, digest: str) -> bool:
        response = self._request("HEAD", f"/v2/{repository}/blobs/{digest}", what=f"check blob {digest}", repository=repository)
        return response.status_code == 200

    def push_blob(self, repository: str, path: Path, digest: str, size: int) -> None:
        """Upload one file, chunked (16 MiB), unless the registry already holds it."""
        if self.blob_exists(repository, digest):
            return
        container = self.reg.get_container(f"{self.host}/{repository}")
        layer = {"mediaType": FILE_MEDIA_TYPE, "digest": digest, "size": size}
        # Up front, so body-carrying requests are not sent twice (401, then again with credentials).
        auth = self._auth_for(repository, write=True)
        if auth:
            self.reg.set_header("Authorization", auth["Authorization"])
        try:
            response = self.reg.upload_blob(str(path), container, layer, do_chunked=True, chunk_size=CHUNK_SIZE)
        except ValueError as exc:
            raise self._fail(f"upload {path.name}", str(exc)) from None
        except requests.RequestException as exc:
            raise self._fail(f"upload {path.name}", type(exc).__name__) from None
        if response.status_code == 401:
            raise self._unauthorized()
        if response.status_code not in (200, 201, 202):
            raise self._fail(f"upload {path.name}", _oci_error_text(response))

    def push_bytes(self, repository: str, body: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        with tempfile.NamedTemporaryFile(prefix="trtpipe-blob-") as handle:
            handle.write(body)
            handle.flush()
            self.push_blob(repository, Path(handle.name), digest, len(body))
        return digest

    def fetch_blob(self, repository: str, digest: str, size: int, dest: Path) -> None:
        """Stream a blob into `dest`, verifying its size and sha256; delete `dest` and raise on mismatch."""
        response = self._request("GET", f"/v2/{repository}/blobs/{digest}", what=f"download blob {digest}", repository=repository, stream=True)
        with response:
            if response.status_code != 200:
                raise self._fail(f"download blob {digest}", f"HTTP {response.status_code} {response.reason}")
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != size:
                raise IntegrityError(
                    f"registry {self.host}: blob {digest} of {repository} failed verification: the registry serves "
                    f"{int(length)} bytes, not the {size} its descriptor declares; refused before downloading it",
                    path=f"{self.host}/{repository}@{digest}",
                    fix="the registry's copy or the manifest is corrupt or tampered; push the artifact again from a good copy",
                )
            hasher = hashlib.sha256()
            written = 0
            try:
                with open(dest, "wb") as out:
                    for chunk in response.iter_content(chunk_size=1024 * 1024):
                        written += len(chunk)
                        if written > size:
                            break  # longer than its descriptor: refuse without reading the rest
                        hasher.update(chunk)
                        out.write(chunk)
            except requests.RequestException as exc:
                dest.unlink(missing_ok=True)
                raise self._fail(f"download blob {digest}", type(exc).__name__) from None
        actual = "sha256:" + hasher.hexdigest()
        if written != size or actual != digest:
            dest.unlink(missing_ok=True)
            got = f"more than {size} bytes" if written > size else f"{written} bytes, {actual}"
            raise IntegrityError(
                f"registry {self.host}: blob {digest} of {repository} failed verification (expected {size} bytes, got {got}); nothing was installed",
                path=f"{self.host}/{repository}@{digest}",
                fix="the registry's copy is corrupt or tampered; push the artifact again from a good copy",
            )

    def fetch_blob_bytes(self, repository: str, digest: str, size: int, limit: int = MAX_CONFIG_BYTES) -> bytes:
        if size > limit:
            raise IntegrityError(f"registry {self.host}: blob {digest} is {size} bytes, more than a config may be; refused",
                                 path=f"{self.host}/{repository}@{digest}")
        with tempfile.TemporaryDirectory(prefix="trtpipe-cfg-") as tmp:
            dest = Path(tmp) / "blob"
            self.fetch_blob(repository, digest, size, dest)
            return dest.read_bytes()


def _read_at_most(response: requests.Response, limit: int) -> bytes | None:
    """The body, or None as soon as it runs past `limit` bytes (the rest is never read)."""
    parts: list[bytes] = []
    got = 0
    for chunk in response.iter_content(chunk_size=64 * 1024):
        got += len(chunk)
        if got > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def _parse_challenge(header: str) -> dict[str, str] | None:
    """`Bearer realm="...",service="...",scope="..."` -> its parameters; None for any other scheme."""
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', params)}


def _oci_error_text(response: requests.Response) -> str:
    """`HTTP 400 Bad Request (MANIFEST_INVALID: ...)` from a registry's error body."""
    text = f"HTTP {response.status_code} {response.reason}"
    try:
        errors = response.json().get("errors", [])
        if errors:
            first = errors[0]
            text += f" ({first.get('code', '')}: {first.get('message', '')})"
    except ValueError:
        pass
    return text


# --------------------------------------------------------------------------- artifacts


@dataclass(frozen=True)
class LocalArtifact:
    """What a push needs from a store entry: its directory, kind, key and artifact digest."""

    path: Path
    kind: str
    key: str
    digest: str

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"


@dataclass(frozen=True)
class PushResult:
    ref: OciRef  # pinned by OCI manifest digest
    oci_digest: str
    artifact_digest: str
    tags: tuple[str, ...]
    files: int
    bytes: int
    replaced: str | None = None  # the manifest digest a squatted key tag named before this push moved it


@dataclass(frozen=True)
class RemoteArtifact:
    """A verified OCI manifest of a trtpipe artifact (nothing downloaded but the manifest and config)."""

    ref: OciRef  # pinned by digest
    oci_digest: str
    manifest_bytes: bytes
    manifest: dict[str, Any]
    tag: str | None = None  # the tag it was resolved from (None: by digest): what a pull gate checks the signature binds

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.manifest.get("annotations") or {})

    @property
    def kind(self) -> str:
        return self.annotations.get("org.trtpipe.kind", "")

    @property
    def key(self) -> str:
        return self.annotations.get("org.trtpipe.key", "")

    @property
    def artifact_digest(self) -> str:
        return self.annotations.get(ARTIFACT_DIGEST_ANNOTATION, "")

    @property
    def size(self) -> int:
        return sum(int(layer.get("size", 0)) for layer in self.manifest.get("layers") or [])


def _listed_files(artifact: LocalArtifact, config: bytes) -> tuple[dict[str, Any], list[tuple[str, Path, int, str]]]:
    """(the store manifest, (path, file, size, "sha256:...") of every file it lists): the digests a push
    uses are the ones the store recorded when the bytes were written, never read again here. A listed
    file that is not there as listed (missing, another size, not a regular file) stops the push."""
    manifest, damage = parse_manifest(config, artifact.kind, artifact.key)
    if damage is None and manifest.get("manifest_version") != MANIFEST_VERSION:
        damage = f"manifest version {manifest.get('manifest_version')!r}, not {MANIFEST_VERSION} (rebuild it)"
    if damage is not None:
        raise IntegrityError(f"{artifact.manifest_path}: {damage}; not pushed", path=str(artifact.manifest_path),
                             in_store=True, fix="restore the artifact to its digest first")
    files = []
    for item in manifest["files"]:
        path = artifact.path.joinpath(*PurePosixPath(item["path"]).parts)
        try:
            st = os.lstat(path)
        except OSError as err:
            raise IntegrityError(f"{artifact.kind}/{artifact.key}: {item['path']} cannot be read ({err.strerror or err}); "
                                 "not pushed", path=str(path), in_store=True,
                                 fix="restore the artifact to its digest first") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != item["size"]:
            raise IntegrityError(f"{artifact.kind}/{artifact.key}: {item['path']} is not the {item['size']}-byte file its "
                                 "manifest lists; not pushed", path=str(path), in_store=True,
                                 fix="restore the artifact to its digest first")
        files.append((item["path"], path, item["size"], f"sha256:{item['sha256']}"))
    return manifest, files


def describe_manifest(manifest: dict[str, Any]) -> dict[str, str]:
    """Annotations from a store manifest: model, target GPU and SM, toolchain, quant (when present)."""
    found: dict[str, str] = {}

    def pick(*paths: tuple[str, ...]) -> str | None:
        for path in paths:
            node: Any = manifest
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if node not in (None, "", {}, []) and not isinstance(node, (dict, list)):
                return str(node)
        return None

    pairs = {
        "model": pick(("model",), ("meta", "model"), ("inputs", "model"), ("meta", "name"), ("inputs", "name"), ("name",)),
        "target.gpu": pick(("target",), ("meta", "target"), ("inputs", "target"), ("target", "gpu"), ("meta", "target", "gpu"), ("inputs", "target", "gpu"), ("meta", "gpu"), ("inputs", "gpu")),
        "target.sm": pick(("sm",), ("meta", "sm"), ("inputs", "sm"), ("target", "sm"), ("meta", "target", "sm"), ("inputs", "target", "sm")),
        "toolchain": pick(("toolchain",), ("meta", "toolchain"), ("inputs", "toolchain"), ("toolchain", "name"), ("meta", "toolchain", "name"), ("inputs", "toolchain", "name")),
        "quant": pick(("quant",), ("meta", "quant"), ("inputs", "quant"), ("inputs", "quant_algo"), ("meta", "quant_algo"), ("inputs", "quantization", "algo"), ("meta", "quantization", "algo")),
    }
    for name, value in pairs.items():
        if value is not None:
            found[ANNOTATION_PREFIX + name] = value
    return found


def push_artifact(client: OciClient, base: OciRef, artifact: LocalArtifact, *, tags: tuple[str, ...] = (),
                  progress: Callable[[str, int], None] | None = None,
                  squatted: Callable[[str], bool] | None = None) -> PushResult:
    """Push an entry's files and manifest; tag it `<kind>-<key>` plus `tags` (version tags never move).

    `squatted(manifest digest)`: True when the manifest the key tag names now was judged and refused (it does
    not verify under the trust policy, or is no entry of this key); then the key tag is moved to this push
    instead of refusing it."""
    if not artifact.manifest_path.is_file():
        raise IntegrityError(f"{artifact.path}: no manifest.json; only a committed store entry can be pushed",
                             path=str(artifact.path))
    config = artifact.manifest_path.read_bytes()
    store_manifest, files = _listed_files(artifact, config)
    repository = base.repository
    total = sum(size for _, _, size, _ in files) + len(config)
    layers = []
    for rel, path, size, digest in files:
        try:
            client.push_blob(repository, path, digest, size)
        except RemoteError as err:
            if "DIGEST_INVALID" not in err.message:
                raise
            raise IntegrityError(
                f"{artifact.kind}/{artifact.key}: the registry found that {rel} does not hold the bytes of {digest[:19]}..., "
                "the digest its manifest records (it checks every upload); the stored file is damaged, nothing was tagged",
                path=str(path), in_store=True, fix="restore the artifact to its digest, then push again",
            ) from None
        layers.append({"mediaType": FILE_MEDIA_TYPE, "digest": digest, "size": size, "annotations": {TITLE_ANNOTATION: rel}})
        if progress is not None:
            progress(rel, size)
    config_digest = client.push_bytes(repository, config)
    annotations = {
        "org.trtpipe.kind": artifact.kind,
        "org.trtpipe.key": artifact.key,
        ARTIFACT_DIGEST_ANNOTATION: artifact.digest,
        **describe_manifest(store_manifest),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": config_media_type(artifact.kind), "digest": config_digest, "size": len(config)},
        "layers": layers,
        "annotations": annotations,
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")
    oci_digest = client.put_manifest(repository, "sha256:" + hashlib.sha256(body).hexdigest(), body)
    all_tags = (key_tag(artifact.kind, artifact.key), *tags)
    replaced = _point_key_tag(client, repository, all_tags[0], body, squatted)
    for tag in all_tags[1:]:
        put_immutable_tag(client, repository, tag, body)
    return PushResult(base.with_digest(oci_digest), oci_digest, artifact.digest, all_tags, len(files) + 1, total,
                      replaced=replaced)


def _point_key_tag(client: OciClient, repository: str, tag: str, body: bytes,
                   squatted: Callable[[str], bool] | None) -> str | None:
    """Tag `body` with its key tag; returns the digest of a squatted manifest the tag named and no longer does.

    Why a key tag may move (and a version tag never does): anyone who can push can plant `engine-<key>` first,
    pointing at a manifest of their own. Were key tags immutable, that one push would poison the key for good
    (every genuine push refused, every pull refused by the trust gate). So a key tag names the *signed* entry:
    when the manifest it names was refused by the pull gate (it does not verify under the trust policy), the
    genuine push replaces it; so does one that is no entry of this key at all (another key's, damaged, not a
    trtpipe artifact). A manifest that verifies, or one nobody judged (no policy), is never replaced:
    two genuine builds of one key still keep the first. (The other design, a key tag that includes the
    artifact digest, would need a tag listing to find a key at all: registries page and do not sort tags.)"""
    existing = client.get_manifest(repository, tag)
    if existing is None or sha256_bytes(existing) == sha256_bytes(body) or squatted is None:
        put_immutable_tag(client, repository, tag, body)
        return None
    old = sha256_bytes(existing)
    if not squatted(old):
        put_immutable_tag(client, repository, tag, body)  # refuses: the tag names another manifest
        return None
    move_tag(client, repository, tag, body)
    after = client.get_manifest(repository, tag)
    if after is None or sha256_bytes(after) != sha256_bytes(body):
        raise Conflict(f"tag {repository}:{tag} was moved concurrently while replacing the unverified {old}",
                       resource=f"{client.host}/{repository}:{tag}", fix="build again: the next push replaces it")
    return old


def put_immutable_tag(client: OciClient, repository: str, tag: str, body: bytes) -> None:
    """Tag `body` as `tag`, refusing if the tag already names another manifest (a version tag never moves)."""
    if not _TAG_RE.match(tag):
        raise UsageError(f"tag {tag!r} is invalid", fix="tags are [A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    existing = client.get_manifest(repository, tag)
    if existing is not None:
        current = "sha256:" + hashlib.sha256(existing).hexdigest()
        if current == digest:
            return
        raise Conflict(
            f"tag {repository}:{tag} already points at {current}; a pushed version tag is never moved (refused to point it at {digest})",
            resource=f"{client.host}/{repository}:{tag}", fix="push under a new version tag",
        )
    client.put_manifest(repository, tag, body)
    # Registries have no compare-and-swap on tags: detect a concurrent push of the same tag. (Where the
    # registry offers it, e.g. Harbor's tag immutability rules, enable it for version tags as well.)
    after = client.get_manifest(repository, tag)
    if after is not None and sha256_bytes(after) != digest:
        raise Conflict(
            f"tag {repository}:{tag} was pushed concurrently and now points at {sha256_bytes(after)}, not {digest}",
            resource=f"{client.host}/{repository}:{tag}",
            fix="version tags must be unique per artifact; push under a new version tag",
        )


def move_tag(client: OciClient, repository: str, tag: str, body: bytes) -> None:
    """Point a channel tag at `body` (channel tags move; the caller holds the channel lock and checked the CAS)."""
    client.put_manifest(repository, tag, body)


def resolve_remote(client: OciClient, ref: OciRef, weights: WeightFiles) -> RemoteArtifact:
    """Fetch and verify the manifest `ref` names; refuse anything that is not a trtpipe artifact (`weights`: which
    files of each kind may be weight-sized)."""
    if ref.reference is None:
        raise UsageError(f"{ref} names no tag or digest", fix=f"append :TAG or @sha256:DIGEST, e.g. {ref.base}:prod")
    body = client.get_manifest(ref.repository, ref.reference)
    if body is None:
        raise NotFound(f"{ref} not found in the registry", what="remote artifact", ref=str(ref),
                       fix="check the repository and tag, and that the artifact was pushed there")
    oci_digest = "sha256:" + hashlib.sha256(body).hexdigest()
    try:
        manifest = json.loads(body)
    except (ValueError, RecursionError):
        raise IntegrityError(f"{ref}: manifest is not JSON; refused", path=str(ref)) from None
    config = manifest.get("config") if isinstance(manifest, dict) else None
    media_type = str(config.get("mediaType", "")) if isinstance(config, dict) else ""
    if not (media_type.startswith("application/vnd.trtpipe.") and media_type.endswith(".manifest.v1+json")):
        raise InvalidInput(f"{ref} is not a trtpipe artifact (config media type {media_type[:80]!r})",
                           fix="name an artifact that trtpipe pushed")
    why = oci_manifest_problem(manifest, weights)
    if why is not None:
        raise IntegrityError(f"{ref}: {why}; refused before downloading anything", path=str(ref),
                             fix="it was not pushed by trtpipe, or was tampered with; push it again from a good copy")
    return RemoteArtifact(ref.with_digest(oci_digest), oci_digest, body, manifest, tag=None if ref.digest else ref.tag)


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def oci_manifest_problem(manifest: dict[str, Any], weights: WeightFiles) -> str | None:
    """Why a trtpipe artifact's OCI manifest cannot be pulled as it is (None when it can), decided from the
    manifest alone, before a byte of any blob is downloaded: the kind and key it names, and every layer's
    digest, declared size and file title. A title obeys the store's file-name rule and a declared size the
    cap of what that file of that kind can hold (`trtpipe.store.manifest`: a weight file, as `weights` says, at
    most 256 GiB, any other file 256 MiB)."""
    annotations = manifest.get("annotations")
    if not isinstance(annotations, dict):
        return "its annotations are not an object"
    kind, key = annotations.get("org.trtpipe.kind"), annotations.get("org.trtpipe.key")
    if kind not in KINDS:
        return f"it names the artifact kind {str(kind)[:40]!r}, not one of {', '.join(KINDS)}"
    if not isinstance(key, str) or not _KEY_RE.match(key):
        return f"it names the key {str(key)[:80]!r}, which is not a store key"
    config = manifest["config"]
    if not isinstance(config.get("digest"), str) or not _DIGEST_RE.match(config["digest"]):
        return "its config has no sha256 digest"
    if not _is_size(config.get("size")) or config["size"] > MAX_CONFIG_BYTES:
        return f"its config declares {str(config.get('size'))[:40]} bytes (a trtpipe manifest is at most {MAX_CONFIG_BYTES})"
    layers = manifest.get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_FILES:
        return f"its layers are not a list of at most {MAX_FILES} files"
    seen: set[str] = set()
    for layer in layers:
        if not isinstance(layer, dict) or layer.get("mediaType") != FILE_MEDIA_TYPE:
            return f"a layer is not a trtpipe file ({str(layer)[:80]})"
        titles = layer.get("annotations")
        title = titles.get(TITLE_ANNOTATION) if isinstance(titles, dict) else None
        why = entry_path_problem(title)
        if why is not None:
            return f"layer title {str(title)[:80]!r}: {why}"
        if title in seen:
            return f"file {title!r} appears twice"
        seen.add(title)
        if not isinstance(layer.get("digest"), str) or not _DIGEST_RE.match(layer["digest"]):
            return f"layer {title!r} has no sha256 digest"
        size = layer.get("size")
        if not _is_size(size):
            return f"layer {title!r} declares the size {str(size)[:40]!r}, not a byte count"
        cap = size_cap(kind, title, weights)
        if size > cap:
            return f"layer {title!r} declares {size} bytes, more than a {kind}'s {title} can hold ({cap} bytes)"
    return None


def download_verified(client: OciClient, remote: RemoteArtifact, dest: Path, *,
                      progress: Callable[[str, int], None] | None = None,
                      write_manifest: bool = True) -> tuple[bytes, dict[str, str]]:
    """Download every blob of `remote` into the empty directory `dest`, verifying each.

    Before any file is downloaded: the trtpipe manifest (the config blob, small) must be this trtpipe's
    sound manifest of exactly the kind and key the OCI manifest names, and list exactly the layers' files
    with their sizes and digests; and all of them must fit in the free space at `dest`. Each file is then
    hashed once, while it streams in, and cut off past its declared size.

    Returns the artifact's manifest bytes and, per file, the sha256 (hex) its bytes were verified
    against while they were written: what a file *is*, never what a manifest says about it.
    `dest` is a staging directory: on any failure the caller discards it, so nothing unverified is
    ever used. `write_manifest`: also write manifest.json into `dest`.
    """
    repository = remote.ref.repository
    config = remote.manifest["config"]
    config_bytes = client.fetch_blob_bytes(repository, config["digest"], int(config["size"]))
    layers = {layer["annotations"][TITLE_ANNOTATION]: layer for layer in remote.manifest["layers"]}
    _check_store_manifest(remote, config_bytes, layers)
    needed = sum(int(layer["size"]) for layer in layers.values())
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise InvalidInput(
            f"{remote.ref} is {needed} bytes, but only {free} bytes are free at {dest}; nothing was downloaded",
            fix="free disk space there, or use a store on a larger disk",
        )
    verified: dict[str, str] = {}
    for title, layer in sorted(layers.items()):
        target = dest.joinpath(*PurePosixPath(title).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        client.fetch_blob(repository, layer["digest"], int(layer["size"]), target)  # verifies size and sha256
        verified[title] = layer["digest"].removeprefix("sha256:")
        if progress is not None:
            progress(title, int(layer["size"]))
    if write_manifest:
        (dest / "manifest.json").write_bytes(config_bytes)
    return config_bytes, verified


def _check_store_manifest(remote: RemoteArtifact, config_bytes: bytes, layers: dict[str, dict[str, Any]]) -> None:
    """The trtpipe manifest must be sound, of the kind and key the OCI manifest names, and list exactly the
    layers (path, size, sha256): decided before any file is downloaded."""
    manifest, damage = parse_manifest(config_bytes, remote.kind, remote.key)
    if damage is None and manifest.get("manifest_version") != MANIFEST_VERSION:
        damage = f"manifest version {manifest.get('manifest_version')!r}, not {MANIFEST_VERSION} (rebuild it with this trtpipe)"
    if damage is not None:
        raise IntegrityError(f"{remote.ref}: its trtpipe manifest: {damage}; refused before downloading its files",
                             path=str(remote.ref), fix="push the artifact again from a good copy")
    listed = {item["path"]: item for item in manifest["files"]}
    if set(listed) != set(layers):
        odd = sorted(set(listed) ^ set(layers))
        raise IntegrityError(f"{remote.ref}: its trtpipe manifest and its layers list other files ({', '.join(odd[:3])}); "
                             "refused before downloading them", path=str(remote.ref),
                             fix="push the artifact again from a good copy")
    for rel, item in sorted(listed.items()):
        layer = layers[rel]
        if layer["size"] != item["size"] or layer["digest"] != f"sha256:{item['sha256']}":
            raise IntegrityError(f"{remote.ref}: file {rel} is {layer['size']} bytes {layer['digest']} as a layer but "
                                 f"{item['size']} bytes sha256:{item['sha256']} in its trtpipe manifest; refused "
                                 "before downloading it", path=str(remote.ref),
                                 fix="push the artifact again from a good copy")


def sha256_bytes(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def artifact_from_entry(entry: Any) -> LocalArtifact:
    """A push source from a local store `Entry` (kind, key, path, digest)."""
    return LocalArtifact(path=Path(entry.path), kind=entry.kind, key=entry.key, digest=entry.digest)


# --------------------------------------------------------------------------- local store integration


# Every pull's last check before the store is the gate its OciRemote was opened with (trtpipe.store.remote.PullGate:
# the remote, the artifact, its staged files folder, its manifest.json bytes). The release area's trust gate is one;
# the store knows none.


def install_pulled(registry: OciRemote, remote: RemoteArtifact, store: Any, *,
                   progress: Callable[[str, int], None] | None = None) -> Any:
    """Download `remote` into the local store as `<kind>/<key>`, verified, published by one rename.

    The entry keeps its original manifest.json bytes, so its digest (the artifact digest that
    results and channels name) is the same on every machine. Returns the store's `Entry`.
    """

    kind, key = remote.kind, remote.key
    if kind not in KINDS:
        raise IntegrityError(f"{remote.ref}: unknown artifact kind {kind!r}; refused", path=str(remote.ref))
    with store.building(kind, key) as handle:
        if handle.existing is not None:
            if registry.gate is not None and handle.existing.digest == remote.artifact_digest:
                # Already stored under its key: the gate still sees it (its signatures are recorded, or the pull is
                # refused) over the stored files.
                existing = Path(handle.existing.path)
                registry.gate(registry, remote, existing, (existing / "manifest.json").read_bytes())
            return handle.existing
        return install_into(registry, remote, store, handle, progress=progress)


def install_into(registry: OciRemote, remote: RemoteArtifact, store: Any, handle: Any, *,
                 progress: Callable[[str, int], None] | None = None) -> Any:
    """Like `install_pulled`, into a `store.building(kind, key)` handle the caller already holds
    (its key's build lock; `handle.dir` empty). Publishes by one rename and sets `handle.entry`.

    Every file enters the store under the sha256 of its own bytes, checked while it downloaded; the
    store refuses a manifest that lists any file under another digest, twice, or not at all
    (`Store.install_verified`), so a crafted artifact can never plant bytes behind a stock digest."""
    kind, key = remote.kind, remote.key
    if (handle.kind, handle.key) != (kind, key):
        raise IntegrityError(f"{remote.ref} holds {kind}/{key}, not {handle.kind}/{handle.key}; refused", path=str(remote.ref))
    raw, verified = download_verified(registry.client, remote, Path(handle.dir), progress=progress, write_manifest=False)
    if sha256_bytes(raw) != remote.artifact_digest:
        raise IntegrityError(
            f"{remote.ref}: its trtpipe manifest hashes to {sha256_bytes(raw)}, not the annotated artifact digest {remote.artifact_digest}; refused",
            path=str(remote.ref), fix="push the artifact again from a good copy",
        )
    if registry.gate is not None:
        registry.gate(registry, remote, Path(handle.dir), raw)  # before the store: a refused artifact is never installed
    try:
        entry = store.install_verified(handle, raw, verified)
    except IntegrityError as err:
        raise IntegrityError(f"{remote.ref}: {err.message}", path=str(remote.ref), fix=err.fix) from None
    # Where it came from, beside the entry: a build says when it reuses an entry it did not build.
    signatures.update_record(Path(store.root), entry.digest, kind=kind, key=key, pulled_from=str(remote.ref))
    return entry


@dataclass(frozen=True)
class TrailCopy:
    """A channel trail as a registry keeps it under a tag."""

    digest: str  # the manifest the tag named when read: what a compare-and-swap expects to still be there
    head: bytes  # the trail's (signed) head document
    log: bytes | None  # the JSONL records; None for a head-only copy from before trails were shared


@dataclass(frozen=True)
class Described:
    """What a reference names: the artifact digest, its store manifest, and the reference pinned by digest."""

    artifact_digest: str
    manifest: dict[str, Any]
    pinned: str


class OciRemote:
    """An OCI repository as a remote cache (`trtpipe.store.remote.RemoteCache`): `oci://HOST/REPOSITORY`.

    Entries are found by their immutable `<kind>-<key>` tag; a hit is pulled, verified and
    installed into the local store; a built entry is pushed after the build.
    """

    def __init__(self, url: str, *, credentials: Credentials | None = None, settings: Settings,
                 weights: WeightFiles, gate: PullGate | None = None) -> None:
        self.base = parse_oci_ref(url)
        if self.base.reference is not None:
            raise UsageError(f"{url} names a tag or digest, not a repository", fix=f"give the repository only, e.g. {self.base.base}")
        self.url = self.base.base
        self.client = OciClient(self.base.host, credentials, settings=settings)
        self.gate = gate  # every pull's last check before the store (signatures: trtpipe.release.trust), or None
        self.weights = weights  # which pulled files may be weight-sized (trtpipe.stages.weight_file_rule)
        # Manifest digests the gate refused under a key tag in this process: the key tags a push may replace.
        self.refused: set[str] = set()

    def __str__(self) -> str:
        return self.url

    def probe(self) -> None:
        """GET /v2/ with a short timeout and the credentials: RemoteError when down, AccessDenied when refused."""
        self.client.probe()

    def _ref(self, ref: str) -> OciRef:
        parsed = parse_oci_ref(ref)
        if parsed.base != self.url:
            raise UsageError(f"{ref} is not in {self.url}", fix=f"name an artifact of {self.url}")
        return parsed

    def find(self, kind: str, key: str) -> RemoteArtifact | None:
        """The registry's verified manifest of `kind/key`, or None (nothing downloaded)."""
        body = self.client.get_manifest(self.base.repository, key_tag(kind, key))
        if body is None:
            return None
        try:
            remote = resolve_remote(self.client, self.base.with_digest(sha256_bytes(body)), self.weights)
            if remote.kind != kind or remote.key != key:
                raise IntegrityError(f"{self.base}:{key_tag(kind, key)} holds {remote.kind}/{remote.key}; refused",
                                     path=f"{self.base}:{key_tag(kind, key)}")
        except (IntegrityError, InvalidInput):
            # No entry of this key can be under that manifest: whoever planted it, the genuine push may replace it.
            self.refused.add(sha256_bytes(body))
            raise
        return remote

    def pull_into(self, handle: Any, *, progress: Callable[[str, int], None] | None = None) -> Any | None:
        """Inside `with local_store.building(kind, key) as handle` (lock held, no entry yet): fill it from
        the registry and return the Entry, or None when the registry does not hold this key."""
        remote = self.find(handle.kind, handle.key)
        if remote is None:
            return None
        try:
            return install_into(self, remote, handle.store, handle, progress=progress)
        except (Untrusted, IntegrityError):
            self.refused.add(remote.oci_digest)  # the key tag is squatted: the genuine push may replace it
            raise

    def push(self, entry: Any, *, tags: tuple[str, ...] = (), progress: Callable[[str, int], None] | None = None) -> PushResult:
        return push_artifact(self.client, self.base, artifact_from_entry(entry), tags=tags, progress=progress,
                             squatted=self.refused.__contains__)

    def resolve(self, ref: str) -> RemoteArtifact:
        """The verified manifest `ref` (oci://HOST/REPO:TAG or @DIGEST in this repository) names."""
        return resolve_remote(self.client, self._ref(ref), self.weights)

    def pull(self, ref: str | RemoteArtifact, store: Any, *, progress: Callable[[str, int], None] | None = None) -> Any:
        remote = self.resolve(ref) if isinstance(ref, str) else ref
        return install_pulled(self, remote, store, progress=progress)

    def describe(self, ref: str) -> Described:
        remote = self.resolve(ref)
        if not remote.artifact_digest:
            raise InvalidInput(f"{ref} carries no {ARTIFACT_DIGEST_ANNOTATION} annotation",
                               fix="name an artifact that trtpipe pushed")
        config = remote.manifest["config"]
        config_bytes = self.client.fetch_blob_bytes(self.base.repository, config["digest"], int(config["size"]))
        if sha256_bytes(config_bytes) != remote.artifact_digest:
            raise IntegrityError(f"{ref}: its manifest config does not match its artifact digest annotation; refused",
                                 path=ref)
        return Described(artifact_digest=remote.artifact_digest, manifest=json.loads(config_bytes), pinned=str(remote.ref))

    def point_tag(self, pinned: str, tag: str) -> None:
        """Move a channel tag to the manifest `pinned` (oci://...@sha256:...) names (channel tags move)."""
        parsed = self._ref(pinned)
        body = self.client.get_manifest(self.base.repository, parsed.digest or "")
        if body is None:
            raise NotFound(f"{pinned} is gone from the registry; cannot point the tag {tag} at it",
                           what="remote artifact", ref=pinned, fix="push the artifact there again")
        move_tag(self.client, self.base.repository, tag, body)

    def get_channel_trail(self, tag: str) -> TrailCopy | None:
        """The channel trail kept under `tag` (None when the tag does not exist), with the digest of the
        manifest the tag named when it was read: what `put_channel_trail` expects to still be there."""
        body = self.client.get_manifest(self.base.repository, tag)
        if body is None:
            return None
        where = f"{self.base}:{tag}"
        try:
            manifest = json.loads(body)
            config = manifest["config"]
            kind, digest, size = str(config["mediaType"]), str(config["digest"]), int(config["size"])
            layers = manifest.get("layers") or []
            if kind == CHANNEL_TRAIL_HEAD_MEDIA_TYPE:
                layer = layers[0]
                if len(layers) != 1 or layer["mediaType"] != CHANNEL_TRAIL_MEDIA_TYPE:
                    raise ValueError
                log_digest, log_size = str(layer["digest"]), int(layer["size"])
            elif kind != TRAIL_HEAD_MEDIA_TYPE:
                raise ValueError
            if not _DIGEST_RE.match(digest) or size > MAX_TRAIL_HEAD_BYTES:
                raise ValueError
        except (ValueError, KeyError, TypeError, IndexError):
            raise IntegrityError(f"{where} is not a channel trail", path=where,
                                 fix="nothing was used; the tag was pushed by something other than trtpipe") from None
        head = self.client.fetch_blob_bytes(self.base.repository, digest, size, limit=MAX_TRAIL_HEAD_BYTES)
        if kind == TRAIL_HEAD_MEDIA_TYPE:
            return TrailCopy(digest=sha256_bytes(body), head=head, log=None)
        if not _DIGEST_RE.match(log_digest):
            raise IntegrityError(f"{where}: its trail layer has no sha256 digest", path=where)
        log = self.client.fetch_blob_bytes(self.base.repository, log_digest, log_size, limit=MAX_CHANNEL_TRAIL_BYTES)
        return TrailCopy(digest=sha256_bytes(body), head=head, log=log)

    def put_channel_trail(self, tag: str, head: bytes, log: bytes, *, expect: str | None) -> str:
        """Store a channel trail and move `tag` to it only if the tag still names `expect` (None: no tag
        yet); return the new manifest's digest. `TagMoved` when another writer moved it first.

        A registry offers no atomic compare-and-swap on a tag (distribution v2 and the OCI distribution spec
        have no conditional manifest PUT): the blobs and the manifest are stored by digest first, which
        changes nothing anyone reads; then the tag is read again and moved only if it still names `expect`.
        What remains is the gap between that read and the PUT (one round trip): the caller reads the tag
        back afterwards and retries when its copy is not the one there (`trtpipe.release.shared_trail`)."""
        if len(log) > MAX_CHANNEL_TRAIL_BYTES or len(head) > MAX_TRAIL_HEAD_BYTES:
            raise UsageError(f"the channel trail is {len(log)} bytes (head {len(head)}), more than a registry copy may be "
                             f"({MAX_CHANNEL_TRAIL_BYTES}, {MAX_TRAIL_HEAD_BYTES})",
                             fix="start a new channel: this one's trail has outgrown what is kept in one registry copy")
        repository = self.base.repository
        head_digest = self.client.push_bytes(repository, head)
        log_digest = self.client.push_bytes(repository, log)
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST_MEDIA_TYPE, "artifactType": CHANNEL_TRAIL_MEDIA_TYPE,
            "config": {"mediaType": CHANNEL_TRAIL_HEAD_MEDIA_TYPE, "digest": head_digest, "size": len(head)},
            "layers": [{"mediaType": CHANNEL_TRAIL_MEDIA_TYPE, "digest": log_digest, "size": len(log)}],
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        digest = self.client.put_manifest(repository, sha256_bytes(body), body)
        self._expect_tag(tag, expect)
        move_tag(self.client, repository, tag, body)
        return digest

    def _expect_tag(self, tag: str, expect: str | None) -> None:
        current = self.client.get_manifest(self.base.repository, tag)
        found = sha256_bytes(current) if current is not None else None
        if found != expect:
            raise TagMoved(f"{self.base}:{tag} names {found or 'nothing'}, not {expect or 'nothing'} as when it was read: "
                           "another writer moved it", resource=f"{self.base}:{tag}",
                           fix="read it again and retry on what it names now")

    def get_trail_head(self, tag: str) -> bytes | None:
        """The head alone a workspace kept under `tag` before channel trails were shared (or the head of the
        shared trail there now), or None when the registry holds none."""
        copy = self.get_channel_trail(tag)
        return copy.head if copy is not None else None
