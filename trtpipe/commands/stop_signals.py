"""SIGINT and SIGTERM set a `threading.Event`, without taking a lock inside the signal handler.

A Python signal handler runs in the main thread between two of its bytecodes, possibly while that thread holds
the event's own lock (inside `Event.wait`, which `serve` calls in a loop). `Event.set()` from the handler then
waits for a lock its own thread holds, and the process hangs for good: a SIGTERM that a CI step sends right
after `ready` hung `serve` (CI, stop 31). The handler here only writes a byte to a pipe (`os.write` takes no
Python lock); a relay thread reads it and sets the event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_on_signals(stop: threading.Event, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, each of `signals` sets `stop`; the previous handlers are back afterwards. Main thread
    only (where Python runs signal handlers)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a handler never waits

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        try:
            os.write(write_fd, bytes([signum % 256]))
        except OSError:  # the pipe is full (a burst of signals): one byte in it is enough
            pass

    def relay() -> None:
        while os.read(read_fd, 64):  # b"" once the write end is closed
            stop.set()

    relay_thread = threading.Thread(target=relay, name="stop-signals", daemon=True)
    relay_thread.start()
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)
        relay_thread.join()
        os.close(read_fd)
