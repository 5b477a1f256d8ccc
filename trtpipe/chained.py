"""An append-only, hash-chained JSONL log whose head is anchored beside it (the audit trail and result logs).

Each line is one JSON record carrying `seq` (1, 2, ...), the previous record's `hash` (`prev_hash`;
the first links to `GENESIS`) and its own `hash` over its canonical JSON. So an edited, removed,
inserted or reordered line breaks the chain. A chain alone cannot show that its END went missing: a
file cut after record 7 (or emptied, or deleted) is a valid chain of 7 (or 0) records, and a file
rewritten and re-hashed from record 3 on is a valid chain too. The head (`<name>.head.json` beside
the log: the record count and the last hash, written after every append) anchors the end:

- without a key, a shortened, emptied or deleted log and a re-hashed one are detected unless the head
  was rewritten to match (anyone who can write the log can write the head);
- with a key (the release key, `trtpipe.signing_keys`), the head carries a signature over the log's
  name, its record count, last hash and sequence; rewriting the head needs the key, so a shortened,
  emptied, deleted or re-hashed log is detected whenever the head is checked against the key's public
  half. Deleting the log AND its head leaves nothing to check here (an empty workspace looks the same):
  the high-water mark and the registry's copy show it (the channels are the trail's projection, gone with it).

Heads are numbered (`sequence`, one more with every head written; a head written before heads carried
one counts as its record count) and the newest seen is kept as the log's high-water mark (`mark`, a path
outside the log's folder): an older head put back, genuinely signed or not, or a log cut back together
with its head, is older than the mark and reported, and nothing is appended to it.

Under a signing key an unsigned, foreign-signed or missing head is tamper, never a head lagging behind:
appends refuse it (`adopt` is the key holder's explicit word for a log kept without the key until now).
Appends happen under a lock (`<name>.lock`): with a key the new head is signed and stored as the pending
head (`<name>.pending.json`) first; then each record is one write() on an O_APPEND descriptor, fsynced;
then the head is replaced atomically and the mark raised. A crash before the head leaves records it does
not anchor (reported by `verify`; the next append re-anchors them and says so, under a key only when the
signed pending head covers exactly them). A torn last line (a crash or a full disk in the middle of a
write) is either completed (it is a whole record that lacks only its newline) or cut off (truncated back
to the last whole record), under a key only when the head's signature covers what is left; the caller
is told, so the repair can be recorded. Nothing in this module decides what a record means.
What this detects with and without a key, and what it cannot: docs/trail-integrity.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout

from trtpipe.atomic import write_text_atomically
from trtpipe.errors import IntegrityError, TimedOut

GENESIS = "sha256:" + "0" * 64
LOCK_TIMEOUT_S = 60.0


class HeadKey(Protocol):
    """What signs and checks a head: the release key (an adapter over `trtpipe.signing_keys`)."""

    key_id: str
    can_sign: bool  # False: only a public key (verify, never sign)

    def sign(self, data: bytes) -> bytes: ...

    def verify(self, data: bytes, signature: bytes) -> bool: ...


def canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(canonical(body)).hexdigest()


@dataclass(frozen=True)
class Repair:
    """What an append had to mend before it could append: said to the caller, which records it."""

    kind: str  # completed | dropped | anchored
    detail: str


@dataclass
class Scan:
    """A log as read: its whole records, a torn tail (bytes after the last newline), chain problems."""

    records: list[dict[str, Any]] = field(default_factory=list)
    tail: bytes = b""
    problems: list[str] = field(default_factory=list)
    size: int = 0  # bytes up to and including the last newline


def scan_bytes(data: bytes, where: str) -> Scan:
    """Parse and check the chain of a log's bytes (`where` names it in problems): a log read from a file
    or fetched from elsewhere (a registry's copy) is checked by the same rules."""
    cut = data.rfind(b"\n") + 1
    out = Scan(tail=data[cut:], size=cut)
    prev, expected_seq = GENESIS, 1
    for number, raw in enumerate(data[:cut].split(b"\n")[:-1], start=1):
        at = f"{where}:{number}"
        if not raw.strip():
            out.problems.append(f"{at}: an empty line (the file was edited)")
            continue
        try:
            fields = json.loads(raw)
            if not isinstance(fields, dict):
                raise ValueError
        except ValueError:
            out.problems.append(f"{at}: not a JSON record (the file was edited)")
            prev = "?"
            expected_seq += 1
            continue
        if fields.get("prev_hash") != prev:
            out.problems.append(f"{at}: chain broken (prev_hash does not match the record before it: "
                                "a record was removed, inserted or reordered)")
        if record_hash(fields) != fields.get("hash"):
            out.problems.append(f"{at}: record hash mismatch (the record was edited)")
        if fields.get("seq") != expected_seq:
            out.problems.append(f"{at}: sequence {fields.get('seq')} where {expected_seq} was expected")
        prev = str(fields.get("hash"))
        expected_seq = fields["seq"] + 1 if isinstance(fields.get("seq"), int) else expected_seq + 1
        out.records.append(fields)
    return out


def chained_line(records: list[dict[str, Any]], fields: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The record `fields` becomes when appended after `records` (its seq, prev_hash and hash), and its line."""
    prev = records[-1]["hash"] if records else GENESIS
    body = {**fields, "seq": len(records) + 1, "prev_hash": prev}
    body["hash"] = record_hash(body)
    return body, json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n"


def signed_part(log_name: str, records: int, last_hash: str, sequence: int | None = None) -> bytes:
    """What a head's signature covers: the log's name, its record count, its last hash and (heads written
    since heads carry one) its sequence. A head without `sequence` (an earlier version's) is checked as it
    was signed; stripping the sequence from a newer head changes what is checked, so its signature fails."""
    fields: dict[str, Any] = {"log": log_name, "records": records, "hash": last_hash}
    if sequence is not None:
        fields["sequence"] = sequence
    return canonical(fields)


def head_sequence(head: dict[str, Any] | None) -> int:
    """A head's place among the heads of its log: its `sequence`; a head written before heads carried one
    counts as its record count (an append-only log's count only grows, so it sorts below every later head)."""
    if not head:
        return 0
    sequence = head.get("sequence")
    if isinstance(sequence, int) and not isinstance(sequence, bool):
        return sequence
    records = head.get("records")
    return records if isinstance(records, int) and not isinstance(records, bool) else 0


def head_document(log_name: str, records: list[dict[str, Any]], key: HeadKey | None,
                  previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The head anchoring `records` (signed when `key` can sign), one sequence after `previous` (the head
    it replaces; none: the first, or unknown, whose sequence is the record count)."""
    last = records[-1]["hash"] if records else GENESIS
    sequence = head_sequence(previous) + 1 if previous else len(records)
    head: dict[str, Any] = {"log": log_name, "records": len(records), "hash": last, "sequence": sequence,
                            "key_id": None, "signature": None}
    if key is not None and key.can_sign:
        head["key_id"] = key.key_id
        head["signature"] = base64.b64encode(key.sign(signed_part(log_name, len(records), last, sequence))).decode("ascii")
    return head


def head_bytes_of(head: dict[str, Any]) -> bytes:
    return (json.dumps(head, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _sequence_field(head: dict[str, Any]) -> int | None:
    sequence = head.get("sequence")
    return sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None


def signature_verifies(head: dict[str, Any], key: HeadKey) -> bool:
    """Whether `head` carries `key`'s valid signature over what it anchors."""
    if head.get("key_id") != key.key_id or not isinstance(head.get("records"), int) or not isinstance(head.get("hash"), str):
        return False
    if "sequence" in head and _sequence_field(head) is None:
        return False
    try:
        raw = base64.b64decode(str(head.get("signature") or ""), validate=True)
    except ValueError:
        return False
    return key.verify(signed_part(str(head.get("log")), head["records"], head["hash"], _sequence_field(head)), raw)


# What a head finding is: a log that is not what its head anchors (`fatal`: never appended to), records the
# head does not anchor yet (`unanchored`: an interrupted append, or lines added outside trtpipe), or, with a
# key, a head that key did not sign (`unsigned`: tamper, never mended by re-signing).
FATAL, UNANCHORED, UNSIGNED = "fatal", "unanchored", "unsigned"


class ChainedLog:
    """One chained log file and its head (and, with `mark`, the high-water mark of its heads)."""

    def __init__(self, path: Path, *, what: str, log_name: str | None = None, mark: Path | None = None,
                 adopt_hint: str | None = None) -> None:
        self.path = Path(path)
        self.adopt_hint = adopt_hint  # the command that adopts an unsigned log explicitly (None: none does)
        self.what = what  # "audit trail", "result log": for messages
        stem = self.path.name.removesuffix(".jsonl")
        self.head_path = self.path.with_name(stem + ".head.json")
        # The head an append with a key signs BEFORE it writes its records: what shows that records a crash
        # left unanchored were written by the key holder (lines added without the key have no such head).
        self.pending_path = self.path.with_name(stem + ".pending.json")
        # The highest head seen here, kept outside the log's folder (`mark`): a log cut back together with
        # its head, or an older (genuinely signed) head restored, is older than the mark.
        self.mark_path = Path(mark) if mark is not None else None
        # What the head names (and, with a key, signs) as the log it anchors: the file name, unless the log
        # has an identity of its own (a channel's trail is the same log in every workspace and the registry).
        self.log_name = log_name or self.path.name

    # ------------------------------------------------------------------ reading

    def scan(self) -> Scan:
        """Read and check the chain (not the head). A missing file is an empty log."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return Scan()
        except OSError as err:
            raise IntegrityError(f"{self.path}: the {self.what} cannot be read ({err.strerror or err})",
                                 path=str(self.path), fix="make it readable by this user") from None
        return scan_bytes(data, str(self.path))

    def read_head(self) -> dict[str, Any] | None:
        return self._read_head_file(self.head_path, "head")

    def _read_head_file(self, path: Path, what: str) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise IntegrityError(f"{path}: the {self.what}'s {what} cannot be read ({err})",
                                 path=str(path), fix="restore it from a backup") from None
        try:
            head = json.loads(text)
            if not (isinstance(head, dict) and isinstance(head.get("records"), int) and isinstance(head.get("hash"), str)):
                raise ValueError
            if "sequence" in head and _sequence_field(head) is None:
                raise ValueError
        except ValueError:
            return {"records": -1, "hash": "", "corrupt": True}
        return head

    def read_mark(self) -> dict[str, Any] | None:
        """The highest head seen here (None: no mark kept, or none written yet)."""
        return self._read_head_file(self.mark_path, "high-water mark") if self.mark_path is not None else None

    def _signed_part(self, head: dict[str, Any]) -> bytes:
        return signed_part(self.log_name, head["records"], head["hash"], _sequence_field(head))

    def verify(self, key: HeadKey | None = None) -> list[str]:
        """Every problem with the log, its head and its high-water mark (empty: intact). With `key`, the head
        must carry a valid signature by it. A head that is fine and newer than the mark raises the mark."""
        scan = self.scan()
        problems = list(scan.problems)
        if scan.tail:
            problems.append(f"{self.path}: the last line is incomplete ({len(scan.tail)} bytes without a newline: "
                            "an interrupted append; the next append repairs it)")
        head = self.read_head()
        findings = self._head_findings(scan, head, key)
        problems.extend(message for _, message in findings)
        problems.extend(self._mark_problems(scan, head))
        if not problems and head is not None:
            self._raise_mark(head, best_effort=True)
        return problems

    def _head_findings(self, scan: Scan, head: dict[str, Any] | None, key: HeadKey | None) -> list[tuple[str, str]]:
        n = len(scan.records)
        if head is None:
            if n:
                return [(UNSIGNED if key is not None else UNANCHORED,
                         f"{self.head_path}: missing while the {self.what} holds {n} records "
                         "(the head was deleted, or the log was written outside trtpipe)")]
            return [(FATAL, f"{self.head_path}: no signed head (a release key is set, so a head signed by it is expected; "
                            "an emptied or deleted log looks like this)")] if key is not None and self.path.exists() else []
        if head.get("corrupt"):
            return [(FATAL, f"{self.head_path}: not a valid head (edited)")]
        found: list[tuple[str, str]] = []
        anchored, anchored_hash = head["records"], head["hash"]
        if head.get("log") not in (None, self.log_name):
            found.append((FATAL, f"{self.head_path}: is the head of {head.get('log')}, not of {self.log_name}"))
        if anchored > n:
            gone = "emptied or deleted" if n == 0 else "shortened"
            found.append((FATAL, f"{self.path}: {gone}: the head anchors {anchored} records, the log holds {n} "
                                 f"(records {n + 1}..{anchored} were removed)"))
        elif anchored > 0 and scan.records[anchored - 1].get("hash") != anchored_hash:
            found.append((FATAL, f"{self.path}:{anchored}: rewritten: record {anchored}'s hash differs from the anchored "
                                 "head (records were edited and the chain re-hashed)"))
        elif n > anchored:
            if key is None:
                why = "an append interrupted before its head was written, or lines appended outside trtpipe"
            elif self._pending_covers(scan.records, head, key):
                why = "an append interrupted before its head was written: its signed pending head covers them"
            else:
                why = ("appended without the release key: no head signed by it covers them; an append interrupted "
                       "with the key leaves a signed pending head, and there is none")
            found.append((UNANCHORED, f"{self.path}: records {anchored + 1}..{n} are not anchored by the head ({why})"))
        if key is not None:
            signature = head.get("signature")
            if not signature:
                found.append((UNSIGNED, f"{self.head_path}: the head is not signed (a release key is set: a head without "
                                        "its signature may have been rewritten)"))
            elif head.get("key_id") != key.key_id:
                found.append((UNSIGNED, f"{self.head_path}: the head is signed by key {str(head.get('key_id'))[:16]}, "
                                        f"not by the release key {key.key_id[:16]}"))
            else:
                try:
                    raw = base64.b64decode(str(signature), validate=True)
                except ValueError:
                    raw = b""
                if not key.verify(self._signed_part(head), raw):
                    found.append((UNSIGNED, f"{self.head_path}: the head's signature does not verify (the head was edited)"))
        return found

    def _pending_covers(self, records: list[dict[str, Any]], head: dict[str, Any] | None, key: HeadKey) -> bool:
        """Whether the signed pending head covers exactly `records`, one head after `head`."""
        try:
            pending = self._read_head_file(self.pending_path, "pending head")
        except IntegrityError:
            return False
        if pending is None or pending.get("corrupt") or pending.get("log") != self.log_name or not records:
            return False
        return (pending["records"] == len(records) and pending["hash"] == records[-1].get("hash")
                and head_sequence(pending) > head_sequence(head) and signature_verifies(pending, key))

    def _mark_problems(self, scan: Scan, head: dict[str, Any] | None) -> list[str]:
        """Whether the log and its head are older than the highest head seen here (a rewind)."""
        try:
            mark = self.read_mark()
        except IntegrityError as err:
            return [err.one_line()]
        if mark is None:
            return []
        if mark.get("corrupt") or mark.get("log") not in (None, self.log_name):
            return [f"{self.mark_path}: not a high-water mark of {self.log_name} (edited)"]
        seen, records, last = head_sequence(mark), mark["records"], mark["hash"]
        problems: list[str] = []
        if head is not None and not head.get("corrupt") and head_sequence(head) < seen:
            problems.append(f"{self.head_path}: rewound: the head is number {head_sequence(head)} ({head['records']} records), "
                            f"this workspace has seen head number {seen} ({records} records, {self.mark_path}): an older "
                            "head was put back, or the log and its head were cut back together")
        n = len(scan.records)
        if records > n:
            problems.append(f"{self.path}: cut back: it holds {n} records, this workspace has seen {records} "
                            f"(the high-water mark {self.mark_path})")
        elif records > 0 and scan.records[records - 1].get("hash") != last:
            problems.append(f"{self.path}:{records}: rewritten: record {records} differs from the one this workspace "
                            f"has seen (the high-water mark {self.mark_path})")
        return problems

    def _raise_mark(self, head: dict[str, Any], *, best_effort: bool = False) -> None:
        """Keep `head` as the high-water mark when it is newer than the mark (`best_effort`: a reader that
        cannot write the workspace leaves the mark as it is)."""
        if self.mark_path is None or head.get("corrupt"):
            return
        try:
            mark = self.read_mark()
            if mark is not None and not mark.get("corrupt") and head_sequence(mark) >= head_sequence(head):
                return
            write_text_atomically(self.mark_path, head_bytes_of(head).decode("utf-8"), mode=0o644)
        except (OSError, IntegrityError):
            if not best_effort:
                raise

    def check_copy(self, head: dict[str, Any], where: str, key: HeadKey | None = None) -> list[str]:
        """Problems between the log and a copy of an earlier head kept elsewhere (`where`: the registry):
        the log must still hold the records it anchored, unchanged (with `key`, its signature must verify)."""
        scan = self.scan()
        records, last = head.get("records"), head.get("hash")
        if not isinstance(records, int) or not isinstance(last, str) or head.get("log") != self.log_name:
            return [f"{where}: not a head of {self.log_name}"]
        problems: list[str] = []
        n = len(scan.records)
        if records > n:
            problems.append(f"{self.path}: {'emptied or deleted' if n == 0 else 'shortened'}: the head {where} holds "
                            f"anchors {records} records, the log holds {n}")
        elif records > 0 and scan.records[records - 1].get("hash") != last:
            problems.append(f"{self.path}:{records}: rewritten: record {records}'s hash differs from the head {where} holds")
        if key is not None and not signature_verifies(head, key):
            problems.append(f"{where}: the head is not signed by the release key {key.key_id[:16]}")
        return problems

    def head_bytes(self) -> bytes | None:
        try:
            return self.head_path.read_bytes()
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ appending

    @contextmanager
    def lock(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise TimedOut(f"another writer has held {self.path}.lock for {LOCK_TIMEOUT_S:g} s",
                           operation=f"waiting to append to the {self.what}", seconds=LOCK_TIMEOUT_S,
                           fix="wait for it to finish and try again") from None
        try:
            yield
        finally:
            lock.release()

    def append(self, fields: dict[str, Any], *, key: HeadKey | None = None,
               on_repair: Callable[[list[Repair]], list[dict[str, Any]]] | None = None,
               adopt: bool = False) -> dict[str, Any]:
        """Append one record (fields without seq/prev_hash/hash) and re-anchor the head.

        Refused (IntegrityError, nothing written) when the chain is broken, the head shows the log was
        shortened or rewritten, or the log is older than its high-water mark. With a signing `key`, also
        when the head is not signed by it (unsigned, another key's, a bad signature, or missing under
        records): that is tamper, never a head lagging behind. A torn tail, and records the head lags
        behind, are mended first and reported to `on_repair`, whose records are appended before `fields`
        (without `on_repair`, they are refused too); with a signing key, lagging records are mended only
        when the signed pending head an interrupted keyed append leaves covers them, and a torn line only
        when the head's signature covers the intact prefix. `adopt` (the key holder's explicit decision)
        takes an unsigned or foreign-signed log as it stands, recorded as a repair, and signs it from here on.
        `validate` of the caller happens before: `fields` must be JSON-serializable."""
        with self.lock():
            scan = self.scan()
            if scan.problems:
                raise IntegrityError(f"{scan.problems[0]}; nothing was appended", path=str(self.path),
                                     fix=f"restore the {self.what} from a backup")
            signer = key if key is not None and key.can_sign else None
            head = self.read_head()
            whole = self._whole_tail(scan)
            mended = Scan(records=[*scan.records, *([whole] if whole is not None else [])])
            # Judged on the log as the tail mending would leave it, before anything is written.
            findings = self._head_findings(mended, head, signer) if head is not None or mended.records else []
            fatal = [m for kind, m in findings if kind == FATAL] + self._mark_problems(mended, head)
            if fatal:
                raise IntegrityError(f"{fatal[0]}; nothing was appended", path=str(self.path),
                                     fix=f"restore the {self.what} and its head from a backup")
            due: list[Repair] = []
            # Adopting takes a log exactly as its (unsigned or other key's) head anchors it: never records
            # beyond the head, nor a log whose head is gone (which is what lines added without the key leave).
            adoptable = adopt and head is not None and not any(kind == UNANCHORED for kind, _ in findings)
            for kind, message in findings:
                if kind == UNSIGNED:
                    if not adoptable:
                        raise IntegrityError(f"{message}: tamper, not a lagging head; nothing was appended",
                                             path=str(self.path), fix=self._tamper_fix(head is not None))
                    due.append(Repair("adopted", f"{message}; taken as it stands by the release key's holder "
                                                 "(explicitly) and signed from here on"))
                elif kind == UNANCHORED:
                    if signer is not None and not self._pending_covers(mended.records, head, signer):
                        raise IntegrityError(f"{message}; nothing was appended", path=str(self.path),
                                             fix=self._tamper_fix(False))
                    if on_repair is None:
                        raise IntegrityError(f"{message}; nothing was appended", path=str(self.path),
                                             fix=f"restore the {self.what} and its head from a backup")
                    due.append(Repair("anchored", message))
            repairs = [*self._mend_tail(scan, on_repair is not None), *due]
            extra = on_repair(repairs) if repairs and on_repair is not None else []
            records = list(scan.records)
            lines = []
            for body in [*extra, fields]:
                chained, line = chained_line(records, body)
                records.append(chained)
                lines.append(line)
            new_head = head_document(self.log_name, records, key, previous=head if head and not head.get("corrupt") else None)
            if signer is not None:  # first: lines a crash leaves unanchored are then provably the key holder's
                write_text_atomically(self.pending_path, head_bytes_of(new_head).decode("utf-8"), mode=0o644)
            for line in lines:
                self._write_line(line)
            write_text_atomically(self.head_path, head_bytes_of(new_head).decode("utf-8"), mode=0o644)
            self._raise_mark(new_head)
            if signer is not None:
                self.pending_path.unlink(missing_ok=True)
        return records[-1]

    def _tamper_fix(self, adoptable: bool) -> str:
        fix = (f"inspect it with `trtpipe channels --verify` and restore the {self.what} and its head from a trusted copy "
               "(a backup, or a workspace that holds all of it)")
        if self.adopt_hint and adoptable:
            fix += f"; a {self.what} kept without the release key until now is adopted once, explicitly, with {self.adopt_hint}"
        return fix

    def _whole_tail(self, scan: Scan) -> dict[str, Any] | None:
        """The torn tail as a record, when it is one whole record that lacks only its newline."""
        if not scan.tail:
            return None
        prev = scan.records[-1]["hash"] if scan.records else GENESIS
        try:
            whole = json.loads(scan.tail)
        except ValueError:
            return None
        complete = (isinstance(whole, dict) and whole.get("prev_hash") == prev and record_hash(whole) == whole.get("hash")
                    and whole.get("seq") == len(scan.records) + 1)
        return whole if complete else None

    def _mend_tail(self, scan: Scan, allowed: bool) -> list[Repair]:
        if not scan.tail:
            return []
        whole = self._whole_tail(scan)
        if not allowed:
            raise IntegrityError(f"{self.path}: the last line is incomplete ({len(scan.tail)} bytes without a newline: "
                                 "an interrupted write); nothing was appended", path=str(self.path),
                                 fix="remove the incomplete last line (everything after the last newline)")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            if whole is not None:
                os.write(fd, b"\n")
                scan.records.append(whole)
                scan.size += len(scan.tail) + 1
                repair = Repair("completed", f"record {whole['seq']} was whole but lacked its newline (an interrupted "
                                             "append); the newline was added")
            else:
                os.ftruncate(fd, scan.size)
                repair = Repair("dropped", f"an incomplete last line ({len(scan.tail)} bytes, sha256 "
                                           f"{hashlib.sha256(scan.tail).hexdigest()[:16]}) was cut off (an interrupted append)")
            os.fsync(fd)
        finally:
            os.close(fd)
        scan.tail = b""
        return [repair]

    def _write_line(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, data: bytes, head: bytes) -> None:
        """Replace the log and its head with a copy kept elsewhere (a registry's, already checked by the
        caller, who holds `lock()`): each file atomically, the log first, so a crash in between leaves a
        head behind its log (reported by `verify`), never a head anchoring records the log lacks."""
        write_text_atomically(self.path, data.decode("utf-8"), mode=0o644)
        write_text_atomically(self.head_path, head.decode("utf-8"), mode=0o644)
        adopted = self.read_head()
        if adopted is not None:
            self._raise_mark(adopted)
