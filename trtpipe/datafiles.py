"""The shipped YAML data tables under `build_configs/` (toolchains, GPU catalog, trtllm-build flags).

They are plain data (no spec positions needed), so they load with libyaml's C loader when PyYAML
has it: about ten times faster than the pure-Python one, and they are read on every build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from trtpipe.errors import IntegrityError, MissingCapability

Item = TypeVar("Item", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    """The YAML document at `path` (safe loading; yaml.YAMLError and OSError pass through)."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_table(path: Path, what: str, list_key: str, model: type[Item]) -> list[Item]:
    """The entries of the top-level `list_key:` list in the table at `path`, each validated as `model`.

    `what` names the table in error messages, e.g. "GPU catalog".
    """
    try:
        data = read_yaml(path)
    except FileNotFoundError:
        raise MissingCapability(
            f"{what} {path} is missing",
            fix="reinstall trtpipe (its wheel carries build_configs/), restore the file from git in a checkout, "
                "or set TRTPIPE_BUILD_CONFIGS to a complete build_configs/ folder",
        ) from None
    except yaml.YAMLError as exc:
        raise IntegrityError(f"{what} {path} is not valid YAML: {exc}", path=str(path),
                             fix="restore the file from git") from None
    entries = data.get(list_key) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise IntegrityError(f"{path}: top-level `{list_key}:` list is missing", path=str(path),
                             fix="restore the file from git")
    items: list[Item] = []
    for index, entry in enumerate(entries):
        try:
            items.append(model.model_validate(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise IntegrityError(
                f"{path}: {list_key}[{index}].{loc}: {first['msg']}", path=str(path),
                fix="fix the entry or restore the file from git",
            ) from None
    return items
