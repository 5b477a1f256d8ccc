"""The trust policy: which keys may sign artifacts, where a signature is required, and whether a
hand-recorded result may count toward a channel's gates.

A policy is a YAML file the operator keeps (named by `--policy FILE` or the TRTPIPE_POLICY setting),
never a field of the artifact or of the spec published inside it: an artifact cannot choose who is
trusted to have built it.

    keys:                          # name -> a public key PEM file (relative paths: from this file)
      release: keys/release.pub    # or pinned: {path: keys/release.pub, id: <key id or its first 16+ hex>}
    default:                       # pull, serve, build, and every channel not listed below
      require_signature: true
      signers: [release]           # names from `keys`; empty or absent: any key in `keys`
    channels:
      dev:  {require_signature: false, allow_hand_recorded: true}
      prod: {signers: [release]}

Read strictly (`load_policy`): a regular file of at most 1 MiB; YAML whose mappings have no duplicate key;
`true`/`false` for booleans (never the string 'no'); `channels:` names only the known channels
(`KNOWN_CHANNELS`, or names the policy lists under `extra_channels:`), so a misspelt `Prod` cannot leave prod
under the default; a pinned key whose file holds another key is refused naming both ids. Errors name the line.

A workspace can hold its own policy (`trtpipe.release.workspace_policy`): then every command that moves or
serves uses it, whether or not TRTPIPE_POLICY is set.

No policy at all means: nothing required, nothing trusted (`verify` can then only say "unsigned" or
"signed by key X"), and hand-recorded results count for no channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag, ValidationError, \
    field_validator

from trtpipe.errors import InvalidInput
from trtpipe.signing_keys import PublicKey, load_public_key
from trtpipe.small_file import MAX_SMALL_FILE, read_small_file

# The channels trtpipe's flow promotes through (dev -> staging -> prod). A policy naming any other channel must
# list it under `extra_channels:`, so a typo (`Prod`, `production`) is an error instead of a silent default.
KNOWN_CHANNELS: tuple[str, ...] = ("dev", "staging", "prod")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChannelRule(_Strict):
    """What one channel (or the default) demands."""

    require_signature: StrictBool = Field(
        default=True, description="An artifact without a signature by a trusted key is refused.")
    signers: list[str] = Field(
        default_factory=list, description="Names from `keys` whose signatures count; empty: every key in `keys`.")
    allow_hand_recorded: StrictBool = Field(
        default=False, description="Results recorded by hand (no run behind them) may satisfy this channel's gates.")
    unsigned_results: Literal["allow", "refuse"] | None = Field(
        default=None, description="Whether a result not covered by a results-log head signed by a trusted key may "
                                  "satisfy this channel's gates; default: refuse where require_signature is true.")


class KeyPin(_Strict):
    """A trusted key pinned to its id: the file at `path` must hold the key whose id (or fingerprint: the
    id's hex, at least its first 16 characters) is `id`, so a swapped key file is refused, not trusted."""

    path: Path
    id: str = Field(pattern=r"^(sha256:)?[0-9a-f]{16,64}$", description="The key id (sha256 hex of the DER "
                    "public key, as `trtpipe` prints it), or at least its first 16 hex characters.")


# A key entry is a path, or a {path, id} pin: told apart by its YAML type, so an error names that form's field.
_KEY_FORMS = ("pinned", "file")
KeyEntry = Annotated[Union[Annotated[KeyPin, Tag("pinned")], Annotated[Path, Tag("file")]],
                     Discriminator(lambda value: "pinned" if isinstance(value, (dict, KeyPin)) else "file")]


class PolicyFile(_Strict):
    """The policy file as written."""

    version: StrictInt = Field(default=1, ge=1, le=1)
    keys: dict[str, KeyEntry] = Field(default_factory=dict, description="Key name -> public key PEM file, "
                                           "or {path, id} to pin the key it must hold.")
    default: ChannelRule = Field(default_factory=ChannelRule)
    extra_channels: list[str] = Field(default_factory=list, description="Channels beyond dev, staging and prod "
                                      "this policy has rules for.")
    channels: dict[str, ChannelRule] = Field(default_factory=dict)

    @field_validator("keys")
    @classmethod
    def _key_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"key name {name!r} must be letters, digits, '-', '_' or '.'")
        return value

    @field_validator("extra_channels")
    @classmethod
    def _extra_names(cls, value: list[str]) -> list[str]:
        from trtpipe.names import name_problem

        for name in value:
            problem = name_problem("channel", name)
            if problem:
                raise ValueError(problem)
        return value

    def known_channels(self) -> tuple[str, ...]:
        return (*KNOWN_CHANNELS, *(c for c in self.extra_channels if c not in KNOWN_CHANNELS))


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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that keeps each node, so duplicate keys and field lines can be found before construction."""


def _walk(node: yaml.Node, at: tuple[Any, ...], lines: dict[tuple[Any, ...], int], origin: Path,
          seen_nodes: set[int] | None = None) -> None:
    """Record the line of every mapping key and list item under `at`; refuse a key given twice in one mapping
    (yaml keeps the last one silently: a second, laxer `default:` would win) and an alias of a mapping or list
    (a policy needs none, and nested aliases make a 1 MiB file expand without bound: "billion laughs")."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        if id(node) in seen_nodes:
            raise InvalidInput(f"{origin}:{node.start_mark.line + 1}: {_field_of(at)}: a YAML alias (*name) of a "
                               "mapping or list; a trust policy allows none", fix="write the value out in full")
        seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise InvalidInput(f"{origin}:{line}: {_field_of((*at, key))}: given twice (first at line {seen[key]})",
                                   fix="keep one of them: a policy key means one thing")
            seen[key] = line
            lines[(*at, key)] = line
            _walk(value_node, (*at, key), lines, origin, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*at, index)] = item.start_mark.line + 1
            _walk(item, (*at, index), lines, origin, seen_nodes)


def _parse(path: Path, text: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """(the document, the line of each field path) of strict YAML."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple[Any, ...], int] = {}
        if node is not None:
            _walk(node, (), lines, path)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise InvalidInput(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})",
                           fix="fix the YAML syntax") from None
    finally:
        loader.dispose()
    return data, lines


def _at(path: Path, lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> str:
    """`FILE:LINE` of the nearest field of `loc` that has a line (FILE alone when none does)."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return f"{path}:{lines[loc[:end]]}"
    return str(path)


def _key_matches(key: PublicKey, pin: str) -> bool:
    pin = pin.removeprefix("sha256:")
    return key.key_id == pin if len(pin) == 64 else key.key_id.startswith(pin)


def load_policy(path: Path | str) -> TrustPolicy:
    """Read, validate and resolve a policy file: every error is one line naming the file, the line and the field."""
    path = Path(path).expanduser()
    raw = read_small_file(path, "trust policy", limit=MAX_SMALL_FILE,
                          fix=f"name the policy YAML file itself (a regular file of at most {MAX_SMALL_FILE} bytes; "
                              "see trtpipe/release/policy.py)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: cannot read the trust policy ({exc})",
                           fix="make it a readable UTF-8 file") from None
    data, lines = _parse(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: a trust policy is a mapping (keys, default, channels)",
                           fix="write it as YAML keys: keys:, default:, channels:")
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        if len(loc) > 2 and loc[0] == "keys" and loc[2] in _KEY_FORMS:  # the form's tag is not a field
            loc = loc[:2] + loc[3:]
        raise InvalidInput(f"{_at(path, lines, loc)}: {_field_of(loc)}: {first['msg']}",
                           fix="write true or false, unquoted" if first["type"] == "bool_type"
                           else "see the fields in trtpipe/release/policy.py") from None
    known = parsed.known_channels()
    for channel in parsed.channels:
        if channel not in known:
            raise InvalidInput(f"{_at(path, lines, ('channels', channel))}: channels.{channel}: not a known channel "
                               f"(known: {', '.join(known)})",
                               fix="name one of them (channel names are case-sensitive), or list the channel under "
                                   "extra_channels:")
    for where, rule in [("default", parsed.default)] + [(f"channels.{c}", r) for c, r in parsed.channels.items()]:
        for name in rule.signers:
            if name not in parsed.keys:
                raise InvalidInput(f"{_at(path, lines, tuple(where.split('.')) + ('signers',))}: {where}.signers: "
                                   f"{name!r} is not a key of this policy",
                                   fix=f"add it under keys: (known: {', '.join(parsed.keys) or 'none'})")
        if rule.require_signature and not parsed.keys:
            raise InvalidInput(f"{_at(path, lines, tuple(where.split('.')))}: {where}.require_signature: a "
                               "signature is "
                               "required but the policy lists no keys",
                               fix="list the trusted public keys under keys:, or set require_signature: false")
    keys: dict[str, PublicKey] = {}
    for name, entry in parsed.keys.items():
        key_path = entry.path if isinstance(entry, KeyPin) else entry
        full = key_path.expanduser()
        if not full.is_absolute():
            full = path.parent / full
        try:
            keys[name] = load_public_key(full)
        except InvalidInput as exc:
            raise InvalidInput(f"{_at(path, lines, ('keys', name))}: keys.{name}: {exc.message}", fix=exc.fix) from None
        if isinstance(entry, KeyPin) and not _key_matches(keys[name], entry.id):
            raise InvalidInput(f"{_at(path, lines, ('keys', name))}: keys.{name}: {full} holds key "
                               f"{keys[name].key_id}, "
                               f"not the pinned key {entry.id.removeprefix('sha256:')}",
                               fix="restore the pinned key file, or pin the new key's id if it was replaced on purpose")
    return TrustPolicy(source=str(path), file=parsed, keys=keys)


def policy_from(explicit: Path | str | None, setting: Path | None) -> TrustPolicy | None:
    """The policy a command runs under: its --policy value, else the TRTPIPE_POLICY setting, else none."""
    chosen = explicit if explicit is not None and str(explicit) != "" else setting
    return load_policy(chosen) if chosen is not None else None
