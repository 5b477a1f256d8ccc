"""The tensorrtllm backend's parameter contract (build_configs/triton_contracts/tensorrtllm_parameters.yaml):
every GPU example publishes a tensorrt_llm config the table accepts, and validate refuses what the backend would
not load or would read otherwise (a missing required key, a mistyped value, a broken cross-key rule, a logits
type other than the engine's), in one line naming the key and the table row. No TensorRT here: the engines are
stand-ins laid out as trtllm-build writes them."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from trtpipe.engine.plan import make_build_plan
from trtpipe.errors import IntegrityError, InvalidInput
from trtpipe.serving.parameters import PARAMETER_FILE, RULE_IDS, load_parameter_table, parameter_path
from trtpipe.serving.inflight_repository import publish_repository
from trtpipe.serving.templates import TEMPLATE_ROOT
from trtpipe.serving.validate import ValidationIssue, errors_only, validate_repository
from trtpipe.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "build_configs" / "examples"
# Every GPU example (tiny-cpu* are the cpu-reference ones), found on disk so a new example is covered too.
GPU_EXAMPLES = sorted(p.stem for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("tiny"))
TABLE = load_parameter_table()
REQUIRED = TABLE.required_keys
DIGEST = "sha256:" + "cd" * 32


def resolve_example(name: str):
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    return resolve(load_spec(EXAMPLES / f"{name}.yaml"), need_weights=False)


def _engine(root: Path, plan, *, logits_dtype: str | None = "float16", **plugin_changes) -> Path:
    """An engine dir as trtllm-build writes it for `plan`: config.json (version, pretrained_config with the
    checkpoint's mapping and logits_dtype, build_config with the limits and resolved plugins) + rank{N}.engine."""
    plugins = {k: (plan.dtype if v == "auto" else v) for k, v in plan.plugin_config.items()}
    plugins.update(plugin_changes)
    pretrained = {"architecture": plan.architecture or "LlamaForCausalLM", "dtype": plan.dtype,
                  "mapping": {"world_size": plan.tp * plan.pp, "tp_size": plan.tp, "pp_size": plan.pp}}
    if logits_dtype is not None:
        pretrained["logits_dtype"] = logits_dtype
    config = {"version": plan.trtllm_version, "pretrained_config": pretrained,
              "build_config": {**plan.limits, "kv_cache_type": "PAGED", "plugin_config": plugins}}
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    for rank in range(plan.tp * plan.pp):
        (root / f"rank{rank}.engine").write_bytes(b"stand-in engine")
    return root


def _publish(tmp: Path, example: str, tokenizer: Path, **engine_changes) -> Path:
    resolved = resolve_example(example)
    # The examples plan from a shipped config.json (no weights, no tokenizer): the tiny model's tokenizer stands in.
    resolved = dataclasses.replace(resolved, tokenizer_dir=tokenizer)
    plan = make_build_plan(resolved)
    # trtpipe's checkpoint writer records float16 logits for float16 and bfloat16 checkpoints.
    engine = _engine(tmp / "engine", plan, **engine_changes)
    return publish_repository(resolved, engine, DIGEST, "engine-key", tmp / "repo")


def _writable_copy(repo: Path, dest: Path) -> Path:
    shutil.copytree(repo, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dest


def _set_param(repo: Path, model: str, key: str, value: str | None) -> None:
    """Rewrite (value None: remove) one parameters entry of `model`'s config.pbtxt."""
    path = repo / model / "config.pbtxt"
    text = path.read_text()
    pattern = re.compile(r'^parameters \{ key: "' + re.escape(key) + r'" value: \{ string_value: "[^"]*" \} \}\n', re.M)
    if pattern.search(text):
        line = "" if value is None else f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        text = pattern.sub(line, text)
    else:
        assert value is not None, f"{key} not in {path}"
        text += f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    path.write_text(text)


def _issue(repo: Path, model: str, key: str, says: str = "") -> ValidationIssue:
    """The first error on `model`'s parameters.`key` whose message or fix holds `says`."""
    issues = validate_repository(repo)
    errors = [i for i in errors_only(issues)
              if i.model == model and i.field == f"parameters.{key}" and says in i.message + i.fix]
    assert errors, f"no error on {model} parameters.{key} saying {says!r}: {[i.one_line() for i in issues]}"
    return errors[0]


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return _publish(tmp_path_factory.mktemp("llama3-8b-fp8-h100"), "llama3-8b-fp8-h100", tiny_llama_dir)


@pytest.fixture
def broken(gpu_repo: Path, tmp_path: Path) -> Path:
    return _writable_copy(gpu_repo, tmp_path / "repo")


# --- the table itself ---------------------------------------------------------------------------------------

def test_every_row_cites_file_function_and_commit() -> None:
    raw = yaml.safe_load(parameter_path().read_text())
    rows = [*raw["parameters"], *raw["rules"], *raw["python_models"], raw["logits"]]
    assert all("source" in row for row in rows), [row.get("key", row.get("id")) for row in rows if "source" not in row]
    citations = TABLE.citations()
    assert len(citations) >= len(rows)
    for what, citation in citations:
        reading = TABLE.readings[citation.reading]
        assert re.fullmatch(r"[0-9a-f]{40}", reading.commit), what
        assert citation.file and citation.function and reading.repo, what
    # verified only where read at the source the container carries: no backend row is (see the table's header).
    assert not any(p.verified for p in TABLE.parameters) and not any(r.verified for r in TABLE.rules)
    assert not any(t.read_at_tag for t in TABLE.toolchains.values())


def test_a_row_without_its_citation_does_not_load(tmp_path: Path) -> None:
    raw = yaml.safe_load(parameter_path().read_text())
    del raw["parameters"][0]["source"]
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(IntegrityError, match=r"parameters\.0\.source"):
        load_parameter_table(path)
    raw = yaml.safe_load(parameter_path().read_text())
    raw["rules"][0]["source"]["reading"] = "nowhere@0"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(IntegrityError, match="nowhere@0"):
        load_parameter_table(path)


def test_the_required_keys_are_the_unguarded_reads() -> None:
    assert REQUIRED == ["gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"]
    assert {r.id for r in TABLE.rules} == set(RULE_IDS)


def test_python_model_rows_name_keys_their_files_read() -> None:
    for row in TABLE.python_models:
        source = (TEMPLATE_ROOT / row.source.file).read_text()
        assert f'"{row.key}"' in source, f"{row.model}.{row.key} is not read by {row.source.file}"


# --- every GPU example publishes what the table accepts -------------------------------------------------------

@pytest.mark.parametrize("example", GPU_EXAMPLES)
def test_gpu_example_publishes_every_required_key(example: str, tmp_path: Path, tiny_llama_dir: Path) -> None:
    repo = _publish(tmp_path, example, tiny_llama_dir)
    assert errors_only(validate_repository(repo)) == []
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    for key in REQUIRED:
        assert f'key: "{key}"' in text, key
    for key in ("tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        assert f'key: "{key}" value: {{ string_value: "" }}' in text  # empty: the backend's "unset"
    world = resolve_example(example).spec.target.tp
    assert f'"{",".join(str(i) for i in range(world))}"' in text  # gpu_device_ids: one per rank of its tp


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_required_key_fails_validate_naming_it(broken: Path, key: str) -> None:
    _set_param(broken, "tensorrt_llm", key, None)
    issue = _issue(broken, "tensorrt_llm", key)
    assert "missing" in issue.message and f"parameters.{key}" in issue.message and PARAMETER_FILE in issue.message
    assert "Cannot find parameter with name" in issue.message


@pytest.mark.parametrize(("key", "value", "says"), [
    ("gpt_model_type", "static", "one of V1"),
    ("gpt_model_type", "V1", "in-flight"),
    ("enable_kv_cache_reuse", "yes", "a bool"),
    ("enable_chunked_context", "True!", "a bool"),
    ("max_beam_width", "abc", "an integer"),
    ("max_beam_width", "12abc", "an integer"),
    ("kv_cache_free_gpu_mem_fraction", "abc", "a decimal number"),
    ("kv_cache_free_gpu_mem_fraction", "1.0", "< 1"),
    ("kv_cache_free_gpu_mem_fraction", "0", "> 0"),
    ("batch_scheduler_policy", "fifo", "max_utilization, guaranteed_no_evict"),
    ("gpu_device_ids", "a,b", "comma lists"),
    ("decoding_mode", "greedy", "top_k"),
    ("max_tokens_in_paged_kv_cache", "-5", "> 0"),
])
def test_a_mistyped_value_fails_validate_naming_it(broken: Path, key: str, value: str, says: str) -> None:
    _set_param(broken, "tensorrt_llm", key, value)
    issue = _issue(broken, "tensorrt_llm", key, says)
    if key != "gpt_model_type" or value != "V1":  # V1 is trtpipe's own rule, the rest the table's rows
        assert f"parameters.{key}:" in issue.message or "range:" in issue.message


def test_an_empty_optional_key_is_unset_and_accepted(broken: Path) -> None:
    for key in ("max_tokens_in_paged_kv_cache", "enable_kv_cache_reuse", "decoding_mode"):
        _set_param(broken, "tensorrt_llm", key, "")
    assert errors_only(validate_repository(broken)) == []


@pytest.mark.parametrize(("changes", "key", "rule"), [
    ({"decoding_mode": "lookahead", "lookahead_window_size": "4"}, "lookahead_ngram_size", "lookahead-needs-sizes"),
    ({"guided_decoding_backend": "outlines", "xgrammar_tokenizer_info_path": "/trtpipe/repo/info.json"},
     "guided_decoding_backend", "guided-decoding-needs-xgrammar"),
    ({"gpt_model_path": None}, "gpt_model_path", "engine-path"),
    ({"cross_kv_cache_fraction": "0.5"}, "cross_kv_cache_fraction", "cross-kv-cache-fraction-decoder-only"),
])
def test_a_broken_cross_key_rule_fails_validate(broken: Path, changes: dict, key: str, rule: str) -> None:
    for name, value in changes.items():
        _set_param(broken, "tensorrt_llm", name, value)
    _issue(broken, "tensorrt_llm", key, f"rules.{rule}")


def test_guided_decoding_is_off_when_either_key_is_empty(broken: Path) -> None:
    _set_param(broken, "tensorrt_llm", "guided_decoding_backend", "outlines")  # the path stays empty: off
    assert errors_only(validate_repository(broken)) == []
    _set_param(broken, "tensorrt_llm", "xgrammar_tokenizer_info_path", "/trtpipe/repo/info.json")
    _set_param(broken, "tensorrt_llm", "guided_decoding_backend", "xgrammar")
    assert errors_only(validate_repository(broken)) == []


@pytest.mark.parametrize(("plugin", "key", "value"), [
    ("use_paged_context_fmha", "enable_chunked_context", "true"),
    (None, "kv_cache_onboard_blocks", "false"),
])
def test_rules_against_the_engine(tmp_path: Path, tiny_llama_dir: Path, plugin: str | None, key: str, value: str) -> None:
    """enable_chunked_context needs paged context FMHA in the engine; kv_cache_onboard_blocks false refuses it."""
    repo = _writable_copy(_publish(tmp_path, "llama3-8b-fp8-h100", tiny_llama_dir), tmp_path / "broken")
    if plugin:  # the spec asks for chunked context; an engine built without paged context FMHA cannot serve it
        config = repo / "tensorrt_llm" / "1" / "config.json"
        engine = json.loads(config.read_text())
        engine["build_config"]["plugin_config"][plugin] = False
        config.write_text(json.dumps(engine))
    else:
        _set_param(repo, "tensorrt_llm", key, value)
    issue = _issue(repo, "tensorrt_llm", key, "paged context FMHA")
    assert "rules." in issue.message


@pytest.mark.parametrize(("model", "key", "value", "says"), [
    ("preprocessing", "add_special_tokens", "True", 'exactly "true"'),
    ("preprocessing", "max_input_len", "abc", "not an integer"),
    ("postprocessing", "skip_special_tokens", "yes", 'exactly "true"'),
    ("tensorrt_llm_bls", "tensorrt_llm_model_name", "llm", "names no model"),
    ("tensorrt_llm_bls", "tensorrt_llm_decoupled", "1", 'exactly "true"'),
])
def test_python_model_keys_are_checked(broken: Path, model: str, key: str, value: str, says: str) -> None:
    _set_param(broken, model, key, value)
    issue = _issue(broken, model, key, says)
    assert f"python_models {model}.{key}" in issue.message, issue.one_line()


# --- logits dtypes --------------------------------------------------------------------------------------------

def _logits(repo: Path, model: str) -> set[str]:
    text = (repo / model / "config.pbtxt").read_text()
    return set(re.findall(r'name: "(?:context|generation)_logits" data_type: (\w+)', text))


@pytest.mark.parametrize(("engine_dtype", "declared"), [("float16", "TYPE_FP16"), ("float32", "TYPE_FP32"),
                                                        (None, "TYPE_FP32")])
def test_logits_are_declared_with_the_engine_type(tmp_path: Path, tiny_llama_dir: Path, engine_dtype: str | None,
                                                  declared: str) -> None:
    repo = _publish(tmp_path, "llama2-13b-fp16-a100", tiny_llama_dir, logits_dtype=engine_dtype)
    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        assert _logits(repo, model) == {declared}, model
    assert errors_only(validate_repository(repo)) == []


def test_bf16_logits_are_refused_at_publish(tmp_path: Path, tiny_llama_dir: Path) -> None:
    with pytest.raises(InvalidInput, match="logits_dtype is 'bfloat16'"):
        _publish(tmp_path, "llama2-13b-fp16-a100", tiny_llama_dir, logits_dtype="bfloat16")


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble", "tensorrt_llm_bls"])
def test_validate_refuses_logits_declared_otherwise_than_the_engine(broken: Path, model: str) -> None:
    path = broken / model / "config.pbtxt"
    path.write_text(path.read_text().replace('"context_logits" data_type: TYPE_FP16', '"context_logits" data_type: TYPE_FP32'))
    issues = [i for i in errors_only(validate_repository(broken))
              if i.model == model and i.field == "output[context_logits]" and "logits_dtype: float16" in i.message]
    assert issues and "TYPE_FP32" in issues[0].message and "TYPE_FP16" in issues[0].fix, validate_repository(broken)


def test_the_reference_repository_declares_its_engine_logits(example_repo: Path) -> None:
    engine = json.loads((example_repo / "tensorrt_llm" / "1" / "config.json").read_text())
    assert engine["pretrained_config"]["logits_dtype"] == "float16"  # a float16 checkpoint
    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        assert _logits(example_repo, model) == {"TYPE_FP16"}


def test_the_reference_model_refuses_to_load_on_a_logits_mismatch(repo_copy: Path) -> None:
    """The served cpu-reference model checks the declared logits type against the engine's at initialize, as the
    C++ backend does per request: the server does not start, and says why in one line."""
    from trtpipe.errors import TrtpipeError
    from trtpipe.serving.server import start_server

    for model in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):  # consistent among themselves, not with the engine
        path = repo_copy / model / "config.pbtxt"
        text = path.read_text()
        for name in ("context_logits", "generation_logits"):
            text = text.replace(f'"{name}" data_type: TYPE_FP16', f'"{name}" data_type: TYPE_FP32')
        path.write_text(text)
        assert _logits(repo_copy, model) == {"TYPE_FP32"}
    assert any(i.field == "output[context_logits]" for i in errors_only(validate_repository(repo_copy)))
    with pytest.raises(TrtpipeError) as raised:
        start_server(repo_copy, start_timeout=180, validate=False, settings=Settings.from_env()).stop()
    assert "logits_dtype is float16" in str(raised.value) and "declare it TYPE_FP16" in str(raised.value)


def test_a_gpu_publish_refuses_a_memory_fraction_the_executor_refuses(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """The spec allows kv_cache_free_gpu_mem_fraction 1.0 (the llm-api backend shares it); the C++ backend's
    executor takes only 0 < f < 1, so a GPU publish says so in one line instead of writing a repository that fails."""
    resolved = dataclasses.replace(resolve_example("llama3-8b-int4awq-a100"), tokenizer_dir=tiny_llama_dir)
    resolved.spec.runtime.kv_cache_free_fraction = 1.0
    engine = _engine(tmp_path / "engine", make_build_plan(resolved))
    with pytest.raises(InvalidInput, match=r"runtime.kv_cache_free_fraction 1: .*< 1") as raised:
        publish_repository(resolved, engine, DIGEST, "engine-key", tmp_path / "repo")
    assert "below 1" in (raised.value.fix or "")
