"""What every repository layout's writer shares: the trtpipe.json header, placing stored files without copying
them, the atomic publish (staging directory, validation, one rename) and reading a repository's manifest back.

The layouts' own writers are trtpipe.serving.inflight_repository (upstream's inflight_batcher_llm ensemble) and
trtpipe.serving.llmapi_repository (TensorRT-LLM's llmapi model); trtpipe.serving.layouts names each.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from trtpipe.errors import IntegrityError, InternalError, NotFound, UsageError
from trtpipe.serving import identity
from trtpipe.serving.templates import MANIFEST_NAME

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
# Where `trtpipe serve --print` mounts the repository inside the Triton container; the GPU
# tensorrt_llm model's gpt_model_path points below it, so the repository can move on the host.
CONTAINER_REPO_MOUNT = "/trtpipe/repo"
# The artifact store's per-entry manifest (trtpipe.store.local.MANIFEST): not an engine file.
STORE_MANIFEST = "manifest.json"
Placement = Literal["hardlink", "reflink", "copy"]


def _reflink(src: Path, dst: Path) -> bool:
    """Copy-on-write clone (FICLONE) where the filesystem supports it."""
    ficlone = 0x40049409
    try:
        with open(src, "rb") as fsrc, open(dst, "wb") as fdst:
            fcntl.ioctl(fdst.fileno(), ficlone, fsrc.fileno())
        return True
    except OSError:
        dst.unlink(missing_ok=True)
        return False


def place_file(src: Path, dst: Path) -> Placement:
    """Hard link, else reflink, else copy (and say so)."""
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
    if _reflink(src, dst):
        return "reflink"
    log.warning("copying %s into the repository: hard link and reflink both failed (another filesystem?)", src)
    shutil.copy2(src, dst)
    return "copy"


def manifest_header(resolved: Any, repository_key: str | None) -> dict[str, Any]:
    """What every repository's trtpipe.json says of the spec and the toolchain, whichever layout it has."""
    spec = resolved.spec
    toolchain = resolved.toolchain
    return {
        "name": spec.artifact_name,
        # What promotion requires, carried by the artifact itself (also in its store key document).
        "release": spec.release.model_dump(mode="json"),
        "repository_key": repository_key,
        "target": spec.target.gpu,
        "reference": spec.target.is_cpu_reference,
        "toolchain": toolchain.name,
        "trtllm_version": toolchain.trtllm_version,
        "serving_container": toolchain.triton_container,
        "serving_container_digest": toolchain.triton_container_digest,
        "container_repo_mount": CONTAINER_REPO_MOUNT,
    }


def write_repository_atomically(
    out_dir: Path, digest: str, repository_key: str | None,
    write: Callable[[Path, dict[str, str]], dict[str, Any]], validate: Callable[[Path], list[Any]], what: str,
) -> Path:
    """Publish a repository into `out_dir` (absent or empty), whatever its layout: `write(staging, identity values)`
    writes the models into a staging directory beside it and returns the trtpipe.json manifest; the result must
    pass `validate`, then one rename puts it in place. A reader never sees half a repository."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"{out_dir} is not empty", fix="publish into a new or empty directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        identity_values = {identity.ENGINE_DIGEST: digest}
        if repository_key is not None:
            identity_values[identity.REPOSITORY_KEY] = repository_key
        manifest = write(staging, identity_values)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        issues = [i for i in validate(staging) if i.severity == "error"]
        if issues:
            raise InternalError(f"published {what} does not validate: {issues[0].one_line()}",
                                fix="report this bug with the spec that produced it")
        staging.chmod(0o755)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above); the store hands us its own empty build dir
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def read_manifest(repo: Path) -> dict[str, Any]:
    path = Path(repo) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(f"{path} not found: {repo} is not a repository trtpipe published", what="repository", ref=str(repo),
                       fix="give the repository path a build printed (repository_path in its JSON report)") from None
    except json.JSONDecodeError as err:
        raise IntegrityError(f"{path}: not valid JSON ({err})", path=str(path), fix="publish the repository again") from None


def bool_parameter(value: str | None) -> bool | None:
    """A config.pbtxt string parameter read as a boolean, as upstream's model.py files read theirs ("true", in any
    case, is true); None when it is absent or empty (the model's default applies)."""
    if value is None or value == "":
        return None
    return value.strip().lower() == "true"
