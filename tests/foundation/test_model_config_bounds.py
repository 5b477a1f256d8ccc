"""Impossible model configs (issue 14): a model folder's config.json with `"num_hidden_layers": 1e9` grew past
8 GB before anything answered; `"hidden_size": "256"` gave a TypeError traceback in the build; a negative
hidden_size was planned as "fits" with negative parameters. Each is now refused before anything is sized from
it, by the one check plan, resolve, convert and the reference runtime share (trtpipe.config_json), in one line
naming the file (with the line) and the field, exit 2.

Memory error model for the subprocess build: its peak RSS on a refused config is the interpreter and
trtpipe's imports (measured in the same test on a refused spec that never reaches config.json), plus the
config check itself, which allocates nothing in proportion to the config's values; the bound is that
baseline + 64 MB (main grew past 8 GB on 1e9 layers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trtpipe.config_json import BOUNDS, check_model_config, read_model_config
from trtpipe.errors import InvalidInput

# (name, the config.json text edit: field -> value as written in the file, what the line must say)
HOSTILE: dict[str, tuple[dict[str, str], str]] = {
    "layers_1e9": ({"num_hidden_layers": "1e9"}, '"num_hidden_layers": 1e9 is a number with a fraction or an exponent'),
    "hidden_as_text": ({"hidden_size": '"256"'}, '"hidden_size": "256" is text, not a whole number'),
    "hidden_negative": ({"hidden_size": "-256"}, '"hidden_size": -256 is below 1'),
    "heads_bool": ({"num_attention_heads": "true"}, '"num_attention_heads": true is true/false'),
    "vocab_zero": ({"vocab_size": "0"}, '"vocab_size": 0 is below 1'),
    "vocab_huge": ({"vocab_size": "1000000000000"}, '"vocab_size": 1000000000000 is beyond 4,194,304'),
    "layers_huge_int": ({"num_hidden_layers": "1000000"}, '"num_hidden_layers": 1000000 is beyond 1,024'),
    "intermediate_float": ({"intermediate_size": "512.0"}, '"intermediate_size": 512.0 is a number with a fraction'),
    "positions_negative": ({"max_position_embeddings": "-1"}, '"max_position_embeddings": -1 is below 1'),
    "kv_heads_not_dividing": ({"num_key_value_heads": "3"}, '"num_key_value_heads": 3 does not divide num_attention_heads 4'),
    "head_dim_odd": ({"head_dim": "63"}, '"head_dim": 63 gives heads of odd width 63'),
    "tied_as_text": ({"tie_word_embeddings": '"false"'}, '"tie_word_embeddings": "false" is text, not true or false'),
    "rope_theta_nan": ({"rope_theta": "NaN"}, '"rope_theta": NaN is not a finite, non-negative number'),
    "architectures_object": ({"architectures": '{"0": "LlamaForCausalLM"}'}, '"architectures": {"0": "LlamaForCausalLM"} is not a list'),
}


def _hostile_config(tiny_config: str, edits: dict[str, str]) -> str:
    """The tiny model's config.json text with each field's value replaced by the text given (as a user would
    write it: `1e9` stays `1e9` in the file)."""
    data = json.loads(tiny_config)
    text = json.dumps(data, indent=2)
    for field, value in edits.items():
        placeholder = f"@@{field}@@"
        data[field] = placeholder
        text = json.dumps(data, indent=2).replace(f'"{placeholder}"', value)
    return text


def _hidden_without_head_dim(tiny_config: str) -> str:
    data = json.loads(tiny_config)
    data.pop("head_dim")
    data["hidden_size"] = 250  # 250 / 4 heads is not whole
    return json.dumps(data, indent=2)


@pytest.fixture
def hostile_model(tiny_llama_dir: Path, tmp_path: Path):
    """hostile_model(config_text) -> a copy of the tiny model folder with that config.json, and a spec for it."""

    def make(config_text: str) -> tuple[Path, Path]:
        folder = tmp_path / "model"
        shutil.copytree(tiny_llama_dir, folder)
        (folder / "config.json").write_text(config_text)
        spec = tmp_path / "spec.yaml"
        spec.write_text(f"name: hostile\nmodel:\n  path: {folder}\n  dtype: float16\ntarget:\n  gpu: cpu-reference\n"
                        "engine: {max_batch_size: 4, max_input_len: 64, max_seq_len: 128}\n")
        return folder, spec

    return make


def _one_line(result_err: str) -> str:
    lines = [x for x in result_err.splitlines() if x.strip()]
    assert len(lines) == 1, result_err
    assert "Traceback" not in result_err
    return lines[0]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_plan_refuses_an_impossible_config_in_one_line(case: str, cli, hostile_model, tiny_llama_dir: Path) -> None:
    edits, needle = HOSTILE[case]
    text = _hostile_config((tiny_llama_dir / "config.json").read_text(), edits)
    folder, spec = hostile_model(text)
    result = cli("plan", spec)
    assert result.code == 2, (result.code, result.out[-500:], result.err)
    line = _one_line(result.err)
    field = next(iter(edits))
    written_at = next(i for i, x in enumerate(text.splitlines(), start=1) if f'"{field}"' in x)
    assert f"{spec}:3:" in line  # the spec field that named the model folder
    assert f"{folder / 'config.json'}:{written_at}: " in line, line
    assert needle in line, line
    assert "fits" not in result.out


def test_heads_that_have_no_whole_width(cli, hostile_model, tiny_llama_dir: Path) -> None:
    folder, spec = hostile_model(_hidden_without_head_dim((tiny_llama_dir / "config.json").read_text()))
    line = _one_line(cli("plan", spec).err)
    assert '"hidden_size": 250 does not divide by num_attention_heads 4' in line, line


def test_a_negative_hidden_size_is_never_planned_as_fitting(cli, hostile_model, tiny_llama_dir: Path) -> None:
    """main: `plan --json` said fits with total_params -1.44 M."""
    folder, spec = hostile_model(_hostile_config((tiny_llama_dir / "config.json").read_text(), {"hidden_size": "-256"}))
    result = cli("plan", spec, "--json")
    assert result.code == 2, result.out
    refusal = json.loads(result.out)  # with --json the refusal is the one object on stdout, no plan in it
    assert refusal["ok"] is False and refusal["error"]["type"] == "SpecError" and "fits" not in refusal
    assert '"hidden_size": -256 is below 1' in refusal["error"]["message"]


def test_spec_check_and_convert_refuse_it_the_same_way(cli, hostile_model, tiny_llama_dir: Path, tmp_path: Path) -> None:
    text = _hostile_config((tiny_llama_dir / "config.json").read_text(), {"hidden_size": '"256"'})
    folder, spec = hostile_model(text)
    for args in (("spec-check", spec), ("spec-check", "--weights", spec), ("convert", spec, "--out", tmp_path / "ck")):
        result = cli(*args)
        assert result.code == 2, (args, result.err)
        assert '"hidden_size": "256" is text' in _one_line(result.err)
    assert not (tmp_path / "ck").exists()


def test_the_converters_own_source_check_applies_it(hostile_model, tiny_llama_dir: Path) -> None:
    """hf_source.inspect_source (what convert checks before loading any weight) reads config.json through it."""
    from trtpipe.checkpoint.hf_source import inspect_source

    folder, _ = hostile_model(_hostile_config((tiny_llama_dir / "config.json").read_text(), {"num_hidden_layers": "1e9"}))
    with pytest.raises(InvalidInput, match=r'config\.json:\d+: "num_hidden_layers": 1e9'):
        inspect_source(folder, None)


_MEASURED_CLI = textwrap.dedent("""
    import resource, sys
    from trtpipe.cli import main
    code = main(sys.argv[1:])
    sys.stderr.write("\\nMAXRSS_KB=%d\\n" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    sys.exit(code)
""")


def _measured_build(spec: Path, home: Path) -> tuple[int, list[str], int]:
    proc = subprocess.run([sys.executable, "-c", _MEASURED_CLI, "build", str(spec), "--store", str(home)],
                          capture_output=True, text=True, timeout=300)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    rss = int(lines.pop().removeprefix("MAXRSS_KB="))
    return proc.returncode, lines, rss


@pytest.mark.timeout(600)
def test_a_build_on_a_billion_layers_answers_in_bounded_memory(hostile_model, tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The issue's case through `trtpipe build` in a child process: one line, exit 2, memory near the baseline,
    and a failed build record that names the stage and the reason."""
    from trtpipe.build_record import read_records

    folder, spec = hostile_model(_hostile_config((tiny_llama_dir / "config.json").read_text(), {"num_hidden_layers": "1e9"}))
    baseline_spec = tmp_path / "baseline.yaml"
    baseline_spec.write_text(spec.read_text().replace("gpu: cpu-reference", "gpu: no-such-gpu"))
    base_code, base_lines, base_rss = _measured_build(baseline_spec, tmp_path / "store")
    assert base_code == 2, base_lines
    code, lines, rss = _measured_build(spec, tmp_path / "store")
    assert code == 2, lines
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1 and '"num_hidden_layers": 1e9' in errors[0], lines
    assert not any("Traceback" in x for x in lines)
    assert rss <= base_rss + 64 * 1024, (rss, base_rss)
    record = next(r for r in read_records(tmp_path / "store") if r.spec_path == str(spec))
    assert record.status == "failed" and '"num_hidden_layers": 1e9' in (record.error or "")
    assert [s.outcome for s in record.stages if s.name == "resolve"] == ["failed"]


def test_every_shipped_and_example_config_is_within_the_bounds(tiny_llama_dir: Path, tiny_qwen2_dir: Path) -> None:
    """The bounds never refuse a real model: the shipped Llama-2/3, Mistral, Qwen2.5 configs and the examples."""
    from trtpipe.shipped import shipped_build_configs_dir

    configs = sorted((shipped_build_configs_dir() / "models").glob("*/config.json"))
    assert len(configs) >= 5
    for path in [*configs, tiny_llama_dir / "config.json", tiny_qwen2_dir / "config.json"]:
        read_model_config(path)


def test_bounds_cover_the_largest_released_decoders() -> None:
    """Llama-3.1-405B's config.json (126 layers, hidden 16384, 128 heads, 8 KV heads, intermediate 53248, vocab
    128256, 131072 positions) and Gemma 3's vocabulary (262144) pass; one past each ceiling does not."""
    llama_405b = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 126, "hidden_size": 16384,
                  "num_attention_heads": 128, "num_key_value_heads": 8, "intermediate_size": 53248,
                  "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0}
    check_model_config(llama_405b, "405b/config.json")
    check_model_config({**llama_405b, "vocab_size": 262144}, "gemma/config.json")
    for bound in BOUNDS:
        too_big = {**llama_405b, bound.hf: bound.high + 1}
        if bound.hf in ("hidden_size", "num_attention_heads", "head_dim", "num_key_value_heads"):
            too_big.update({"head_dim": 128} if bound.hf != "head_dim" else {})
        with pytest.raises(InvalidInput, match=f'"{bound.hf}": {bound.high + 1} is beyond'):
            check_model_config(too_big, "x/config.json")


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"num_hidden_layers": ' + "9" * 5000 + "}", "Exceeds the limit"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "is a list, not a JSON object"),
])
def test_a_config_json_that_does_not_parse_is_one_line(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=needle) as caught:
        read_model_config(path)
    assert str(path) in caught.value.one_line() and "\n" not in caught.value.one_line()


def test_a_config_json_larger_than_the_bound_is_not_read(tmp_path: Path) -> None:
    from trtpipe.config_json import MAX_CONFIG_BYTES

    path = tmp_path / "config.json"
    path.write_text('{"pad": "' + "x" * MAX_CONFIG_BYTES + '"}')
    with pytest.raises(InvalidInput, match="larger than 4 MiB"):
        read_model_config(path)
