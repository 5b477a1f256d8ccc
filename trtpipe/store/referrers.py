"""OCI referrers: small artifacts (a signature bundle, a provenance attestation) attached to an artifact's
manifest, found again from its digest.

A referrer is an OCI image manifest whose `subject` names the artifact's manifest, with an
`artifactType` saying what it carries, the empty config, and one layer holding the payload
(OCI image-spec v1.1, manifest.md "subject" and "artifactType"; the empty descriptor
`application/vnd.oci.empty.v1+json` / `{}`).

Finding them (OCI distribution-spec v1.1, "Listing Referrers" and "Referrers Tag Schema"):
  - `GET /v2/<repo>/referrers/<digest>` answers an image index of the referrers' descriptors where the
    registry implements the API;
  - where it answers 404 (Debian's docker-registry 2.8, Docker Hub before 2023, many mirrors), the
    client keeps that index itself under the tag `sha256-<hex of the subject digest>` and updates it
    on every attach. That tag has no compare-and-swap: two attaches to one artifact at the same
    moment can drop one descriptor from the index (the referrer's manifest stays, pinned by digest);
    the attach reads the index back and retries once when its descriptor is missing.
Nothing read here is trusted: a payload is checked against its descriptor's digest and size, and
what it says is verified by the caller (a signature, an attestation's envelope).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from trtpipe.errors import IntegrityError
from trtpipe.store.oci import OCI_MANIFEST_MEDIA_TYPE, MAX_OCI_MANIFEST_BYTES, OciClient, _read_at_most, sha256_bytes

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
MAX_PAYLOAD_BYTES = 4 * 2**20  # a signature bundle or an attestation: kilobytes
MAX_REFERRERS = 256


@dataclass(frozen=True)
class Referrer:
    """One referrer's descriptor, as the index lists it (nothing fetched yet)."""

    digest: str
    artifact_type: str
    annotations: dict[str, str]
    size: int


def fallback_tag(subject_digest: str) -> str:
    """The referrers tag schema's tag for a subject: `sha256-<hex>`."""
    algorithm, _, hexpart = subject_digest.partition(":")
    return f"{algorithm}-{hexpart}"


def _index(manifests: list[dict[str, Any]]) -> bytes:
    body = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _get(client: OciClient, path: str, accept: str, what: str, repository: str) -> bytes | None:
    """GET a small JSON document; None on 404 (or, for the referrers API, 'not implemented')."""
    response = client._request("GET", path, what=what, repository=repository, headers={"Accept": accept}, stream=True)
    with response:
        if response.status_code in (404, 405, 501):
            return None
        if response.status_code != 200:
            raise client._fail(what, f"HTTP {response.status_code} {response.reason}")
        body = _read_at_most(response, MAX_OCI_MANIFEST_BYTES)
    if body is None:
        raise IntegrityError(f"registry {client.host}: {what}: larger than {MAX_OCI_MANIFEST_BYTES} bytes; refused",
                             path=f"{client.host}/{repository}")
    return body


def _descriptors(body: bytes | None, where: str) -> list[dict[str, Any]]:
    if body is None:
        return []
    try:
        index = json.loads(body)
    except ValueError:
        raise IntegrityError(f"{where}: the referrers index is not JSON; refused", path=where) from None
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise IntegrityError(f"{where}: the referrers index lists no manifests array; refused", path=where)
    return [m for m in manifests[:MAX_REFERRERS] if isinstance(m, dict) and isinstance(m.get("digest"), str)]


def _query(client: OciClient, repository: str, subject_digest: str) -> tuple[bool, list[dict[str, Any]]]:
    """(whether the registry answers the referrers API, the descriptors it or the fallback tag lists)."""
    api = _get(client, f"/v2/{repository}/referrers/{subject_digest}", INDEX_MEDIA_TYPE,
               f"referrers of {subject_digest[:19]}", repository)
    if api is not None:
        return True, _descriptors(api, f"{client.host}/{repository} referrers of {subject_digest}")
    tag = fallback_tag(subject_digest)
    body = _get(client, f"/v2/{repository}/manifests/{tag}", INDEX_MEDIA_TYPE, f"referrers tag {tag}", repository)
    return False, _descriptors(body, f"{client.host}/{repository}:{tag}")


def api_available(client: OciClient, repository: str, subject_digest: str) -> bool:
    """Whether the registry answers the referrers API (else the tag schema stands in)."""
    return _query(client, repository, subject_digest)[0]


def list_referrers(client: OciClient, repository: str, subject_digest: str, artifact_type: str | None = None) -> list[Referrer]:
    """The referrers of `subject_digest` (optionally of one artifact type): referrers API, else the tag schema."""
    _, descriptors = _query(client, repository, subject_digest)
    out = []
    for item in descriptors:
        kind = str(item.get("artifactType") or "")
        if artifact_type is not None and kind != artifact_type:
            continue
        annotations = item.get("annotations") if isinstance(item.get("annotations"), dict) else {}
        size = item.get("size") if isinstance(item.get("size"), int) else 0
        out.append(Referrer(digest=item["digest"], artifact_type=kind,
                            annotations={str(k): str(v) for k, v in annotations.items()}, size=size))
    return out


def attach(client: OciClient, repository: str, subject_body: bytes, *, artifact_type: str, payload: bytes,
           payload_media_type: str, annotations: dict[str, str]) -> str:
    """Push `payload` as a referrer of the manifest `subject_body`; return the referrer manifest's digest."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise IntegrityError(f"a {artifact_type} payload of {len(payload)} bytes is larger than {MAX_PAYLOAD_BYTES}; not pushed")
    subject_digest = sha256_bytes(subject_body)
    client.push_bytes(repository, EMPTY_CONFIG)
    payload_digest = client.push_bytes(repository, payload)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": sha256_bytes(EMPTY_CONFIG), "size": len(EMPTY_CONFIG)},
        "layers": [{"mediaType": payload_media_type, "digest": payload_digest, "size": len(payload)}],
        "subject": {"mediaType": OCI_MANIFEST_MEDIA_TYPE, "digest": subject_digest, "size": len(subject_body)},
        "annotations": dict(annotations),
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")
    digest = client.put_manifest(repository, sha256_bytes(body), body)
    descriptor = {"mediaType": OCI_MANIFEST_MEDIA_TYPE, "digest": digest, "size": len(body),
                  "artifactType": artifact_type, "annotations": dict(annotations)}
    for _attempt in range(2):
        api, listed = _query(client, repository, subject_digest)
        if any(item.get("digest") == digest for item in listed):
            return digest
        if api:
            # The registry indexes referrers itself (from `subject`); it may do so a moment later.
            return digest
        tag = fallback_tag(subject_digest)
        client.put_manifest(repository, tag, _index([*listed, descriptor]), media_type=INDEX_MEDIA_TYPE)
    api, listed = _query(client, repository, subject_digest)
    if not any(item.get("digest") == digest for item in listed):
        raise IntegrityError(f"registry {client.host}: the referrers tag {fallback_tag(subject_digest)} lost the "
                             f"{artifact_type} just attached (a concurrent attach won twice)",
                             fix="push it again")
    return digest


def fetch_payload(client: OciClient, repository: str, referrer: Referrer) -> tuple[dict[str, Any], bytes]:
    """(the referrer's manifest, its one payload), both checked against their digests and sizes."""
    body = client.get_manifest(repository, referrer.digest)  # verified against the digest it is fetched by
    if body is None:
        raise IntegrityError(f"registry {client.host}: referrer {referrer.digest} is listed but gone",
                             path=f"{client.host}/{repository}@{referrer.digest}", fix="push it again")
    try:
        manifest = json.loads(body)
        layer = manifest["layers"][0]
        digest, size = str(layer["digest"]), int(layer["size"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise IntegrityError(f"registry {client.host}: referrer {referrer.digest} is not a one-layer manifest; refused",
                             path=f"{client.host}/{repository}@{referrer.digest}") from None
    if size > MAX_PAYLOAD_BYTES:
        raise IntegrityError(f"registry {client.host}: referrer {referrer.digest} declares {size} bytes; refused",
                             path=f"{client.host}/{repository}@{referrer.digest}")
    payload = client.fetch_blob_bytes(repository, digest, size, limit=MAX_PAYLOAD_BYTES)  # verifies sha256 and size
    return manifest, payload


def subject_of(manifest: dict[str, Any]) -> str | None:
    subject = manifest.get("subject")
    return str(subject.get("digest")) if isinstance(subject, dict) and subject.get("digest") else None


def sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
