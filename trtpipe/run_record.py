"""The hook that writes a run's build record (trtpipe.build_record) when it ends, whatever the outcome.

A dry run has none: its caller hands the runner no `RecordWriter`. A full disk while writing it fails a build
that stored every stage (the user must know the record is missing); a build that failed anyway keeps its own
error, and the report's message says the record is missing too.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from trtpipe import build_record
from trtpipe.build_report import BuildReport, StageReport
from trtpipe.disk import disk_full, disk_full_error
from trtpipe.errors import DiskFull

# The build record of a report (and when the build started): the resolving build's from its resolution, a
# memo's from the resolution it kept.
RecordMaker = Callable[[BuildReport, str], build_record.BuildRecord]


class RecordWriter:
    def __init__(self, store_root: Path, make: RecordMaker) -> None:
        self.store_root = Path(store_root)
        self.make = make
        # Made as the run starts: the record's started_at.
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="microseconds")

    def on_stage(self, stage: StageReport) -> None:
        pass

    def on_note(self, text: str, style: str | None) -> None:
        pass

    def on_done(self, report: BuildReport) -> None:
        try:
            report.record_path = str(build_record.write_record(self.store_root, self.make(report, self.started_at)))
        except Exception as exc:
            if not disk_full(exc, self.store_root):
                raise
            lost = disk_full_error(exc, build_record.records_dir(self.store_root))
            if report.status != "failed":
                raise DiskFull(f"every stage was stored, but the build record could not be written: {lost.message}",
                               path=lost.path, free=lost.free, fix=lost.fix) from None
            report.message = f"the build record could not be written either ({lost.message})"


__all__ = ["RecordMaker", "RecordWriter"]
