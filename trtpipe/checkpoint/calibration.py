"""Calibration data: which text, which samples, in which order.

Source: `quantization.calibration.dataset` in the spec (plain text: one sample per blank-line separated
paragraph; `.jsonl`: one JSON object per line with a text field), else the team-written text shipped in
`trtpipe/data/calibration.txt`.

Selection is deterministic: the paragraphs are shuffled with `random.Random(seed)`, tokenized, joined with
the EOS token and cut into `max_seq_len` windows; the first `samples` windows are used (fewer when the text
is short: the summary reports how many). Same file + tokenizer + settings -> the same token tensors.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe.checkpoint.example_model import shipped_text_path
from trtpipe.errors import InvalidInput, NotFound
from trtpipe.spec import BuildSpec


class CalibrationInfo(BaseModel):
    path: str
    sha256: str
    samples_requested: int
    samples_used: int
    tokens: int
    max_seq_len: int
    seed: int


def calibration_source(spec: BuildSpec) -> Path:
    """The dataset file a conversion of `spec` reads: the spec's, or the shipped default."""
    dataset = spec.quantization.calibration.dataset
    return Path(dataset) if dataset is not None else shipped_text_path()


# A calibration run reads a few hundred samples; a file past this is refused before it is read (a user's
# whole corpus, or a device), so reading it is bounded in memory.
MAX_CALIBRATION_BYTES = 1024**3


def read_texts(path: Path, text_field: str = "text") -> list[str]:
    """The samples of a plain-text or JSONL file, in file order; empty ones dropped. Any problem with the file
    (not UTF-8, a line that is not a JSON object, JSON nested beyond the parser's recursion limit, too large)
    is one InvalidInput naming the file and line."""
    if not path.is_file():
        raise NotFound(
            f"quantization.calibration.dataset: {path} does not exist", what="calibration dataset", ref=str(path),
            fix="give a .txt or .jsonl file",
        )
    with path.open("rb") as handle:
        data = handle.read(MAX_CALIBRATION_BYTES + 1)
    if len(data) > MAX_CALIBRATION_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_CALIBRATION_BYTES // 1024**3} GiB of calibration data",
                           fix="give a sample of a few thousand paragraphs or lines")
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidInput(f"{path}:{line}: not UTF-8 text", fix="save the calibration data as UTF-8") from None
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        texts: list[str] = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"{path}:{number}: not valid JSON ({exc.msg})", fix="one JSON object per line") from None
            except (ValueError, RecursionError) as exc:  # an integer past int()'s digit limit; nesting too deep
                what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
                raise InvalidInput(f"{path}:{number}: not a usable JSON object ({what})",
                                   fix="one flat JSON object per line with a text field") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise InvalidInput(
                    f"{path}:{number}: no string field {text_field!r}",
                    fix="set quantization.calibration.text_field to the field holding the text",
                )
            texts.append(record[text_field])
    else:
        texts = raw.split("\n\n")
    texts = [t.strip() for t in texts if t.strip()]
    if not texts:
        raise InvalidInput(f"{path}: no calibration text in it", fix="give a file with some text")
    return texts


def calibration_samples(
    tokenizer: Any, texts: list[str], *, samples: int, max_seq_len: int, seed: int
) -> list[list[int]]:
    """Deterministic token windows: shuffle with `seed`, tokenize, join with EOS, cut into max_seq_len windows."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    budget = samples * max_seq_len
    for index in order:
        stream.extend(tokenizer(texts[index], add_special_tokens=True)["input_ids"])
        if eos is not None:
            stream.append(eos)
        if len(stream) >= budget:
            break
    windows = [stream[i : i + max_seq_len] for i in range(0, min(len(stream), budget), max_seq_len)]
    # a short tail teaches the quantizers little and skews the AWQ search; keep it only if it is all we have
    if len(windows) > 1 and len(windows[-1]) < max_seq_len // 2:
        windows.pop()
    return windows


def prepare_calibration(spec: BuildSpec, tokenizer: Any) -> tuple[list[list[int]], CalibrationInfo]:
    cal = spec.quantization.calibration
    path = calibration_source(spec)
    texts = read_texts(path, cal.text_field)
    windows = calibration_samples(tokenizer, texts, samples=cal.samples, max_seq_len=cal.max_seq_len, seed=cal.seed)
    info = CalibrationInfo(
        path=str(path),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        samples_requested=cal.samples,
        samples_used=len(windows),
        tokens=sum(len(w) for w in windows),
        max_seq_len=cal.max_seq_len,
        seed=cal.seed,
    )
    return windows, info
