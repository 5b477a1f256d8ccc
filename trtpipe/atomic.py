"""Replace a small text file atomically: a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` to a temp file beside `path`, fsync it, then rename it over `path`.

    The temp file (`.NAME.XXXX.tmp`) never matches a `*.json` glob. `mode`: the file's permissions
    (mkstemp's 0600 otherwise), e.g. 0o644 for reports meant for others.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
