"""Artifact signatures with sigstore's model-signing, and DSSE envelopes for attestations.

What is signed: a folder holding exactly the artifact's listed files and its manifest.json. model-signing
records every file's relative path and sha256 in the signed statement, so the signature covers every
file; and since the artifact digest is the sha256 of manifest.json, and manifest.json names the kind, the
key and every file, the signature binds the digest, kind and key as well. Nothing else is signed (a
stray file beside them fails verification), and no file kind is skipped: model-signing ignores git
files (.gitignore, .git/ ...) by default, which would leave such a file unsigned, so both sides use a
hashing config that ignores nothing and follows no symlink.

Key-based signing (an EC P-256 PEM key, `trtpipe.signing_keys`) runs offline. Keyless sigstore signing
(`--sign sigstore`: an OIDC identity, Fulcio and Rekor) needs those services; where they cannot be reached
it fails with one line saying so (`sign_keyless`).

Attestations (the provenance statement) are signed as DSSE envelopes (in-toto's envelope: the signature
is over PAE(payloadType, payload)) with the same release key.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trtpipe.errors import InvalidInput, MissingCapability
from trtpipe.signing_keys import PrivateKey, PublicKey, sign_bytes, verify_bytes

# model-signing 1.1.1 writes sigstore bundles v0.3 (its _signing/sign_sigstore_pb.py).
SIGNATURE_ARTIFACT_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PROVENANCE_ARTIFACT_TYPE = "application/vnd.in-toto+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
KEY_ID_ANNOTATION = "org.trtpipe.signature.key-id"
MANIFEST = "manifest.json"


def _hashing_config() -> Any:
    from model_signing import hashing

    return (hashing.Config()
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=[], ignore_git_paths=False))


@contextmanager
def signed_view(files_dir: Path, listed: list[str], manifest_raw: bytes, scratch: Path) -> Iterator[Path]:
    """A folder of exactly the listed files (hard links, else copies) and manifest.json: what is signed."""
    scratch.mkdir(parents=True, exist_ok=True)
    view = Path(tempfile.mkdtemp(prefix="sign-", dir=scratch))
    try:
        for rel in listed:
            source = files_dir.joinpath(*PurePosixPath(rel).parts)
            target = view.joinpath(*PurePosixPath(rel).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        (view / MANIFEST).write_bytes(manifest_raw)
        yield view
    finally:
        shutil.rmtree(view, ignore_errors=True)


def sign_folder(folder: Path, key: PrivateKey) -> bytes:
    """model-signing's elliptic-key signature (a sigstore bundle, JSON) over every file of `folder`."""
    from model_signing import signing

    with key.pem_file() as pem, tempfile.TemporaryDirectory(prefix="trtpipe-sig-") as out:
        bundle = Path(out) / "bundle.sig"
        signing.Config().set_hashing_config(_hashing_config()).use_elliptic_key_signer(private_key=pem).sign(folder, bundle)
        return bundle.read_bytes()


def sign_keyless(folder: Path) -> bytes:
    """Keyless sigstore signing (OIDC identity -> Fulcio certificate -> Rekor entry). Needs those services."""
    from model_signing import signing

    with tempfile.TemporaryDirectory(prefix="trtpipe-sig-") as out:
        bundle = Path(out) / "bundle.sig"
        try:
            signing.Config().set_hashing_config(_hashing_config()).use_sigstore_signer().sign(folder, bundle)
        except Exception as exc:  # sigstore raises network, OIDC and TUF errors of many kinds
            raise MissingCapability(
                f"keyless sigstore signing failed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})",
                fix="keyless signing needs an OIDC identity (a CI job with id-token permission) and network access to "
                    "sigstore's Fulcio and Rekor; offline, sign with a release key file instead",
            ) from None
        return bundle.read_bytes()


@dataclass(frozen=True)
class BundleCheck:
    """The outcome of checking one bundle against some public keys."""

    key_name: str | None      # the key (by policy name) whose signature verified over the files
    key_id: str | None
    mismatch: str | None      # a key's signature verified but the files differ (tampered): why


def check_bundle(folder: Path, bundle: bytes, keys: dict[str, PublicKey]) -> BundleCheck:
    """Which of `keys` (name -> key) signed exactly the files of `folder` with `bundle`. A bundle by another
    key verifies under none of them (BundleCheck(None, None, None)); one by a listed key over other bytes
    is a mismatch."""
    from model_signing import verifying

    with tempfile.TemporaryDirectory(prefix="trtpipe-sig-") as tmp:
        path = Path(tmp) / "bundle.sig"
        path.write_bytes(bundle)
        for name, public in keys.items():
            with tempfile.NamedTemporaryFile(prefix="trtpipe-pub-", suffix=".pem", dir=tmp, delete=False) as pem:
                pem.write(public.pem())
            config = verifying.Config().set_hashing_config(_hashing_config()).use_elliptic_key_verifier(public_key=pem.name)
            try:
                config.verify(folder, path)
            except ValueError as exc:
                text = " ".join(str(exc).split())
                if text.startswith("Key mismatch"):
                    continue  # another key signed it: try the next one
                if text.startswith("Signature mismatch"):
                    return BundleCheck(name, public.key_id, text.removeprefix("Signature mismatch: ")[:300])
                continue  # a signature that does not verify under this key
            except Exception:  # noqa: BLE001 - a malformed bundle (protobuf/JSON errors) verifies under no key
                continue
            return BundleCheck(name, public.key_id, None)
    return BundleCheck(None, None, None)


def signed_files(bundle: bytes) -> dict[str, str]:
    """path -> sha256 hex that a bundle's statement lists (read without verifying: for display only)."""
    try:
        envelope = json.loads(bundle)["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"]))
        items = statement["predicate"]["resources"]
        return {str(item["name"]): str(item["digest"]) for item in items}
    except (ValueError, KeyError, TypeError):
        return {}


# --------------------------------------------------------------------------- DSSE (attestations)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature is over (DSSE v1 protocol)."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def sign_envelope(statement: dict[str, Any], key: PrivateKey) -> bytes:
    """A DSSE envelope (JSON) carrying `statement`, signed with `key` (keyid: trtpipe's key id)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode("utf-8")
    signature = sign_bytes(key, pae(INTOTO_PAYLOAD_TYPE, payload))
    envelope = {"payloadType": INTOTO_PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                "signatures": [{"keyid": key.key_id, "sig": base64.b64encode(signature).decode()}]}
    return json.dumps(envelope, sort_keys=True).encode("utf-8")


@dataclass(frozen=True)
class OpenedEnvelope:
    statement: dict[str, Any]
    claimed_key_ids: tuple[str, ...]
    verified_by: str | None  # the name of the key (among those given) whose signature verified


def open_envelope(body: bytes, keys: dict[str, PublicKey], origin: str) -> OpenedEnvelope:
    """Parse a DSSE envelope; say which of `keys` signed it (None: unverified, or no keys given)."""
    try:
        envelope = json.loads(body)
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = [(str(s.get("keyid", "")), base64.b64decode(s["sig"], validate=True)) for s in envelope["signatures"]]
        if envelope.get("payloadType") != INTOTO_PAYLOAD_TYPE:
            raise ValueError("payloadType")
        statement = json.loads(payload)
        if not isinstance(statement, dict):
            raise ValueError("statement")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidInput(f"{origin}: not a DSSE envelope of an in-toto statement", fix="name a provenance trtpipe wrote") from None
    verified = None
    for name, public in keys.items():
        if any(verify_bytes(public, pae(INTOTO_PAYLOAD_TYPE, payload), sig) for _, sig in signatures):
            verified = name
            break
    return OpenedEnvelope(statement, tuple(k for k, _ in signatures), verified)
