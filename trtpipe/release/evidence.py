"""Evidence that travels: recorded results carried from one workspace to another as a bundle.

A GPU runner smokes and benches an artifact and records the results in its own workspace; the release runner
promotes on them. Copying result files between them is refused, rightly (`trtpipe.results`: a log written
outside trtpipe counts for nothing), and appending a copy twice would break the chain for good. Instead:

- `export_results` writes a bundle: one JSON document holding, for each digest, its whole hash chain as stored
  (every record with its seq, prev_hash and hash, and evidence) and its head; signed with the release key when
  one is set (ECDSA P-256 over the canonical JSON of everything but the signature; the signer's public key and
  key id travel with it). Written to a temporary file and renamed: never half a bundle.
- `import_results` checks every bundle before it appends anything: its format, each chain (an edited, removed
  or reordered record breaks it), each head against its chain, and the signature. When this workspace knows a
  key to check with (`--public-key`, the release key setting, the trust policy's keys), a bundle must be
  signed by one of them: an unsigned or foreign-signed bundle is refused in one line, and nothing is imported.
  It then merges by record identity (`trtpipe.results.result_identity`): each record this workspace does not
  hold yet is appended to its own chain (re-chained, with `imported` naming the bundle), each one once. Importing
  a bundle twice, or bundles of one digest from two runners, is a no-op or a merge; an interrupted import is
  completed by importing again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.chained import GENESIS, canonical, record_hash
from trtpipe.errors import IntegrityError, NotFound, Untrusted, UsageError
from trtpipe.signing_keys import PrivateKey, PublicKey, key_id, load_public_key, public_key_from_pem, sign_bytes, verify_bytes
from trtpipe.release.policy import TrustPolicy
from trtpipe.results import ResultRecord, ResultsLog, current_user, normalize_digest, result_identity
from trtpipe.settings import Settings

BUNDLE_FORMAT = "trtpipe-results-bundle"
BUNDLE_VERSION = 1
MAX_BUNDLE_BYTES = 512 * 1024 * 1024  # a bench record keeps every request's TTFT: large, never this large


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundleSignature(_Strict):
    key_id: str  # sha256 of the signer's DER public key (what a trust policy names)
    public_key: str  # the signer's public key, PEM: checks the signature; trusting it is the importer's decision
    signature: str  # base64 DER ECDSA over `signed_bytes`


class BundleLog(_Strict):
    """One digest's result log as stored: the whole chain and its head."""

    artifact_digest: str
    records: list[dict[str, Any]]
    head: dict[str, Any] | None


class Bundle(_Strict):
    format: str
    version: int
    exported_at: str
    exported_by: str
    host: str
    trtpipe: str | None = None
    logs: list[BundleLog]
    signature: BundleSignature | None = None


def signed_bytes(document: dict[str, Any]) -> bytes:
    """What a bundle's signature covers: its canonical JSON without the signature."""
    return canonical({k: v for k, v in document.items() if k != "signature"})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------- export


class ExportRequest(_Strict):
    """`trtpipe results export DIGEST... --out BUNDLE`."""

    digests: list[str] = Field(min_length=1)
    out: Path


class ExportOutcome(_Strict):
    bundle: str
    bundle_digest: str  # sha256 of the bundle file
    records: dict[str, int]  # artifact digest -> records exported
    signed_by: str | None  # key id, or None: unsigned (no release key)


def export_results(results: ResultsLog, request: ExportRequest, key: PrivateKey | None, *, who: str) -> ExportOutcome:
    """Write the bundle of every result recorded for `request.digests` (each log verified first; a digest with
    no results is refused: exporting nothing is a wrong digest, not evidence)."""
    from trtpipe.versions import installed_version

    logs: list[BundleLog] = []
    for digest in dict.fromkeys(normalize_digest(d) for d in request.digests):
        records, head = results.chain(digest)
        if not records:
            raise NotFound(f"{results.dir}: no results are recorded for {digest}", what="results", ref=digest,
                           fix="record them (smoke, bench with the repository to record for) or name the digest the "
                               "build reported (artifacts.repository)")
        logs.append(BundleLog(artifact_digest=digest, records=records, head=head))
    document = Bundle(format=BUNDLE_FORMAT, version=BUNDLE_VERSION, exported_at=_now(), exported_by=who,
                      host=platform.node(), trtpipe=installed_version("trtpipe"), logs=logs).model_dump(mode="json")
    signed_by = None
    if key is not None:
        document["signature"] = BundleSignature(
            key_id=key.key_id, public_key=key.public_pem().decode("ascii"),
            signature=base64.b64encode(sign_bytes(key, signed_bytes(document))).decode("ascii")).model_dump()
        signed_by = key.key_id
    text = json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    out = Path(request.out)
    if out.is_dir():
        raise UsageError(f"{out} is a folder", fix="name the bundle file to write, e.g. evidence/results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, text, mode=0o644)
    return ExportOutcome(bundle=str(out), bundle_digest="sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest(),
                         records={log.artifact_digest: len(log.records) for log in logs}, signed_by=signed_by)


# --------------------------------------------------------------------------- import


class ImportRequest(_Strict):
    """`trtpipe results import BUNDLE...`."""

    bundles: list[Path] = Field(min_length=1)
    public_key: Path | None = None  # the only key a bundle may be signed by (default: the workspace's keys)


class NewResult(_Strict):
    kind: str
    passed: bool
    recorded_at: str
    recorded_by: str | None
    gpu_class: str | None
    seq: int  # where it landed in this workspace's chain
    identity: str


class ImportedLog(_Strict):
    artifact_digest: str
    new: list[NewResult]
    already_present: int


class CheckedBundle(_Strict):
    bundle: str
    bundle_digest: str
    exported_by: str
    host: str
    signed_by: str | None  # key id
    trust: str  # one line: by which trusted key, or why nothing was checked


class ImportOutcome(_Strict):
    bundles: list[CheckedBundle]
    logs: list[ImportedLog]

    @property
    def new(self) -> int:
        return sum(len(log.new) for log in self.logs)

    @property
    def already_present(self) -> int:
        return sum(log.already_present for log in self.logs)

    def as_dict(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "new": self.new, "already_present": self.already_present}


def trusted_keys(settings: Settings, policy: TrustPolicy | None, public_key: Path | None) -> dict[str, PublicKey]:
    """name -> key a bundle may be signed by here: the key given to check with alone, else the release key
    setting's public half and every key of the trust policy. Empty: this workspace checks no signature."""
    if public_key is not None:
        return {str(public_key): load_public_key(public_key)}
    keys: dict[str, PublicKey] = {}
    if settings.signing_key:
        from trtpipe.signing_keys import load_signing_key

        private = load_signing_key(settings.signing_key)
        keys["the release key (TRTPIPE_SIGNING_KEY)"] = PublicKey(key=private.public, origin=private.origin)
    if policy is not None:
        keys.update({f"{name} (policy {policy.source})": key for name, key in policy.keys.items()})
    return keys


def _refuse(path: Path, what: str, fix: str) -> IntegrityError:
    return IntegrityError(f"{path}: {what}; nothing was imported", path=str(path), fix=fix)


_RE_EXPORT = "export the bundle again from the workspace that recorded the results"


def _read_bundle(path: Path) -> tuple[Bundle, dict[str, Any], str]:
    try:
        size = path.stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise _refuse(path, f"{size} bytes, more than a results bundle may be ({MAX_BUNDLE_BYTES})", _RE_EXPORT)
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{path}: no such bundle", what="bundle", ref=str(path),
                       fix="name a results bundle file (an export, e.g. a CI job's artifact)") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder, not a results bundle", fix="name the bundle file itself") from None
    try:
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError
    except ValueError:
        raise _refuse(path, "not a results bundle (not a JSON object)", _RE_EXPORT) from None
    if document.get("format") != BUNDLE_FORMAT:
        raise _refuse(path, f"format {str(document.get('format'))[:60]!r} is not {BUNDLE_FORMAT!r}", _RE_EXPORT)
    if document.get("version") != BUNDLE_VERSION:
        raise _refuse(path, f"version {document.get('version')!r} is not {BUNDLE_VERSION} (another trtpipe wrote "
                            "it)", "import it with the trtpipe version that exported it, or export it again")
    try:
        bundle = Bundle.model_validate(document)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise _refuse(path, f"{where}: {err.get('msg')} (edited, or not written by trtpipe)", _RE_EXPORT) from None
    return bundle, document, "sha256:" + hashlib.sha256(data).hexdigest()


def _chain_problem(log: BundleLog, index: int) -> str | None:
    """What is wrong with one exported chain (None: intact): the records link from the genesis, each hash
    matches its record, each record is a valid result of this digest, and the head anchors the last one."""
    where = f"logs[{index}] ({log.artifact_digest[:19]})"
    try:
        if normalize_digest(log.artifact_digest) != log.artifact_digest:
            raise UsageError("not normalized")
    except UsageError:
        return f"{where}: {log.artifact_digest!r} is not an artifact digest"
    prev = GENESIS
    for number, fields in enumerate(log.records, start=1):
        at = f"{where}.records[{number - 1}]"
        if fields.get("seq") != number:
            return f"{at}: sequence {fields.get('seq')!r} where {number} was expected (a record was removed or reordered)"
        if fields.get("prev_hash") != prev:
            return f"{at}: chain broken (prev_hash does not match the record before it)"
        if record_hash(fields) != fields.get("hash"):
            return f"{at}: record hash mismatch (the record was edited)"
        try:
            record = ResultRecord.model_validate(fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            return f"{at}: {'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
        if record.artifact_digest != log.artifact_digest:
            return f"{at}: a result of {record.artifact_digest}, not of {log.artifact_digest}"
        prev = str(fields["hash"])
    head = log.head or {}
    if head.get("records") != len(log.records) or head.get("hash") != prev:
        return (f"{where}.head: anchors {head.get('records')!r} records, the chain holds {len(log.records)} "
                "(records were added or removed after the export)")
    if head.get("log") not in (None, log.artifact_digest.split(":", 1)[1] + ".jsonl"):
        return f"{where}.head: is the head of {head.get('log')!r}, another log"
    return None


def _check_signature(path: Path, bundle: Bundle, document: dict[str, Any], trusted: dict[str, PublicKey]) -> str:
    """The bundle's trust line, or an Untrusted / IntegrityError when it is unsigned where a key is known, signed
    by a key not trusted here, or its signature does not verify."""
    known = ", ".join(f"{name} {key.key_id[:16]}" for name, key in trusted.items())
    signature = bundle.signature
    if signature is None:
        if trusted:
            raise Untrusted(f"{path}: the bundle is not signed, and this workspace trusts only signed evidence "
                            f"({known}); nothing was imported", subject=str(path), missing=list(trusted),
                            fix="export it on a runner with the release key (TRTPIPE_SIGNING_KEY, a CI secret)")
        return "unsigned (this workspace has no release key or trust policy to check with)"
    try:
        public = public_key_from_pem(signature.public_key.encode("ascii"), f"{path}: signature.public_key")
        raw = base64.b64decode(signature.signature, validate=True)
    except (ValueError, UnicodeEncodeError):
        raise _refuse(path, "signature: not a base64 signature and PEM public key", _RE_EXPORT) from None
    if key_id(public.key) != signature.key_id:
        raise _refuse(path, "signature.key_id is not the id of signature.public_key (edited)", _RE_EXPORT)
    if not verify_bytes(public, signed_bytes(document), raw):
        raise _refuse(path, f"the signature by key {signature.key_id[:16]} does not verify: the bundle was changed "
                            "after it was signed", _RE_EXPORT)
    if not trusted:
        return (f"signed by key {signature.key_id[:16]} (the signature verifies; no release key or trust policy here "
                "says whether to trust it)")
    for name, key in trusted.items():
        if key.key_id == signature.key_id:
            return f"signed by {name} {key.key_id[:16]}"
    raise Untrusted(f"{path}: signed by key {signature.key_id[:16]}, which this workspace does not trust ({known}); "
                    "nothing was imported", subject=str(path), missing=list(trusted),
                    fix="export it with the release key, or add the signer's public key to the trust policy")


def import_results(results: ResultsLog, request: ImportRequest, *, settings: Settings,
                   policy: TrustPolicy | None) -> ImportOutcome:
    """Check every bundle (format, chains, heads, signature against the keys this workspace trusts:
    `trusted_keys`), then merge each record this workspace does not hold yet into its own chain. Nothing is
    appended unless every bundle passes."""
    trusted = trusted_keys(settings, policy, request.public_key)
    checked: list[tuple[Path, Bundle, CheckedBundle]] = []
    for path in request.bundles:
        path = Path(path)
        bundle, document, digest = _read_bundle(path)
        seen: set[str] = set()
        for index, log in enumerate(bundle.logs):
            problem = _chain_problem(log, index)
            if problem is None and log.artifact_digest in seen:
                problem = f"logs[{index}]: {log.artifact_digest} appears twice"
            if problem is not None:
                raise _refuse(path, problem, _RE_EXPORT)
            seen.add(log.artifact_digest)
        trust = _check_signature(path, bundle, document, trusted)
        checked.append((path, bundle, CheckedBundle(
            bundle=str(path), bundle_digest=digest, exported_by=bundle.exported_by, host=bundle.host,
            signed_by=bundle.signature.key_id if bundle.signature else None, trust=trust)))
    for digest in dict.fromkeys(log.artifact_digest for _, bundle, _ in checked for log in bundle.logs):
        results.settled(digest)  # a damaged log here is refused before anything is appended anywhere
    merged: dict[str, ImportedLog] = {}
    now, who = _now(), current_user(settings)
    for path, bundle, about in checked:
        for log in bundle.logs:
            written = results.merge(log.artifact_digest, log.records, {
                "bundle": path.name, "bundle_digest": about.bundle_digest, "exported_by": bundle.exported_by,
                "exported_at": bundle.exported_at, "host": bundle.host, "signed_by": about.signed_by,
                "at": now, "by": who,
            })
            before = merged.get(log.artifact_digest, ImportedLog(artifact_digest=log.artifact_digest, new=[],
                                                                 already_present=0))
            new = [NewResult(kind=w["kind"], passed=w["passed"], recorded_at=w["recorded_at"],
                             recorded_by=w.get("recorded_by"), gpu_class=w.get("gpu_class"), seq=w["seq"],
                             identity=result_identity(w)) for w in written]
            merged[log.artifact_digest] = ImportedLog(
                artifact_digest=log.artifact_digest, new=[*before.new, *new],
                already_present=before.already_present + len(log.records) - len(written))
    return ImportOutcome(bundles=[about for _, _, about in checked], logs=list(merged.values()))
