"""The package's own import graph: no cycle between its packages, and no lower layer importing a higher one.

Read from the source with `ast` (every `import trtpipe.x` / `from trtpipe.x import ...`, at module level or
inside a function: a lazy import is a dependency too). A unit is a top-level module (trtpipe/resolve.py)
or package (trtpipe/serving/). Layers, low -> high; a unit may import its own layer and the ones below:

    0  errors, settings, atomic, versions, names, datafiles,    what everything may use (disk: telling a
       hostfacts, disk, shipped, signing_keys, small_file       full disk from other failures; shipped: where
                                                                the shipped data is; signing_keys: the release
                                                                key, which signs log heads and artifacts;
                                                                small_file: reading a key or policy file)
    1  toolchain, gpu, quant, spec, spec_loader, trtllm_build,  the tables and the spec (trtllm_build: the
       config_json, model_folder, llm_api, installation,        trtllm-build backend's flag and rule tables;
       model_semantics, spec_schema, backend_options,           config_json: a model config's bounds;
       spec_shape, release.gate_models                          backend_options: each backend's spec section;
                                                                spec_shape: the spec's earlier shape, upgraded;
                                                                model_folder: confinement, tokenizer check;
                                                                llm_api: the LLM-API backend's TorchLlmArgs;
                                                                installation: what --version reports;
                                                                model_semantics: what a config's fields compute;
                                                                spec_schema: the spec's JSON Schema;
                                                                release.gate_models: the release gates the spec's
                                                                `release:` section declares, a unit of its own)
    2  resolve, plan, hostcheck, migrate                        every rule, the memory plan, the host check, the
                                                                trtllm-build -> llm-api migration report
    3  store, results, build_record, build_report, stage_plan,  where artifacts, results, records and build
       workspace                                                reports live; the stage plan every build walks;
                                                                the workspace (root, settings, store, remote,
                                                                results), the first argument of the release
                                                                area's entry points
    4  checkpoint, engine, reference, serving                   what the stages call, and serving their output
    5  stages, pipeline, runner, shared_cache, warm,            the declared stages, the build (resolve ->
       run_hooks, run_record, run_report, dry_run,              plan), the runner that executes a plan, the
       stage_build, stage_leases, input_check,                  remote cache as a build uses it, the warm
       integrity_watch, pulled_trust                            path that reuses a build's resolution, and
                                                                the runner's parts: its hooks (printer,
                                                                record), its report, the dry run, one
                                                                stage's build, its leases, its input and
                                                                integrity checks, the trust gate as it
                                                                judges pulled entries
    6  bench, release, repair, matrix, build_session,           what works on built and served artifacts, the
       serve_session                                            matrix, which runs the runner on Ray workers,
                                                                a build as the CLI asks for it (trust, memo),
                                                                and a serve as the CLI asks for it (the trust
                                                                check over the folder, then serving's watch)
    7  commands, cli                                            the shell

So serving never imports the stages or the runner, the store never imports a stage, and resolve reads
the trtllm-build rule tables from below instead of from the engine. serving sits beside the stage
implementations (not above the runner, as issue 13's first sketch had it): the publish stage calls its
repository writer, and serving itself imports only lower layers (the reference runtime, results, store).

A module named in SUBUNITS is a unit of its own, apart from its package: `release.gate_models` holds the gate
models the spec embeds, so the spec (layer 1) imports it without importing the release area (layer 6).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtpipe"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "settings", "atomic", "versions", "names", "datafiles", "hostfacts", "disk", "chained", "shipped",
     "signing_keys", "small_file"),
    ("toolchain", "gpu", "quant", "spec", "spec_loader", "trtllm_build", "config_json", "model_folder", "llm_api",
     "installation", "model_semantics", "spec_schema", "backend_options", "spec_shape", "release.gate_models"),
    ("resolve", "plan", "hostcheck", "migrate"),
    ("store", "results", "build_record", "build_report", "stage_plan", "workspace"),
    ("checkpoint", "engine", "reference", "serving"),
    ("stages", "pipeline", "runner", "shared_cache", "warm", "run_hooks", "run_record", "run_report", "dry_run",
     "stage_build", "stage_leases", "input_check", "integrity_watch", "pulled_trust"),
    ("bench", "release", "repair", "matrix", "build_session", "serve_session"),
    ("commands", "cli"),
)
LAYER = {unit: index for index, units in enumerate(LAYERS) for unit in units}
# Modules that are units of their own, apart from their package (see the docstring).
SUBUNITS = ("release.gate_models",)


def _unit(module: str) -> str | None:
    """`trtpipe.serving.smoke` -> `serving`, `trtpipe.release.gate_models` -> `release.gate_models`; None for the
    package itself."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "trtpipe":
        return None
    dotted = ".".join(parts[1:])
    return next((sub for sub in SUBUNITS if dotted == sub or dotted.startswith(sub + ".")), parts[1])


def _source_unit(path: Path, package: Path) -> str:
    parts = path.relative_to(package).with_suffix("").parts
    return _unit(".".join(("trtpipe", *parts))) or parts[0]


def imports(package: Path = PACKAGE) -> dict[str, set[tuple[str, str]]]:
    """unit -> {(imported unit, 'file:line')} over every trtpipe import in the package."""
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == "__init__.py":
            continue
        source = _source_unit(path, package)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from trtpipe import quant` imports the unit `quant`; `from trtpipe.release import gate_models`
                # the unit `release.gate_models`
                modules = [f"{node.module}.{alias.name}"
                           if node.module == "trtpipe" or _unit(f"{node.module}.{alias.name}") in SUBUNITS
                           else node.module for alias in node.names]
            else:
                continue
            for module in modules:
                target = _unit(module)
                if target is not None and target != source and target != "__version__":
                    found[source].add((target, f"{rel}:{node.lineno}"))
    return found


def upward_imports(package: Path = PACKAGE) -> list[str]:
    return [f"{where}: {source} (layer {LAYER[source]}) imports {target} (layer {LAYER[target]})"
            for source, edges in imports(package).items() for target, where in sorted(edges)
            if LAYER[target] > LAYER[source]]


def cycles(package: Path = PACKAGE) -> list[list[str]]:
    graph = {source: {target for target, _ in edges} for source, edges in imports(package).items()}
    found: list[list[str]] = []

    def visit(unit: str, path: list[str], done: set[str]) -> None:
        for nxt in sorted(graph.get(unit, ())):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt], done)
        done.add(unit)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start], done)
    return found


def test_every_unit_has_a_layer() -> None:
    units = {_source_unit(p, PACKAGE) for p in PACKAGE.rglob("*.py")
             if p.relative_to(PACKAGE).as_posix() != "__init__.py"}
    units |= {target for edges in imports().values() for target, _ in edges}
    assert sorted(units - set(LAYER)) == [], "place each new module or package in LAYERS (and the docstring)"


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert upward_imports() == []


def test_no_cycle_between_packages() -> None:
    assert cycles() == []


def test_the_checks_catch_a_lazy_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """A package where resolve imports the engine inside a function (the import issue 13 removed) and the
    engine imports resolve back: both checks fail on it."""
    package = tmp_path / "trtpipe"
    (package / "engine").mkdir(parents=True)
    (package / "resolve.py").write_text("def rules():\n    from trtpipe.engine.rules import simulate\n")
    (package / "engine" / "rules.py").write_text("from trtpipe import resolve\n")
    assert upward_imports(package) == ["resolve.py:2: resolve (layer 2) imports engine (layer 4)"]
    assert cycles(package) == [["engine", "resolve", "engine"]]


def test_the_gate_models_are_a_unit_below_the_spec(tmp_path: Path) -> None:
    """The spec imports the release area's gate models, not the release area: a spec that imports the gates' judge,
    or gate models that import the release area back, are upward imports; the gate models themselves are not."""
    package = tmp_path / "trtpipe"
    (package / "release").mkdir(parents=True)
    (package / "spec.py").write_text("from trtpipe.release.gate_models import ReleaseSection\n"
                                     "from trtpipe.release import gate_models\n"
                                     "def judge():\n    from trtpipe.release.gates import evaluate_gates\n")
    (package / "release" / "gate_models.py").write_text("from trtpipe.release import promote\n")
    (package / "release" / "gates.py").write_text("from trtpipe.release.gate_models import ChannelGates\n")
    assert upward_imports(package) == [
        "release/gate_models.py:1: release.gate_models (layer 1) imports release (layer 6)",
        "spec.py:4: spec (layer 1) imports release (layer 6)",
    ]
    assert {target for target, _ in imports(package)["release"]} == {"release.gate_models"}


# --------------------------------------------------------------------------- layouts are looked up, not named
# Issue 24: a repository layout is a unit (trtpipe.serving.layouts: its writer, templates, recognition, validation,
# served tokenizer, container processes; its request contract and upstream's client patterns in
# trtpipe.serving.client.REQUEST_CONTRACTS). These modules ask the registry and use what it returns; none names a
# layout. (The store's weight-size rule is handed the layouts' and stages' own `weight_files`: trtpipe.stages.)
LAYOUT_NEUTRAL = ("serving/smoke.py", "serving/server.py", "serving/container.py", "serving/validate.py",
                  "serving/templates.py", "serving/client_patterns.py", "bench/__init__.py", "bench/loadgen.py",
                  "bench/counting.py", "commands/bench.py", "stages/publish.py", "store", "serve_session.py")


def _modules(rel: str) -> list[Path]:
    path = PACKAGE / rel
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]
LAYOUT_NAMES = {"inflight_batcher_llm", "llmapi"}
LAYOUT_CONSTANTS = {"INFLIGHT", "INFLIGHT_BATCHER_LLM", "LLMAPI"}


def layout_mentions(path: Path) -> list[str]:
    """Where a module's code names a layout: a string equal to a layout's name, or a layout-name constant."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value in LAYOUT_NAMES:
            found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Name) and node.id in LAYOUT_CONSTANTS:
            found.append(f"{path.name}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.alias) and node.name in LAYOUT_CONSTANTS:
            found.append(f"{path.name}: imports {node.name}")
    return found


def test_the_layout_neutral_modules_name_no_layout(tmp_path: Path) -> None:
    assert [m for rel in LAYOUT_NEUTRAL for path in _modules(rel) for m in layout_mentions(path)] == []
    # The check sees both ways of naming one.
    probe = tmp_path / "probe.py"
    probe.write_text('from trtpipe.serving.client import LLMAPI\nif contract == "llmapi" or contract == LLMAPI:\n    pass\n')
    assert layout_mentions(probe) == ["probe.py: imports LLMAPI", "probe.py:2: 'llmapi'", "probe.py:2: LLMAPI"]


# --------------------------------------------------------------------------- backends are looked up, not named
# Issue 24: a backend is a type (trtpipe.toolchain: its class and its BackendFacts; trtpipe.stages builds its plan
# and stages from those facts). The spec, resolve, the stages, the runner, the memo, parity, serving, bench, the
# store, release and the matrix ask the registry; none names a backend. Its own files (toolchain, trtllm_build/,
# engine/, llm_api/, migrate, the llmapi layout's writer) and the CLI may (model_semantics is keyed by runtime).
BACKEND_NAMES = {"trtllm-build", "llm-api", "reference"}
BACKEND_NEUTRAL = ("spec.py", "resolve.py", "hostcheck.py", "stages", "pipeline.py", "runner.py", "run_hooks.py",
                   "run_record.py", "run_report.py", "dry_run.py", "stage_build.py", "stage_leases.py",
                   "input_check.py", "integrity_watch.py", "pulled_trust.py", "shared_cache.py", "build_session.py",
                   "serve_session.py", "stage_plan.py", "warm.py", "checkpoint/afresh.py", "bench", "store",
                   "release", "matrix")


def backend_mentions(path: Path) -> list[str]:
    """Where a module's code compares a value with a backend's name (`x == "llm-api"`, `x != "reference"`,
    `x in ("trtllm-build", ...)`) or returns one: the ways code branches on which backend it holds."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        values: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        elif isinstance(node, ast.Return) and node.value is not None:
            values = [node.value]
        elif isinstance(node, ast.IfExp):
            values = [node.body, node.orelse]
        for value in values:
            for leaf in ast.walk(value):
                if isinstance(leaf, ast.Constant) and leaf.value in BACKEND_NAMES:
                    found.append(f"{path.name}:{leaf.lineno}: {leaf.value!r}")
    return sorted(set(found))


def test_the_backend_neutral_modules_name_no_backend(tmp_path: Path) -> None:
    assert [m for rel in BACKEND_NEUTRAL for path in _modules(rel) for m in backend_mentions(path)] == []
    probe = tmp_path / "probe.py"
    probe.write_text('def f(kind):\n    if kind == "llm-api":\n        return None\n'
                     '    return "reference" if kind else "trtllm-build"\n')
    assert backend_mentions(probe) == ["probe.py:2: 'llm-api'", "probe.py:4: 'reference'", "probe.py:4: 'trtllm-build'"]
