"""Hostile calibration data (issue 14: "any other file a user gives"): a dataset that is not UTF-8, a JSONL line
nested past the JSON parser's recursion limit, an integer past int()'s digit limit. On main each was a raw
traceback (UnicodeDecodeError, RecursionError, ValueError) minutes into a conversion; now one line naming the
file and line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trtpipe.checkpoint.calibration import read_texts
from trtpipe.errors import InvalidInput

HOSTILE = {
    "not_utf8": ("cal.txt", b"fine text\n\ncaf\xe9 au lait\n", r"cal\.txt:3: not UTF-8 text"),
    "deep_json": ("cal.jsonl", b'{"text": "ok"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n",
                  r"cal\.jsonl:2: not a usable JSON object \(nested too deeply\)"),
    "huge_int": ("cal.jsonl", b'{"text": "ok", "n": ' + b"9" * 5000 + b"}\n",
                 r"cal\.jsonl:1: not a usable JSON object \(Exceeds the limit"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_dataset_is_one_invalid_input(case: str, tmp_path: Path) -> None:
    name, data, pattern = HOSTILE[case]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InvalidInput, match=pattern):
        read_texts(path)


@pytest.mark.timeout(600)
def test_a_conversion_with_hostile_calibration_data_ends_in_one_line(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """Through the CLI, as a user meets it: fp8 needs calibration; the dataset's line 2 nests 100,000 deep."""
    name, data, _ = HOSTILE["deep_json"]
    dataset = tmp_path / name
    dataset.write_bytes(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  path: {tiny_llama_dir}\n  dtype: float16\nquantization:\n  algo: fp8\n"
                    f"  calibration:\n    dataset: {dataset}\n    samples: 2\n    max_seq_len: 16\n")
    proc = subprocess.run([sys.executable, "-m", "trtpipe.cli", "convert", str(spec), "--out", str(tmp_path / "ck")],
                          capture_output=True, text=True, timeout=580)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and f"{dataset}:2: not a usable JSON object" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "ck").exists()
