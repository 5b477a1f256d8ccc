"""What the release report says about an artifact's signature and provenance: one small adapter.

The report asks `artifact_trust(home, digest, entry, channel, settings)` for each channel's artifact and
shows the answer; it reads no signature itself. The answer comes from the signing work (issue 18): the
entry's kept signature bundles are verified again over its files against the trust policy the settings
name (TRTPIPE_POLICY), under that channel's rule (`trtpipe.release.trust.judge_entry`), and the kept
provenance envelope (`trtpipe.store.signatures`) is opened and its signature checked against the keys the
policy trusts for the channel. The report, its HTML and its JSON need no other change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from trtpipe.settings import Settings

SignatureState = Literal["signed", "unsigned", "invalid", "untrusted", "unknown"]
ProvenanceState = Literal["present", "none", "invalid", "unknown"]


class ArtifactTrust(BaseModel):
    """An artifact's signature and provenance, as the report shows them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signature: SignatureState
    signer: str | None = None  # the key or identity that signed, when signed
    signature_detail: str
    provenance: ProvenanceState
    provenance_detail: str


def _short(key_ids: tuple[str, ...] | list[str]) -> str:
    return ", ".join(k[:16] for k in key_ids if k) or "unknown"


def _signature(home: Path, entry: Any, channel: str, policy: Any) -> tuple[SignatureState, str | None, str]:
    """(state, signer, detail) of `entry`'s kept signatures under `policy`'s rule for `channel`."""
    from trtpipe.release.trust import judge_entry

    judgement = judge_entry(entry, policy, channel, home)
    if judgement.tampered is not None:
        return "invalid", None, judgement.reason()
    if not judgement.signed:
        if policy is not None and policy.requires_signature(channel):
            return "unsigned", None, judgement.reason()
        return "unsigned", None, "no signature recorded"
    if policy is None:
        return "signed", _short(judgement.claimed), "not verified: no trust policy"
    if judgement.allowed and judgement.verified:
        names = ", ".join(dict.fromkeys(c.key_name for c in judgement.verified if c.key_name))
        return "signed", names, judgement.reason()
    if judgement.allowed:
        # The channel requires no signature, and none of its trusted keys made this one.
        return "untrusted", _short(judgement.claimed), (
            f"signed by key {_short(judgement.claimed)}, which policy {policy.source} does not trust for channel "
            f"{channel!r} (the channel requires no signature)")
    return "untrusted", _short(judgement.claimed), judgement.reason()


def _provenance(home: Path, digest: str, channel: str, policy: Any) -> tuple[ProvenanceState, str]:
    """(state, detail) of the provenance attestation kept beside `digest`."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.release.signing import open_envelope
    from trtpipe.store import signatures

    record = signatures.read_record(home, digest)
    text = record.get("provenance") if record else None
    if not text:
        return "none", "no provenance attestation recorded"
    keys = policy.trusted_keys(channel) if policy is not None else {}
    try:
        opened = open_envelope(str(text).encode("utf-8"), keys, f"provenance of {digest}")
    except TrtpipeError as exc:
        return "invalid", exc.message
    subjects = opened.statement.get("subject")
    first = subjects[0] if isinstance(subjects, list) and subjects and isinstance(subjects[0], dict) else {}
    about = first.get("digest", {}).get("sha256") if isinstance(first.get("digest"), dict) else None
    if about != digest.removeprefix("sha256:"):
        return "invalid", f"the attestation is about another artifact ({first.get('name', 'no subject')})"
    if opened.verified_by is not None:
        return "present", f"SLSA provenance signed by trusted key {opened.verified_by}"
    if policy is None:
        return "present", f"SLSA provenance, signature not verified (no trust policy); it claims key {_short(opened.claimed_key_ids)}"
    return "present", (f"SLSA provenance NOT verified: signed by key {_short(opened.claimed_key_ids)}, which policy "
                       f"{policy.source} does not trust for channel {channel!r}")


def artifact_trust(home: Path, digest: str, entry: Any | None, channel: str,
                   settings: Settings | None = None) -> ArtifactTrust:
    """The signature and provenance status of the artifact `digest` in `channel` (`entry`: its store entry,
    None when this workspace's store does not hold it), judged under the trust policy `settings` name."""
    if entry is None:
        return ArtifactTrust(signature="unknown", signature_detail="artifact not in this store: its signature cannot be checked over its files",
                             provenance="unknown", provenance_detail="artifact not in this store")
    from trtpipe.release.policy import policy_from

    policy = policy_from(None, settings.policy if settings is not None else None)
    signature, signer, signature_detail = _signature(Path(home), entry, channel, policy)
    provenance, provenance_detail = _provenance(Path(home), digest, channel, policy)
    return ArtifactTrust(signature=signature, signer=signer, signature_detail=signature_detail,
                         provenance=provenance, provenance_detail=provenance_detail)
