"""The workspace's own trust policy: once set, every command that moves or serves runs under it.

A policy named per command (`--policy`, TRTPIPE_POLICY) is only as good as the shell that runs the command:
the same forced promote from a shell without it passes. So a workspace can hold its policy:

    trtpipe policy set FILE     validate FILE, copy it and its public keys into `<home>/policy/`, and record
                                the copy's digest in the audit trail (action `policy`)

The copy is self-contained: `policy/policy.yaml` names each key as `{path: keys/<key id>.pub, id: <key id>}`,
so a key file swapped inside the workspace is refused by its pin, and the copy keeps working when FILE's
folder moves. The audit trail is what says a workspace has a policy: the copy must have the digest of the
trail's last `policy set` record (a copy written by hand, or deleted, is refused; `policy set` again puts
it right, recorded). Promote, rollback, serve, cache pull and build then use it with TRTPIPE_POLICY unset;
a `--policy`/TRTPIPE_POLICY naming a different policy is refused rather than silently preferred; running
without it takes `--no-policy`, which is recorded in the audit trail (action `policy`, with the command).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtpipe.errors import IntegrityError, UsageError

if TYPE_CHECKING:
    from trtpipe.release.policy import TrustPolicy
    from trtpipe.settings import Settings
    from trtpipe.workspace import Workspace

# Light at import (no YAML, pydantic or cryptography): every build asks `may_have_policy`, and a warm build
# without a policy must stay as light as it was; the rest imports what it needs when it runs.

UNSCOPED = "-"  # the model/target/channel of a record about no channel (as trust.record_refusal writes)
SET_PREFIX = "workspace policy set"


def policy_dir(home: Path) -> Path:
    return Path(home) / "policy"


def policy_file(home: Path) -> Path:
    return policy_dir(home) / "policy.yaml"


def _trail_file(home: Path) -> Path:
    return Path(home) / "audit" / "audit.jsonl"  # trtpipe.release.audit.audit_path (not imported: see above)


def may_have_policy(home: Path) -> bool:
    """Cheap: whether the workspace holds a policy copy or its trail mentions one (then `workspace_policy`
    decides); False means it certainly has none."""
    if policy_file(home).exists() or policy_file(home).is_symlink():
        return True
    try:
        return b'"policy"' in _trail_file(home).read_bytes()
    except OSError:
        return False


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(policy: TrustPolicy) -> dict[str, Any]:
    """What a policy decides, independent of where its files are: keys by id, the rules as written."""
    body = policy.file.model_dump(mode="json", exclude={"keys"})
    body["keys"] = {name: key.key_id for name, key in sorted(policy.keys.items())}
    return body


@dataclass(frozen=True)
class PolicySet:
    path: Path
    digest: str
    source: str
    keys: dict[str, str]  # name -> key id
    audit_seq: int


def set_policy(workspace: Workspace, source: Path) -> PolicySet:
    """Validate `source`, record its copy's digest in the workspace's trail (signed with its release key, by its
    user), then write the copy (keys first, the policy file last and atomically: a crash leaves the old copy or
    the new one, and a copy that is not the one the trail records is refused until `policy set` runs again)."""
    import yaml

    from trtpipe.atomic import write_text_atomically
    from trtpipe.release.audit import append_audit
    from trtpipe.release.channels import now_iso
    from trtpipe.release.policy import load_policy
    from trtpipe.results import current_user
    from trtpipe.signing_keys import release_key

    home, settings = workspace.root, workspace.settings
    who, at, key = current_user(settings), now_iso(), release_key(settings)
    policy = load_policy(source)
    keys_dir = policy_dir(home) / "keys"
    body = canonical(policy)
    body["keys"] = {name: {"path": f"keys/{key_id}.pub", "id": key_id} for name, key_id in body["keys"].items()}
    text = (f"# The trust policy of this workspace, copied from {source} by `trtpipe policy set`; change it with\n"
            "# `trtpipe policy set FILE` (recorded in the audit trail), not by hand (a hand edit is refused).\n"
            + yaml.safe_dump(body, sort_keys=False))
    digest = _digest(text.encode("utf-8"))
    record = append_audit(home, key=key, at=at, who=who, action="policy", channel=UNSCOPED, model=UNSCOPED,
                          target=UNSCOPED, from_digest=None, to_digest=digest, ref=str(Path(source).resolve()),
                          detail=f"{SET_PREFIX} from {source} (keys: "
                                 + (", ".join(f"{n}={k[:16]}" for n, k in canonical(policy)["keys"].items()) or "none")
                                 + ")")
    for name, public in policy.keys.items():
        write_text_atomically(keys_dir / f"{public.key_id}.pub", public.pem().decode("ascii"), mode=0o644)
    write_text_atomically(policy_file(home), text, mode=0o644)
    return PolicySet(policy_file(home), digest, str(source), canonical(policy)["keys"], record.seq)


def _recorded_digest(home: Path) -> str | None:
    """The digest the trail's last `policy set` record names (None: the trail sets no policy). The trail is
    read only when its bytes mention a policy record, so a workspace without one pays one file read."""
    from trtpipe.release.audit import read_audit

    try:
        raw = _trail_file(home).read_bytes()
    except FileNotFoundError:
        return None
    if b'"policy"' not in raw:
        return None
    sets = [r for r in read_audit(home) if r.action == "policy" and (r.detail or "").startswith(SET_PREFIX)]
    return sets[-1].to_digest if sets else None


def workspace_policy(home: Path) -> TrustPolicy | None:
    """The workspace's policy (None: it has none); IntegrityError when the copy is not what the trail records."""
    from trtpipe.release.policy import load_policy
    from trtpipe.small_file import read_small_file

    path = policy_file(home)
    recorded = _recorded_digest(home)
    if not path.exists() and not path.is_symlink():
        if recorded is None:
            return None
        raise IntegrityError(f"{path}: missing, but the audit trail records workspace policy {recorded}; "
                             "nothing was done",
                             path=str(path), fix="set the workspace's policy again (recorded), or run without a policy "
                                                 "(recorded)")
    found = _digest(read_small_file(path, "trust policy"))
    if found != recorded:
        said = f"records {recorded}" if recorded else "records no workspace policy"
        raise IntegrityError(f"{path}: holds {found}, but the audit trail {said} (edited outside "
                             "`trtpipe policy set`); "
                             "nothing was done", path=str(path),
                             fix="set the intended policy again (recorded), not by editing the copy")
    return load_policy(path)


def policy_for(workspace: Workspace, explicit: Path | None, *, no_policy: bool, command: str) -> TrustPolicy | None:
    """The policy `command` runs under: the workspace's when it has one (a --policy or TRTPIPE_POLICY naming
    another policy is refused), else `explicit` (--policy), else the settings' TRTPIPE_POLICY, else none;
    `no_policy`: none, recorded in the workspace's trail."""
    from trtpipe.release.policy import load_policy, policy_from

    home, settings = workspace.root, workspace.settings
    setting = settings.policy
    if no_policy:
        if explicit is not None and str(explicit) != "":
            raise UsageError("--policy and --no-policy contradict each other", fix="give one of them")
        _record_no_policy(home, command, setting, settings)
        return None
    own = workspace_policy(home)
    if own is None:
        return policy_from(explicit, setting)
    named = explicit if explicit is not None and str(explicit) != "" else setting
    if named is not None:
        other = load_policy(named)
        if canonical(other) != canonical(own):
            where = "--policy" if named is explicit else "TRTPIPE_POLICY"
            raise UsageError(f"{where} {named} is not this workspace's policy ({policy_file(home)}), which every "
                             f"{command} here runs under; nothing was done",
                             fix=f"drop {where}, make that the workspace's policy (recorded), or run without a policy "
                                 "(recorded)")
    return own


def _record_no_policy(home: Path, command: str, setting: Path | None, settings: Settings) -> None:
    from trtpipe.release.audit import append_audit
    from trtpipe.release.channels import now_iso
    from trtpipe.signing_keys import release_key
    from trtpipe.results import current_user

    recorded = _recorded_digest(home)
    bypassed = [f"workspace policy {recorded}" if recorded else None,
                f"TRTPIPE_POLICY={setting}" if setting is not None else None]
    append_audit(home, key=release_key(settings), at=now_iso(), who=current_user(settings),
                 action="policy", channel=UNSCOPED, model=UNSCOPED, target=UNSCOPED, from_digest=recorded,
                 to_digest=None, reason=f"{command} --no-policy",
                 detail=f"{command} ran without a trust policy (--no-policy"
                        + (f"; not applied: {', '.join(b for b in bypassed if b)}" if any(bypassed) else "") + ")")
