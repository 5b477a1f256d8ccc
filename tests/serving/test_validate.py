"""Validation of published repositories: the clean example passes; each kind of breakage is caught."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trtpipe.cli import main
from trtpipe.serving.validate import ValidationIssue, errors_only, validate_repository


def _edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def _find(issues: list[ValidationIssue], model: str, field_part: str, message_part: str) -> ValidationIssue:
    for issue in issues:
        if issue.model == model and field_part in issue.field and message_part in issue.message:
            return issue
    raise AssertionError(f"no issue {model}/{field_part}/{message_part} in {[i.one_line() for i in issues]}")


def test_example_repository_is_valid(example_repo: Path) -> None:
    assert errors_only(validate_repository(example_repo)) == []


def test_published_layout_and_manifest(example_repo: Path) -> None:
    for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        text = (example_repo / model / "config.pbtxt").read_text()
        assert "${" not in text
    llm = (example_repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "python"' in llm and "decoupled: true" in llm and "KIND_CPU" in llm
    assert '"inflight_fused_batching"' in llm
    manifest = json.loads((example_repo / "trtpipe.json").read_text())
    assert manifest["target"] == "cpu-reference" and manifest["reference"] is True
    assert manifest["engine"]["key"] and manifest["engine"]["digest"].startswith("sha256:")
    assert manifest["serving_container"] and manifest["toolchain"]
    assert manifest["triton_max_batch_size"] <= manifest["engine"]["max_batch_size"]
    # Name and gates travel with the artifact; how its files were placed does not (content only).
    assert manifest["name"] == "tiny-llama-cpu" and "gates" in manifest["release"]
    assert "placement" not in manifest["engine"]
    for model in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        text = (example_repo / model / "config.pbtxt").read_text()
        assert f'key: "trtpipe_engine_digest" value: {{ string_value: "{manifest["engine"]["digest"]}" }}' in text
        assert f'key: "trtpipe_repository_key" value: {{ string_value: "{example_repo.name}" }}' in text
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (example_repo / "preprocessing" / "tokenizer" / name).is_file()


def test_engine_files_are_hard_links_to_the_store(example_repo: Path) -> None:
    from trtpipe.store.local import Store

    manifest = json.loads((example_repo / "trtpipe.json").read_text())
    store = Store.open(example_repo.parent.parent)
    engine = store.get("engine", manifest["engine"]["key"])
    assert engine is not None
    for name in manifest["engine"]["files"]:
        assert (example_repo / "tensorrt_llm" / "1" / name).stat().st_ino == (engine.path / name).stat().st_ino


def test_ensemble_dtype_mismatch(repo_copy: Path) -> None:
    _edit(repo_copy / "ensemble" / "config.pbtxt",
          '{ name: "max_tokens" data_type: TYPE_INT32', '{ name: "max_tokens" data_type: TYPE_INT64')
    issue = _find(validate_repository(repo_copy), "ensemble", "input_map[REQUEST_OUTPUT_LEN]", "dtype mismatch")
    assert "TYPE_INT64" in issue.message and "TYPE_INT32" in issue.fix


def test_missing_tokenizer(repo_copy: Path) -> None:
    (repo_copy / "postprocessing" / "tokenizer" / "tokenizer.json").unlink()
    issue = _find(validate_repository(repo_copy), "postprocessing", "tokenizer/tokenizer.json", "missing")
    assert "publish again" in issue.fix


def test_streaming_without_decoupled(repo_copy: Path) -> None:
    _edit(repo_copy / "tensorrt_llm" / "config.pbtxt", "decoupled: true", "decoupled: false")
    issue = _find(validate_repository(repo_copy), "tensorrt_llm", "model_transaction_policy.decoupled", "streaming")
    assert "decoupled: true" in issue.fix


def test_unfilled_template_variable(repo_copy: Path) -> None:
    config = repo_copy / "preprocessing" / "config.pbtxt"
    config.write_text(re.sub(r"max_batch_size: \d+", "max_batch_size: ${triton_max_batch_size}", config.read_text()))
    issue = _find(validate_repository(repo_copy), "preprocessing", "config.pbtxt:", "unfilled template variable")
    assert "${triton_max_batch_size}" in issue.message


def test_batch_size_above_the_engines(repo_copy: Path) -> None:
    engine_batch = json.loads((repo_copy / "trtpipe.json").read_text())["engine"]["max_batch_size"]
    for model in ("ensemble", "tensorrt_llm"):
        config = repo_copy / model / "config.pbtxt"
        config.write_text(re.sub(r"max_batch_size: \d+", f"max_batch_size: {engine_batch * 2}", config.read_text(), count=1))
    issues = validate_repository(repo_copy)
    issue = _find(issues, "tensorrt_llm", "max_batch_size", f"exceeds the engine's max_batch_size {engine_batch}")
    assert f"<= {engine_batch}" in issue.fix


def test_config_syntax_error(repo_copy: Path) -> None:
    _edit(repo_copy / "postprocessing" / "config.pbtxt", 'backend: "python"', 'backend: "python" }')
    issue = _find(validate_repository(repo_copy), "postprocessing", "config.pbtxt:", "syntax error")
    assert re.match(r"config\.pbtxt:\d+:\d+", issue.field)


def test_serving_container_must_match_the_toolchain(repo_copy: Path) -> None:
    manifest_path = repo_copy / "trtpipe.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["serving_container"] = "nvcr.io/nvidia/tritonserver:24.01-trtllm-python-py3"
    manifest_path.write_text(json.dumps(manifest))
    _find(validate_repository(repo_copy), "trtpipe.json", "serving_container", "is not the container of toolchain")


def test_validate_reads_the_tables_of_trtpipe_build_configs(example_repo: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """TRTPIPE_BUILD_CONFIGS is read by the CLI and handed to the validator: a copy of the tables without the
    inflight contract makes `validate` warn that it cannot check it, naming the copy's file; the library given no
    folder reads the shipped one."""
    import shutil

    from trtpipe.shipped import shipped_build_configs_dir

    def contract_warnings(issues: list[ValidationIssue]) -> list[str]:
        return [i.message for i in issues if "cannot check the upstream Triton contract" in i.message]

    configs = shutil.copytree(shipped_build_configs_dir(), tmp_path / "build_configs")
    missing = configs / "triton_contracts" / "inflight_batcher_llm.yaml"
    missing.unlink()
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(configs))
    assert main(["validate", str(example_repo), "--json"]) == 0  # a table it cannot read is a warning
    issues = [ValidationIssue(**i) for i in json.loads(capsys.readouterr().out)["issues"]]
    assert any(str(missing) in m for m in contract_warnings(issues)), issues
    assert contract_warnings(validate_repository(example_repo)) == []  # no folder given: the shipped tables
    assert contract_warnings(validate_repository(example_repo, configs=configs)) != []


def test_validate_command_exit_codes(example_repo: Path, repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(example_repo)]) == 0
    assert "valid" in capsys.readouterr().out
    (repo_copy / "preprocessing" / "tokenizer" / "tokenizer.json").unlink()
    assert main(["validate", str(repo_copy), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and any(i["model"] == "preprocessing" for i in out["issues"])


def test_templates_digest_moves_when_a_model_py_or_a_template_changes(tmp_path: Path) -> None:
    """The repository key hashes the templates: editing a served model.py (or a config.pbtxt) must change it."""
    import shutil

    from trtpipe.serving.templates import TEMPLATE_ROOT, templates_digest

    copy = tmp_path / "triton_repo"
    shutil.copytree(TEMPLATE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = templates_digest()
    assert templates_digest(copy) == original  # content only: another folder, the same digest
    model_py = copy / "tensorrt_llm_reference" / "1" / "model.py"
    text = model_py.read_text()
    model_py.write_text(text + "\n# a one-line change\n")
    edited = templates_digest(copy)
    assert edited != original
    model_py.write_text(text)
    assert templates_digest(copy) == original
    config = copy / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size", "max_batch_size ", 1))
    assert templates_digest(copy) not in (original, edited)
