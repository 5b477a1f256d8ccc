"""The warm path: a build of a spec whose every input is as it was at its last build reuses that build's
resolution (the resolution memo) instead of resolving, planning and keying again.

For a warm build (every stage already stored) resolving is all the work there is, and importing what
resolves (YAML, the tables, every rule, the stages) costs more than the rest of the command. So every
successful build (`trtpipe.pipeline.run_build`) leaves a memo of its resolution in the store: what it
read, fingerprinted, and what it concluded. The next `trtpipe build` of the same spec file checks the
memo with stat calls (and one read of the small spec file), imports none of resolve, plan or the stages,
and when nothing changed it hands the memo's stage plan (trtpipe.stage_plan: each stage's key and the
digest it must find) to the runner (trtpipe.runner), which runs it as it runs a resolving build's plan:
the same leases, hit checks (`Store.get`: present, sizes right), build record and report, with resolve
and plan shown as hits. The memo is a second resolver, not a second runner. A stage whose entry is not
the memo's (`PlanStale`), or any doubt, takes the normal path, which writes a new memo.

What a memo fingerprints (a file or folder by (type, size, mtime_ns, ctime_ns, inode): the digest
cache's rule, with ctime because nobody can set it back; a folder also by each entry's fingerprint and
symlink target):
  - the spec file: its real path names the memo; its bytes by sha256;
  - how the spec's paths resolved: each path field's text and where it led ($HOME and symlinks move it);
  - every path the spec names, and the model, tokenizer and config.json locations resolve used;
  - every file of the trtpipe package (code, the quantization table, shipped data), of the build_configs/
    folder in use ($TRTPIPE_BUILD_CONFIGS or the shipped one, trtpipe.shipped) and of the triton_repo/
    templates;
  - the Python version and the site-packages folders on sys.path (an install or removal changes their
    mtime): the installed versions a key or a record reads;
  - the host facts a plan reads (`trtpipe.hostfacts`).
A memo is written only when every one of those last changed at least RACY_WINDOW_NS before the build
started: nothing changed while the build read it, and a same-size rewrite within one timestamp tick cannot
hide behind an unchanged fingerprint.

Never the warm path (the caller or the memo decides): --dry-run, --force, --verify, a remote cache, and a
spec whose model comes from the Hugging Face cache (model.repo_id: it resolves through the Hub's cache
layout and settings). A new input that resolve, plan or a stage key reads must be fingerprinted here:
tests/store/test_warm.py checks that every file a resolving build opens is covered.

Layout: `<store>/memos/<sha256 of the spec's real path>.json`, written atomically (a reader sees a whole
memo or the previous one; two builds writing at once each write a whole, valid memo).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtpipe import build_record, hostfacts
from trtpipe.atomic import write_text_atomically
from trtpipe.build_report import BuildReport, StagePrinter, StageReport
from trtpipe.stage_plan import PlannedStage, StagePlan
from trtpipe.shipped import package_dir
from trtpipe.store.digest_cache import RACY_WINDOW_NS

if TYPE_CHECKING:
    from trtpipe.resolve import ResolvedSpec
    from trtpipe.store.local import Store

MEMO_VERSION = 3  # 3: the resolve step's notes are kept and printed; 2: each stage says whether it serves (the runner reports its path)
MEMO_FOLDER = "memos"

Fingerprint = list[int]


class Stale(Exception):
    """The memo cannot stand for a resolution now: why, in words a person reads."""


class NoMemo(Stale):
    """This spec was never built into this store (or its memo was never written): nothing to say."""


# ----------------------------------------------------------------------------------------------- fingerprints


def _fingerprint(st: os.stat_result) -> Fingerprint:
    return [stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _stat(path: str) -> Fingerprint | None:
    """The fingerprint of what `path` leads to (symlinks followed), None when nothing is there."""
    try:
        return _fingerprint(os.stat(path))
    except OSError:
        return None


def _observe(path: str) -> dict[str, Any]:
    """A path as resolve sees it: its fingerprint and, for a folder, every entry (name -> [fingerprint,
    symlink target or None]): a file added, removed, replaced or re-linked changes it."""
    seen: dict[str, Any] = {"stat": _stat(path)}
    if seen["stat"] is not None and stat.S_ISDIR(seen["stat"][0]):
        entries: dict[str, Any] = {}
        try:
            with os.scandir(path) as listing:
                for item in listing:
                    entries[item.name] = [_stat(item.path), os.readlink(item.path) if item.is_symlink() else None]
        except OSError:
            entries = {"": None}  # unreadable now: never equal to a recorded listing
        seen["entries"] = dict(sorted(entries.items()))
    return seen


def _tree(root: str) -> dict[str, Fingerprint | None]:
    """Every file under `root` (bytecode caches aside) by relative path."""
    files: dict[str, Fingerprint | None] = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".pyc"):
                path = os.path.join(folder, name)
                files[os.path.relpath(path, root)] = _stat(path)
    return files


def _roots(configs: Path) -> dict[str, str]:
    """Where the code, the tables (`configs`: the build_configs/ folder the build reads) and the templates a build
    reads are, as this process finds them."""
    from trtpipe.serving.templates import TEMPLATE_ROOT

    return {
        "trtpipe": os.path.realpath(package_dir()),
        "build_configs": os.path.realpath(configs),
        "templates": os.path.realpath(TEMPLATE_ROOT),
    }


def _import_path() -> list[list[Any]]:
    """Where Python finds modules and distributions (importlib.metadata reads the installed versions there),
    each with its fingerprint: installing or removing anything changes a folder's mtime. The first entry
    (the script's folder, or the working directory under `python -m`) is left out: it changes with every
    file written beside it, and trtpipe's own place is checked by `_roots`."""
    return [[p, _stat(p)] for p in sys.path[1:]]


def _anchored(raw: str, base: str) -> str:
    """Where a spec path field's text leads, by the spec loader's rule (trtpipe.spec_loader): `~` expanded,
    a relative path taken from the spec's folder with symlinks resolved, an absolute one as written."""
    value = os.path.expanduser(raw)
    return str(Path(value)) if os.path.isabs(value) else os.path.realpath(os.path.join(base, value))


def memo_path(store_root: Path, spec_real_path: str) -> Path:
    return Path(store_root) / MEMO_FOLDER / f"{hashlib.sha256(spec_real_path.encode()).hexdigest()}.json"


# ----------------------------------------------------------------------------------------------- checking


def _first_difference(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    for name in sorted(set(recorded) | set(now)):
        if recorded.get(name) != now.get(name):
            return name
    return None


def check_memo(spec_path: Path | str, store_root: Path, configs: Path) -> dict[str, Any]:
    """The memo of `spec_path` in the store, if every input it fingerprinted is unchanged (`configs`: the
    build_configs/ folder this build would read); else Stale (why).

    Reads the spec file (bounded by its recorded size) and stats everything else: no YAML, no hashing of
    model files, nothing of resolve or plan imported."""
    real = os.path.realpath(spec_path)
    where = memo_path(store_root, real)
    try:
        memo = json.loads(where.read_bytes())
    except FileNotFoundError:
        raise NoMemo("no memo of this spec yet") from None
    except (OSError, ValueError) as err:
        raise Stale(f"its memo {where} is unreadable ({err})") from None
    try:
        _check(memo, real, configs)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:  # another shape: never trusted
        raise Stale(f"its memo {where} is not in this trtpipe's format ({err!r})") from None
    except OSError as err:  # whatever the normal path makes of it, it says so itself
        raise Stale(f"{err.filename or where} could not be read ({err.strerror})") from None
    return memo


def _check(memo: dict[str, Any], real: str, configs: Path) -> None:
    if memo.get("memo_version") != MEMO_VERSION or memo["spec"]["path"] != real:
        raise Stale("its memo was written by another trtpipe")
    try:
        st = os.stat(real)
    except OSError:
        raise Stale(f"{real} is not readable") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size != memo["spec"]["size"]:
        raise Stale(f"{real} changed")
    with open(real, "rb") as handle:
        raw = handle.read(st.st_size + 1)
    if hashlib.sha256(raw).hexdigest() != memo["spec"]["sha256"]:
        raise Stale(f"{real} changed")
    if memo["python"] != sys.version:
        raise Stale("another Python runs trtpipe")
    if memo["host"] != hostfacts.facts():
        raise Stale("this host's memory changed")
    roots = _roots(configs)
    if memo["roots"] != roots:
        raise Stale("trtpipe, its build_configs or its templates are read from another place")
    base = os.path.dirname(real)
    for raw_text, resolved in memo["paths"]:
        if _anchored(raw_text, base) != resolved:
            raise Stale(f"the spec's path {raw_text!r} now leads elsewhere than {resolved}")
    for path, seen in memo["inputs"].items():
        if _observe(path) != seen:
            raise Stale(f"{path} changed")
    for name, root in roots.items():
        changed = _first_difference(memo["trees"][name], _tree(root))
        if changed is not None:
            raise Stale(f"{os.path.join(root, changed)} changed")
    if memo["import_path"] != _import_path():
        raise Stale("Python's import path or the packages installed on it changed")


# ----------------------------------------------------------------------------------------------- the warm build


def warm_build(spec_path: Path | str, store: Store, *, progress: bool, configs: Path) -> BuildReport | None:
    """Build `spec_path` from its memo when nothing it fingerprinted changed: the memo's stage plan, run by the
    runner as a resolving build's plan is, each stage a hit of the entry the memo names (resolve and plan
    shown as hits), with its record written. None otherwise (having said why when there was a memo): the
    caller runs the normal build."""
    from trtpipe.run_hooks import HeldLines, Hooks, PrinterHook
    from trtpipe.run_record import RecordWriter
    from trtpipe.runner import PlanStale, Runner

    started = time.monotonic()
    printer = StagePrinter(progress)
    try:
        memo = check_memo(spec_path, store.root, configs)
    except Stale as why:
        if not isinstance(why, NoMemo):
            printer.note(f"  resolving again: {why}", style="dim")
        return None
    result, kept = memo["result"], memo["result"]["record"]
    report = BuildReport(spec_path=str(spec_path), name=result["name"], target=result["target"],
                         toolchain=result["toolchain"], backend=result["backend"], store=str(store.root))

    def record(report: BuildReport, started_at: str) -> build_record.BuildRecord:
        return build_record.record_of(report=report, toolchain=kept["toolchain"], spec=kept["spec"],
                                      memory_plan=kept["memory_plan"], versions=kept["versions"], started_at=started_at)

    plan = StagePlan(stages=tuple(
        PlannedStage(name=stage["name"], kind=stage["kind"], reads=(), key=stage["key"], digest=stage["digest"],
                     serves=stage["serves"])
        for stage in result["stages"]))
    # Its lines are held until the memo's plan is known to hold: a stale one says only why.
    runner = Runner(store, report, hooks=Hooks([HeldLines(PrinterHook(printer)), RecordWriter(store.root, record)]))
    checked = time.monotonic()
    try:
        with runner.running():
            runner.add(StageReport(name="resolve", outcome="hit", seconds=checked - started,
                                   detail=f"{result['details']['resolve']}; inputs unchanged, last resolution reused"))
            for note in result["notes"]:
                runner.note(f"    note: {note}", style="yellow")
            runner.add(StageReport(name="plan", outcome="hit", seconds=0.0,
                                   detail=f"{result['details']['plan']}; inputs unchanged, last plan reused"))
            runner.run_plan(plan)
    except PlanStale as why:
        printer.note(f"  resolving again: {why}", style="dim")
        return None
    return report


# ----------------------------------------------------------------------------------------------- remembering


def _holds_a_path(value: Any) -> bool:
    if isinstance(value, Path):
        return True
    if hasattr(type(value), "model_fields"):
        return any(_holds_a_path(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, dict):
        return any(_holds_a_path(v) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_a_path(v) for v in value)
    return False


def _path_fields(model: Any, at: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Path]]:
    """(field path, value) of every Path-valued field of a spec (pydantic models nested in models); Stale
    for a path inside a list or mapping, which the memo does not follow."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, Path):
            yield (*at, name), value
        elif hasattr(type(value), "model_fields"):
            yield from _path_fields(value, (*at, name))
        elif _holds_a_path(value):
            raise Stale(f"{'.'.join((*at, name))} holds paths in a collection, which the memo does not follow")


def _raw_text(data: Any, field_path: tuple[str, ...]) -> str | None:
    for name in field_path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data if isinstance(data, str) else None


def _settled(fingerprints: Iterator[Fingerprint | None], before_ns: int) -> bool:
    return all(fp is None or max(fp[2], fp[3]) <= before_ns for fp in fingerprints)


def _all_fingerprints(memo: dict[str, Any]) -> Iterator[Fingerprint | None]:
    yield memo["spec"]["stat"]
    for seen in memo["inputs"].values():
        yield seen["stat"]
        for fingerprint, _link in seen.get("entries", {}).values():
            yield fingerprint
    for files in memo["trees"].values():
        yield from files.values()
    for _path, fingerprint in memo["import_path"]:
        yield fingerprint


def memo_of(spec_path: Path | str, *, resolved: ResolvedSpec, report: BuildReport, stages: Sequence[Any],
            started_ns: int) -> dict[str, Any]:
    """The memo of a successful build of `spec_path` (Stale: why this build cannot leave one)."""
    import yaml

    if report.status != "ok" or report.dry_run:
        raise Stale("only a completed build leaves a memo")
    spec = resolved.spec
    if spec.model.repo_id is not None:
        raise Stale("a Hub model (model.repo_id) resolves through the Hugging Face cache")
    planned = []
    for stage in stages:
        key, digest = report.keys.get(stage.name), report.artifacts.get(stage.kind)
        if key is None or digest is None:
            raise Stale(f"the build did not store its {stage.name} stage")
        planned.append({"name": stage.name, "kind": stage.kind, "key": key, "digest": digest,
                        "serves": bool(getattr(stage, "serves", False))})
    details = {name: (report.stage(name) or StageReport(name=name, outcome="ran")).detail or "" for name in ("resolve", "plan")}
    if report.record_path is None:
        raise Stale("the build wrote no record")
    # The record's resolution half as this build wrote it: a warm build's record repeats it exactly.
    written = json.loads(Path(report.record_path).read_text(encoding="utf-8"))
    record = {name: written[name] for name in ("toolchain", "spec", "memory_plan", "versions")}

    real = os.path.realpath(spec_path)
    with open(real, "rb") as handle:
        spec_stat, raw = _fingerprint(os.fstat(handle.fileno())), handle.read()
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, UnicodeDecodeError):
        raise Stale("the spec file no longer parses") from None
    base = os.path.dirname(real)
    paths, locations = [], set()
    for field_path, value in _path_fields(spec):
        text = _raw_text(data, field_path)
        if text is None or _anchored(text, base) != str(value):
            raise Stale(f"{'.'.join(field_path)} is not a path the memo can re-resolve")
        paths.append([text, str(value)])
        locations.add(str(value))
    for where in (resolved.model_dir, resolved.tokenizer_dir, resolved.config_path):
        if where is not None:
            locations.add(str(where))
    roots = _roots(resolved.configs)
    memo = {
        "memo_version": MEMO_VERSION,
        "spec": {"path": real, "size": spec_stat[1], "sha256": hashlib.sha256(raw).hexdigest(), "stat": spec_stat},
        "python": sys.version,
        "host": hostfacts.facts(),
        "roots": roots,
        "paths": paths,
        "inputs": {path: _observe(path) for path in sorted(locations)},
        "trees": {name: _tree(root) for name, root in roots.items()},
        "import_path": _import_path(),
        "result": {
            "name": report.name, "target": report.target, "toolchain": report.toolchain, "backend": report.backend,
            "details": details,
            "notes": resolved.notes,  # the resolve step's notes (the spec's earlier shape, a preview line's)
            "stages": planned,
            "record": record,
        },
    }
    if not _settled(_all_fingerprints(memo), started_ns - RACY_WINDOW_NS):
        raise Stale("an input changed shortly before or during the build")
    return memo


def remember(store_root: Path, spec_path: Path | str, *, resolved: ResolvedSpec, report: BuildReport,
             stages: Sequence[Any], started_ns: int) -> Path | None:
    """Leave the memo of a successful build in the store (the path), or nothing (None) when the build cannot
    vouch for one. A memo is a shortcut, never a result: failing to write one never fails the build."""
    try:
        memo = memo_of(spec_path, resolved=resolved, report=report, stages=stages, started_ns=started_ns)
        path = memo_path(store_root, memo["spec"]["path"])
        write_text_atomically(path, json.dumps(memo, separators=(",", ":")), mode=0o644)
    except Exception:  # noqa: BLE001 - a memo is only ever a shortcut: the build it would describe stands
        return None
    return path
