"""The options commands share for signing and trust: --sign KEY and --policy FILE (thin: parse and load)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

SignOption = Annotated[Optional[str], typer.Option(
    "--sign", help="Sign with this release key (a PEM EC P-256 private key file), or 'sigstore' for keyless "
                   "signing with an OIDC identity (CI); default: $TRTPIPE_SIGNING_KEY.")]
PolicyOption = Annotated[Optional[Path], typer.Option(
    "--policy", help="Trust policy file (YAML: keys, default and per-channel rules); default: the workspace's own "
                     "(`trtpipe policy set`), else $TRTPIPE_POLICY.")]
NoPolicyOption = Annotated[bool, typer.Option(
    "--no-policy", help="Run without any trust policy, even the workspace's own (recorded in the audit trail).")]


def load_policy_option(policy: Path | None, workspace: Any, *, no_policy: bool = False,
                       command: str = "command") -> Any:
    """The TrustPolicy the command runs under (the workspace's own when it has one), or None (then nothing
    heavy is imported: a warm build stays light). `no_policy`: None, recorded in the audit trail."""
    from trtpipe.release.workspace_policy import may_have_policy

    settings = workspace.settings
    if policy is None and settings.policy is None and not no_policy and not may_have_policy(workspace.root):
        return None
    from trtpipe.release.workspace_policy import policy_for

    return policy_for(workspace, policy, no_policy=no_policy, command=command)


def signing_key_option(sign: str | None, settings: Any) -> Any:
    """The key to sign with: a PrivateKey, the string 'sigstore' (keyless), or None (do not sign)."""
    from trtpipe.release.trust import signing_key

    return signing_key(sign, settings)
