"""Trust: sign what is pushed, verify what is pulled, and judge stored artifacts against the policy.

- `sign_pushed`: after a push, sign the artifact (model-signing over its files and manifest.json), write
  its provenance (in-toto statement, SLSA provenance v1, `trtpipe.release.provenance`) as a DSSE
  envelope, attach both to the pushed manifest as OCI referrers (`trtpipe.store.referrers`: referrers API,
  else the tag schema), and keep them beside the local entry (`trtpipe.store.signatures`).
- `PullGate`: the gate a remote is opened with (`trtpipe.store.remote.open_remote(..., gate=)`), called by
  its pulls between download and install (the staged files, not yet in the store): fetches the artifact's signatures, verifies them against the policy's keys over the staged
  bytes, and refuses (audited) what the policy does not accept. With no policy it lets the pull through
  and says whether the artifact was signed at all.
- `judge_entry`: a stored artifact against a policy rule (serve, promote into a channel, a build's pulled
  entry): the kept bundles are verified again over the entry's files every time, so a file changed
  after the pull is caught.
Every refusal is appended to the audit trail (`record_refusal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpipe.errors import IntegrityError, InvalidInput, Untrusted
from trtpipe.release.policy import TrustPolicy, Verdict
from trtpipe.release.signing import (
    DSSE_MEDIA_TYPE,
    KEY_ID_ANNOTATION,
    PROVENANCE_ARTIFACT_TYPE,
    SIGNATURE_ARTIFACT_TYPE,
    BundleCheck,
    check_bundle,
    sign_envelope,
    signed_files,
    sign_folder,
    sign_keyless,
    signed_view,
)
from trtpipe.settings import Settings
from trtpipe.signing_keys import PrivateKey
from trtpipe.store import referrers, signatures
from trtpipe.workspace import Workspace

Note = Callable[[str], None]
KEYLESS = "sigstore"


def _describe_mismatch(folder: Path, bundle: bytes) -> str:
    """Which files differ from what the bundle's statement lists (its signature verified: the list is the
    signer's), in plain words."""
    import hashlib

    signed = signed_files(bundle)
    actual = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    changed = sorted(rel for rel in set(signed) & set(actual)
                     if hashlib.sha256(actual[rel].read_bytes()).hexdigest() != signed[rel])
    added = unsigned_files(folder, set(signed))
    removed = sorted(set(signed) - set(actual))
    parts = [f"{', '.join(items[:4])} {what}" for items, what in
             ((changed, "changed"), (added, "not signed"), (removed, "missing")) if items]
    return "; ".join(parts) or "the files differ from what was signed"


def unsigned_files(folder: Path, signed: set[str]) -> list[str]:
    """Everything under `folder` that is not a directory (files, links, sockets, ...) and not in `signed`
    (paths relative to `folder`), sorted: what a signature over `signed` does not vouch for."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue  # a folder is not content; what it holds is listed on its own
        rel = path.relative_to(folder).as_posix()
        if rel not in signed:
            found.append(rel)
    return found


# --------------------------------------------------------------------------- audit


def record_refusal(home: Path, *, settings: Settings, action: str, subject: str, digest: str | None, reason: str,
                   channel: str = "-", model: str = "-", target: str = "-", ref: str | None = None) -> None:
    """Append a refusal to the audit trail (`action`: pull, serve, promote, build). One place, so the
    trail's writer can change without touching the callers. Signed with the release key when the caller's
    `settings` name one (TRTPIPE_SIGNING_KEY), and recorded as their actor: an unsigned head over a signed trail
    is tamper to the next keyed append, so a refusal recorded without the key would stop every later promote of
    this workspace."""
    from trtpipe.release.audit import append_audit
    from trtpipe.release.channels import now_iso
    from trtpipe.signing_keys import release_key
    from trtpipe.results import current_user

    append_audit(home, key=release_key(settings), at=now_iso(), who=current_user(settings), action="refused",
                 channel=channel, model=model, target=target, from_digest=None, to_digest=digest, ref=ref,
                 reason=f"{action} refused: {reason}", detail=f"untrusted artifact {subject}")


# --------------------------------------------------------------------------- signing at push


@dataclass(frozen=True)
class Signed:
    key_id: str | None
    signature_ref: str
    provenance_ref: str | None
    fallback: bool  # the registry lacks the referrers API: the tag schema holds the index


def _listed(entry: Any) -> list[str]:
    return [item["path"] for item in entry.files]


def sign_entry(entry: Any, key: PrivateKey | str, scratch: Path) -> bytes:
    """The model-signing bundle over `entry`'s files and manifest.json (`key`: a release key, or 'sigstore')."""
    raw = (Path(entry.path) / "manifest.json").read_bytes()
    with signed_view(Path(entry.path), _listed(entry), raw, scratch) as view:
        return sign_keyless(view) if key == KEYLESS else sign_folder(view, key)  # type: ignore[arg-type]


TAGS_ANNOTATION = "org.trtpipe.tags"  # on the statement's subject: the tags it was pushed under (signed)


def bind_tags(statement: dict[str, Any], tags: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`statement` with its subject naming `tags` (in-toto ResourceDescriptor annotations): what the signature
    over it binds, so a tag re-pointed at another signed manifest is caught at pull."""
    import copy

    out = copy.deepcopy(statement)
    subject = out["subject"][0]
    subject["annotations"] = {**(subject.get("annotations") or {}), TAGS_ANNOTATION: sorted(set(tags))}
    return out


def signed_tags(envelopes: list[bytes], keys: dict[str, Any], artifact_digest: str) -> tuple[str, ...] | None:
    """Every tag the provenance envelopes signed by one of `keys` bind to `artifact_digest` (None: no such
    envelope names tags). An envelope that does not parse or verify, or is about another artifact, counts for nothing."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.release.signing import open_envelope

    found: set[str] | None = None
    for body in envelopes:
        try:
            opened = open_envelope(body, keys, "provenance")
        except TrtpipeError:
            continue
        subjects = opened.statement.get("subject")
        first = subjects[0] if isinstance(subjects, list) and subjects and isinstance(subjects[0], dict) else {}
        digest = first.get("digest") if isinstance(first.get("digest"), dict) else {}
        notes = first.get("annotations") if isinstance(first.get("annotations"), dict) else {}
        tags = notes.get(TAGS_ANNOTATION)
        if opened.verified_by is None or digest.get("sha256") != artifact_digest.removeprefix("sha256:"):
            continue
        if isinstance(tags, list):
            found = (found or set()) | {str(t) for t in tags}
    return tuple(sorted(found)) if found is not None else None


def sign_pushed(workspace: Workspace, remote: Any, pushed: Any, entry: Any, key: PrivateKey | str, *,
                provenance: dict[str, Any] | None, bundle: bytes | None = None) -> Signed:
    """Sign the pushed `entry` (or take the `bundle` signed before the push), attach signature and provenance
    to the pushed manifest, keep both in the workspace's store."""
    store_root = workspace.root
    client, repository = remote.client, remote.base.repository
    subject = client.get_manifest(repository, pushed.oci_digest)
    if subject is None:
        raise IntegrityError(f"{pushed.ref} vanished from the registry right after the push; not signed",
                             path=str(pushed.ref), fix="push it again")
    if bundle is None:
        bundle = sign_entry(entry, key, store_root / "tmp")
    key_id = key.key_id if isinstance(key, PrivateKey) else None
    annotations = {KEY_ID_ANNOTATION: key_id or "sigstore-keyless",
                   "org.trtpipe.artifact.digest": entry.digest}
    sig_digest = referrers.attach(client, repository, subject, artifact_type=SIGNATURE_ARTIFACT_TYPE, payload=bundle,
                                  payload_media_type=SIGNATURE_ARTIFACT_TYPE, annotations=annotations)
    envelope = None
    prov_digest = None
    if provenance is not None and isinstance(key, PrivateKey):
        envelope = sign_envelope(bind_tags(provenance, tuple(getattr(pushed, "tags", ()))), key)
        prov_digest = referrers.attach(client, repository, subject, artifact_type=PROVENANCE_ARTIFACT_TYPE,
                                       payload=envelope, payload_media_type=DSSE_MEDIA_TYPE, annotations=annotations)
    signatures.update_record(store_root, entry.digest, kind=entry.kind, key=entry.key,
                             bundles=[{"bundle": bundle.decode(), "claimed_key_id": key_id or "sigstore-keyless"}],
                             provenance=envelope.decode() if envelope is not None else None)
    api = referrers.api_available(client, repository, pushed.oci_digest)
    base = remote.base
    return Signed(key_id, f"{base.base}@{sig_digest}", f"{base.base}@{prov_digest}" if prov_digest else None, not api)


def signing_key(sign: str | None, settings: Settings) -> PrivateKey | str | None:
    """The key to sign with: `sign` (a key file, or 'sigstore' for keyless), else the settings' signing key; a
    PrivateKey, the string KEYLESS, or None (do not sign)."""
    from trtpipe.signing_keys import load_signing_key, signing_key_source

    source = signing_key_source(sign, settings.signing_key)
    if source is None:
        return None
    if source == KEYLESS:
        return KEYLESS
    return load_signing_key(source)


def push_signer(workspace: Workspace, key: PrivateKey | str) -> Callable[[Any, Any, Any], str]:
    """The runner's signer of what a build pushes (`trtpipe.pipeline.PushSigner`): `sign_pushed` with `key`.

    The provenance is the entry's own inputs (the build record of this run is written when the run ends, after
    its pushes); `cache push --sign` of the same entry later carries the record's stage keys as well."""
    from trtpipe.release.provenance import statement

    def sign(remote: Any, pushed: Any, entry: Any) -> str:
        signed = sign_pushed(workspace, remote, pushed, entry, key, provenance=statement(workspace, entry))
        return f"signed by key {(signed.key_id or 'sigstore (keyless)')[:16]}"

    return sign


# --------------------------------------------------------------------------- fetching from a registry


@dataclass(frozen=True)
class RemoteSignatures:
    bundles: list[dict[str, str]]      # {"bundle": JSON text, "claimed_key_id": ...}
    provenance: list[bytes]            # DSSE envelopes
    skipped: tuple[str, ...] = ()      # one line per referrer that could not be read: which, and why


def fetch_signatures(client: Any, repository: str, oci_digest: str) -> RemoteSignatures:
    """The signature bundles and provenance envelopes attached to `oci_digest`. Anyone who can push can
    attach a referrer, so one that cannot be read (gone, not a one-layer manifest, oversized, bytes that do
    not match their digest, not text) is skipped with a note naming it, never a reason to fail the pull:
    the others are judged as they are (under a policy, skipping one can only take a signature away)."""
    from trtpipe.errors import TrtpipeError

    bundles, provenance, skipped = [], [], []
    try:
        listed = referrers.list_referrers(client, repository, oci_digest)
    except IntegrityError as err:  # the tag-schema index itself is junk: as if nothing were attached
        return RemoteSignatures([], [], (f"the referrers index of {oci_digest} is unreadable ({err.message}); "
                                         "judged as carrying no signature",))
    for item in listed:
        if item.artifact_type not in (SIGNATURE_ARTIFACT_TYPE, PROVENANCE_ARTIFACT_TYPE):
            continue
        try:
            manifest, payload = referrers.fetch_payload(client, repository, item)
        except TrtpipeError as err:
            skipped.append(f"referrer {item.digest} skipped: {err.message}")
            continue
        if referrers.subject_of(manifest) != oci_digest:
            continue  # listed under this artifact but about another: ignore it (it proves nothing here)
        claimed = str((manifest.get("annotations") or {}).get(KEY_ID_ANNOTATION, ""))
        if item.artifact_type == SIGNATURE_ARTIFACT_TYPE:
            try:
                bundles.append({"bundle": payload.decode("utf-8"), "claimed_key_id": claimed})
            except UnicodeDecodeError:
                skipped.append(f"referrer {item.digest} skipped: its signature payload is not UTF-8 text")
        else:
            provenance.append(payload)
    return RemoteSignatures(bundles, provenance, tuple(skipped))


# --------------------------------------------------------------------------- judging


def wellformed(bundle_text: str) -> bool:
    """Whether a bundle is shaped like a model-signing bundle (a statement listing files): junk text attached
    as a signature is not, and is called malformed, never signed."""
    return bool(signed_files(bundle_text.encode("utf-8")))


@dataclass(frozen=True)
class Judgement:
    """What the signatures of one artifact prove. Everything said about a signer comes from `verified`
    (a policy key the signature verified against); the key ids a referrer's annotation or a bundle claims are
    kept (`claimed`) only to be shown as claims, never as who signed."""

    verdict: Verdict | None          # None: no policy
    signed: bool                     # any signature found at all (verified or not, well-formed or not)
    verified: tuple[BundleCheck, ...]
    tampered: str | None             # a trusted key's signature over other bytes
    claimed: tuple[str, ...]         # key ids the signatures claim (unverified)
    malformed: int = 0               # how many of the signatures are not even shaped like a signature

    @property
    def allowed(self) -> bool:
        return self.tampered is None and (self.verdict is None or self.verdict.allowed)

    @property
    def signer(self) -> str | None:
        """The policy keys (name and key id) a signature verified against; None: none did."""
        seen = dict.fromkeys(f"{c.key_name} (key id {str(c.key_id)[:16]})" for c in self.verified if c.key_name)
        return ", ".join(seen) or None

    def reason(self) -> str:
        if self.tampered is not None:
            return f"signature does not match its files ({self.tampered})"
        if self.verdict is not None:
            if self.signer is not None and self.verdict.allowed and self.verdict.trusted_signers:
                return f"signed by trusted key {self.signer}"
            return self.verdict.reason
        if not self.signed:
            return "unsigned"
        if self.malformed == len(self.claimed):
            return "carries only malformed signatures (unverified)"
        return "signature present, not verified (no trust policy to check it against)"


def judge_folder(folder: Path, bundles: list[dict[str, str]], policy: TrustPolicy | None, channel: str | None) -> Judgement:
    """Check every bundle over `folder` (exactly the artifact's files and manifest.json) against the keys
    the policy trusts for `channel`; a signature by a trusted key over other bytes is tampering."""
    claimed = tuple(b.get("claimed_key_id", "") for b in bundles)
    malformed = sum(1 for b in bundles if not wellformed(b["bundle"]))
    if policy is None:
        return Judgement(None, bool(bundles), (), None, claimed, malformed)
    keys = policy.trusted_keys(channel)
    checks, tampered = [], None
    for item in bundles:
        check = check_bundle(folder, item["bundle"].encode("utf-8"), keys)
        if check.mismatch is not None:
            tampered = f"signed by {check.key_name}, but {_describe_mismatch(folder, item['bundle'].encode('utf-8'))}"
        elif check.key_id is not None:
            checks.append(check)
    key_ids = [c.key_id for c in checks if c.key_id]
    verdict = policy.judge(key_ids, channel)
    if not checks and bundles and not tampered:
        # Signatures, but none verifies under a trusted key. What key made them is not known (a claimed key id is
        # the pusher's word), so the refusal names only the keys that were tried.
        where = f"channel {channel!r}" if channel else "the default rule"
        what = ("it carries only malformed signatures" if malformed == len(bundles) else
                f"none of its {len(bundles)} signature(s) verifies under them")
        verdict = Verdict(verdict.allowed, verdict.required, (), (),
                          verdict.reason if verdict.allowed else
                          f"not signed by any key that {where} of policy {policy.source} trusts "
                          f"({', '.join(keys) or 'none listed'}): {what}")
    return Judgement(verdict, bool(bundles), tuple(checks), tampered, claimed, malformed)


def judge_entry(entry: Any, policy: TrustPolicy | None, channel: str | None, store_root: Path) -> Judgement:
    """A stored artifact against the policy: its kept signatures, verified again over its files."""
    record = signatures.read_record(store_root, entry.digest) or {"bundles": []}
    bundles = [b for b in record["bundles"] if isinstance(b, dict) and isinstance(b.get("bundle"), str)]
    if policy is None or not bundles:
        return judge_folder(Path(entry.path), bundles, policy, channel)
    # A folder read on its own carries the manifest bytes it was read from: the ones judged are those.
    raw = getattr(entry, "raw", None) or (Path(entry.path) / "manifest.json").read_bytes()
    # The entry's folder holds exactly its files and manifest.json; a view keeps anything else out of the check.
    with signed_view(Path(entry.path), _listed(entry), raw, store_root / "tmp") as view:
        return judge_folder(view, bundles, policy, channel)


def pulled_from(entry: Any, store_root: Path) -> str | None:
    record = signatures.read_record(store_root, entry.digest)
    return str(record["pulled_from"]) if record and record.get("pulled_from") else None


def require_trusted(entry: Any, policy: TrustPolicy, channel: str | None, *, store_root: Path, home: Path,
                    action: str, model: str = "-", target: str = "-", settings: Settings) -> Judgement:
    """Raise Untrusted (audited) unless `entry` satisfies the policy's rule for `channel`."""
    judgement = judge_entry(entry, policy, channel, store_root)
    if judgement.allowed:
        return judgement
    subject = f"{entry.kind}/{entry.key[:16]} ({entry.digest})"
    reason = judgement.reason()
    record_refusal(home, settings=settings, action=action, subject=subject, digest=entry.digest, reason=reason,
                   channel=channel or "-", model=model, target=target)
    missing = [f"a signature by {name}" for name in policy.trusted_keys(channel)] or ["a signature by a listed key"]
    raise Untrusted(f"{action} refused: {subject} is {'tampered: ' if judgement.tampered else ''}{reason}",
                    subject=subject, missing=missing,
                    fix="use an artifact signed by a key the trust policy lists (sign it when pushing it), "
                        "or add its signer's public key to the policy if it is trusted")


# --------------------------------------------------------------------------- pull


def channel_of_tag(tag: str | None, manifest_raw: bytes, policy: TrustPolicy | None) -> tuple[str, str, str] | None:
    """(model, target, channel) when `tag` is a channel tag `<model>.<target>.<channel>` (None: a version or key
    tag, or no tag). Read from the signed manifest.json (its recorded name and target, what promote tags it
    under), never from the OCI manifest's annotations (anyone who can push writes those); a tag ending in
    `.<channel>` for a channel the policy names counts too, so an artifact that records no name cannot slip a
    channel pull under the default rule."""
    import json

    if not tag:
        return None
    try:
        manifest = json.loads(manifest_raw)
    except ValueError:
        manifest = {}
    inputs = manifest.get("inputs") if isinstance(manifest, dict) and isinstance(manifest.get("inputs"), dict) else {}
    name = inputs.get("name")
    target = inputs.get("target", {}).get("gpu") if isinstance(inputs.get("target"), dict) else None
    if isinstance(name, str) and isinstance(target, str) and tag.startswith(f"{name}.{target}."):
        channel = tag.removeprefix(f"{name}.{target}.")
        if channel and "." not in channel:
            return name, target, channel
    parts = tag.split(".")
    if policy is not None and len(parts) >= 3 and parts[-1] in policy.file.channels:
        return parts[0], ".".join(parts[1:-1]), parts[-1]
    return None


def channel_tag_binding_problem(registry: Any, home: Path, cid: tuple[str, str, str], policy: TrustPolicy,
                                artifact_digest: str) -> str | None:
    """Why a channel tag is not bound to `artifact_digest` (None: it is). A channel tag moves, so no signature
    over the artifact can bind it; the channel's trail does: the registry keeps it beside the tag, and its head
    must be signed by a key the channel's rule trusts (anyone who can push can rewrite an unsigned trail along
    with the tag), and its last move must name this artifact. What this cannot see is an older, genuinely
    signed trail put back together with the tag (the trail's freshness, checked by `channels --verify`)."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.release.shared_trail import SharedChannel, as_records, read_registry
    from trtpipe.release.trail import replay
    from trtpipe.signing_keys import ReleaseKey

    shared = SharedChannel(Path(home), *cid)
    if registry is None or not hasattr(registry, "get_channel_trail"):
        return f"the channel's trail cannot be read from {registry or 'this remote'}, so nothing binds the channel tag"
    where = f"{registry.url}:{shared.tag}"
    problems: list[str] = []
    for name, public in policy.trusted_keys(cid[2]).items():
        try:
            copy = read_registry(registry, shared, ReleaseKey(public))
            records = as_records(copy.records, where) if copy is not None and not copy.legacy else []
        except TrtpipeError as err:
            return f"the channel's trail {where} cannot be read ({err.one_line()})"
        if copy is None:
            return f"the registry holds no trail of channel {shared.label} ({where}), so nothing binds the channel tag"
        if copy.legacy:
            return f"{where} holds only a head (a trail from before channels were shared), which names no artifact"
        if copy.problems:
            problems = problems or copy.problems
            continue
        pointer = replay(records).pointers.get(cid)
        named = pointer.digest if pointer is not None else None
        if named != artifact_digest:
            return (f"the channel tag names {artifact_digest}, but channel {shared.label}'s trail (signed by {name}, "
                    f"key id {public.key_id[:16]}) says {named or 'nothing'} (the tag was moved outside trtpipe)")
        return None
    return problems[0] if problems else f"policy {policy.source} lists no key for channel {cid[2]!r}"


def tag_problem(tag: str, channel: tuple[str, str, str] | None, provenance: list[bytes], policy: TrustPolicy,
                artifact_digest: str) -> str | None:
    """Why pulling by `tag` is refused although the artifact's signature verified (None: the tag is bound).

    A version tag is bound by the signed provenance: sign_pushed names the tags it pushed in the statement
    (`bind_tags`), so the tag asked for must be among those a trusted key signed for this very artifact.
    An artifact signed before statements named tags (or keyless, which attaches no provenance) proves
    nothing about its tags: refused by tag under a policy, pullable by digest, and a `cache push --sign`
    of the same entry again binds them. A channel tag moves by design; its binding is the channel's trail
    (`channels --verify` compares the registry's channel tag with it), and it is judged by the channel's rule."""
    if channel is not None:
        return None  # checked against the channel's trail (`channel_tag_binding_problem`)
    signed = signed_tags(provenance, policy.trusted_keys(None), artifact_digest)
    if signed is None:
        return (f"its signed provenance names none of its tags (signed before tags were bound, or keyless), so the tag "
                f"{tag} is not proven to be its own")
    if tag in signed:
        return None
    from trtpipe.store.oci import KINDS

    key_tags = tuple(f"{kind}-" for kind in KINDS)  # the version tags say more than the key tag
    named = ", ".join(t for t in signed if not t.startswith(key_tags)) or ", ".join(signed)
    return f"the tag {tag} names a manifest whose signature binds it to tag {named}, not {tag} (the tag was re-pointed)"


def _own_key_tag(tag: str, manifest_raw: bytes) -> bool:
    """Whether `tag` is the `<kind>-<key>` tag of the kind and key the signed manifest.json names: bound by the
    signature over that manifest already (another artifact under that tag would need its own trusted signature)."""
    import json

    from trtpipe.store.oci import key_tag

    try:
        manifest = json.loads(manifest_raw)
        return isinstance(manifest, dict) and tag == key_tag(str(manifest["kind"]), str(manifest["key"]))
    except (ValueError, KeyError):
        return False


class PullGate:
    """Called by the registry pull with the verified-but-not-installed files: refuse what the policy does
    not accept (audited); keep the signatures it found beside the entry.

    A pull by a channel tag is judged by that channel's rule; a pull by a version tag under a policy also
    needs the tag to be one the signed provenance names (`tag_problem`)."""

    def __init__(self, workspace: Workspace, policy: TrustPolicy | None, *, note: Note | None = None) -> None:
        self.policy = policy
        self.settings = workspace.settings  # the caller's: a refusal is signed and attributed as they say
        self.store_root = workspace.root
        self.home = workspace.root
        self.note = note

    def __call__(self, registry: Any, remote: Any, staged: Path, raw: bytes) -> None:
        """Judge `remote` (an artifact of `registry`, the remote pulling it, which also keeps its channels'
        trails) from its files staged in `staged` and its manifest.json bytes `raw`."""
        found = fetch_signatures(registry.client, remote.ref.repository, remote.oci_digest)
        tag = getattr(remote, "tag", None)
        shown = f"{remote.ref.base}:{tag}" if tag else str(remote.ref)
        if self.note is not None:
            for line in found.skipped:
                self.note(f"note: {shown}: {line}")
        cid = channel_of_tag(tag, raw, self.policy)
        channel = cid[2] if cid is not None else None
        files = [layer["annotations"]["org.opencontainers.image.title"] for layer in remote.manifest["layers"]]
        with signed_view(staged, files, raw, self.store_root / "tmp") as view:
            judgement = judge_folder(view, found.bundles, self.policy, channel)
        subject = f"{remote.kind}/{remote.key[:16]} ({remote.artifact_digest})"
        problem = None
        if judgement.allowed and self.policy is not None and tag and judgement.verified and not _own_key_tag(tag, raw):
            problem = tag_problem(tag, cid, found.provenance, self.policy, remote.artifact_digest)
        if judgement.allowed and self.policy is not None and cid is not None \
                and self.policy.requires_signature(channel):
            problem = channel_tag_binding_problem(registry, self.home, cid, self.policy, remote.artifact_digest)
        if not judgement.allowed or problem is not None:
            reason = problem or judgement.reason()
            record_refusal(self.home, settings=self.settings, action="pull", subject=subject,
                           digest=remote.artifact_digest, reason=reason, ref=str(remote.ref), channel=channel or "-",
                           model=str(remote.annotations.get("org.trtpipe.model", "-")),
                           target=str(remote.annotations.get("org.trtpipe.target.gpu", "-")))
            if problem is not None:
                raise Untrusted(f"pull refused: {shown} ({remote.kind}/{remote.key[:16]}): {problem}; "
                                "nothing was installed",
                                subject=subject, missing=[f"a signature binding the tag {tag}"],
                                fix=f"pull it by digest ({remote.ref}) if that artifact is the one you want, or have the "
                                    "release key holder sign it again under this tag")
            missing = ([f"a signature by {n}" for n in self.policy.trusted_keys(channel)] if self.policy is not None else [])
            raise Untrusted(f"pull refused: {shown} ({remote.kind}/{remote.key[:16]}) is "
                            f"{'tampered: ' if judgement.tampered else ''}{reason}; nothing was installed",
                            subject=subject, missing=missing,
                            fix="pull only artifacts signed by a key the trust policy lists; if this signer is trusted, "
                                "add its public key to the policy")
        if self.note is not None:
            rule = f" (channel {channel!r}'s rule)" if channel is not None else ""
            if self.policy is None:
                self.note(f"note: {subject}: {judgement.reason()}; set a trust policy to require signatures")
            else:
                self.note(f"verified: {subject} {judgement.reason()}{rule}")
        signatures.update_record(self.store_root, remote.artifact_digest, kind=remote.kind, key=remote.key,
                                 pulled_from=str(remote.ref), bundles=found.bundles,
                                 provenance=found.provenance[0].decode("utf-8", "replace") if found.provenance else None)


def open_gated(workspace: Workspace, url: str, gate: PullGate) -> Any:
    """The remote `url` names (a cache or a full reference in one), opened by the workspace (its settings and
    weight-file rule), every pull judged by `gate`. A kind of remote whose pulls cannot be judged (it keeps no
    signatures) is refused when a policy is set: its pulls would pass unverified; without a policy there is
    nothing to enforce."""
    from trtpipe.store.remote import judges_pulls

    if gate.policy is not None and not judges_pulls(url):
        raise Untrusted(f"{url} cannot verify signatures on pull, and trust policy {gate.policy.source} is set",
                        subject=url, missing=["signature verification on pull"],
                        fix="use an oci:// remote, or run without a trust policy")
    return workspace.remote_for(url, gate=gate)


# --------------------------------------------------------------------------- a folder as an artifact


@dataclass(frozen=True)
class FolderArtifact:
    """A stored artifact's folder read on its own (serve takes a folder, not a store reference)."""

    kind: str
    key: str
    digest: str
    path: Path
    files: list[dict[str, Any]]
    inputs: dict[str, Any]
    raw: bytes = b""  # the manifest.json bytes `digest` is the sha256 of


def artifact_at(path: Path) -> FolderArtifact | None:
    """The artifact whose folder `path` is (its manifest.json names kind, key and files), or None."""
    import hashlib
    import json

    from trtpipe.store.manifest import sound_files

    try:
        raw = (Path(path) / "manifest.json").read_bytes()
        manifest = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("kind"), str) or not isinstance(manifest.get("key"), str):
        return None
    inputs = manifest.get("inputs") if isinstance(manifest.get("inputs"), dict) else {}
    return FolderArtifact(kind=manifest["kind"], key=manifest["key"], digest="sha256:" + hashlib.sha256(raw).hexdigest(),
                          path=Path(path), files=sound_files(manifest), inputs=inputs, raw=raw)


def store_root_of(artifact: FolderArtifact, default: Path) -> Path:
    """The store an artifact's folder sits in (`<root>/<kind>/<key>`), else `default`."""
    resolved = artifact.path.resolve()
    if resolved.name == artifact.key and resolved.parent.name == artifact.kind:
        return resolved.parent.parent
    return Path(default)


# --------------------------------------------------------------------------- build


def pulled_checker(workspace: Workspace, policy: TrustPolicy) -> Callable[[Any], tuple[bool, str]]:
    """The runner's judge of entries that came from a registry into the workspace's store: usable only when
    their signatures satisfy the policy's default rule (a refusal is audited, and the stage is rebuilt)."""
    store_root = home = workspace.root
    settings = workspace.settings

    def check(entry: Any) -> tuple[bool, str]:
        origin = pulled_from(entry, store_root)
        if origin is None:
            return True, ""  # built here
        judgement = judge_entry(entry, policy, None, store_root)
        if judgement.allowed:
            return True, f"pulled entry from {origin}: {judgement.reason()}"
        subject = f"{entry.kind}/{entry.key[:16]} ({entry.digest})"
        record_refusal(home, settings=settings, action="build", subject=subject, digest=entry.digest,
                       reason=judgement.reason(), ref=origin)
        return False, f"pulled {entry.kind} {entry.key[:16]} (from {origin}) not used: {judgement.reason()}"

    return check


@dataclass(frozen=True)
class VerifiedFolder:
    """A folder judged whole under a policy: its signature (if the rule asks for one) verified over exactly
    these files, and nothing else in the folder. Serve hands the server these files and no others
    (`trtpipe.serving.serving_copy.prepare(verified=...)` copies them by this list, checking each sha256)."""

    judgement: Judgement
    digest: str | None                  # the artifact digest (sha256 of the manifest.json judged); None: no manifest
    files: dict[str, dict[str, str]]    # relative path -> {"sha256", "mode"}, from that manifest.json

    @property
    def signature_verified(self) -> bool:
        """A trusted key's signature verified over these files (not merely let through by a lax rule)."""
        return bool(self.judgement.verified)


def require_trusted_folder(workspace: Workspace, folder: Path, policy: TrustPolicy, *, action: str,
                           channel: str | None = None) -> VerifiedFolder:
    """`require_trusted` for an artifact given as a folder (serve), over the WHOLE folder: every file in it
    must be one its manifest.json lists (which the signature covers), so a file or model folder added to a
    copy of a signed repository is refused, named (audited in the workspace). A folder that is no stored
    artifact carries no signature, so a policy that requires one refuses it."""
    home, settings = workspace.root, workspace.settings
    artifact = artifact_at(folder)
    if artifact is None:
        if not policy.requires_signature(channel):
            return VerifiedFolder(Judgement(policy.judge([], channel), False, (), None, ()), None, {})
        reason = f"{folder} is not a stored artifact (no manifest.json), so it carries no signature"
        record_refusal(home, settings=settings, action=action, subject=str(folder), digest=None, reason=reason,
                       channel=channel or "-")
        raise Untrusted(f"{action} refused: {reason}, and policy {policy.source} requires one", subject=str(folder),
                        missing=[f"a signature by {n}" for n in policy.trusted_keys(channel)],
                        fix="serve a repository from the store that a trusted key signed")
    model = str(artifact.inputs.get("name") or "-")
    target_doc = artifact.inputs.get("target")
    target = str(target_doc.get("gpu")) if isinstance(target_doc, dict) and target_doc.get("gpu") else "-"
    judgement = require_trusted(artifact, policy, channel, store_root=store_root_of(artifact, home), home=home,
                                action=action, model=model, target=target, settings=settings)
    listed = {item["path"]: {"sha256": str(item["sha256"]), "mode": str(item.get("mode") or "0644")}
              for item in artifact.files}
    extra = unsigned_files(Path(folder), set(listed) | {"manifest.json"})
    if extra:
        subject = f"{artifact.kind}/{artifact.key[:16]} ({artifact.digest})"
        named = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        reason = f"{folder} holds {len(extra)} file(s) its signed manifest does not list: {named} (not signed)"
        record_refusal(home, settings=settings, action=action, subject=subject, digest=artifact.digest, reason=reason,
                       channel=channel or "-", model=model, target=target)
        raise Untrusted(f"{action} refused: {reason}", subject=subject, missing=[f"a signature over {extra[0]}"],
                        fix=f"remove {extra[0]}{' and the rest' if len(extra) > 1 else ''} from {folder}, or serve "
                            "the repository from the store")
    return VerifiedFolder(judgement, artifact.digest, listed)


def require_trusted_digest(workspace: Workspace, digest: str, policy: TrustPolicy, channel: str, *, model: str = "-",
                           target: str = "-", action: str = "promote") -> Judgement | None:
    """A move into `channel` (`action`: promote, rollback): when its rule requires a signature, the artifact
    must be in the workspace's store (a signature is checked over the files) and signed by a key the rule trusts."""
    from trtpipe.errors import NotFound

    if not policy.requires_signature(channel):
        return None
    home, settings = workspace.root, workspace.settings
    try:
        entry = workspace.store.find(digest)
    except NotFound:
        entry = None
    if entry is None or entry.digest != digest:
        reason = (f"{digest} is not in the local store, so its signature cannot be checked over its files "
                  f"(channel {channel!r} of policy {policy.source} requires one)")
        record_refusal(home, settings=settings, action=action, subject=digest, digest=digest, reason=reason, channel=channel,
                       model=model, target=target)
        raise Untrusted(f"{action} refused: {reason}", subject=digest,
                        missing=[f"a signature by {n}" for n in policy.trusted_keys(channel)],
                        fix="pull the artifact into the store first (its signature is verified over its files)")
    return require_trusted(entry, policy, channel, store_root=home, home=home, action=action, model=model,
                           target=target, settings=settings)


# --------------------------------------------------------------------------- provenance


def show_provenance(workspace: Workspace, ref: str, policy: TrustPolicy | None) -> dict[str, Any]:
    """{subject, signature (who signed it, checked against the policy's keys), signed_by, statement} of an
    artifact in the workspace's store (`ref` a kind/key, key prefix or digest) or a registry reference (`ref`
    a URL: SCHEME://...)."""
    from trtpipe.release.provenance import statement as make_statement
    from trtpipe.release.signing import open_envelope

    keys = dict(policy.keys) if policy is not None else {}
    if "://" in ref:
        remote = workspace.remote_for(ref)
        found = remote.resolve(ref)
        fetched = fetch_signatures(remote.client, found.ref.repository, found.oci_digest)
        subject = f"{found.ref} ({found.kind}/{found.key[:16]}, {found.artifact_digest})"
        if not fetched.provenance:
            raise Untrusted(f"{found.ref} carries no provenance attestation", subject=str(found.ref),
                            missing=["a provenance attestation"], fix="push it signed with a release key (that attaches one)")
        envelopes = fetched.provenance
        digest = found.artifact_digest
    else:
        entry = workspace.store.find(ref)
        subject = f"{entry.kind}/{entry.key} ({entry.digest})"
        record = signatures.read_record(workspace.root, entry.digest) or {}
        digest = entry.digest
        if not record.get("provenance"):
            return {"subject": subject, "signature": "unsigned: computed now from the store (not pushed with a key)",
                    "signed_by": None, "verified": False, "statement": make_statement(workspace, entry)}
        envelopes = [str(record["provenance"]).encode("utf-8")]
    opened, unreadable = [], []
    for body in envelopes:  # an envelope anyone attached that does not parse is skipped, not fatal
        try:
            opened.append(open_envelope(body, keys, subject))
        except InvalidInput as err:
            unreadable.append(err)
    if not opened:
        raise unreadable[0]
    best = next((o for o in opened if o.verified_by), opened[0])
    subjects = best.statement.get("subject") or [{}]
    if subjects[0].get("digest", {}).get("sha256") != digest.removeprefix("sha256:"):
        raise IntegrityError(f"{subject}: its provenance is about another artifact "
                             f"({subjects[0].get('name')}); refused", fix="push it again with its own provenance")
    # Who signed is said only from a verification: the envelope's keyid is the pusher's word.
    if best.verified_by:
        said = f"signed by trusted key {best.verified_by} ({keys[best.verified_by].key_id})"
    elif keys:
        said = f"NOT verified: its signature verifies under none of the keys policy {policy.source} lists"
    else:
        said = "signature present, not verified (no trust policy: no key to check it against)"
    return {"subject": subject, "signature": said, "signed_by": best.verified_by, "verified": best.verified_by is not None,
            "claimed_key_ids": list(best.claimed_key_ids), "statement": best.statement}
