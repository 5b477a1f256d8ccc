"""The trust policy: which keys may sign artifacts, where a signature is required, and whether a
hand-recorded result may count toward a channel's gates.

A policy is a YAML file the operator keeps (named by `--policy FILE` or the TRTPIPE_POLICY setting),
never a field of the artifact or of the spec published inside it: an artifact cannot choose who is
trusted to have built it.

    keys:                          # name -> a public key PEM file (relative paths: from this file)
      release: keys/release.pub
    default:                       # pull, serve, build, and every channel not listed below
      require_signature: true
      signers: [release]           # names from `keys`; empty or absent: any key in `keys`
    channels:
      dev:  {require_signature: false, allow_hand_recorded: true}
      prod: {signers: [release]}

No policy at all means: nothing required, nothing trusted (`verify` can then only say "unsigned" or
"signed by key X"), and hand-recorded results count for no channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trtpipe.errors import InvalidInput
from trtpipe.release.keys import PublicKey, load_public_key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChannelRule(_Strict):
    """What one channel (or the default) demands."""

    require_signature: bool = Field(
        default=True, description="An artifact without a signature by a trusted key is refused.")
    signers: list[str] = Field(
        default_factory=list, description="Names from `keys` whose signatures count; empty: every key in `keys`.")
    allow_hand_recorded: bool = Field(
        default=False, description="Results recorded by hand (no run behind them) may satisfy this channel's gates.")
    unsigned_results: Literal["allow", "refuse"] | None = Field(
        default=None, description="Whether a result not covered by a results-log head signed by a trusted key may "
                                  "satisfy this channel's gates; default: refuse where require_signature is true.")


class PolicyFile(_Strict):
    """The policy file as written."""

    version: int = Field(default=1, ge=1, le=1)
    keys: dict[str, Path] = Field(default_factory=dict, description="Key name -> public key PEM file.")
    default: ChannelRule = Field(default_factory=ChannelRule)
    channels: dict[str, ChannelRule] = Field(default_factory=dict)

    @field_validator("keys")
    @classmethod
    def _key_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name in value:
            if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"key name {name!r} must be letters, digits, '-', '_' or '.'")
        return value


@dataclass(frozen=True)
class Verdict:
    """What a policy says about an artifact's signatures (by key id) for one purpose."""

    allowed: bool
    required: bool
    trusted_signers: tuple[str, ...]     # names of trusted keys that signed it
    untrusted_key_ids: tuple[str, ...]   # key ids that signed it but are not trusted here
    reason: str                          # one line: why (or why not)


@dataclass(frozen=True)
class TrustPolicy:
    """A loaded policy: its rules and its public keys, by name."""

    source: str
    file: PolicyFile
    keys: dict[str, PublicKey]

    def rule(self, channel: str | None = None) -> ChannelRule:
        """The rule for `channel` (its own, else the default); None: the default (pull, serve, build)."""
        if channel is not None and channel in self.file.channels:
            return self.file.channels[channel]
        return self.file.default

    def requires_signature(self, channel: str | None = None) -> bool:
        return self.rule(channel).require_signature

    def allows_hand_recorded(self, channel: str | None = None) -> bool:
        return self.rule(channel).allow_hand_recorded

    def allows_unsigned_results(self, channel: str | None = None) -> bool:
        """Whether results whose log head no trusted key signed may count for `channel`. A channel that requires
        signed artifacts requires signed evidence too, unless it says otherwise: anyone who can write to the
        workspace can append a result through the chained log and rewrite its (unsigned) head (issue 28, attack 6)."""
        rule = self.rule(channel)
        if rule.unsigned_results is not None:
            return rule.unsigned_results == "allow"
        return not rule.require_signature

    def trusted_keys(self, channel: str | None = None) -> dict[str, PublicKey]:
        """name -> public key of the keys whose signature counts for `channel`."""
        names = self.rule(channel).signers or list(self.keys)
        return {name: self.keys[name] for name in names}

    def trusted_key_ids(self, channel: str | None = None) -> dict[str, str]:
        """key id -> name, for `channel`."""
        return {key.key_id: name for name, key in self.trusted_keys(channel).items()}

    def judge(self, signer_key_ids: list[str] | tuple[str, ...], channel: str | None = None) -> Verdict:
        """The verdict for an artifact whose signatures verified under `signer_key_ids` (empty:
        unsigned, or no signature verified)."""
        rule = self.rule(channel)
        where = f"channel {channel!r}" if channel is not None else "the default rule"
        trusted = self.trusted_key_ids(channel)
        good = tuple(trusted[k] for k in signer_key_ids if k in trusted)
        bad = tuple(k for k in signer_key_ids if k not in trusted)
        if good:
            return Verdict(True, rule.require_signature, good, bad, f"signed by trusted key {', '.join(good)}")
        if not rule.require_signature:
            return Verdict(True, False, (), bad, f"{where} of policy {self.source} requires no signature")
        if bad:
            return Verdict(False, True, (), bad,
                           f"signed only by untrusted key {', '.join(k[:16] for k in bad)}, and {where} of policy "
                           f"{self.source} requires a signature by {', '.join(trusted.values()) or 'a listed key'}")
        return Verdict(False, True, (), (), f"unsigned, and {where} of policy {self.source} requires a signature by "
                                            f"{', '.join(trusted.values()) or 'a listed key'}")


def allows_hand_recorded(policy: TrustPolicy | None, channel: str) -> bool:
    """Whether a hand-recorded result may count toward `channel`'s gates (no policy: never)."""
    return policy is not None and policy.allows_hand_recorded(channel)


def _field_of(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top)"


def load_policy(path: Path | str) -> TrustPolicy:
    """Read, validate and resolve a policy file: every error is one line naming the file and the field."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such trust policy file",
                           fix="name an existing policy YAML file (see trtpipe/release/policy.py)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot read the trust policy ({exc})", fix="make it a readable UTF-8 file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise InvalidInput(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})",
                           fix="fix the YAML syntax") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: a trust policy is a mapping (keys, default, channels)",
                           fix="write it as YAML keys: keys:, default:, channels:")
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"{path}: {_field_of(tuple(first['loc']))}: {first['msg']}",
                           fix="see the fields in trtpipe/release/policy.py") from None
    for where, rule in [("default", parsed.default)] + [(f"channels.{c}", r) for c, r in parsed.channels.items()]:
        for name in rule.signers:
            if name not in parsed.keys:
                raise InvalidInput(f"{path}: {where}.signers: {name!r} is not a key of this policy",
                                   fix=f"add it under keys: (known: {', '.join(parsed.keys) or 'none'})")
        if rule.require_signature and not parsed.keys:
            raise InvalidInput(f"{path}: {where}.require_signature: a signature is required but the policy lists no keys",
                               fix="list the trusted public keys under keys:, or set require_signature: false")
    keys: dict[str, PublicKey] = {}
    for name, key_path in parsed.keys.items():
        full = key_path.expanduser()
        if not full.is_absolute():
            full = path.parent / full
        try:
            keys[name] = load_public_key(full)
        except InvalidInput as exc:
            raise InvalidInput(f"{path}: keys.{name}: {exc.message}", fix=exc.fix) from None
    return TrustPolicy(source=str(path), file=parsed, keys=keys)


def policy_from(explicit: Path | str | None, setting: Path | None) -> TrustPolicy | None:
    """The policy a command runs under: its --policy value, else the TRTPIPE_POLICY setting, else none."""
    chosen = explicit if explicit is not None and str(explicit) != "" else setting
    return load_policy(chosen) if chosen is not None else None
