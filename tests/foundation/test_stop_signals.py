"""A stop signal sets the event however busy the main thread is waiting on it (trtpipe.commands.stop_signals).

The bug this is about: `Event.set()` called from a signal handler deadlocks when the signal lands while the main
thread holds the event's lock inside `Event.wait` (serve waits in a loop), and `serve` never stopped. The child
below waits on the event in a tight loop, as serve does, and signals itself hundreds of times; a hang is a
failure, told apart from a slow machine by a generous timeout (each round takes microseconds when it works).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    from trtpipe.commands.stop_signals import stop_on_signals

    stop = threading.Event()
    rounds = int(sys.argv[1])
    with stop_on_signals(stop):
        for _ in range(rounds):
            stop.clear()
            threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGTERM)).start()  # lands inside the loop
            while not stop.wait(0):
                pass
    # Outside the block, the previous handler (the default) is back.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    print("stopped", rounds, "times")
""")


def test_every_sigterm_sets_the_event_while_the_main_thread_waits_on_it() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, "300"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped 300 times"
