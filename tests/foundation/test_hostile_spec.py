"""Hostile YAML in a spec (issue 14): each case is what the issue found on main, reproduced the same way
(deep nesting, a "billion laughs" spec, a NUL byte, `~nosuchuser`, an overlong file name, non-UTF-8 ...).
Each now answers with ONE line citing the spec's position (file:line:col), exit code 2, no traceback; the
expensive ones run in a child process whose peak memory is measured.

Error model for the memory bound: the child is `python -m trtpipe.cli spec-check`, whose peak RSS is the
interpreter plus trtpipe's imports (about 40 MB here; measured in the same test as a baseline on a valid
spec). The bound is that baseline + 64 MB: the loader holds at most MAX_NODES values (a few MB) and the
spec's 256 KiB; on main the 9-level "billion laughs" below grew past 7 GB. Time is only a liveness deadline.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trtpipe.spec_loader import MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES

# A child that runs the CLI and reports its own peak RSS (KiB) on the last line of stderr.
_MEASURED_CLI = textwrap.dedent("""
    import resource, sys
    from trtpipe.cli import main
    code = main(sys.argv[1:])
    sys.stderr.write("\\nMAXRSS_KB=%d\\n" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    sys.exit(code)
""")
MEMORY_ALLOWANCE_KB = 64 * 1024
LIVENESS_S = 120

LAUGHS = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi")
)
LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + LAUGHS + "model: {path: *i}\n"


def measured_cli(*args: str | Path, cwd: Path) -> tuple[int, list[str], int]:
    """(exit code, the non-empty stderr lines but the RSS one, peak RSS in KiB) of `trtpipe ARGS` in a child."""
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=LIVENESS_S, cwd=cwd)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    rss = int(lines.pop().removeprefix("MAXRSS_KB="))
    return proc.returncode, lines + [x for x in proc.stdout.splitlines() if x.strip()], rss


def assert_positioned(result, spec: Path, line: int, needle: str, col: int | None = None) -> None:
    assert result.code == 2, (result.code, result.err)
    assert "Traceback" not in result.err + result.out
    lines = [x for x in result.err.splitlines() if x.strip()]
    assert len(lines) == 1, result.err
    where = f"{spec}:{line}:" + (f"{col}:" if col is not None else "")
    assert where in lines[0], lines[0]
    assert needle in lines[0], lines[0]


@pytest.fixture
def baseline_rss(tmp_path: Path) -> int:
    """Peak RSS of spec-check on a small valid spec (the interpreter and trtpipe's imports)."""
    from trtpipe.shipped import shipped_build_configs_dir

    spec = tmp_path / "valid.yaml"
    spec.write_text(f"model:\n  config: {shipped_build_configs_dir() / 'models' / 'llama-3-8b' / 'config.json'}\n")
    code, lines, rss = measured_cli("spec-check", spec, cwd=tmp_path)
    assert code == 0, lines
    return rss


@pytest.mark.timeout(300)
def test_billion_laughs_answers_at_once_in_bounded_memory(tmp_path: Path, baseline_rss: int) -> None:
    """The issue's 400-byte spec (here 9 levels of 9 aliases: 9**9 values expanded). main grew past 7 GB and
    did not answer within a minute; now the anchor that crosses MAX_NODES is cited."""
    spec = tmp_path / "laughs.yaml"
    spec.write_text(LAUGHS)
    assert len(LAUGHS.encode()) < 600
    code, lines, rss = measured_cli("spec-check", spec, cwd=tmp_path)
    assert code == 2, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    # 9**5 > MAX_NODES >= 9**4: the fifth anchor (line 5, `e`) is the first past the bound
    assert 9**4 < MAX_NODES < 9**5
    assert f"{spec}:5:" in lines[0] and f"more than {MAX_NODES:,} values" in lines[0], lines[0]
    assert rss <= baseline_rss + MEMORY_ALLOWANCE_KB, (rss, baseline_rss)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", ["flow", "block", "aliases"])
def test_deep_nesting_is_one_line_not_a_recursion_error(shape: str, tmp_path: Path, baseline_rss: int) -> None:
    """main ended in a RecursionError traceback thousands of lines long (5000 `[`, or 200 nested mappings).
    Aliases can nest too: each anchor below nests the previous one a level deeper once expanded."""
    spec = tmp_path / f"{shape}.yaml"
    if shape == "flow":
        spec.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
        line, col = 1, 7 + MAX_DEPTH  # the bracket that opens level MAX_DEPTH + 1 (the top mapping is level 1)
    elif shape == "block":
        spec.write_text("model:\n" + "".join("  " * i + "a:\n" for i in range(1, 200)))
        line, col = MAX_DEPTH + 1, 2 * MAX_DEPTH + 1  # the mapping that opens level MAX_DEPTH + 1
    else:
        spec.write_text("a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 40)) + "model: {}\n")
        line, col = MAX_DEPTH + 1, 6  # &a16 (its anchor starts the collection) nests MAX_DEPTH + 1 deep expanded
    code, lines, rss = measured_cli("spec-check", spec, cwd=tmp_path)
    assert code == 2, lines
    assert len(lines) == 1 and "Traceback" not in lines[0] and "Recursion" not in lines[0], lines[:3]
    assert f"{spec}:{line}:{col}:" in lines[0], lines[0]
    assert f"more than {MAX_DEPTH} levels deep" in lines[0]
    assert rss <= baseline_rss + MEMORY_ALLOWANCE_KB, (rss, baseline_rss)


def test_a_recursive_alias_is_refused_where_it_is_written(cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {path: /x}\nengine: &e {plugins: *e}\n")
    assert_positioned(cli("spec-check", spec), spec, 2, "recursive alias", col=22)


def test_anchors_and_merge_keys_within_the_bounds_still_work(cli, tmp_path: Path) -> None:
    """Bounding aliases must not refuse the ordinary use: gates shared between channels, a merged mapping."""
    from trtpipe.spec_loader import load_spec
    from trtpipe.shipped import shipped_build_configs_dir

    cfg = shipped_build_configs_dir() / "models" / "llama-3-8b" / "config.json"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {cfg}\nengine: &limits\n  max_batch_size: 4\n  max_seq_len: 512\n"
                    "  max_input_len: 128\nrelease:\n  gates:\n    staging: &g {smoke: true, parity: true}\n"
                    "    prod:\n      <<: *g\n      max_regression_pct: 5\n")
    assert cli("spec-check", spec).code == 0
    gates = load_spec(spec).spec.release.gates
    assert gates["prod"].parity and gates["prod"].max_regression_pct == 5


def test_a_raw_nul_byte_is_cited_where_it_is(cli, tmp_path: Path) -> None:
    """main: a ReaderError traceback ("unacceptable character #x0000 ... position 21")."""
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"model:\n  path: /tmp/a\x00b\n")
    assert_positioned(cli("spec-check", spec), spec, 2, "a NUL byte is not allowed", col=15)


def test_an_escaped_nul_byte_in_a_path_is_refused(cli, tmp_path: Path) -> None:
    """A double-quoted "\\0" reaches the value; main said "/tmp/a b does not exist" (the NUL printed away)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: x\nmodel:\n  path: "/tmp/a\\0b"\n')
    assert_positioned(cli("spec-check", spec), spec, 3, "holds a NUL byte", col=9)


@pytest.mark.parametrize("field", ["path", "tokenizer", "dataset"])
def test_tilde_of_a_user_that_does_not_exist(field: str, cli, tmp_path: Path) -> None:
    """main: RuntimeError("Could not determine home directory.") traceback from pathlib's expanduser."""
    spec = tmp_path / "spec.yaml"
    if field == "dataset":
        spec.write_text("model:\n  path: /x\nquantization:\n  calibration:\n    dataset: ~nosuchuser/cal.txt\n")
        line, name = 5, "quantization.calibration.dataset"
    else:
        spec.write_text(f"model:\n  path: /x\n  {field}: ~nosuchuser/model\n" if field != "path"
                        else "model:\n  path: ~nosuchuser/model\n")
        line, name = (3, "model.tokenizer") if field != "path" else (2, "model.path")
    result = cli("spec-check", spec)
    assert_positioned(result, spec, line, "~nosuchuser names no user of this machine")
    assert f": {name}: " in result.err


@pytest.mark.parametrize("where", ["absolute", "relative", "total"])
def test_overlong_file_names_in_the_spec(where: str, cli, tmp_path: Path) -> None:
    """main: an OSError "File name too long" with no spec position, exit 1."""
    spec = tmp_path / "spec.yaml"
    value = {"absolute": "/tmp/" + "x" * 300, "relative": "x" * 300, "total": "/tmp/" + "/".join(["y" * 200] * 30)}[where]
    spec.write_text(f"name: x\nmodel:\n  path: {value}\n")
    result = cli("spec-check", spec)
    assert_positioned(result, spec, 3, "is at most", col=3)
    assert len(result.err) < 600  # the path is cut in the message, never a 6 KB line


def test_an_overlong_spec_file_name(cli, tmp_path: Path) -> None:
    spec = tmp_path / ("s" * 300 + ".yaml")
    result = cli("spec-check", spec)
    assert result.code == 2 and "Traceback" not in result.err
    lines = [x for x in result.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "a file name is at most 255" in lines[0], result.err


def test_a_spec_larger_than_the_bound_is_refused_without_reading_it_all(cli, tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text("model: {path: /x}\n" + "# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    assert_positioned(cli("spec-check", spec), spec, 1, "larger than 256 KiB")
    # a device that never ends is refused the same way (main read until memory ran out)
    result = cli("spec-check", "/dev/zero")
    assert result.code == 2 and "larger than 256 KiB" in result.err


@pytest.mark.parametrize("value, needle", [
    ("9" * 5000, "Exceeds the limit"),   # Python's int() refuses > 4300 digits: a ValueError traceback on main
    ("2001-13-45", "month must be in 1..12"),  # a YAML timestamp that is no date: ValueError traceback on main
])
def test_values_the_safe_constructor_cannot_build(value: str, needle: str, cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {{path: /x}}\nengine: {{max_batch_size: {value}}}\n")
    assert_positioned(cli("spec-check", spec), spec, 2, needle, col=26)


def test_python_tags_are_refused_by_the_safe_loader(cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: {path: /x}\nname: !!python/object/apply:os.system [touch /tmp/pwned]\n")
    assert_positioned(cli("spec-check", spec), spec, 2, "could not determine a constructor")
