"""What the release report says about an artifact's signature and provenance: one small adapter.

The report asks `artifact_trust(workspace, digest, entry, channel)` for each channel's artifact and
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

from trtpipe.workspace import Workspace

# "signed" only when a signature verified against a key of the policy (and `signer` names that key); a
# signature nothing could check is "unverified", one no key of the policy made is "untrusted", and junk
# attached as a signature is "malformed". A key id a signature claims is never shown as its signer.
SignatureState = Literal["signed", "unsigned", "unverified", "malformed", "invalid", "untrusted", "unknown"]
ProvenanceState = Literal["present", "none", "invalid", "unknown"]


class ArtifactTrust(BaseModel):
    """An artifact's signature and provenance, as the report shows them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    signature: SignatureState
    signer: str | None = None  # the policy key (name, key id) a signature verified against; never a claimed id
    signature_detail: str
    provenance: ProvenanceState
    provenance_detail: str


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
    if judgement.verified:
        return "signed", judgement.signer, judgement.reason()
    if judgement.malformed == len(judgement.claimed):
        return "malformed", None, "what is attached as a signature is not a signature bundle (unverified)"
    if policy is None:
        return "unverified", None, "signature present, not verified: no trust policy (no key to check it against)"
    if judgement.allowed:
        # The channel requires no signature, and none of its trusted keys made this one.
        return "untrusted", None, (
            f"a signature that verifies under none of the keys policy {policy.source} trusts for channel "
            f"{channel!r} (the channel requires no signature)")
    return "untrusted", None, judgement.reason()


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
        key_id = keys[opened.verified_by].key_id[:16]
        return "present", f"SLSA provenance signed by trusted key {opened.verified_by} (key id {key_id})"
    if policy is None:
        return "present", "SLSA provenance, signature not verified (no trust policy: no key to check it against)"
    return "present", (f"SLSA provenance NOT verified: its signature verifies under none of the keys policy "
                       f"{policy.source} trusts for channel {channel!r}")


def artifact_trust(workspace: Workspace, digest: str, entry: Any | None, channel: str) -> ArtifactTrust:
    """The signature and provenance status of the artifact `digest` in `channel` (`entry`: its store entry,
    None when the workspace's store does not hold it), judged under the workspace's own policy, else the one
    its settings name."""
    if entry is None:
        return ArtifactTrust(signature="unknown", signature_detail="artifact not in this store: its signature cannot be checked over its files",
                             provenance="unknown", provenance_detail="artifact not in this store")
    from trtpipe.release.workspace_policy import policy_for

    # The workspace's own policy when it has one (what its promotes and serves run under), else TRTPIPE_POLICY.
    home = workspace.root
    policy = policy_for(workspace, None, no_policy=False, command="report")
    signature, signer, signature_detail = _signature(home, entry, channel, policy)
    provenance, provenance_detail = _provenance(home, digest, channel, policy)
    return ArtifactTrust(signature=signature, signer=signer, signature_detail=signature_detail,
                         provenance=provenance, provenance_detail=provenance_detail)
