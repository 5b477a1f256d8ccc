"""Release keys: load a PEM EC P-256 key pair, sign and verify bytes, name a key by its id.

One key kind on purpose: model-signing's key-based signer (what `cache push --sign` uses) takes an
elliptic-curve PEM key, and one kind keeps every signature trtpipe writes (artifact bundles, the
trail head, results) checkable with the same public key file.

A key's id is the sha256 hex of its public key's DER SubjectPublicKeyInfo: the same for the private
key and its public key file, and what a trust policy, an audit record or a report names.

The private key comes from a file (`--sign KEY`) or from the TRTPIPE_SIGNING_KEY setting, which CI
fills from a secret: either a path or the PEM text itself (`signing_key_source`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trtpipe.errors import InvalidInput
from trtpipe.settings import Settings

_CURVE = ec.SECP256R1
_PEM_START = "-----BEGIN"
_GENERATE = "generate one with: openssl ecparam -name prime256v1 -genkey -noout -out release.key"


@dataclass(frozen=True)
class PrivateKey:
    """A loaded signing key and where it came from (`origin` names a file or the setting, never the key)."""

    key: ec.EllipticCurvePrivateKey
    origin: str

    @property
    def public(self) -> ec.EllipticCurvePublicKey:
        return self.key.public_key()

    @property
    def key_id(self) -> str:
        return key_id(self.public)

    def public_pem(self) -> bytes:
        return public_pem(self.public)

    @contextmanager
    def pem_file(self) -> Iterator[Path]:
        """The key as a PEM file readable only by this user, removed afterwards (for libraries that
        take a path, such as model-signing's elliptic-key signer)."""
        data = self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        fd, name = tempfile.mkstemp(prefix="trtpipe-key-", suffix=".pem")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
            os.close(fd)
            fd = -1
            yield Path(name)
        finally:
            if fd >= 0:
                os.close(fd)
            Path(name).unlink(missing_ok=True)


@dataclass(frozen=True)
class PublicKey:
    """A loaded public key and the file it came from."""

    key: ec.EllipticCurvePublicKey
    origin: str

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    def pem(self) -> bytes:
        return public_pem(self.key)


def key_id(public: ec.EllipticCurvePublicKey) -> str:
    """sha256 hex of the DER SubjectPublicKeyInfo."""
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def public_pem(public: ec.EllipticCurvePublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(path: Path, what: str) -> bytes:
    # Bounded and regular files only: a FIFO named as a key would hang the command, /dev/zero exhaust memory.
    from trtpipe.small_file import read_small_file

    if not path.exists() and not path.is_symlink():
        raise InvalidInput(f"{path}: no such {what} file", fix=f"name an existing PEM file; {_GENERATE}")
    return read_small_file(path, what, fix="name the PEM file itself")


def _check_curve(curve: ec.EllipticCurve, origin: str, what: str) -> None:
    if not isinstance(curve, _CURVE):
        raise InvalidInput(f"{origin}: the {what} is on curve {curve.name}, not P-256 (prime256v1)",
                           fix=f"use an EC P-256 key; {_GENERATE}")


def private_key_from_pem(data: bytes, origin: str) -> PrivateKey:
    """A P-256 private key from PEM bytes (unencrypted: CI passes it as a secret, not a passphrase)."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InvalidInput(f"{origin}: the private key is encrypted with a passphrase",
                           fix="give an unencrypted PEM key (keep it in a secret store instead)") from None
    except (ValueError, Exception) as exc:  # cryptography raises ValueError or UnsupportedAlgorithm
        raise InvalidInput(f"{origin}: not a PEM private key ({type(exc).__name__})",
                           fix=f"give an EC P-256 private key in PEM; {_GENERATE}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidInput(f"{origin}: the private key is not an elliptic-curve key",
                           fix=f"use an EC P-256 key; {_GENERATE}")
    _check_curve(key.curve, origin, "private key")
    return PrivateKey(key=key, origin=origin)


def load_private_key(path: Path | str) -> PrivateKey:
    path = Path(path)
    return private_key_from_pem(_read(path, "private key"), str(path))


def public_key_from_pem(data: bytes, origin: str) -> PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, Exception) as exc:
        hint = " (this is a private key: give its public half, openssl ec -in KEY -pubout)" \
            if b"PRIVATE KEY" in data else ""
        raise InvalidInput(f"{origin}: not a PEM public key{hint} ({type(exc).__name__})",
                           fix="give the EC P-256 public key in PEM (openssl ec -in release.key -pubout -out release.pub)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InvalidInput(f"{origin}: the public key is not an elliptic-curve key", fix="use an EC P-256 key")
    _check_curve(key.curve, origin, "public key")
    return PublicKey(key=key, origin=origin)


def load_public_key(path: Path | str) -> PublicKey:
    path = Path(path)
    return public_key_from_pem(_read(path, "public key"), str(path))


def signing_key_source(explicit: str | Path | None, setting: str | None) -> str | None:
    """Which key a command signs with: its --sign value, else the TRTPIPE_SIGNING_KEY setting, else None.
    (`sigstore` is a value too: keyless signing, handled by the caller.)"""
    if explicit is not None and str(explicit) != "":
        return str(explicit)
    return setting or None


def load_signing_key(source: str) -> PrivateKey:
    """The key a source names: PEM text itself (a CI secret in the environment) or a file path."""
    if source.lstrip().startswith(_PEM_START):
        return private_key_from_pem(source.encode(), "the TRTPIPE_SIGNING_KEY setting")
    return load_private_key(Path(source).expanduser())


def sign_bytes(private: PrivateKey, data: bytes) -> bytes:
    """ECDSA P-256 with SHA-256, DER-encoded."""
    return private.key.sign(data, ec.ECDSA(hashes.SHA256()))


def verify_bytes(public: PublicKey | ec.EllipticCurvePublicKey, data: bytes, signature: bytes) -> bool:
    key = public.key if isinstance(public, PublicKey) else public
    try:
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def generate_key() -> PrivateKey:
    """A fresh P-256 key (for tests and first-time setup; keep it in a secret store)."""
    return PrivateKey(key=ec.generate_private_key(_CURVE()), origin="generated")


def write_key_pair(key: PrivateKey, private_path: Path, public_path: Path) -> None:
    """Write a key pair as PEM files (the private one 0600)."""
    data = key.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    public_path.write_bytes(key.public_pem())


# --------------------------------------------------------------------------- the release key of a log head
# Here, beside the keys, so that the results log and the workspace (which sign their heads with it) need not
# reach up into the release package for it.


@dataclass(frozen=True)
class ReleaseKey:
    """The release key as a head signer (a private key) or checker (a public key file): a `trtpipe.chained.HeadKey`."""

    key: PrivateKey | PublicKey

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def can_sign(self) -> bool:
        return isinstance(self.key, PrivateKey)

    def sign(self, data: bytes) -> bytes:
        assert isinstance(self.key, PrivateKey)
        return sign_bytes(self.key, data)

    def verify(self, data: bytes, signature: bytes) -> bool:
        public = self.key.public if isinstance(self.key, PrivateKey) else self.key
        return verify_bytes(public, data, signature)


def release_key(settings: Settings | None, public_key: Path | None = None) -> ReleaseKey | None:
    """The key heads are signed or checked with: a public key file given to check with, else the
    TRTPIPE_SIGNING_KEY setting (the private key; its public half checks), else none."""
    if public_key is not None:
        return ReleaseKey(load_public_key(public_key))
    if settings is not None and settings.signing_key:
        return ReleaseKey(load_signing_key(settings.signing_key))
    return None
