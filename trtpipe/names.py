"""Plain names: what an artifact, model, target or channel may be called.

These names become path parts (channels/<model>/<target>/<channel>.json), OCI tags and log fields,
so they are plain: letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 128
characters (no slash, no space, no newline). The spec refuses such names when it is checked, and
release refuses them when it promotes: one rule, here, read by both.
"""

from __future__ import annotations

import re

from trtpipe.errors import UsageError

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def name_problem(what: str, value: str) -> str | None:
    """Why `value` is not a plain name for `what` (e.g. "channel"), or None when it is one."""
    if not isinstance(value, str) or not _PLAIN.fullmatch(value) or value in (".", ".."):
        return f"{what} {value!r} is not a plain name"
    return None


def name_fix(what: str) -> str:
    return f"use letters, digits, '.', '_' or '-' (not starting with '.' or '-', at most 128) for the {what}"


def check_name(what: str, value: str) -> str:
    """`value`, or UsageError when it is not a plain name."""
    problem = name_problem(what, value)
    if problem:
        raise UsageError(problem, fix=name_fix(what))
    return value
