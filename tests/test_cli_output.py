"""Issue 23, CI-log output: tables a CI log can show, refusals a CI step can parse, address mistakes named.

As found, at COLUMNS=80 in a pipe: `check`'s table was ~500 columns wide (the containers row set the `found`
column's width, and each WARN row padded ~250 spaces before its fix), `migrate`'s 555, `bench`'s 406; a refused
`promote --json` printed nothing on stdout.

The rule checked: outside a terminal, no line of a table is longer than max(COLUMNS, 120) unless it is one word
(a word is never cut: keys, digests and names stay whole), and no word of any cell is lost.
"""

from __future__ import annotations

import json
import random
import socket
import string
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.commands import output
from trtpipe.commands.output import render_table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "build_configs" / "examples"
WIDTH = 120  # max(COLUMNS=80, 120)


def _fits(line: str, width: int = WIDTH) -> bool:
    """Within the width, or a single word alone on its line (nothing else could go beside it)."""
    return len(line) <= width or (len(line.split()) == 1 and line == line.strip())


def _words(cells: list[str]) -> list[str]:
    return [word for cell in cells for word in str(cell).split()]


# --------------------------------------------------------------------------- the renderer
def _random_table(rng: random.Random) -> tuple[list[str], list[list[str]]]:
    def word() -> str:
        size = rng.choice([1, 3, 5, 8, 12, 20, 40, 71, 130])  # 71: a sha256 digest; 130: longer than a line
        return "".join(rng.choice(string.ascii_lowercase + ":/.-_") for _ in range(size))

    columns = [f"col{i}" for i in range(rng.randint(1, 7))]
    rows = [[" ".join(word() for _ in range(rng.choice([0, 1, 2, 6, 30]))) for _ in columns]
            for _ in range(rng.randint(0, 6))]
    return columns, rows


@pytest.mark.parametrize("seed", range(200))
def test_every_line_fits_and_every_word_is_kept_in_order(seed: int) -> None:
    rng = random.Random(seed)
    columns, rows = _random_table(rng)
    width = rng.choice([40, 80, 120, 200])
    lines = render_table("a title " * rng.randint(0, 30), columns, rows, caption="a caption " * rng.randint(0, 40),
                         width=width)
    assert all(_fits(line, width) for line in lines), [line for line in lines if not _fits(line, width)]
    rendered = " ".join(lines).split()
    for row in rows:  # each row's words, in order, within the output (a cell's words are never reordered or cut)
        for cell in row:
            for word in cell.split():
                assert word in rendered, word


def test_a_table_that_fits_is_one_aligned_line_per_row() -> None:
    lines = render_table(None, ["status", "item"], [["OK", "torch"], ["WARN", "a longer item"]], width=80)
    assert lines == ["status  item", "OK      torch", "WARN    a longer item"]


def test_long_cells_wrap_in_their_column_and_columns_that_cannot_fit_go_below() -> None:
    digest = "sha256:" + "ab" * 32
    rows = [["WARN", "gpu", "no NVIDIA GPU " * 12, digest, "fix it " * 20]]
    lines = render_table(None, ["status", "item", "found", "digest", "fix"], rows, width=80)
    assert lines[0] == "status  item  found"  # digest and fix no longer fit beside found's longest word
    assert lines[1].startswith("WARN    gpu   no NVIDIA GPU")
    assert any(line.startswith("        fix: fix it") for line in lines) and all(len(line) <= 80 for line in lines)
    # 71 characters do not fit beside "digest: " under the second column of 80: the digest gets its own line, whole.
    at = lines.index("        digest:")
    assert lines[at + 1] == digest
    # At 120 columns every column's longest word fits side by side: one grid, each cell wrapped in its column.
    wide = render_table(None, ["status", "item", "found", "digest", "fix"], rows, width=120)
    assert wide[0].split() == ["status", "item", "found", "digest", "fix"] and digest in wide[1].split()
    assert all(len(line) <= 120 for line in wide) and len(wide) > 2


# --------------------------------------------------------------------------- every command's table, for real
@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """Every table the command prints, as render_table made it (COLUMNS=80, not a terminal)."""
    tables: list[list[str]] = []
    real = output.render_table

    def spy(*args, **kwargs):
        lines = real(*args, **kwargs)
        tables.append(lines)
        return lines

    monkeypatch.setattr(output, "render_table", spy)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "home"))
    return tables


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _matrix(tmp_path: Path) -> Path:
    config = ROOT / "build_configs" / "models" / "llama-3-8b" / "config.json"
    path = tmp_path / "matrix.yaml"
    path.write_text(f"""name: m
base: {{engine: {{max_batch_size: 4, max_input_len: 256, max_seq_len: 512}}, toolchain: trtllm-1.2.1}}
axes:
  models: [{{label: llama3-8b, config: {config}, dtype: bfloat16}}]
  targets: [h100-sxm, a100-80gb]
  quantizations: [fp8, int4_awq]
""")
    return path


COMMANDS = {
    "check": lambda tmp: ["check"],
    "check-spec": lambda tmp: ["check", "--spec", str(EXAMPLES / "llama3-8b-fp8-h100.yaml")],
    "plan": lambda tmp: ["plan", str(EXAMPLES / "llama2-13b-fp16-a100.yaml")],
    "engine-plan": lambda tmp: ["engine-plan", str(EXAMPLES / "llama3-8b-fp8-h100.yaml")],
    "migrate": lambda tmp: ["migrate", str(EXAMPLES / "llama3-8b-fp8-h100.yaml")],
    "matrix-plan": lambda tmp: ["matrix", "plan", str(_matrix(tmp))],
    "example-model": lambda tmp: ["example-model", str(tmp / "tiny")],
    "cache-ls": lambda tmp: ["cache", "ls"],
    "channels": lambda tmp: ["channels"],
    "results-show": lambda tmp: ["results", "show", "sha256:" + "c" * 64],
    # Nothing listens there: every request fails, and the table (with its long caption) is still printed.
    "bench": lambda tmp: (["example-model", str(tmp / "tok")], ["bench", f"127.0.0.1:{_free_port()}", "--mode", "closed",
                          "--concurrency", "1", "--requests", "2", "--duration", "20s", "--timeout", "5s",
                          "--warmup", "0", "--tokenizer", str(tmp / "tok")]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_commands_table_fits_a_ci_log_at_columns_80(name: str, rendered: list[list[str]], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = COMMANDS[name](tmp_path)
    if isinstance(argv, tuple):  # a command to prepare with first
        before, argv = argv
        assert main(before) == 0
        rendered.clear()
    main(argv)
    out = capsys.readouterr()
    assert rendered, f"{name} printed no table"
    printed = out.out + out.err
    for lines in rendered:
        assert "\n".join(lines) in printed  # what was rendered is what went out
        too_long = [line for line in lines if not _fits(line)]
        assert too_long == [], (name, too_long)
    if name == "check":  # the row that set ~500 columns: its containers now wrap inside the found column
        assert any("trtllm-python-py3:" in line and len(line) <= WIDTH for lines in rendered for line in lines)


# --------------------------------------------------------------------------- refusals and address mistakes
def test_a_failed_build_with_json_is_a_json_object_on_stdout_too(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nmodel: {path: nowhere, dtype: float16}\ntarget: {gpu: cpu-reference}\n"
                    "quantization: {algo: fp9}\n")
    assert main(["build", str(spec), "--json", "--store", str(tmp_path / "store")]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    refusal = json.loads(out.out)
    assert refusal["ok"] is False and refusal["exit_code"] == 2 and refusal["error"]["stderr"] == line
    assert refusal["error"]["type"] == "SpecError" and refusal["error"]["fields"]["file"] == str(spec)
    assert refusal["error"]["fields"]["field"] and refusal["error"]["stderr"].startswith(f"error: {spec}:")
    # Without --json: the line only, stdout untouched.
    assert main(["build", str(spec), "--store", str(tmp_path / "store")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == line


@pytest.mark.parametrize("command", ["smoke", "bench"])
@pytest.mark.parametrize("address", ["http://127.0.0.1:8001", "https://localhost:8000/v2", "grpc://127.0.0.1:8001"])
def test_an_address_with_a_scheme_is_one_line_exit_2_naming_the_form(command: str, address: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--mode", "closed", "--concurrency", "1", "--token-counting", "words"] if command == "bench" else []
    assert main([command, address, *extra, "--json"]) == 2
    out = capsys.readouterr()
    (line,) = out.err.strip().splitlines()
    assert f"error: {address} has the scheme {address.split('://')[0]}://" in line and "StatusCode" not in line
    assert "host:port" in line
    refusal = json.loads(out.out)
    assert refusal["error"]["type"] == "WrongAddress" and refusal["error"]["fields"]["address"] == address
