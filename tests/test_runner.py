"""The runner drives whatever stages a backend declares: keys from the stage's document, hits, builds, forced
rebuilds, dry-run previews, facts into the build record, and a stage re-keyed when the stored input it
builds on fails verification and comes back with other bytes. The backends' own stage lists and the
toolchain's backend variants are checked here too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtpipe.pipeline import run_build
from trtpipe.stages import BACKEND_STAGES, BackendStages, InputRef, Preview, StageContext
from trtpipe.store.keys import StageKey, make_key
from trtpipe.store.local import Store
from trtpipe.toolchain import BACKEND_KINDS, load_toolchains
from trtpipe.settings import Settings

pytestmark = pytest.mark.timeout(300)


class Note:
    """A first stage: writes which build of it this is (so a rebuild has other bytes)."""

    name, kind, inputs = "checkpoint", "checkpoint", ()

    def __init__(self) -> None:
        self.builds = 0

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        return make_key("checkpoint", {"model": ctx.resolved.spec.artifact_name})

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        self.builds += 1
        (out_dir / "note.txt").write_text(f"build {self.builds}\n")
        return {"builds": self.builds}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return Preview(command=["write", "note.txt"], notes=["writes note.txt"])


class Echo:
    """A second stage keyed by the first one's digest, copying its file."""

    name, kind, inputs = "engine", "engine", ("checkpoint",)

    def __init__(self) -> None:
        self.builds = 0

    def key(self, ctx: StageContext, inputs: dict[str, InputRef]) -> StageKey:
        return make_key("engine", {"note": inputs["checkpoint"].digest})

    def build(self, ctx: StageContext, out_dir: Path, inputs: dict[str, InputRef], key: StageKey) -> dict[str, Any]:
        self.builds += 1
        (out_dir / "echo.txt").write_text((inputs["checkpoint"].path / "note.txt").read_text())
        return {}

    def preview(self, ctx: StageContext, key: str | None, inputs: dict[str, InputRef]) -> Preview | None:
        return None


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> tuple[Note, Echo]:
    note, echo = Note(), Echo()
    monkeypatch.setitem(BACKEND_STAGES, "reference", BackendStages(plan=lambda resolved: None, stages=(note, echo)))
    return note, echo


@pytest.fixture
def spec(tmp_path: Path, tiny_llama_dir: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: runner-test\nmodel:\n  path: {tiny_llama_dir}\n")
    return path


def test_the_runner_builds_hits_forces_and_records_declared_stages(declared, spec: Path, tmp_path: Path) -> None:
    note, echo = declared
    home = tmp_path / "home"
    first = run_build(spec, store=home, progress=False, settings=Settings.from_env())
    assert [(s.name, s.outcome) for s in first.stages] == [
        ("resolve", "ran"), ("plan", "ran"), ("checkpoint", "built"), ("engine", "built")]
    assert first.keys["checkpoint"] == make_key("checkpoint", {"model": "runner-test"}).key
    assert (Path(first.stages[3].path) / "echo.txt").read_text() == "build 1\n"
    record = json.loads(Path(first.record_path).read_text())
    assert record["stages"][2]["facts"]["builds"] == 1  # what build() returned goes to the record ...
    store = Store.open(home)
    assert "builds" not in json.dumps(store.get("checkpoint", first.keys["checkpoint"]).manifest)  # ... not the artifact

    again = run_build(spec, store=home, progress=False, settings=Settings.from_env())
    assert [s.outcome for s in again.stages[2:]] == ["hit", "hit"] and (note.builds, echo.builds) == (1, 1)
    assert again.artifacts == first.artifacts

    forced = run_build(spec, store=home, force=["checkpoint"], progress=False, settings=Settings.from_env())
    # The note came back with other bytes, so the echo keyed by its digest is a new key: built.
    assert [s.outcome for s in forced.stages[2:]] == ["built", "built"]
    assert forced.keys["engine"] != first.keys["engine"] and forced.keys["checkpoint"] == first.keys["checkpoint"]


def test_a_dry_run_keys_what_it_can_and_previews_what_would_build(declared, spec: Path, tmp_path: Path) -> None:
    note, _ = declared
    report = run_build(spec, store=tmp_path / "home", dry_run=True, progress=False, settings=Settings.from_env())
    checkpoint, engine = report.stages[2], report.stages[3]
    assert checkpoint.outcome == "would-build" and checkpoint.command == ["write", "note.txt"]
    assert engine.outcome == "would-build" and engine.key and note.builds == 0
    records = tmp_path / "home" / "records"
    assert report.status == "dry-run" and (not records.exists() or not any(records.iterdir()))


def test_a_damaged_input_is_rebuilt_and_the_stage_on_it_rekeyed(declared, spec: Path, tmp_path: Path) -> None:
    note, echo = declared
    home = tmp_path / "home"
    first = run_build(spec, store=home, progress=False, settings=Settings.from_env())
    stored = Store.open(home).get("checkpoint", first.keys["checkpoint"])
    victim = stored.path / "note.txt"
    victim.chmod(0o644)
    victim.write_text("build X\n")  # same size, other bytes: only a digest check sees it
    report = run_build(spec, store=home, force=["engine"], progress=False, settings=Settings.from_env())
    # The engine verified its input before building on it: quarantined, rebuilt (build 2), and the engine
    # built under the key of the new digest, from the new bytes.
    assert note.builds == 2 and report.keys["engine"] != first.keys["engine"]
    engine = next(s for s in reversed(report.stages) if s.name == "engine")
    assert (Path(engine.path) / "echo.txt").read_text() == "build 2\n"
    assert any(s.name == "checkpoint" and s.outcome == "built" for s in report.stages)


def test_every_backend_kind_has_its_stages_and_every_toolchain_offers_backends() -> None:
    from trtpipe.serving.layouts import LAYOUTS
    from trtpipe.toolchain import backend_facts

    assert set(BACKEND_STAGES) == set(BACKEND_KINDS)
    for kind, backend in BACKEND_STAGES.items():
        names = [s.name for s in backend.stages]
        for stage in backend.stages:
            assert set(stage.inputs) <= set(names[: names.index(stage.name)]), (kind, stage.name)
        # Its facts chose its stages: the last publishes the layout they name; an engine import where it builds
        # engines on a GPU.
        assert backend.stages[-1].layout is LAYOUTS[backend_facts(kind).layout]
        assert (backend.imported is not None) == (backend_facts(kind).runs_on == "gpu"
                                                  and backend_facts(kind).artifact == "trtllm-checkpoint")
    assert [type(s).__name__ for s in BACKEND_STAGES["trtllm-build"].stages] == ["CheckpointStage", "EngineStage",
                                                                                  "PublishStage"]
    assert [type(s).__name__ for s in BACKEND_STAGES["llm-api"].stages] == ["HfCheckpointStage", "PublishStage"]
    assert (BACKEND_STAGES["trtllm-build"].stages[0].in_executor, BACKEND_STAGES["reference"].stages[0].in_executor) \
        == (True, False)
    for toolchain in load_toolchains().values():
        # every stable line builds engines and runs the reference; the LLM-API backend from 1.2.1 on (issue 16)
        llm_api = {"llm-api"} if toolchain.version_tuple >= (1, 2, 1) else set()
        assert {b.kind for b in toolchain.backends} == {"trtllm-build", "reference"} | llm_api
        assert toolchain.backend("trtllm-build").flags == toolchain.name
        if llm_api:
            assert toolchain.backend("llm-api").args == toolchain.name


def test_the_spec_picks_a_backend_its_toolchain_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from trtpipe.errors import SpecError
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec
    from trtpipe.shipped import shipped_build_configs_dir

    config = shipped_build_configs_dir() / "models" / "llama-3-8b" / "config.json"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {config}\n")
    assert resolve(load_spec(spec), need_weights=False).backend.kind == "reference"
    spec.write_text(f"model:\n  config: {config}\ntarget:\n  gpu: h100\n")
    resolved = resolve(load_spec(spec), need_weights=False)
    assert resolved.backend.kind == "trtllm-build" and resolved.backend.flags == "trtllm-1.2.1"
    spec.write_text(f"model:\n  config: {config}\nbackend: trtllm-build\n")
    with pytest.raises(SpecError, match="builds for a GPU, but the target is cpu-reference") as info:
        resolve(load_spec(spec), need_weights=False)
    assert info.value.field == "backend" and info.value.line == 3

    # A toolchain line without the reference backend: a cpu-reference spec is refused at its toolchain.
    configs = tmp_path / "build_configs"
    shutil.copytree(shipped_build_configs_dir(), configs)
    table = configs / "toolchains.yaml"
    table.write_text(table.read_text().replace("        flags: trtllm-1.2.1\n      - kind: reference\n",
                                               "        flags: trtllm-1.2.1\n"))
    spec.write_text(f"model:\n  config: {config}\ntoolchain: trtllm-1.2.1\n")
    with pytest.raises(SpecError, match="offers no reference backend") as info:
        resolve(load_spec(spec), need_weights=False, configs=configs)
    assert info.value.field == "toolchain"
    # An unknown backend kind in the table is refused by the tagged union, naming the entry.
    table.write_text(table.read_text().replace("- kind: trtllm-build\n        flags: trtllm-1.2.1",
                                               "- kind: llm-api\n        flags: trtllm-1.2.1"))
    with pytest.raises(Exception, match="toolchains") as refused:
        load_toolchains(configs=configs)
    assert "backends" in str(refused.value)
