"""Fuzz (hypothesis) of the spec loader, with resolve behind it, and of the model-config checks (issue 14): no
input produces a traceback, more than a bounded amount of memory, or more than a bounded time.

The fuzzing runs in a child process (tests/foundation/fuzz_inputs.py: derandomized, no example database) that
measures every example; this test asserts:
- every example ended in success or ONE positioned line (the child asserts it per example; any other
  exception fails the child with hypothesis's shrunk example);
- Python allocations per example (tracemalloc peak) at most 64 MiB: a spec is at most 256 KiB and at most
  10,000 values once aliases are expanded; a config.json at most 4 MiB (measured here: about 4 MiB);
- CPU time per example (process_time, which other load on the machine does not inflate) at most 10 s: the
  worst measured is a 20,000-deep `[` spec at about 0.4 s on a 2-core host; main did not answer a nested
  "billion laughs" within a minute;
- the child's peak RSS grows by at most 128 MiB over its own baseline (everything imported and hypothesis's
  caches built, by a 10-example run of each property) while fuzzing (measured here: a few MB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = 300  # per property; about 30 s on a loaded 2-core host


@pytest.mark.timeout(1200)
def test_fuzzed_specs_and_model_configs_never_escape_their_bounds(tmp_path: Path) -> None:
    script = Path(__file__).with_name("fuzz_inputs.py")
    out = tmp_path / "stats.json"
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}  # never into the tree
    proc = subprocess.run([sys.executable, str(script), str(out), str(work), str(EXAMPLES)],
                          capture_output=True, text=True, timeout=1100, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    stats = json.loads(out.read_text())
    assert stats["examples"] == 2 * EXAMPLES
    assert stats["max_tracemalloc_peak"] <= 64 * 2**20, stats
    assert stats["max_cpu_s"] <= 10.0, stats
    assert stats["maxrss_kb"] - stats["baseline_maxrss_kb"] <= 128 * 1024, stats
    # the generators reach both sides of each property
    outcomes = stats["outcomes"]
    assert outcomes.get("spec:SpecError", 0) > 0 and outcomes.get("spec:ok", 0) > 0, outcomes
    assert outcomes.get("config:InvalidInput", 0) > 0 and outcomes.get("config:ok", 0) > 0, outcomes
