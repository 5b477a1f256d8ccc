"""What the release report says about an artifact's signature and provenance: one small adapter.

The report asks `artifact_trust(home, digest, entry, channel, settings)` for each channel's artifact and
shows the answer; it reads no signature itself. Until signing lands (issue 18: `trtpipe.release.trust`,
`trtpipe.store.signatures`), nothing in a workspace records a signature or an attestation, so every
artifact is `unsigned` with no provenance: the truth of such a store, not a placeholder. When signing
lands, this function is the one place to wire (judge the entry's kept signatures against the trust
policy the settings name, for the channel; read whether a provenance envelope is kept) and map the
answer onto `ArtifactTrust`; the report, its HTML and its JSON need no other change.
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


def artifact_trust(home: Path, digest: str, entry: Any | None, channel: str,
                   settings: Settings | None = None) -> ArtifactTrust:
    """The signature and provenance status of the artifact `digest` in `channel` (`entry`: its store entry,
    None when this workspace's store does not hold it). This trtpipe records no signature anywhere yet."""
    return ArtifactTrust(
        signature="unsigned",
        signature_detail="no signature recorded" + (" (artifact not in this store)" if entry is None else ""),
        provenance="none",
        provenance_detail="no provenance attestation recorded",
    )
