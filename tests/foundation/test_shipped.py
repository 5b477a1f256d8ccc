"""trtpipe.shipped: where the shipped data is, for a checkout (these tests' editable install), a wheel's layout
(the folders inside the package) and $TRTPIPE_BUILD_CONFIGS; and that every reader asks it. The installed
wheel itself is tests/test_package.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtpipe import shipped
from trtpipe.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_reads_the_folders_at_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpipe.serving.templates import TEMPLATE_ROOT

    monkeypatch.delenv("TRTPIPE_BUILD_CONFIGS", raising=False)
    assert shipped.package_dir() == ROOT / "trtpipe"
    assert shipped.build_configs_dir(Settings.from_env()) == shipped.configs_dir(None) == ROOT / "build_configs"
    assert shipped.triton_repo_dir() == TEMPLATE_ROOT == ROOT / "triton_repo"
    assert shipped.data_file("report", "release.html.j2") == ROOT / "trtpipe" / "data" / "report" / "release.html.j2"
    where = shipped.describe(Settings.from_env())
    assert (where.build_configs_from, where.triton_repo_from) == ("checkout", "checkout")


@pytest.fixture
def fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages-like folder: trtpipe/ in it, and shipped pointed at that package."""
    package = tmp_path / "site" / "trtpipe"
    package.mkdir(parents=True)
    monkeypatch.setattr(shipped, "package_dir", lambda: package)
    monkeypatch.delenv("TRTPIPE_BUILD_CONFIGS", raising=False)
    return package


def test_the_copy_inside_the_package_wins_over_one_beside_it(fake_install: Path) -> None:
    for place in (fake_install, fake_install.parent):
        (place / "build_configs").mkdir()
        (place / "triton_repo").mkdir()
    assert shipped.build_configs_dir(Settings.from_env()) == fake_install / "build_configs"
    assert shipped.triton_repo_dir() == fake_install / "triton_repo"
    assert shipped.describe(Settings.from_env()).model_dump(include={"build_configs_from", "triton_repo_from"}) == {
        "build_configs_from": "package", "triton_repo_from": "package"}
    (fake_install / "triton_repo").rmdir()
    assert shipped.triton_repo_dir() == fake_install.parent / "triton_repo"
    assert shipped.describe(Settings.from_env()).triton_repo_from == "checkout"


def test_a_missing_folder_is_named_where_an_installed_trtpipe_keeps_it(fake_install: Path) -> None:
    """Neither place has it: the reader's 'missing' error then names the package's path (what a wheel has)."""
    from trtpipe.errors import MissingCapability
    from trtpipe.toolchain import load_toolchains

    assert shipped.build_configs_dir(Settings.from_env()) == fake_install / "build_configs"
    with pytest.raises(MissingCapability, match=re.escape(str(fake_install / "build_configs" / "toolchains.yaml"))):
        load_toolchains()


def test_trtpipe_build_configs_overrides_the_shipped_folder(fake_install: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (fake_install / "build_configs").mkdir()
    mine = tmp_path / "my-configs"
    monkeypatch.setenv("TRTPIPE_BUILD_CONFIGS", str(mine))
    assert shipped.build_configs_dir(Settings.from_env()) == mine
    assert shipped.shipped_build_configs_dir() == fake_install / "build_configs"
    # A table reader handed no folder reads the shipped one: the override reaches it only through its caller.
    assert shipped.configs_dir(None) == fake_install / "build_configs"
    assert shipped.describe(Settings.from_env()).build_configs_from == "TRTPIPE_BUILD_CONFIGS"


def test_no_module_finds_shipped_data_on_its_own() -> None:
    """Path arithmetic from a module's location, or importlib.resources, outside trtpipe/shipped.py: a new reader
    that found build_configs/ or triton_repo/ 'beside the package' would work in a checkout and fail in a wheel."""
    pattern = re.compile(r'__file__|resources\.files\(|/ "(build_configs|triton_repo|data)"')
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "trtpipe").rglob("*.py")) if path.name != "shipped.py" or path.parent.name != "trtpipe"
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_resolve_and_the_build_plan_read_the_tables_of_the_folder_they_are_handed(tmp_path: Path) -> None:
    """The build_configs/ folder reaches every table a build reads through the resolved spec, not the
    environment: without the flag contract of the pinned trtllm-build, the copy's resolve fails naming it."""
    import shutil

    from trtpipe.engine.plan import make_build_plan
    from trtpipe.errors import IntegrityError
    from trtpipe.resolve import resolve
    from trtpipe.spec_loader import load_spec

    shipped_configs = shipped.shipped_build_configs_dir()
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {shipped_configs / 'models' / 'llama-3-8b' / 'config.json'}\n"
                    "target:\n  gpu: h100\ntoolchain: trtllm-1.2.1\n")
    configs = shutil.copytree(shipped_configs, tmp_path / "build_configs")
    resolved = resolve(load_spec(spec), need_weights=False, configs=configs)
    assert resolved.configs == configs and make_build_plan(resolved).configs == configs
    (configs / "trtllm_build_flags" / "trtllm-1.2.1.yaml").unlink()
    with pytest.raises(IntegrityError, match="no trtllm-build flag contract for toolchain 'trtllm-1.2.1'") as info:
        resolve(load_spec(spec), need_weights=False, configs=configs)
    assert info.value.path == str(configs / "trtllm_build_flags" / "trtllm-1.2.1.yaml")
    assert resolve(load_spec(spec), need_weights=False).configs == shipped_configs  # none given: the shipped one
