"""Validate a published Triton model repository before any server sees it.

Two layouts (trtpipe.serving.layouts, chosen by the manifest's `layout`): inflight_batcher_llm (the checks
below, `check_inflight_batcher`) and llmapi (trtpipe.serving.llmapi_validate).

Every config.pbtxt is parsed with Triton's own schema (tritonclient's model_config_pb2 and
protobuf text_format). Each issue names the model, the field and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from google.protobuf import text_format
from pydantic import BaseModel
from tritonclient.grpc import model_config_pb2 as mc

from trtpipe.serving.layouts import layout_of
from trtpipe.serving.templates import MANIFEST_NAME, MODEL_NAMES, PLACEHOLDER
PYTHON_MODELS_ALWAYS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")


class ValidationIssue(BaseModel):
    model: str
    field: str
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"

    def one_line(self) -> str:
        return f"{self.model}: {self.field}: {self.message}; {self.fix}"


class _Checker:
    def __init__(self, repo: Path, configs: Path | None = None) -> None:
        self.repo = repo
        self.configs_dir = configs  # the build_configs/ folder the tables are read from (None: the shipped one)
        self.issues: list[ValidationIssue] = []
        self.configs: dict[str, mc.ModelConfig] = {}
        self.manifest: dict[str, Any] | None = None
        self._tokenizers_seen: dict[tuple[int, int, int, int], str | None] = {}  # tokenizer.json -> its problem
        self.flagged_parameters: set[str] = set()  # tensorrt_llm keys the parameter table already reported

    def add(self, model: str, field: str, message: str, fix: str, severity: str = "error") -> None:
        self.issues.append(ValidationIssue(model=model, field=field, message=message, fix=fix, severity=severity))

    # --- parsing --------------------------------------------------------------------------
    def load_manifest(self) -> None:
        path = self.repo / MANIFEST_NAME
        if not path.is_file():
            self.add(MANIFEST_NAME, "file", "the repository has no trtpipe.json manifest",
                     "publish the repository with trtpipe (build or publish)")
            return
        try:
            self.manifest = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            self.add(MANIFEST_NAME, "file", f"not valid JSON ({err})", "publish the repository again")

    def load_configs(self) -> None:
        for name in MODEL_NAMES:
            path = self.repo / name / "config.pbtxt"
            if not path.is_file():
                self.add(name, "config.pbtxt", f"{path} is missing", "publish the repository again")
                continue
            text = path.read_text()
            unfilled = False
            for lineno, line in enumerate(text.splitlines(), start=1):
                for match in PLACEHOLDER.finditer(line):
                    unfilled = True
                    self.add(name, f"config.pbtxt:{lineno}", f"unfilled template variable {match.group(0)}",
                             "publish from the spec (every template variable is filled there); never hand-edit templates")
            config = mc.ModelConfig()
            try:
                text_format.Parse(text, config)
            except text_format.ParseError as err:
                if not unfilled:
                    self.add(name, f"config.pbtxt:{err.GetLine()}:{err.GetColumn()}", f"syntax error: {err}",
                             "fix the config.pbtxt syntax (Triton's protobuf text format) or publish again")
                continue
            if config.name and config.name != name:
                self.add(name, "name", f"config name {config.name!r} differs from its folder {name!r}",
                         f'set name: "{name}"')
            self.configs[name] = config

    # --- checks ---------------------------------------------------------------------------
    @staticmethod
    def param(config: mc.ModelConfig, key: str) -> str | None:
        if key in config.parameters:
            return config.parameters[key].string_value
        return None

    @staticmethod
    def dims_compatible(a: list[int], b: list[int]) -> bool:
        return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))

    def check_ensemble(self) -> None:
        ens = self.configs.get("ensemble")
        if ens is None:
            return
        dtype_name = mc.DataType.Name
        # Tensor name -> (dtype, dims, where it comes from)
        available: dict[str, tuple[int, list[int], str]] = {
            t.name: (t.data_type, list(t.dims), "ensemble input") for t in ens.input
        }
        for index, step in enumerate(ens.ensemble_scheduling.step):
            where = f"ensemble_scheduling.step[{index}] ({step.model_name})"
            model = self.configs.get(step.model_name)
            if model is None:
                if step.model_name not in MODEL_NAMES:
                    self.add("ensemble", where, f"step names an unknown model {step.model_name!r}",
                             f"use one of {', '.join(MODEL_NAMES)}")
                continue
            inputs = {t.name: t for t in model.input}
            outputs = {t.name: t for t in model.output}
            for key, value in step.input_map.items():
                if key not in inputs:
                    self.add("ensemble", f"{where}.input_map[{key}]",
                             f"{step.model_name} has no input {key!r}", f"map only inputs declared in {step.model_name}/config.pbtxt")
                    continue
                if value not in available:
                    self.add("ensemble", f"{where}.input_map[{key}]",
                             f"tensor {value!r} is neither an ensemble input nor an earlier step's output",
                             "map it from an ensemble input or an output_map of an earlier step")
                    continue
                dtype, dims, source = available[value]
                target = inputs[key]
                if dtype != target.data_type:
                    self.add("ensemble", f"{where}.input_map[{key}]",
                             f"dtype mismatch: {value!r} is {dtype_name(dtype)} ({source}) but {step.model_name}.{key} "
                             f"is {dtype_name(target.data_type)}",
                             f"make both {dtype_name(target.data_type)}")
                elif not self.dims_compatible(dims, list(target.dims)):
                    self.add("ensemble", f"{where}.input_map[{key}]",
                             f"dims mismatch: {value!r} has {dims} ({source}) but {step.model_name}.{key} has {list(target.dims)}",
                             "make the dims agree (same rank; -1 for variable)")
            mapped = set(step.input_map.keys())
            for name, tensor in inputs.items():
                if not tensor.optional and name not in mapped:
                    self.add("ensemble", where, f"required input {step.model_name}.{name} is not mapped",
                             f"add input_map {{ key: \"{name}\" value: ... }}")
            for key, value in step.output_map.items():
                if key not in outputs:
                    self.add("ensemble", f"{where}.output_map[{key}]", f"{step.model_name} has no output {key!r}",
                             f"map only outputs declared in {step.model_name}/config.pbtxt")
                    continue
                available[value] = (outputs[key].data_type, list(outputs[key].dims), f"{step.model_name}.{key}")
            if model.max_batch_size < ens.max_batch_size:
                self.add("ensemble", "max_batch_size",
                         f"ensemble max_batch_size {ens.max_batch_size} exceeds {step.model_name}'s {model.max_batch_size}",
                         f"lower the ensemble's max_batch_size to {model.max_batch_size}")
        consumed = {value: step.model_name for step in ens.ensemble_scheduling.step for value in step.input_map.values()}
        for out in ens.output:
            if out.name in consumed:
                # Measured on Triton 2.51: a request for a subset of outputs that leaves such a tensor out gets no
                # answer (decoupled) or "unexpected deadlock" (not decoupled); upstream's ensemble routes the token ids
                # through internal tensors (_TOKENS_BATCH), so every subset works.
                self.add("ensemble", f"output[{out.name}]",
                         f"is also an input of step {consumed[out.name]} (wired so, the token ids left a request for "
                         "text_output alone with no answer)",
                         f"map the step's output to an internal tensor (_{out.name}) for the next step, as upstream does")
            if out.name not in available or available[out.name][2] == "ensemble input":
                self.add("ensemble", f"output[{out.name}]", "no step produces this ensemble output",
                         "add an output_map that produces it, or remove the output")
                continue
            dtype, dims, source = available[out.name]
            if dtype != out.data_type:
                self.add("ensemble", f"output[{out.name}]",
                         f"dtype mismatch: {source} is {dtype_name(dtype)} but the ensemble output is {dtype_name(out.data_type)}",
                         f"make both {dtype_name(dtype)}")

    def check_transaction_policy(self) -> None:
        llm = self.configs.get("tensorrt_llm")
        bls = self.configs.get("tensorrt_llm_bls")
        if llm is not None and self.manifest is not None:
            streaming = bool(self.manifest.get("streaming"))
            decoupled = llm.model_transaction_policy.decoupled
            if streaming and not decoupled:
                self.add("tensorrt_llm", "model_transaction_policy.decoupled",
                         "streaming is enabled (runtime.streaming) but the model is not decoupled; "
                         "TensorRT-LLM refuses streaming requests outside decoupled mode",
                         "set model_transaction_policy { decoupled: true } (publish again with runtime.streaming: true)")
            elif decoupled and not streaming:
                self.add("tensorrt_llm", "model_transaction_policy.decoupled",
                         "the model is decoupled but the manifest says runtime.streaming is false",
                         "publish again so the config and manifest agree")
        if bls is not None and llm is not None and \
                bls.model_transaction_policy.decoupled != llm.model_transaction_policy.decoupled:
            # Upstream's BLS follows the deployment (decoupled: ${decoupled_mode}, like tensorrt_llm): a decoupled BLS
            # on a non-streaming deployment refuses every unary /infer (HTTP 501), a non-decoupled one cannot stream.
            want = "true" if llm.model_transaction_policy.decoupled else "false"
            self.add("tensorrt_llm_bls", "model_transaction_policy.decoupled",
                     f"is {str(bls.model_transaction_policy.decoupled).lower()} but tensorrt_llm's is {want}",
                     f"set model_transaction_policy {{ decoupled: {want} }} (publish again)")
        if bls is not None and llm is not None:
            declared = self.param(bls, "tensorrt_llm_decoupled")
            actual = "true" if llm.model_transaction_policy.decoupled else "false"
            if declared is not None and declared != actual:
                self.add("tensorrt_llm_bls", "parameters.tensorrt_llm_decoupled",
                         f"says {declared} but tensorrt_llm is decoupled={actual}", f'set it to "{actual}"')

    def engine_limits(self) -> dict[str, Any]:
        limits: dict[str, Any] = dict((self.manifest or {}).get("engine") or {})
        config_path = self.repo / "tensorrt_llm" / "1" / "config.json"
        if config_path.is_file():
            try:
                engine_config = json.loads(config_path.read_text())
                build = engine_config.get("build_config") or {}
                mapping = (engine_config.get("pretrained_config") or {}).get("mapping") or {}
                for key in ("max_batch_size", "max_input_len", "max_seq_len"):
                    if key in build:
                        limits[key] = int(build[key])
                limits["world_size"] = int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
                limits["engine_version"] = engine_config.get("version")
                limits["reference_engine"] = bool(engine_config.get("trtpipe_reference", False))
                limits["logits_dtype"] = (engine_config.get("pretrained_config") or {}).get("logits_dtype")
                # What trtllm-build records of the features the backend's cross-key rules need (absent: unknown).
                plugins = build.get("plugin_config") or {}
                if "use_paged_context_fmha" in plugins:
                    limits["paged_context_fmha"] = bool(plugins["use_paged_context_fmha"])
                if "kv_cache_type" in build:
                    limits["paged_kv_cache"] = str(build["kv_cache_type"]).upper() == "PAGED"
                elif "paged_kv_cache" in plugins:
                    limits["paged_kv_cache"] = bool(plugins["paged_kv_cache"])
            except (json.JSONDecodeError, ValueError, TypeError) as err:
                self.add("tensorrt_llm", "1/config.json", f"engine config is unreadable ({err})", "publish again")
        else:
            self.add("tensorrt_llm", "1/config.json", "the engine's config.json is missing from tensorrt_llm/1",
                     "publish again (the engine files are linked into tensorrt_llm/1)")
        return limits

    def check_batch_sizes(self, limits: dict[str, Any]) -> None:
        engine_batch = limits.get("max_batch_size")
        if engine_batch is None:
            return
        for name, config in self.configs.items():
            if config.max_batch_size > engine_batch:
                self.add(name, "max_batch_size",
                         f"{config.max_batch_size} exceeds the engine's max_batch_size {engine_batch}",
                         f"set backend.triton.max_batch_size <= {engine_batch} and publish again")

    def check_semantics(self) -> None:
        """What the model computes and its checkpoint does not carry (trtpipe.model_semantics), as the manifest
        recorded it at publish: the attention window tensorrt_llm is given, the vocabulary preprocessing bans past."""
        engine = (self.manifest or {}).get("engine") or {}
        wanted = {
            ("tensorrt_llm", "max_attention_window_size"): engine.get("max_attention_window_size"),
            ("preprocessing", "vocab_size"): engine.get("vocab_size"),
            ("preprocessing", "padded_vocab_size"): engine.get("padded_vocab_size"),
        }
        for (model, key), value in wanted.items():
            config = self.configs.get(model)
            if value is None or config is None:
                continue  # published before trtpipe recorded it
            written = self.param(config, key)
            if written != str(value):
                self.add(model, f"parameters.{key}",
                         f"is {written!r} but the engine's is {str(value)!r} (trtpipe.json engine.{key}): the served "
                         "model would not compute what the model does",
                         f'set it to "{value}" (publish the repository again)')

    def check_target(self, limits: dict[str, Any]) -> None:
        if self.manifest is None:
            return
        reference = bool(self.manifest.get("reference"))
        llm = self.configs.get("tensorrt_llm")
        for name, config in self.configs.items():
            if reference:
                for i, group in enumerate(config.instance_group):
                    if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                        self.add(name, f"instance_group[{i}].kind",
                                 "KIND_GPU on the cpu-reference target (no GPU: the model would fail to load)",
                                 "use kind: KIND_CPU")
            if name in PYTHON_MODELS_ALWAYS or (name == "tensorrt_llm" and reference):
                if config.backend != "python":
                    self.add(name, "backend", f"backend {config.backend!r}; this model is a Python-backend model",
                             'set backend: "python"')
                elif not (self.repo / name / "1" / "model.py").is_file():
                    self.add(name, "1/model.py", "the Python model code is missing", "publish again")
        if llm is not None and not reference and llm.backend != "tensorrtllm":
            self.add("tensorrt_llm", "backend", f"backend {llm.backend!r} on a GPU target",
                     'set backend: "tensorrtllm"')
        if "reference_engine" in limits and limits["reference_engine"] != reference:
            self.add("tensorrt_llm", "1/config.json",
                     "the engine's kind (reference or TensorRT) does not match the manifest's target",
                     "publish the engine built for this target")
        if llm is None:
            return
        batching = self.param(llm, "gpt_model_type")
        # On a GPU target the parameter table judges what the backend accepts; trtpipe's own rule on top of it is
        # in-flight batching (the backend would also take V1, static batching).
        if batching not in ("inflight_fused_batching", "inflight_batching") and (reference or batching in ("V1", "v1")):
            self.add("tensorrt_llm", "parameters.gpt_model_type",
                     f"{self.param(llm, 'gpt_model_type')!r} is not an in-flight batching strategy",
                     'set it to "inflight_fused_batching"')
        world = limits.get("world_size") or int(limits.get("tp", 1)) * int(limits.get("pp", 1))
        device_ids = (self.param(llm, "gpu_device_ids") or "").strip()
        if not reference and device_ids and "gpu_device_ids" not in self.flagged_parameters:
            count = len([d for d in device_ids.split(",") if d.strip()])
            if count != world:
                self.add("tensorrt_llm", "parameters.gpu_device_ids",
                         f"lists {count} device(s) but the engine's world size (tp*pp) is {world}",
                         f"list exactly {world} device ids, e.g. \"{','.join(str(i) for i in range(world))}\"")
        suffix = ".safetensors" if reference else ".engine"
        for rank in range(world):
            if not (self.repo / "tensorrt_llm" / "1" / f"rank{rank}{suffix}").is_file():
                self.add("tensorrt_llm", f"1/rank{rank}{suffix}", f"engine file for rank {rank} of {world} is missing",
                         "publish again from the complete engine")
        model_path = self.param(llm, "gpt_model_path") or ""
        if reference and (Path(model_path).is_absolute() or not (self.repo / "tensorrt_llm" / model_path / "config.json").is_file()):
            self.add("tensorrt_llm", "parameters.gpt_model_path",
                     f"{model_path!r} does not lead to the engine inside the repository", 'set it to "1"')
        mount = self.manifest.get("container_repo_mount")
        if not reference and mount and model_path != f"{mount}/tensorrt_llm/1":
            self.add("tensorrt_llm", "parameters.gpt_model_path",
                     f"{model_path!r} is not where the container sees the engine", f'set it to "{mount}/tensorrt_llm/1"')

    def check_tokenizers(self) -> None:
        for name in PYTHON_MODELS_ALWAYS:
            config = self.configs.get(name)
            if config is None:
                continue
            tok = self.param(config, "tokenizer_dir")
            if tok is None:
                self.add(name, "parameters.tokenizer_dir", "no tokenizer_dir parameter", 'set it to "tokenizer"')
                continue
            if Path(tok).is_absolute() or ".." in Path(tok).parts:
                self.add(name, "parameters.tokenizer_dir", f"{tok!r} points outside the model folder",
                         'keep the tokenizer inside the model folder ("tokenizer")')
                continue
            folder = self.repo / name / tok
            if not (folder / "tokenizer.json").is_file():
                self.add(name, f"{tok}/tokenizer.json", "tokenizer file missing",
                         "publish again (the tokenizer files are copied from the spec's tokenizer directory)")
                continue
            self.check_tokenizer_loads(name, tok, folder)

    def check_tokenizer_loads(self, name: str, tok: str, folder: Path) -> None:
        """The tokenizer stays inside the repository and loads as the serving models load it
        (trtpipe.model_folder.check_tokenizer), once per distinct tokenizer.json (the models share hard links)."""
        import os

        from trtpipe.errors import InvalidInput
        from trtpipe.model_folder import check_tokenizer, resolves_inside

        repo_root = (Path(os.path.realpath(self.repo)),)
        for path in sorted(folder.iterdir()):
            if resolves_inside(path, repo_root) is None:
                self.add(name, f"{tok}/{path.name}", f"resolves to {os.path.realpath(path)}, outside the repository",
                         "publish again (a published repository holds copies of the tokenizer files, never links)")
                return
        info = (folder / "tokenizer.json").stat()
        seen = self._tokenizers_seen
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if identity not in seen:
            try:
                check_tokenizer(folder)
                seen[identity] = None
            except InvalidInput as err:
                seen[identity] = err.one_line().replace(str(self.repo / name) + "/", "")
        if seen[identity] is not None:
            self.add(name, f"{tok}/tokenizer.json", f"the tokenizer does not load: {seen[identity]}",
                     "publish again from a model folder whose tokenizer loads")

    def check_contract(self) -> None:
        """Every tensor of the upstream inflight_batcher_llm contract of the manifest's toolchain is declared here."""
        if self.manifest is None or not self.manifest.get("toolchain"):
            return
        from trtpipe.errors import TrtpipeError
        from trtpipe.serving.contract import Declared, check_model, contract_for

        try:
            contract = contract_for(str(self.manifest["toolchain"]), configs=self.configs_dir)
        except TrtpipeError as err:
            self.add(MANIFEST_NAME, "toolchain", f"cannot check the upstream Triton contract: {err.message}",
                     err.fix or "publish with a toolchain from build_configs/toolchains.yaml", severity="warning")
            return
        for name, config in self.configs.items():
            if name not in contract.models:
                continue
            declared = {
                direction: {
                    t.name: Declared(dtype=mc.DataType.Name(t.data_type), dims=list(t.dims),
                                     optional=bool(getattr(t, "optional", False)),
                                     reshape=list(t.reshape.shape) if t.HasField("reshape") else None)
                    for t in tensors
                }
                for direction, tensors in (("input", config.input), ("output", config.output))
            }
            for gap in check_model(contract, name, declared):  # type: ignore[arg-type]
                self.add(name, f"{gap.direction}[{gap.tensor}]",
                         f"breaks the upstream inflight_batcher_llm contract: {gap.problem} (upstream: {gap.source})",
                         "declare it as upstream does (build_configs/triton_contracts/inflight_batcher_llm.yaml); "
                         "publish again from trtpipe's templates")

    def check_parameters(self, limits: dict[str, Any]) -> None:
        """Every model's `parameters` against the keys their readers read (build_configs/triton_contracts/
        tensorrtllm_parameters.yaml): the C++ tensorrtllm backend on GPU targets, trtpipe's Python models always."""
        if self.manifest is None:
            return
        from trtpipe.errors import TrtpipeError
        from trtpipe.serving.parameters import EngineFacts, check_backend, check_python_model, load_parameter_table
        from trtpipe.serving.templates import GPU_SOURCES, REFERENCE_SOURCES

        try:
            table = load_parameter_table(configs=self.configs_dir)
        except TrtpipeError as err:
            self.add(MANIFEST_NAME, "toolchain", f"cannot check the backend parameters: {err.message}",
                     err.fix or "restore build_configs/ from git")
            return
        reference = bool(self.manifest.get("reference"))
        sources = REFERENCE_SOURCES if reference else GPU_SOURCES
        params = {name: {key: value.string_value for key, value in config.parameters.items()}
                  for name, config in self.configs.items()}
        for name in params:
            for finding in check_python_model(table, sources.get(name, name), params[name], tuple(self.configs)):
                self.add(name, f"parameters.{finding.key}", f"{finding.message} [{finding.row}]", finding.fix)
        if reference or "tensorrt_llm" not in params:
            return
        toolchain = str(self.manifest.get("toolchain") or "")
        if toolchain not in table.toolchains:
            self.add(MANIFEST_NAME, "toolchain",
                     f"no tensorrtllm parameter contract for toolchain {toolchain!r} "
                     "(build_configs/triton_contracts/tensorrtllm_parameters.yaml); checked against the pinned ones' rows",
                     f"add the toolchain there (known: {', '.join(table.toolchains)})", severity="warning")
        engine = EngineFacts(paged_context_fmha=limits.get("paged_context_fmha"),
                             paged_kv_cache=limits.get("paged_kv_cache"))
        for finding in check_backend(table, params["tensorrt_llm"], engine):
            self.flagged_parameters.add(finding.key)
            self.add("tensorrt_llm", f"parameters.{finding.key}", f"{finding.message} [{finding.row}]", finding.fix)

    def check_logits(self, limits: dict[str, Any]) -> None:
        """context_logits / generation_logits are declared, in every model, with the engine's logits type: the C++
        backend checks the engine's type against the declared one (and the reference model refuses to load)."""
        if "logits_dtype" not in limits:
            return  # no readable engine config.json (reported by engine_limits)
        from trtpipe.serving.parameters import PARAMETER_FILE, load_parameter_table, logits_datatype

        table = load_parameter_table(configs=self.configs_dir)
        engine_dtype = limits.get("logits_dtype")
        expected = logits_datatype(table, engine_dtype)
        shown = engine_dtype or f"absent, so {table.logits.engine_default}"
        if expected is None:
            self.add("tensorrt_llm", "1/config.json:pretrained_config.logits_dtype",
                     f"{engine_dtype!r}: the tensorrtllm backend serves logits only as "
                     f"{', '.join(table.logits.dtypes)} ({PARAMETER_FILE} logits)",
                     "rebuild the engine with trtllm-build --logits_dtype float16 (or float32)")
            return
        for name, config in self.configs.items():
            for output in config.output:
                if output.name in table.logits.outputs:
                    declared = mc.DataType.Name(output.data_type)
                    if declared != expected:
                        self.add(name, f"output[{output.name}]",
                                 f"declared {declared} but the engine's logits are {expected} (its config.json "
                                 f"pretrained_config.logits_dtype: {shown}); the backend refuses every request that "
                                 f"returns logits [{PARAMETER_FILE} logits: {table.cite(table.logits.check_source)}]",
                                 f"declare it {expected} (publish again: publish declares the engine's logits type)")

    def check_toolchain(self, limits: dict[str, Any]) -> None:
        if self.manifest is None:
            return
        name = self.manifest.get("toolchain")
        try:
            from trtpipe.toolchain import get_toolchain
        except ImportError:
            self.add(MANIFEST_NAME, "toolchain", "cannot check the serving container (trtpipe.toolchain unavailable)",
                     "install the complete trtpipe package", severity="warning")
            return
        try:
            toolchain = get_toolchain(name, configs=self.configs_dir)
        except Exception as err:  # an unknown name: the toolchain table says which exist
            self.add(MANIFEST_NAME, "toolchain", f"unknown toolchain {name!r} ({err})",
                     "publish with a toolchain from build_configs/toolchains.yaml")
            return
        reference = bool(self.manifest.get("reference"))
        if not reference and not self.manifest.get("serving_container"):
            self.add(MANIFEST_NAME, "serving_container",
                     f"no serving container for a GPU target (toolchain {name} records no triton_container)",
                     "fill triton_container for this toolchain in build_configs/toolchains.yaml and publish again")
        elif self.manifest.get("serving_container") != toolchain.triton_container:
            self.add(MANIFEST_NAME, "serving_container",
                     f"{self.manifest.get('serving_container')!r} is not the container of toolchain {name} "
                     f"({toolchain.triton_container})",
                     f"serve with {toolchain.triton_container} (publish again to fix the manifest)")
        version = limits.get("engine_version")
        if version and version != toolchain.trtllm_version:
            self.add("tensorrt_llm", "1/config.json:version",
                     f"engine built with TensorRT-LLM {version} but the manifest's toolchain {name} is {toolchain.trtllm_version}",
                     "rebuild the engine with the pinned toolchain, or publish it with its own toolchain")


def validate_repository(repo: Path, *, configs: Path | None = None) -> list[ValidationIssue]:
    """All problems found in the model repository at `repo` (empty list: it is valid), against the tables of
    `configs` (the build_configs/ folder its caller's settings chose; None: the shipped one)."""
    repo = Path(repo)
    checker = _Checker(repo, configs)
    if not repo.is_dir():
        checker.add("repository", "path", f"{repo} is not a directory", "pass the folder publish wrote")
        return checker.issues
    checker.load_manifest()
    layout_of(repo, checker.manifest).validate(checker)
    return checker.issues


def check_inflight_batcher(checker: _Checker) -> None:
    """The inflight_batcher_llm layout's checks (trtpipe.serving.layouts), after the manifest is loaded."""
    checker.load_configs()
    checker.check_ensemble()
    checker.check_transaction_policy()
    limits = checker.engine_limits()
    checker.check_batch_sizes(limits)
    checker.check_parameters(limits)
    checker.check_logits(limits)
    checker.check_target(limits)
    checker.check_semantics()
    checker.check_tokenizers()
    checker.check_toolchain(limits)
    checker.check_contract()


def errors_only(issues: list[ValidationIssue]) -> list[ValidationIssue]:
    return [i for i in issues if i.severity == "error"]
