"""An engine built outside trtpipe (by hand with the pinned trtllm-build, or by NVIDIA's own scripts), checked
against a build spec before trtpipe stores and publishes it (`trtpipe publish SPEC --engine DIR`).

What trtllm-build leaves in its output folder, as read in TensorRT-LLM tensorrt_llm/builder.py (`Engine.save`,
`EngineConfig.to_dict`, `BuildConfig.to_dict`, `BuildConfig.update_kv_cache_type`) at commit 008b2b8d, the copy
rules.yaml's `builder-pre8329` source names (verified: false for the tags; the 1.2 line's copy was not read whole):
- `config.json` = {version, pretrained_config, build_config}; `build_config` holds the limits and `plugin_config`;
  `kv_cache_type` is written as the KVCacheType name ("PAGED", "CONTINUOUS", "DISABLED"), and
  `update_kv_cache_type` keeps `plugin_config.paged_kv_cache` in step with it.
- one `rank{N}.engine` per rank of `pretrained_config.mapping`; `rank{N}_managed_weights.safetensors` when the
  engine's weights are managed; `quant_cfg.json` for a mixed-precision checkpoint. Nothing in config.json names
  the GPU it was built on (the SM) after TRT-LLM PR #8329 removed the auto-parallel planner (the 1.2 line); the
  0.21-1.1 line records `build_config.auto_parallel_config.cluster_key` when auto parallel was used
  (tensorrt_llm/auto_parallel/config.py `infer_cluster_key()` at 66ca3378, verified: false), which is checked
  where present.
What the C++ runtime reads of it (cpp/tensorrt_llm/runtime/gptJsonConfig.cpp at b57221b7, verified: false):
`gpt_attention_plugin` null means no plugin, `remove_input_padding` a bool, and an engine config with a
`version` names its engine files `rank{N}.engine` (`GptJsonConfig::engineFilename`). In-flight batching, which
Triton's `tensorrt_llm` model always uses, refuses an engine without the GPT attention plugin, packed input or
a paged KV cache: the rule `inflight-batching-needs-paged-kv-packed-input-gpt-attention` of
build_configs/trtllm_build_flags/rules.yaml, cited from there in every refusal.

Every refusal is one line: `<file>: <field>: what is wrong; how to fix it` (EngineMismatch, exit 2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtpipe import quant
from trtpipe.engine.validate import _release
from trtpipe.errors import InvalidInput, NotFound
from trtpipe.trtllm_build.rules import load_rules

CONFIG = "config.json"
CONFIG_MAX_BYTES = 16 * 1024 * 1024  # an engine config is kilobytes; a mixed-precision one lists its layers
IFB_RULE = "inflight-batching-needs-paged-kv-packed-input-gpt-attention"
# The limits an engine is built with, each compared with the spec's plan (trtpipe.engine.plan LIMIT_KEYS).
LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens")
_RANK_FILE = re.compile(r"^rank(\d+)(\.engine|_managed_weights\.safetensors)$")
# What Engine.save writes beside the rank engines that the runtime reads (see the module doc).
EXTRA_ENGINE_FILES = ("quant_cfg.json",)


class EngineProblem(BaseModel):
    """One way the engine does not fit the spec: where (a file of the engine and a field in it) and the fix."""

    file: str
    field: str
    message: str
    fix: str

    def one_line(self) -> str:
        return f"{self.file}: {self.field}: {self.message}; {self.fix}"


class EngineMismatch(InvalidInput):
    """An engine built outside trtpipe does not fit the spec it is to be published for; `problems` lists every
    one (the line names the first)."""

    def __init__(self, problems: list[EngineProblem]) -> None:
        self.problems = list(problems)
        first = self.problems[0]
        self.file = first.file
        self.field = first.field
        more = ""
        if len(self.problems) > 1:
            others = ", ".join(p.field if p.field != "(file)" else Path(p.file).name for p in self.problems[1:4])
            others += ", ..." if len(self.problems) > 4 else ""
            more = f" ({len(self.problems) - 1} more: {others})"
        super().__init__(f"{first.file}: {first.field}: {first.message}", fix=first.fix + more)

    def verdicts(self) -> list[object] | None:
        """Every problem found, each with its file, field, message and fix (a JSON refusal's `verdicts`)."""
        return [problem.model_dump() for problem in self.problems]


class OutsideEngine(BaseModel):
    """An outside engine that fits its spec: which of its files are the engine, and what was found."""

    folder: str  # where it was read (the build record keeps it; never a key or a digest)
    files: list[str]  # the engine's files, imported into the store
    left_out: list[str]  # other entries of the folder, not part of the engine
    trtllm_version: str
    tp: int
    pp: int
    limits: dict[str, int]
    notes: list[str]  # what the check accepted that a reader should know (smaller limits, an unrecorded SM)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def cluster_key_of(product: str) -> str | None:
    """The auto-parallel cluster key TRT-LLM's `infer_cluster_key()` gives a GPU of this NVML name (the
    function's own rules, at 66ca3378), or None where it has none (it would fall back to A100-SXM-80GB)."""
    sxm, gb80, gb32 = "SXM" in product, "80GB" in product, "32GB" in product
    if "A100" in product:
        return ("A100-SXM-" if sxm else "A100-PCIe-") + ("80GB" if gb80 else "40GB")
    for name in ("A10G", "A10", "A30", "A40"):
        if name in product:
            return name
    if "H100" in product:
        return "H100-SXM" if sxm else "H100-PCIe"
    for name in ("L40S", "L40", "L4"):
        if name in product:
            return name
    if "V100S" in product:
        return "V100S-PCIe"
    if "V100" in product:
        return ("V100-SXM-" if sxm else "V100-PCIe-") + ("32GB" if gb32 else "16GB")
    return None


def _shown(value: Any) -> str:
    """A config.json value as the file writes it (null, true, "PAGED")."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """The engine folder's config.json as a JSON object, within bounds; one line naming the file otherwise."""
    engine_dir = Path(engine_dir)
    if not engine_dir.is_dir():
        raise NotFound(f"{engine_dir}: no such engine folder", what="engine", ref=str(engine_dir),
                       fix="give the folder trtllm-build wrote its engine to")
    path = engine_dir / CONFIG
    if not path.is_file():
        raise EngineMismatch([EngineProblem(file=str(path), field="(file)", message="missing: not an engine folder "
                                            "trtllm-build wrote", fix="give the folder trtllm-build wrote its engine "
                                            "to (config.json and rank{N}.engine)")])
    size = path.stat().st_size
    if size > CONFIG_MAX_BYTES:
        raise EngineMismatch([EngineProblem(file=str(path), field="(file)",
                                            message=f"{size} bytes, over the {CONFIG_MAX_BYTES} an engine config has",
                                            fix="give the config.json trtllm-build wrote")])
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise EngineMismatch([EngineProblem(file=str(path), field="(file)", message=f"not valid JSON ({err})",
                                            fix="give the config.json trtllm-build wrote")]) from None
    if not isinstance(config, dict):
        raise EngineMismatch([EngineProblem(file=str(path), field="(file)", message="not a JSON object",
                                            fix="give the config.json trtllm-build wrote")])
    return config


class _Checker:
    def __init__(self, engine_dir: Path, resolved: Any, plan: Any) -> None:
        self.dir = Path(engine_dir)
        self.config_file = str(self.dir / CONFIG)
        self.resolved = resolved
        self.plan = plan
        self.problems: list[EngineProblem] = []
        self.notes: list[str] = []

    def refuse(self, field: str, message: str, fix: str, *, file: str | None = None) -> None:
        self.problems.append(EngineProblem(file=file or self.config_file, field=field, message=message, fix=fix))

    @staticmethod
    def section(config: dict[str, Any], name: str) -> dict[str, Any]:
        value = config.get(name)
        return value if isinstance(value, dict) else {}

    # -- what built it, and from what ---------------------------------------------------------------------
    def version(self, config: dict[str, Any]) -> str:
        toolchain = self.resolved.toolchain
        version = config.get("version")
        if not isinstance(version, str) or not version:
            self.refuse("version", "missing: trtllm-build writes the TensorRT-LLM version that built the engine, "
                        "and the C++ runtime reads the rank files of an engine config by it",
                        f"give an engine trtllm-build {toolchain.trtllm_version} wrote")
            return ""
        if _release(version) != _release(toolchain.trtllm_version):
            self.refuse("version", f"TensorRT-LLM {version} built this engine, but the spec's toolchain "
                        f"{toolchain.name} is TensorRT-LLM {toolchain.trtllm_version} (an engine runs only under "
                        "the TensorRT-LLM and TensorRT that built it)",
                        f"build it with trtllm-build {toolchain.trtllm_version} (the toolchain's container "
                        f"{toolchain.triton_container}), or set the spec's toolchain to one of TensorRT-LLM {version}")
        return version

    def model(self, pretrained: dict[str, Any]) -> None:
        spec = self.resolved.spec
        archs = (self.resolved.model_config or {}).get("architectures") or []
        architecture = pretrained.get("architecture")
        if archs and architecture != archs[0]:
            self.refuse("pretrained_config.architecture",
                        f"{_shown(architecture)}, but the spec's model is a {archs[0]}",
                        "publish an engine of the spec's model, or point model.config at this model's config.json")
        dtype = pretrained.get("dtype")
        if dtype != self.resolved.weight_dtype:
            self.refuse("pretrained_config.dtype", f"{_shown(dtype)}, but the spec's model.dtype resolves to "
                        f"{self.resolved.weight_dtype}",
                        f"convert the checkpoint with dtype {self.resolved.weight_dtype}, or set model.dtype: {dtype}")
        quantization = self.section(pretrained, "quantization")
        fmt = quant.FORMATS[spec.quantization.algo]
        found = quantization.get("quant_algo")
        if found != fmt.checkpoint_algo:
            named = quant.by_checkpoint_algo(found)
            self.refuse("pretrained_config.quantization.quant_algo",
                        f"{_shown(found)}, but the spec's quantization.algo {fmt.name} is "
                        f"{_shown(fmt.checkpoint_algo)}",
                        f"quantize the checkpoint as quantization.algo {fmt.name}, or set quantization.algo: "
                        f"{named.name if named else found}")
        elif fmt.grouped and quantization.get("group_size") != spec.quantization.group_size:
            self.refuse("pretrained_config.quantization.group_size",
                        f"{_shown(quantization.get('group_size'))}, but the spec's quantization.group_size is "
                        f"{spec.quantization.group_size}",
                        f"quantize with group size {spec.quantization.group_size}, or set quantization.group_size: "
                        f"{quantization.get('group_size')}")
        kv = quant.KV_CACHES[spec.quantization.kv_cache]
        found_kv = quantization.get("kv_cache_quant_algo")
        if found_kv != kv.checkpoint_algo:
            named_kv = quant.kv_by_checkpoint_algo(found_kv)
            self.refuse("pretrained_config.quantization.kv_cache_quant_algo",
                        f"{_shown(found_kv)}, but the spec's quantization.kv_cache {kv.name} is "
                        f"{_shown(kv.checkpoint_algo)}",
                        f"quantize the KV cache as quantization.kv_cache {kv.name}, or set quantization.kv_cache: "
                        f"{named_kv.name if named_kv else 'auto'}")

    def mapping(self, pretrained: dict[str, Any]) -> tuple[int, int]:
        target = self.resolved.spec.target
        mapping = self.section(pretrained, "mapping")
        sizes: dict[str, int] = {}
        for key, wanted, spec_field in (("tp_size", target.tp, "target.tp"), ("pp_size", target.pp, "target.pp")):
            value = mapping.get(key, 1)
            if not _is_int(value) or value < 1:
                self.refuse(f"pretrained_config.mapping.{key}", f"{_shown(value)} is not a whole number of GPUs",
                            "give the config.json trtllm-build wrote")
                value = wanted
            elif value != wanted:
                self.refuse(f"pretrained_config.mapping.{key}", f"{value}, but the spec's {spec_field} is {wanted}",
                            f"convert the checkpoint for {key.split('_')[0]} {wanted} and build it again, or set "
                            f"{spec_field}: {value}")
            sizes[key] = value
        world = mapping.get("world_size", sizes["tp_size"] * sizes["pp_size"])
        if world != sizes["tp_size"] * sizes["pp_size"]:
            self.refuse("pretrained_config.mapping.world_size",
                        f"{_shown(world)}, but tp_size x pp_size is {sizes['tp_size'] * sizes['pp_size']}",
                        "give the config.json trtllm-build wrote")
        return sizes["tp_size"], sizes["pp_size"]

    # -- the build ------------------------------------------------------------------------------------------
    def limits(self, build: dict[str, Any]) -> dict[str, int]:
        spec = self.resolved.spec
        found: dict[str, int] = {}
        for key in LIMITS:
            value = build.get(key)
            planned = self.plan.limits.get(key)
            if not _is_int(value) or value < 1:
                self.refuse(f"build_config.{key}", f"{_shown(value)} is not a positive whole number",
                            f"give the config.json trtllm-build wrote (it writes every limit), or rebuild with "
                            f"--{key} {planned}")
                continue
            found[key] = value
            given = getattr(spec.limits, key, None)
            what = f"limits.{key} {planned}" if given is not None else \
                f"plan's {key} {planned} (the {spec.limits.profile.value} profile's, limits.{key} unset)"
            if planned is not None and value > planned:
                # The spec's memory plan and serving limits were made for its own limits: an engine that can hold
                # more than the plan sized for is not the artifact the spec describes.
                self.refuse(f"build_config.{key}", f"{value} is over the spec's {what}",
                            f"rebuild with --{key} {planned}, or set limits.{key}: {value} in the spec (its memory "
                            "plan then covers it)")
            elif planned is not None and value < planned:
                self.notes.append(f"build_config.{key} {value} is below the spec's {planned}: the repository serves "
                                  f"the engine's {value}")
        return found

    def inflight_batching(self, build: dict[str, Any]) -> None:
        table = load_rules(configs=self.resolved.configs)
        rule = next((r for r in table.rules if r.id == IFB_RULE), None)
        toolchain = self.resolved.toolchain.name
        cited = f"rules.yaml {IFB_RULE}: {table.citation(rule, toolchain)}" if rule is not None else IFB_RULE
        plugins = self.section(build, "plugin_config")
        gpt = plugins.get("gpt_attention_plugin")
        if gpt is None or gpt is False or gpt == "disable":
            self.refuse("build_config.plugin_config.gpt_attention_plugin",
                        f"{_shown(gpt)}: the engine has no GPT attention plugin, which Triton's in-flight batching "
                        f"needs ({cited})", "rebuild with --gpt_attention_plugin auto")
        if plugins.get("remove_input_padding") is not True:
            self.refuse("build_config.plugin_config.remove_input_padding",
                        f"{_shown(plugins.get('remove_input_padding'))}: the engine takes padded input, and Triton's "
                        f"in-flight batching needs packed input ({cited})",
                        "rebuild with --remove_input_padding enable")
        kv_type = build.get("kv_cache_type")
        if kv_type is not None:
            if str(kv_type).upper() != "PAGED":
                self.refuse("build_config.kv_cache_type", f"{_shown(kv_type)}: the KV cache is not paged, and "
                            f"Triton's in-flight batching needs a paged KV cache ({cited})",
                            "rebuild with --kv_cache_type paged")
        elif plugins.get("paged_kv_cache") is not True:
            self.refuse("build_config.plugin_config.paged_kv_cache",
                        f"{_shown(plugins.get('paged_kv_cache'))} (and no build_config.kv_cache_type): the KV cache "
                        f"is not paged, and Triton's in-flight batching needs a paged KV cache ({cited})",
                        "rebuild with --kv_cache_type paged")

    def gpu(self, build: dict[str, Any]) -> None:
        resolved = self.resolved
        gpu = resolved.gpu
        recorded = self.section(build, "auto_parallel_config").get("cluster_key")
        if isinstance(recorded, str) and recorded and gpu is not None:
            expected = cluster_key_of(gpu.product)
            if expected is not None and recorded != expected:
                self.refuse("build_config.auto_parallel_config.cluster_key",
                            f"{_shown(recorded)}: the engine was planned for another GPU than the spec's target "
                            f"{resolved.spec.target.gpu} ({expected}); an engine runs on the SM it was built for",
                            f"build it on a {resolved.spec.target.gpu}, or set target.gpu to the GPU it was built on")
            return
        self.notes.append(f"config.json records no GPU (trtllm-build {resolved.toolchain.trtllm_version} writes none): "
                          f"the engine is taken to be built on the spec's {resolved.spec.target.gpu} "
                          f"(SM{resolved.sm}), which it must run on")

    def rank_files(self, world: int) -> tuple[list[str], list[str]]:
        """(the engine's files, the folder's other entries)."""
        engine, left_out = [CONFIG], []
        for entry in sorted(self.dir.iterdir(), key=lambda p: p.name):
            name = entry.name
            if name == CONFIG:
                continue
            match = _RANK_FILE.match(name)
            if match is not None and int(match.group(1)) >= world:
                self.refuse("(file)", f"rank {match.group(1)} is beyond the engine's world size {world} "
                            f"(ranks 0 to {world - 1}): not a file of this engine",
                            "remove it, or give the folder of the engine it belongs to", file=str(entry))
            elif (match is not None or name in EXTRA_ENGINE_FILES) and entry.is_file():
                engine.append(name)
            else:
                left_out.append(name + ("/" if entry.is_dir() else ""))
        for rank in range(world):
            name = f"rank{rank}.engine"
            path = self.dir / name
            if not path.is_file():
                self.refuse("(file)", f"missing: the engine's mapping has world size {world}, one rank{{N}}.engine "
                            f"per rank (0 to {world - 1})",
                            "copy every rank{N}.engine trtllm-build wrote into the folder, or build it again",
                            file=str(path))
            elif path.stat().st_size == 0:
                self.refuse("(file)", "empty: a TensorRT engine is never 0 bytes",
                            "copy the rank file again from where trtllm-build wrote it, or build it again",
                            file=str(path))
        if left_out:
            self.notes.append(f"not part of the engine, left out: {', '.join(left_out)}")
        return sorted(engine), left_out


def check_outside_engine(engine_dir: Path, resolved: Any, plan: Any) -> OutsideEngine:
    """Check the engine folder `engine_dir` (trtllm-build's output, made outside trtpipe) against the resolved
    spec and its build plan (trtpipe.engine.plan.BuildPlan); EngineMismatch names every misfit (module doc)."""
    engine_dir = Path(engine_dir).resolve()
    config = read_engine_config(engine_dir)
    checker = _Checker(engine_dir, resolved, plan)
    if config.get("trtpipe_reference"):
        checker.refuse("trtpipe_reference", "this is trtpipe's CPU reference engine, not a TensorRT engine",
                       "give the folder trtllm-build wrote")
        raise EngineMismatch(checker.problems)
    pretrained, build = checker.section(config, "pretrained_config"), checker.section(config, "build_config")
    for name, section in (("pretrained_config", pretrained), ("build_config", build)):
        if not section:
            checker.refuse(name, "missing: trtllm-build writes it into every engine config",
                           "give the config.json trtllm-build wrote")
    if checker.problems:
        raise EngineMismatch(checker.problems)
    version = checker.version(config)
    checker.model(pretrained)
    tp, pp = checker.mapping(pretrained)
    limits = checker.limits(build)
    checker.inflight_batching(build)
    checker.gpu(build)
    files, left_out = checker.rank_files(tp * pp)
    if checker.problems:
        raise EngineMismatch(checker.problems)
    return OutsideEngine(folder=str(engine_dir), files=files, left_out=left_out, trtllm_version=version, tp=tp, pp=pp,
                         limits=limits, notes=checker.notes)
