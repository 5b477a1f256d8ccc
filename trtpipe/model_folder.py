"""A model folder is a boundary, and its tokenizer must load.

**Confinement.** Every file trtpipe, transformers or the published repository reads from a model folder
must resolve (symlinks followed) inside that folder, unless the spec says `model.allow_external_links: true`.
transformers picks files of the folder by name, so the rule covers every file at the folder's top level (not
its subfolders, which nothing reads), every shard a `*.safetensors.index.json` names, the tokenizer folder's
files the same way, and a calibration file whose path (as written in the spec) lies in the model folder.

The Hugging Face cache is the common legitimate case of links leaving a folder: a snapshot
`<cache>/models--ORG--NAME/snapshots/<commit>/` holds links into `../../blobs/<sha>`. For a folder of that
shape (its parent is `snapshots`, its grandparent is named `models--*` and holds `blobs/`), files may resolve
into the snapshot or into that repository's own `blobs/` - nowhere else, not into another repository's cache
nor another snapshot. Hard links are the file itself and cannot be told from one; a link swapped in after the
check is caught where the published repository copies the tokenizer (it copies only files that pass again).

**Tokenizer.** The serving models (triton_repo/preprocessing, postprocessing, tensorrt_llm_bls) load
`tokenizer.json` with the `tokenizers` library, read `tokenizer_config.json` and `generation_config.json` as
JSON objects and need an end token; `check_tokenizer` does exactly that, so an empty or malformed tokenizer is
refused when the build resolves (and by `validate`), not when the server starts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtpipe.errors import InvalidInput

# The largest tokenizer.json in common use is a few tens of MB (Gemma 3: ~33 MB); the cap keeps a hostile
# file from being parsed at all.
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
MAX_TOKENIZER_CONFIG_BYTES = 16 * 1024 * 1024
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
MAX_INDEX_BYTES = 64 * 1024 * 1024

# One table of what a Hugging Face tokenizer folder is (every layer reads these names from here):
# the files a consumer of the folder may read (the Triton Python models, the LLM API's AutoTokenizer, users),
# copied wherever the tokenizer travels; what makes a folder a tokenizer at all; and the one file the serving
# models and calibration load (with the tokenizers library).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model")
SERVING_TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Escape:
    """A file of a folder that resolves outside it."""

    file: Path  # as found in the folder
    target: Path  # where it resolves

    def describe(self, what: str) -> str:
        return f"{self.file} resolves to {self.target}, outside the {what}"


def folder_roots(folder: Path) -> tuple[Path, ...]:
    """The real folders a model folder's files may resolve into: the folder, and for a Hugging Face cache
    snapshot also its repository's blobs/ (see the module doc)."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    snapshots = real.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        roots.append(Path(os.path.realpath(repo / "blobs")))
    return tuple(roots)


def resolves_inside(path: Path, roots: Iterable[Path]) -> Path | None:
    """The real path of `path` when it lies inside one of `roots` (real paths), else None."""
    real = Path(os.path.realpath(path))
    for root in roots:
        if real == root or root in real.parents:
            return real
    return None


def escapes(folder: Path, names: Iterable[str] | None = None) -> list[Escape]:
    """Files of `folder` that resolve outside its roots: every entry at its top level that is (or links to) a
    file, or only `names` when given; plus every shard a weight index names. Sorted by name."""
    folder = Path(folder)
    roots = folder_roots(folder)
    found: list[Escape] = []
    if names is None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return found
        candidates = [Path(e.path) for e in entries if e.is_symlink() or e.is_file(follow_symlinks=False)]
    else:
        candidates = [folder / n for n in names if os.path.lexists(folder / n)]
    for path in candidates:
        if path.is_dir():
            continue  # a folder (or a link to one): nothing reads it
        if resolves_inside(path, roots) is None:
            found.append(Escape(path, Path(os.path.realpath(path))))
    return found


def copy_confined(src: Path, dst: Path, roots: tuple[Path, ...]) -> None:
    """Copy `src` to `dst` only if it resolves inside `roots` now: the real path is opened without following a
    last-moment symlink (O_NOFOLLOW) and must be a regular file. Mode bits are kept, as shutil.copy2 would."""
    real = resolves_inside(src, roots)
    if real is None:
        raise InvalidInput(Escape(src, Path(os.path.realpath(src))).describe(f"folder {roots[0]}"),
                           fix="copy the file into the folder, or set model.allow_external_links: true in the spec "
                               "if you trust where it points")
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"{src} is not a regular file", fix="replace it with the model's file")
        with open(dst, "wb") as target:
            shutil.copyfileobj(source, target, 1024 * 1024)
    os.chmod(dst, stat.S_IMODE(info.st_mode))


def index_shards(folder: Path) -> list[tuple[Path, str]]:
    """(index file, shard name) for every shard a `*.safetensors.index.json` (or `.bin.index.json`) of the
    folder names. transformers joins the name to the folder, so '../x' or '/x' would read outside it."""
    shards: list[tuple[Path, str]] = []
    for index in sorted(Path(folder).iterdir()):
        if not index.name.endswith(INDEX_SUFFIXES) or not index.is_file():
            continue
        data = _read_json_object(index, MAX_INDEX_BYTES, "weight index")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict):
            raise InvalidInput(f"{index}: no weight_map object", fix="restore the model's index file")
        for name in sorted({v for v in weight_map.values()}, key=str):
            shards.append((index, name))
    return shards


def shard_problems(folder: Path) -> list[str]:
    """One line per shard a weight index names that is not a plain file name of this folder."""
    problems = []
    for index, name in index_shards(folder):
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
            problems.append(f"{index} names the shard {name!r}, which is not a file name inside the folder")
    return problems


# ----------------------------------------------------------------------------------------------- tokenizer


def _read_json_object(path: Path, limit: int, what: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read the {what} ({exc.strerror})", fix="check the file") from None
    if len(data) > limit:
        raise InvalidInput(f"{path}: larger than {limit // 2**20} MiB, not a {what}", fix="restore the model's file")
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: the {what} is not UTF-8 text", fix="restore the model's file") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path}:{exc.lineno}: the {what} is not valid JSON ({exc.msg})",
                           fix="restore the model's file") from None
    except (ValueError, RecursionError) as exc:
        what_wrong = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise InvalidInput(f"{path}: the {what} is not usable JSON ({what_wrong})", fix="restore the model's file") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{path}: the {what} is not a JSON object", fix="restore the model's file")
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


@dataclass(frozen=True)
class TokenizerFacts:
    vocab_size: int
    end_id: int


def check_tokenizer(tokenizer_dir: Path) -> TokenizerFacts:
    """Load the folder's tokenizer as the serving models do (see the module doc). Raises one InvalidInput
    naming the file that does not load."""
    tokenizer_dir = Path(tokenizer_dir)
    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        raise InvalidInput(f"{path} does not exist", fix="copy the model's tokenizer.json there")
    size = path.stat().st_size
    if size == 0:
        raise InvalidInput(f"{path} is empty", fix="restore the model's tokenizer.json (tokenizer.save_pretrained writes it)")
    if size > MAX_TOKENIZER_BYTES:
        raise InvalidInput(f"{path} is {size:,} bytes, larger than any tokenizer ({MAX_TOKENIZER_BYTES // 2**20} MiB)",
                           fix="restore the model's tokenizer.json")
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # tokenizers raises Exception, and pyo3's PanicException (a BaseException)
        raise InvalidInput(f"{path} does not load with the tokenizers library ({_first_line(exc)})",
                           fix="restore the model's tokenizer.json (tokenizer.save_pretrained writes it)") from None
    end_id = _end_id(tokenizer, _end_token_configs(tokenizer_dir))
    if end_id is None:
        raise InvalidInput(f"{tokenizer_dir}: cannot tell the end token (no eos_token in tokenizer_config.json that "
                           "tokenizer.json knows, no eos_token_id in generation_config.json)",
                           fix="restore the model's tokenizer_config.json or generation_config.json")
    return TokenizerFacts(vocab_size=tokenizer.get_vocab_size(), end_id=end_id)


# Which file names the end token first. The Triton preprocessing model (triton_repo/preprocessing/1/model.py, as
# upstream's reads its tokenizer) takes tokenizer_config.json's eos_token; TensorRT-LLM's LLM API takes
# generation_config.json's eos_token_id (its first, when a list). Each falls back on the other.
EndTokenRule = Literal["preprocessing", "llm-api"]


def _eos_from_tokenizer_config(tokenizer: Any, config: dict[str, Any]) -> int | None:
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and eos:
        found = tokenizer.token_to_id(eos)
        if found is not None:
            return int(found)
    return None


def _eos_from_generation_config(config: dict[str, Any]) -> int | None:
    eos_id = config.get("eos_token_id")
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None  # [] names no end token: not an IndexError
    if isinstance(eos_id, int) and not isinstance(eos_id, bool) and eos_id >= 0:
        return eos_id
    return None


def _end_token_configs(folder: Path) -> dict[str, dict[str, Any]]:
    """The files that name a folder's end token, parsed (file name -> object); absent files are left out."""
    configs: dict[str, dict[str, Any]] = {}
    for name in ("tokenizer_config.json", "generation_config.json"):
        if (folder / name).is_file():
            configs[name] = _read_json_object(folder / name, MAX_TOKENIZER_CONFIG_BYTES, name.removesuffix(".json"))
    return configs


def _end_id(tokenizer: Any, configs: dict[str, dict[str, Any]], rule: EndTokenRule = "preprocessing") -> int | None:
    """The end token `rule`'s consumer stops on, from the folder's parsed configs (file name -> object)."""
    from_tokenizer = _eos_from_tokenizer_config(tokenizer, configs.get("tokenizer_config.json", {}))
    from_generation = _eos_from_generation_config(configs.get("generation_config.json", {}))
    first, second = (from_tokenizer, from_generation) if rule == "preprocessing" else (from_generation, from_tokenizer)
    return first if first is not None else second


def end_token_id(folder: Path, rule: EndTokenRule) -> int | None:
    """The end token of the model or tokenizer folder as `rule`'s consumer reads it (None: the folder names
    none). Files that are absent count as empty; a tokenizer.json is needed only to look an eos_token up."""
    folder = Path(folder)
    configs = _end_token_configs(folder)
    tokenizer: Any = _NoTokenizer()
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return _end_id(tokenizer, configs, rule)


class _NoTokenizer:
    """A folder without tokenizer.json: an eos_token cannot be looked up."""

    def token_to_id(self, token: str) -> None:
        return None
