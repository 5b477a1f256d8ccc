"""The options commands share for signing and trust: --sign KEY and --policy FILE (thin: parse and load)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

SignOption = Annotated[Optional[str], typer.Option(
    "--sign", help="Sign with this release key (a PEM EC P-256 private key file), or 'sigstore' for keyless "
                   "signing with an OIDC identity (CI); default: $TRTPIPE_SIGNING_KEY.")]
PolicyOption = Annotated[Optional[Path], typer.Option(
    "--policy", help="Trust policy file (YAML: keys, default and per-channel rules); default: $TRTPIPE_POLICY.")]


def load_policy_option(policy: Path | None, settings: Any) -> Any:
    """The TrustPolicy the command runs under, or None (then nothing is imported: a warm build stays light)."""
    if policy is None and settings.policy is None:
        return None
    from trtpipe.release.policy import policy_from

    return policy_from(policy, settings.policy)


def signing_key_option(sign: str | None, settings: Any) -> Any:
    """The key to sign with: a PrivateKey, the string 'sigstore' (keyless), or None (do not sign)."""
    from trtpipe.release.keys import load_signing_key, signing_key_source
    from trtpipe.release.trust import KEYLESS

    source = signing_key_source(sign, settings.signing_key)
    if source is None:
        return None
    if source == KEYLESS:
        return KEYLESS
    return load_signing_key(source)
