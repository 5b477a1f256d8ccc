"""How `trtpipe bench` counts prompt tokens: with the served model's tokenizer, checked by the server.

Where the tokenizer comes from. Triton has no API to fetch a model's files, so the tokenizer is read
from disk: a published model repository, or a tokenizer directory (the CLI picks which:
`trtpipe.commands.bench.token_counter`). In a repository it is the preprocessing model's own tokenizer,
found the way the served `preprocessing/1/model.py` finds it (its `tokenizer_dir` parameter), counted
with its `add_special_tokens` parameter. What the disk cannot prove, the server can: before any load, bench
asks the served `preprocessing` model (the model the ensemble and BLS tokenize with) for its
parameters and has it count the first prompts (REQUEST_INPUT_LEN, the length the engine sees);
a different count is refused (`TokenizerMismatch`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from trtpipe.bench.workload import ServerCountCheck, TokenCounter, Workload
from trtpipe.errors import UsageError
from trtpipe.model_folder import SERVING_TOKENIZER_FILE as TOKENIZER_FILE
from trtpipe.serving.layouts import DEFAULT_LAYOUT, LAYOUTS, RepositoryLayout, recognised_layout
from trtpipe.serving.repository_files import bool_parameter

CHECKED_PROMPTS = 32  # a foreign tokenizer miscounts nearly every prompt; 32 prompts are a few ms of server time
SERVER_TIMEOUT_S = 10.0


class ServedPreprocessing(BaseModel):
    """The tokenization parameters of the served model that counts prompts (its config, read over gRPC): the
    preprocessing model the ensemble and BLS tokenize with."""

    model: str
    add_special_tokens: bool
    max_input_len: int | None
    max_batch_size: int


def _parameters(config: dict) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in (config.get("parameters") or {}).items()}


def served_preprocessing(url: str, model: str) -> tuple[ServedPreprocessing | None, str | None]:
    """The served counting model's parameters, or None and the reason it cannot be asked."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(url)
    except Exception as err:  # noqa: BLE001 - a bad URL shows up again (and is reported) when the load starts
        return None, f"cannot reach {url}: {' '.join(str(err).split())[:160]}"
    try:
        if not client.is_model_ready(model, client_timeout=SERVER_TIMEOUT_S):
            return None, f"the server at {url} serves no ready {model} model"
        config = client.get_model_config(model, as_json=True, client_timeout=SERVER_TIMEOUT_S)["config"]
    except InferenceServerException as err:
        return None, f"cannot ask {url} for its {model} model: {' '.join(str(err.message()).split())[:160]}"
    finally:
        client.close()
    params = _parameters(config)
    max_input_len = int(params.get("max_input_len") or 0) or None
    add_special = bool_parameter(params.get("add_special_tokens"))
    return ServedPreprocessing(
        model=model,
        add_special_tokens=True if add_special is None else add_special,  # model.py's default
        max_input_len=max_input_len,
        max_batch_size=int(config.get("max_batch_size") or 0),
    ), None


class TokenizerMismatch(UsageError):
    """The tokenizer given counts prompts differently from the served model."""


def served_tokenizer(source: Path, option: str) -> tuple[Path, bool | None, RepositoryLayout | None]:
    """The tokenizer.json prompts are counted with, the add_special_tokens the served model counts with (None:
    as the server does), and the layout of `source` (None: a bare tokenizer). `source` is a model repository
    (its layout says where its served model's tokenizer sits) or a tokenizer directory or file."""
    layout = recognised_layout(source)
    if layout is not None:
        tokenizer_json, add_special = layout.served_tokenizer(source, option)
        return tokenizer_json, add_special, layout
    if (source / TOKENIZER_FILE).is_file():
        return source / TOKENIZER_FILE, None, None
    if source.is_file() and source.name == TOKENIZER_FILE:
        return source, None, None
    raise UsageError(
        f"{option}: {source} is neither a model repository (preprocessing/config.pbtxt) nor a tokenizer "
        f"directory ({TOKENIZER_FILE})",
        fix="pass the model repository the server serves, or count words instead of tokens",
    )


def ask_server(url: str, layout: RepositoryLayout | None) -> tuple[ServedPreprocessing | None, str | None]:
    """The served counting model's parameters for the repository's layout (a bare tokenizer: the default
    layout's), or None and why the server cannot count prompts."""
    layout = layout if layout is not None else LAYOUTS[DEFAULT_LAYOUT]
    if layout.counting_model is None:
        return None, layout.uncounted
    return served_preprocessing(url, layout.counting_model)


def token_counter(counting: str, source: Path | None, option: str, url: str
                  ) -> tuple[TokenCounter, ServedPreprocessing | None, str | None]:
    """The prompt-token counter for `counting` ("words", or "tokenizer": the served tokenizer found from `source`,
    which `option` named), the served counting model's parameters, and why the server cannot check the counts
    (None when it can). Nothing is asked of the server unless the tokenizer is found."""
    from trtpipe.bench.workload import HfTokenizerCounter, WordCounter

    if counting == "words":
        return WordCounter(), None, None
    assert counting == "tokenizer" and source is not None, "the caller checks the counting and names the source"
    tokenizer_json, add_special, layout = served_tokenizer(source, option)
    served, reason = ask_server(url, layout)
    if add_special is None:  # a bare tokenizer: add special tokens as the server does (model.py's default: true)
        add_special = served.add_special_tokens if served is not None else True
    try:
        counter = HfTokenizerCounter(tokenizer_json, add_special_tokens=add_special)
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for a bad file
        raise UsageError(
            f"{option}: cannot load {tokenizer_json}: {' '.join(str(err).split())[:160]}",
            fix="pass the model repository the server serves (its tokenizer.json is what the server loads)",
        ) from None
    return counter, served, reason


def text_token_counter(tokenizer_json: Path) -> Callable[[str], int]:
    """Tokens of generated text as the served tokenizer splits it (no special tokens): how an llmapi model's
    output, which comes back as text, is counted."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def server_counts(url: str, prompts: list[str], max_batch_size: int, model: str) -> list[int]:
    """The served counting model's REQUEST_INPUT_LEN for each prompt (the length the engine sees), asked with
    upstream preprocessing's tensors (QUERY, REQUEST_OUTPUT_LEN)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    batch = max(1, max_batch_size)
    counts: list[int] = []
    client = grpcclient.InferenceServerClient(url)
    try:
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            query = grpcclient.InferInput("QUERY", [len(chunk), 1], "BYTES")
            query.set_data_from_numpy(np.array([[p.encode("utf-8")] for p in chunk], dtype=object))
            out_len = grpcclient.InferInput("REQUEST_OUTPUT_LEN", [len(chunk), 1], "INT32")
            out_len.set_data_from_numpy(np.ones((len(chunk), 1), dtype=np.int32))
            try:
                result = client.infer(
                    model, [query, out_len],
                    outputs=[grpcclient.InferRequestedOutput("REQUEST_INPUT_LEN")],
                    client_timeout=SERVER_TIMEOUT_S,
                )
            except InferenceServerException as err:
                message = " ".join(str(err.message()).split())[:200]
                raise UsageError(
                    f"the served {model} model refused prompt {start} while counting its tokens: {message}",
                    fix="shorten the prompts to the served max_input_len, or check the server",
                ) from None
            counts.extend(int(n) for n in result.as_numpy("REQUEST_INPUT_LEN").reshape(-1))
    finally:
        client.close()
    return counts


def check_with_server(
    url: str, workload: Workload, served: ServedPreprocessing | None, skipped: str | None
) -> Workload:
    """The workload with its counts checked by the served preprocessing model (or why they were not).

    Refuses (one line) when the server counts any checked prompt differently: the tokenizer is not the served one.
    """
    if workload.token_counting != "tokenizer":
        return workload.model_copy(update={"server_check_skipped": "prompt lengths are counted in words"})
    if served is None:
        return workload.model_copy(update={"server_check_skipped": skipped})
    over_max = 0
    if served.max_input_len:
        over_max = sum(1 for spec in workload.requests if spec.input_tokens > served.max_input_len)
    sample = [spec for spec in workload.requests if not served.max_input_len or spec.input_tokens <= served.max_input_len]
    sample = sample[:CHECKED_PROMPTS]
    counts = server_counts(url, [spec.prompt for spec in sample], served.max_batch_size, served.model)
    for spec, count in zip(sample, counts):
        if count != spec.input_tokens:
            raise TokenizerMismatch(
                f"the served {served.model} model counts {count} tokens in request {spec.index} where "
                f"{workload.tokenizer} counts {spec.input_tokens}: that is not the tokenizer the server serves",
                fix="count with the tokenizer of the model repository the server serves, or count words",
            )
    check = ServerCountCheck(
        prompts_checked=len(sample), max_input_len=served.max_input_len, prompts_over_max_input_len=over_max
    )
    return workload.model_copy(update={"server_check": check})
