"""The request patterns upstream's clients send to the llmapi model (the llmapi layout's request contract), as
checks a served repository must pass; the machinery and the ensemble's patterns are trtpipe.serving.client_patterns.

Read from TensorRT-LLM triton_backend/tools/llmapi_client.py (and /work/shared/notes/upstream-clients.md): it calls
the model unary (async_infer) with text_input and sampling_param_max_tokens and no requested outputs, and sends
`stop` with the request id to cancel a generation; the model ends a stopped request with a CANCELLED error.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trtpipe.errors import CheckFailed
from trtpipe.serving.client_patterns import Deployment, Refused, stop_check, texts_of, unary_request


def unary(d: Deployment) -> str:
    """llmapi_client.py: a unary infer with text_input and sampling_param_max_tokens, no outputs named (Triton
    allows unary calls only on a model that is not decoupled)."""
    if d.decoupled:
        return "skipped: Triton refuses unary calls to a decoupled model (upstream's too)"
    values = {"text_input": np.array([d.prompts[0].encode("utf-8")], dtype=object),
              "sampling_param_max_tokens": np.array([d.max_tokens], dtype=np.int32)}
    try:
        result = unary_request(d.url, d.model, values, outputs=None, timeout=d.timeout)
    except Refused as err:
        raise CheckFailed(f"{d.model} refused llmapi_client.py's unary request: {err}", check="patterns") from None
    text = texts_of(result, d.model)
    if not text or not text[0]:
        raise CheckFailed(f"{d.model} answered llmapi_client.py's request with no text", check="patterns")
    echo = "echoes the prompt" if text[0].startswith(d.prompts[0]) else "does not echo the prompt"
    return f"unary (llmapi_client.py): {len(text[0])} characters, {echo}"


def stop(d: Deployment) -> str:
    """llmapi_client.py: `stop` with the request id, sent to the served model itself, cancels its generation."""
    if d.model not in d.models:
        return f"skipped: no {d.model} model to send `stop` to"
    stop_values = {"text_input": np.array([b""], dtype=object), "stop": np.array([True])}
    long_tokens = d.max_tokens * 4
    values = {"text_input": np.array([d.prompts[0].encode("utf-8")], dtype=object),
              "streaming": np.array([d.decoupled]),
              "sampling_param_max_tokens": np.array([long_tokens], dtype=np.int32)}
    return stop_check(d, d.model, stop_values, values, long_tokens, cancelled_is_an_end=True)


PATTERNS: dict[str, Callable[[Deployment], str]] = {"unary": unary, "stop": stop}
