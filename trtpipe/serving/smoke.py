"""`trtpipe smoke URL`: prove a running Triton server serves the trtpipe models correctly.

Checks: live, ready, every model in the repository index ready, the model's metadata, one
non-streaming and one streaming request (their texts must agree), the request patterns of upstream's own clients
(`trtpipe.serving.client_patterns`: text_output alone, log probs, every output, several prompts in one request, unary,
stop), and, with a reference, greedy
parity: the token ids Triton returns equal the reference runtime's for the same prompts. The
reference is given by the caller (`trtpipe smoke --parity SPEC` converts the spec's model afresh,
`trtpipe.checkpoint.afresh`): never the stored bytes the server loads.

The result carries the identity the server reports (`trtpipe.serving.identity`); `record_smoke`
files it under the repository digest the server serves, and nothing else.

Both request contracts are spoken (`trtpipe.serving.client`): the inflight_batcher_llm ensemble/BLS, compared
token by token, and the llmapi model (text only), compared on the text the reference's greedy tokens decode to
(special tokens skipped, as the LLM API detokenizes). The default model, the ensemble, stands for the llmapi
model on a server that serves an llmapi repository.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from trtpipe.errors import CheckFailed, TrtpipeError

if TYPE_CHECKING:
    from trtpipe.reference.parity import ParityReference
    from trtpipe.results import ResultsLog

DEFAULT_PROMPTS = ("Once upon a time", "The cat sat on the", "In the beginning")


class SmokeCheck(BaseModel):
    name: str
    passed: bool
    detail: str = ""
    seconds: float = 0.0


class SmokeResult(BaseModel):
    url: str
    model: str
    passed: bool
    checks: list[SmokeCheck] = Field(default_factory=list)
    parity: dict[str, Any] | None = None
    served: dict[str, Any] | None = Field(default=None, description="The identity the server reports serving.")
    recorded_for: str | None = None


def _check(checks: list[SmokeCheck], name: str, fn: Callable[[], str]) -> bool:
    start = time.monotonic()
    try:
        detail = fn()
        checks.append(SmokeCheck(name=name, passed=True, detail=detail, seconds=time.monotonic() - start))
        return True
    except Exception as err:  # every failure becomes a failed check with its one-line reason
        message = err.one_line() if isinstance(err, TrtpipeError) else f"{type(err).__name__}: {err}"
        checks.append(SmokeCheck(name=name, passed=False, detail=message, seconds=time.monotonic() - start))
        return False


def _pattern_checks(checks: list[SmokeCheck], url: str, model: str, *, prompts: list[str], max_tokens: int,
                    timeout: float) -> None:
    """The request patterns of upstream's own clients (trtpipe.serving.client_patterns), one check each."""
    from trtpipe.serving import client_patterns

    deployment: list[client_patterns.Deployment] = []

    def describe() -> str:
        deployment.append(client_patterns.describe(url, model, prompts=prompts, max_tokens=max_tokens,
                                                   timeout=timeout))
        return "decoupled" if deployment[0].decoupled else "not decoupled"

    if not _check(checks, "deployment", describe):
        return
    for name, pattern in client_patterns.patterns_for(deployment[0].contract).items():
        _check(checks, name, lambda pattern=pattern, name=name: client_patterns.run_pattern(name, pattern,
                                                                                             deployment[0]))


def end_id_of(tokenizer_dir: Path) -> int | None:
    """The end token the preprocessing model uses (tokenizer_config eos, then generation_config)."""
    from trtpipe.model_folder import end_token_id

    return end_token_id(tokenizer_dir, "preprocessing")


def _reference_model(reference: ParityReference):
    from trtpipe.reference.runtime import ReferenceModel

    model = ReferenceModel.load(reference.engine_dir)
    model.set_attention_windows(reference.attention_windows)
    return model.set_token_vocab_size(reference.token_vocab_size)


def reference_greedy(reference: ParityReference, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """What the reference runtime generates greedily for each prompt (tokenized as preprocessing does)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(reference.tokenizer_dir / "tokenizer.json"))
    end_id = end_id_of(reference.tokenizer_dir)
    model = _reference_model(reference)
    outputs = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        outputs.append([t.token_id for t in model.generate(ids, max_new_tokens=max_tokens, end_id=end_id, top_k=1)])
    return outputs


def reference_llmapi_greedy(reference: ParityReference, prompts: list[str], max_tokens: int) -> list[str]:
    """What the llmapi model answers greedily for each prompt, computed by the reference runtime on an HF-format
    checkpoint: the LLM API's tokenization (special tokens added), end token (hf_end_id) and detokenization
    (special tokens skipped), generated text only."""
    from tokenizers import Tokenizer

    from trtpipe.reference.hf_loader import hf_end_id

    checkpoint_dir = reference.engine_dir
    tokenizer = Tokenizer.from_file(str(checkpoint_dir / "tokenizer.json"))
    end_id = hf_end_id(checkpoint_dir)
    model = _reference_model(reference)
    texts = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        out = [t.token_id for t in model.generate(ids, max_new_tokens=max_tokens, end_id=end_id, top_k=1)]
        texts.append(tokenizer.decode(out, skip_special_tokens=True))
    return texts


def long_prompts(reference: ParityReference, max_tokens: int, count: int = 2) -> list[str]:
    """Prompts of `long_prompt_tokens` tokens cut from the shipped text, so generation runs past every window."""
    wanted = reference.long_prompt_tokens(max_tokens)
    if not wanted:
        return []
    from tokenizers import Tokenizer

    from trtpipe.checkpoint.example_model import shipped_paragraphs

    tokenizer = Tokenizer.from_file(str(reference.tokenizer_dir / "tokenizer.json"))
    ids = tokenizer.encode(" ".join(shipped_paragraphs()), add_special_tokens=False).ids
    length = wanted - 1  # the BOS preprocessing adds
    out = []
    for index in range(count):
        start = (index * 7919) % max(1, len(ids) - length)
        text = tokenizer.decode(ids[start:start + length])
        # Trimmed to what re-encodes within the length (a decode/encode round trip may merge differently).
        while text and len(tokenizer.encode(text, add_special_tokens=True).ids) > wanted:
            text = text[: max(1, int(len(text) * 0.95))]
        out.append(text)
    return out


def check_parity(url: str, model: str, reference: ParityReference, *, prompts: list[str], max_tokens: int,
                 timeout: float) -> dict[str, Any]:
    """The server's greedy answers against the reference runtime on the fresh conversion (tokens, or text on the
    llmapi contract), on the given prompts and on long ones (`long_prompts`)."""
    from trtpipe.serving.client import TritonLLMClient

    client = TritonLLMClient(url, model=model, timeout=timeout)
    prompts = [*prompts, *long_prompts(reference, max_tokens)]
    rows = []
    if not client.contract().returns_token_ids:  # text only (llmapi): compare texts
        expected_texts = reference_llmapi_greedy(reference, prompts, max_tokens)
        for prompt, want in zip(prompts, expected_texts):
            got = client.generate(prompt, max_tokens, top_k=1).text
            rows.append({"prompt": prompt, "triton": got, "reference": want, "equal": got == want})
        return {"prompts": len(rows), "mismatches": sum(not r["equal"] for r in rows), "rows": rows, "compared": "text"}
    expected = reference_greedy(reference, prompts, max_tokens)
    for prompt, want in zip(prompts, expected):
        got = client.generate(prompt, max_tokens, top_k=1, exclude_input_in_output=True).output_token_ids
        rows.append({"prompt": prompt, "triton": got, "reference": want, "equal": got == want})
    return {"prompts": len(rows), "mismatches": sum(not r["equal"] for r in rows), "rows": rows, "compared": "token ids"}


def check_model_parity(parity: dict[str, Any], reference: ParityReference, *, max_tokens: int) -> dict[str, Any]:
    """The original model itself (transformers on `hf_dir`) against what the server answered in `parity`'s rows: an
    unquantized conversion must give the same greedy tokens (text on the llmapi contract); a quantized one must
    keep its format's logit bounds between the reference runtime and transformers (trtpipe.reference.parity), the
    server having matched the reference runtime."""
    from tokenizers import Tokenizer

    from trtpipe.reference.parity import check_parity as logit_parity
    from trtpipe.reference.parity import hf_greedy

    assert reference.hf_dir is not None
    tokenizer = Tokenizer.from_file(str(reference.tokenizer_dir / "tokenizer.json"))
    prompt_ids = [tokenizer.encode(row["prompt"], add_special_tokens=True).ids for row in parity["rows"]]
    text = parity["compared"] == "text"
    if reference.exact:
        wanted = hf_greedy(reference.hf_dir, prompt_ids, max_tokens, end_id_of(reference.tokenizer_dir))
        rows = []
        for row, ids, want in zip(parity["rows"], prompt_ids, wanted):
            want_value: Any = tokenizer.decode(want, skip_special_tokens=True) if text else want
            rows.append({"prompt_tokens": len(ids), "triton": row["triton"], "transformers": want_value,
                         "equal": row["triton"] == want_value})
        return {"compared": "greedy text" if text else "greedy token ids", "prompts": len(rows),
                "mismatches": sum(not r["equal"] for r in rows), "rows": rows,
                "longest_prompt": max(len(i) for i in prompt_ids)}
    report = logit_parity(reference.hf_dir, reference.engine_dir, prompt_ids, reference=_reference_model(reference))
    return {"compared": f"logits ({report.format} bounds)", "prompts": len(report.prompts),
            "mismatches": 0 if report.passed else len(report.failures), "failures": report.failures,
            "max_rel_error": report.max_rel_error, "top1_agreement": report.top1_agreement,
            "longest_prompt": max(len(i) for i in prompt_ids)}


def run_smoke(
    url: str,
    *,
    model: str = "ensemble",
    parity_engine: ParityReference | tuple[Path, Path] | None = None,
    prompts: list[str] | None = None,
    max_tokens: int = 16,
    timeout: float = 30,
) -> SmokeResult:
    """Run every smoke check against the server at `url` (gRPC host:port).

    `parity_engine`: (a checkpoint or reference engine dir, its tokenizer dir) the reference runtime
    runs for the parity check; no parity check without it."""
    import tritonclient.grpc as grpcclient

    from trtpipe.serving.client import TritonLLMClient, contract_of, resolve_model

    prompts = list(prompts or DEFAULT_PROMPTS)
    try:
        model, _ = resolve_model(url, model, timeout=timeout)
    except TrtpipeError:
        pass  # the live/ready checks below report an unreachable server
    checks: list[SmokeCheck] = []
    result = SmokeResult(url=url, model=model, passed=False, checks=checks)
    raw = grpcclient.InferenceServerClient(url)
    try:
        def live() -> str:
            if not raw.is_server_live(client_timeout=timeout):
                raise CheckFailed("server is not live", check="live")
            return "live"

        def ready() -> str:
            if not raw.is_server_ready(client_timeout=timeout):
                raise CheckFailed("server is not ready", check="ready")
            return "ready"

        def models_ready() -> str:
            index = raw.get_model_repository_index(as_json=True, client_timeout=timeout).get("models", [])
            # The models the server was told to load (explicit model control): a folder it never loaded is
            # listed without a state, and is not part of what it serves.
            names = sorted({m["name"] for m in index if m.get("state")})
            if model not in names:
                raise CheckFailed(f"the repository has no model {model!r} (it has {', '.join(names)})", check="models_ready")
            not_ready = [n for n in names if not raw.is_model_ready(n, client_timeout=timeout)]
            if not_ready:
                raise CheckFailed(f"models not ready: {', '.join(not_ready)}", check="models_ready")
            return f"{len(names)} ready: {', '.join(names)}"

        def metadata() -> str:
            meta = raw.get_model_metadata(model, as_json=True, client_timeout=timeout)
            names = {t["name"] for t in meta.get("inputs", [])}
            contract = contract_of(meta)
            missing = [n for n in contract.required_inputs if n not in names]
            if missing:
                raise CheckFailed(f"{model} lacks inputs {', '.join(missing)}", check="metadata")
            outputs = {t["name"] for t in meta.get("outputs", [])}
            if "text_output" not in outputs:
                raise CheckFailed(f"{model} lacks the text_output output", check="metadata")
            return f"{len(names)} inputs, {len(outputs)} outputs ({contract.name} contract)"

        client = TritonLLMClient(url, model=model, timeout=timeout)
        generated: dict[str, str] = {}

        def non_streaming() -> str:
            gen = client.generate(prompts[0], max_tokens, top_k=1)
            if not client.contract().returns_token_ids:  # text only (llmapi)
                if not gen.text:
                    raise CheckFailed("no text generated", check="generate")
                generated["text"] = gen.text
                return f"{len(gen.text)} characters in {gen.latency_s:.2f}s: {gen.text[:60]!r}"
            if not gen.output_token_ids:
                raise CheckFailed("no tokens generated", check="generate")
            generated["text"] = gen.text
            return f"{len(gen.output_token_ids)} tokens in {gen.latency_s:.2f}s: {gen.text[:60]!r}"

        def streaming() -> str:
            if not client.is_decoupled():
                return "skipped: the deployment is not decoupled (runtime.streaming: false)"
            chunks = list(client.stream(prompts[0], max_tokens, top_k=1))
            if not chunks or not chunks[-1].is_final:
                raise CheckFailed("the stream ended without a final response", check="stream")
            text = "".join(c.text for c in chunks)
            if "text" in generated and text != generated["text"]:
                raise CheckFailed(f"streamed text {text!r} differs from the non-streaming text {generated['text']!r}", check="stream")
            if not client.contract().returns_token_ids:
                return f"{len(text)} characters in {len(chunks)} responses"
            return f"{sum(len(c.token_ids) for c in chunks)} tokens in {len(chunks)} responses"

        ok = _check(checks, "live", live) and _check(checks, "ready", ready)
        if ok:
            _check(checks, "models_ready", models_ready)
            if _check(checks, "metadata", metadata):
                _check(checks, "generate", non_streaming)
                _check(checks, "stream", streaming)
                _pattern_checks(checks, url, model, prompts=prompts, max_tokens=max_tokens, timeout=timeout)
                if parity_engine is not None:
                    from trtpipe.reference.parity import ParityReference

                    reference = parity_engine if isinstance(parity_engine, ParityReference) else ParityReference(
                        engine_dir=parity_engine[0], tokenizer_dir=parity_engine[1])

                    def parity() -> str:
                        report = check_parity(url, model, reference, prompts=prompts, max_tokens=max_tokens,
                                              timeout=timeout)
                        result.parity = report
                        if report["mismatches"]:
                            bad = next(r for r in report["rows"] if not r["equal"])
                            raise CheckFailed(
                                f"{report['mismatches']}/{report['prompts']} prompts differ from the reference runtime, "
                                f"e.g. {bad['prompt'][:60]!r}: triton {bad['triton']} vs reference {bad['reference']}",
                                check="parity",
                            )
                        return f"{report['prompts']} prompts equal to the reference runtime (greedy, {report['compared']})"

                    def model_parity() -> str:
                        if reference.hf_dir is None:
                            return f"skipped: {reference.hf_skipped or 'the original model is not available here'}"
                        if result.parity is None:
                            raise CheckFailed("the reference parity did not run", check="model-parity")
                        report = check_model_parity(result.parity, reference, max_tokens=max_tokens)
                        result.parity["model"] = report
                        if report["mismatches"]:
                            detail = report.get("failures") or [
                                f"prompt of {r['prompt_tokens']} tokens: triton {r['triton']} vs transformers "
                                f"{r['transformers']}" for r in report["rows"] if not r["equal"]]
                            raise CheckFailed(f"the served model differs from the original model (transformers): "
                                              f"{detail[0]}", check="model-parity",
                                              fix="check the model's attention window, rope scaling and vocabulary")
                        return (f"{report['prompts']} prompts (up to {report['longest_prompt']} tokens) agree with the "
                                f"original model in transformers ({report['compared']})")

                    _check(checks, "parity", parity)
                    _check(checks, "model-parity", model_parity)
    finally:
        raw.close()
    result.checks = checks  # pydantic copied the list at construction
    result.passed = bool(checks) and all(c.passed for c in checks)
    if any(c.name == "ready" and c.passed for c in checks):
        from trtpipe.serving.identity import read_served_identity

        try:
            result.served = read_served_identity(url, timeout=timeout).model_dump()
        except TrtpipeError as err:
            result.served = {"error": err.one_line()}
    return result


def record_smoke(result: SmokeResult, target: Any, log: ResultsLog) -> str:
    """File the result (and its parity) in `log` under `target` (a `trtpipe.serving.identity.RecordTarget`
    the caller checked against what the server reports). Returns the digest recorded for."""
    from trtpipe.results import run_evidence

    evidence = run_evidence("trtpipe smoke", result.url, result.served)
    log.record(target.digest, "smoke", result.passed, result.model_dump(mode="json"), evidence=evidence)
    if result.parity is not None:
        log.record(target.digest, "parity", not result.parity["mismatches"], result.parity, evidence=evidence)
    return target.digest
