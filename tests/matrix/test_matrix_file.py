"""The matrix file: positioned errors (file:line:col: field: what; fix), expansion, excludes, includes."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.errors import SpecError
from trtpipe.matrix.expand import expand, load_cell
from trtpipe.matrix.loader import load_matrix

GOOD = """\
name: fleet
base:
  engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}
  quantization: {calibration: {samples: 8}}
axes:
  models:
    - {label: llama, path: models/llama, dtype: float16}
    - models/qwen2
  targets: [cpu-reference, {gpu: h100-sxm, tp: 2}]
  quantizations: [none, {algo: int4_awq, group_size: 64}]
exclude:
  - {target: h100-sxm-tp2, quantization: none}
include:
  - {target: {label: h200, gpu: h200}, quantization: fp8}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_expansion_product_less_excludes_plus_includes(tmp_path: Path) -> None:
    matrix = load_matrix(_write(tmp_path, GOOD))
    cells = expand(matrix)
    assert [c.name for c in cells] == [
        "llama-cpu-reference-none", "llama-cpu-reference-int4_awq-g64", "llama-h100-sxm-tp2-int4_awq-g64",
        "qwen2-cpu-reference-none", "qwen2-cpu-reference-int4_awq-g64", "qwen2-h100-sxm-tp2-int4_awq-g64",
        # the include names no model: it takes each
        "llama-h200-fp8", "qwen2-h200-fp8",
    ]
    llama = cells[2]
    assert llama.labels == {"model": "llama", "target": "h100-sxm-tp2", "quantization": "int4_awq-g64"}
    assert llama.data["name"] == llama.name  # each cell is its own artifact, named after its labels
    assert llama.data["target"] == {"gpu": "h100-sxm", "tp": 2}
    # a mapping value deep-merges into the base's section: the base's calibration stays
    assert llama.data["quantization"] == {"calibration": {"samples": 8}, "algo": "int4_awq", "group_size": 64}
    # relative paths are read against the matrix file's folder, as a spec's are against the spec's
    assert llama.data["model"]["path"] == str((tmp_path / "models" / "llama").resolve())
    assert cells[3].data["model"] == {"path": str((tmp_path / "models" / "qwen2").resolve())}
    assert cells[6].origin == "include[0]" and cells[6].data["quantization"]["algo"] == "fp8"


def test_a_cell_spec_error_is_cited_where_the_matrix_set_the_field(tmp_path: Path) -> None:
    text = GOOD.replace("[none, {algo", "[none, fp9, {algo").replace("max_batch_size: 4", "max_batch_size: 0")
    matrix = load_matrix(_write(tmp_path, text))
    cells = {c.name: c for c in expand(matrix)}
    with pytest.raises(SpecError) as bad_value:
        load_cell(matrix, cells["llama-cpu-reference-fp9"])
    line = text.splitlines().index("  quantizations: [none, fp9, {algo: int4_awq, group_size: 64}]") + 1
    # both problems are the cell's; the first in file order (the base's max_batch_size) is reported, then fp9
    assert bad_value.value.one_line().startswith(f"{tmp_path / 'm.yaml'}:3:")
    text = text.replace("max_batch_size: 0", "max_batch_size: 4")
    matrix = load_matrix(_write(tmp_path, text))
    cells = {c.name: c for c in expand(matrix)}
    with pytest.raises(SpecError) as bad_value:
        load_cell(matrix, cells["llama-cpu-reference-fp9"])
    assert bad_value.value.one_line().startswith(
        f"{tmp_path / 'm.yaml'}:{line}:25: quantization.algo: cell llama-cpu-reference-fp9: 'fp9' is not a "
        "quantization format; use one of:")
    unknown = GOOD.replace("{label: llama, path:", "{label: llama, pth:")
    matrix = load_matrix(_write(tmp_path, unknown))
    with pytest.raises(SpecError) as typo:
        load_cell(matrix, expand(matrix)[0])
    assert typo.value.one_line() == (f"{tmp_path / 'm.yaml'}:7:22: model.pth: cell llama-cpu-reference-none: "
                                     "unknown key 'pth'; did you mean 'path'?")


@pytest.mark.parametrize(("edit", "expected"), [
    (("axes:", "axis:"), ":5:1: axis: unknown key 'axis'; did you mean 'axes'?"),
    (("  models:", "  model:"), ":6:3: axes.model: unknown key 'model'; did you mean 'models'?"),
    (("  targets: [cpu-reference, {gpu: h100-sxm, tp: 2}]", "  targets: cpu-reference"),
     ":9:3: axes.targets: axes.targets must be a list, got 'cpu-reference'"),
    (("  targets: [cpu-reference, {gpu: h100-sxm, tp: 2}]", "  targets: [cpu-reference, cpu-reference]"),
     ":9:28: axes.targets[1]: label 'cpu-reference' is used twice in axes.targets (first at line 9); give each "
     "value its own `label:`"),
    (("base:\n", "base:\n  name: x\n"),
     ":3:3: base.name: a matrix names each cell after its labels, so base may not set `name`"),
    (("  - {target: h100-sxm-tp2, quantization: none}", "  - {target: h100, quantization: none}"),
     ":12:6: exclude[0].target: 'h100' is not a label of axes.targets; use one of: cpu-reference, h100-sxm-tp2"),
    (("  - {target: h100-sxm-tp2, quantization: none}", "  - {profile: latency}"),
     ":12:6: exclude[0].profile: unknown key 'profile'; valid keys here: model, target, quantization"),
    (("  - {target: {label: h200, gpu: h200}, quantization: fp8}", "  - {targets: h200}"),
     ":14:6: include[0].targets: unknown key 'targets'; did you mean 'target'?"),
    (("  - {target: {label: h200, gpu: h200}, quantization: fp8}", "  - {target: {label: 'h 200', gpu: h200}}"),
     ":14:15: include[0].target.label: label 'h 200' is not a plain name"),
    (("  - {label: llama, path: models/llama, dtype: float16}", "  - {dtype: float16}"),
     ":7:7: axes.models[0]: this model value has no label; add `label:`"),
    (("name: fleet\n", "name: fleet\nname: again\n"), ":2:1: name: duplicate key 'name' (first written at line 1)"),
])
def test_a_bad_matrix_file_is_one_positioned_line(tmp_path: Path, edit: tuple[str, str], expected: str) -> None:
    old, new = edit
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(SpecError) as raised:
        expand(load_matrix(path))
    line = raised.value.one_line()
    assert line.startswith(str(path) + expected), line
    assert "\n" not in line and raised.value.exit_code == 2


def test_an_include_that_repeats_a_cell_adds_nothing_and_one_that_clashes_is_refused(tmp_path: Path) -> None:
    same = GOOD.replace("  - {target: {label: h200, gpu: h200}, quantization: fp8}",
                        "  - {model: llama, target: cpu-reference, quantization: none}")
    assert len(expand(load_matrix(_write(tmp_path, same)))) == 5 + 1  # 6 from the axes; the include repeats one
    clash = GOOD.replace("  - {target: {label: h200, gpu: h200}, quantization: fp8}",
                         "  - {model: llama, target: {label: cpu-reference, gpu: cpu-reference, tp: 2}, "
                         "quantization: none}")
    with pytest.raises(SpecError) as raised:
        expand(load_matrix(_write(tmp_path, clash)))
    assert ("include[0]: this makes cell llama-cpu-reference-none, which axes also makes with other settings"
            in raised.value.one_line())


def test_a_matrix_whose_excludes_leave_nothing_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("  - {target: h100-sxm-tp2, quantization: none}", "  - {model: llama}\n  - {model: qwen2}")
    text = text[: text.index("include:")]
    with pytest.raises(SpecError) as raised:
        expand(load_matrix(_write(tmp_path, text)))
    assert "the matrix has no cells" in raised.value.one_line()


@pytest.mark.parametrize(("text", "expected"), [
    ("", "matrix file is empty"),
    ("- a\n- b\n", "the top level is not a mapping"),
    ("axes: {targets: [\n", "invalid YAML"),
])
def test_unreadable_matrix_files(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as raised:
        load_matrix(_write(tmp_path, text))
    assert expected in raised.value.one_line()
    with pytest.raises(SpecError) as missing:
        load_matrix(tmp_path / "nope.yaml")
    assert missing.value.one_line().startswith(f"{tmp_path / 'nope.yaml'}:1:1: matrix file does not exist")
