"""What the release report says about an artifact's signature and provenance: one small adapter.

The report asks `artifact_trust(home, digest, entry_dir)` and shows its answer; it never reads
signatures itself. Until signing lands (issue 18, `trtpipe.release.signing`), nothing in a
workspace records a signature or an attestation, so every artifact is `unsigned` with `no
provenance`: that is the truth of such a store, not a placeholder. Once signing lands, this
function is the one place to wire: ask signing for the artifact's verified signature (signer,
trust-policy verdict) and provenance (present, builder, input digests) and map them onto
`ArtifactTrust`. The report, its HTML and its JSON need no other change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

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

    @property
    def trusted(self) -> bool:
        return self.signature == "signed"


def artifact_trust(home: Path, digest: str, entry_dir: Path | None) -> ArtifactTrust:
    """The signature and provenance status of the artifact `digest` (stored at `entry_dir`, or None
    when the workspace's store does not hold it). No signature is recorded anywhere yet."""
    return ArtifactTrust(
        signature="unsigned",
        signature_detail="no signature recorded" + (" (artifact not in this store)" if entry_dir is None else ""),
        provenance="none",
        provenance_detail="no provenance attestation recorded",
    )
