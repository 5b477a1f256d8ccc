"""Triton's server-side view: scrape the Prometheus metrics endpoint before and after a run.

Triton exports cumulative per-model counters (labels `model`, `version`):
`nv_inference_request_success`, `nv_inference_request_failure`, `nv_inference_count`,
`nv_inference_request_duration_us`, `nv_inference_queue_duration_us`,
`nv_inference_compute_infer_duration_us`. The difference of two scrapes divided by the
difference in successful requests gives the server's mean time per request, to set beside the
client's E2E: the gap is network plus client overhead.
"""

from __future__ import annotations

import re
import urllib.request
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Sample(BaseModel):
    """One line of the Prometheus text format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_text(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (comments and malformed lines are skipped)."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, _, label_text, value_text = match.group(1), match.group(2), match.group(3), match.group(4)
        try:
            value = float(value_text)
        except ValueError:
            continue
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(label_text or "")}
        samples.append(Sample(name=name, labels=labels, value=value))
    return samples


class ModelCounters(BaseModel):
    """Triton's cumulative counters for one model (all versions summed)."""

    model_config = ConfigDict(extra="forbid")

    request_success: float = 0.0
    request_failure: float = 0.0
    inference_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0
    compute_infer_duration_us: float = 0.0


_FIELD_OF = {
    "nv_inference_request_success": "request_success",
    "nv_inference_request_failure": "request_failure",
    "nv_inference_count": "inference_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
}


def counters_by_model(samples: Iterable[Sample]) -> dict[str, ModelCounters]:
    """Per-model counters from parsed samples (failure counters summed over their `reason` label)."""
    totals: dict[str, dict[str, float]] = {}
    for sample in samples:
        field = _FIELD_OF.get(sample.name)
        model = sample.labels.get("model")
        if field is None or model is None:
            continue
        totals.setdefault(model, {}).setdefault(field, 0.0)
        totals[model][field] += sample.value
    return {model: ModelCounters(**values) for model, values in sorted(totals.items())}


def scrape(metrics_url: str, timeout: float = 5.0) -> dict[str, ModelCounters]:
    """Per-model counters from a live `/metrics` endpoint (`http://host:port/metrics`)."""
    url = metrics_url if metrics_url.rstrip("/").endswith("/metrics") else metrics_url.rstrip("/") + "/metrics"
    if "://" not in url:
        url = "http://" + url
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a URL the user gave
        text = response.read().decode("utf-8", errors="replace")
    return counters_by_model(parse_prometheus_text(text))


class ServerModelDelta(BaseModel):
    """What one model did between two scrapes, and its mean times per successful request (seconds)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    request_success: int
    request_failure: int
    inference_count: int
    mean_request_s: float | None = Field(default=None, description="nv_inference_request_duration_us / successes")
    mean_queue_s: float | None = None
    mean_compute_infer_s: float | None = None


class ServerSide(BaseModel):
    """The server's view of one run, per model; `error` says why it is missing when it is."""

    model_config = ConfigDict(extra="forbid")

    metrics_url: str | None = None
    models: list[ServerModelDelta] = Field(default_factory=list)
    error: str | None = None

    def for_model(self, model: str) -> ServerModelDelta | None:
        return next((m for m in self.models if m.model == model), None)


def _mean_s(total_us: float, requests: int) -> float | None:
    return total_us / 1e6 / requests if requests > 0 else None


def delta(before: dict[str, ModelCounters], after: dict[str, ModelCounters], metrics_url: str | None = None) -> ServerSide:
    """The per-model difference of two scrapes (models that did nothing are left out)."""
    models = []
    for name in sorted(after):
        a = after[name]
        b = before.get(name, ModelCounters())
        success = int(round(a.request_success - b.request_success))
        failure = int(round(a.request_failure - b.request_failure))
        count = int(round(a.inference_count - b.inference_count))
        if success == 0 and failure == 0 and count == 0:
            continue

        models.append(
            ServerModelDelta(
                model=name,
                request_success=success,
                request_failure=failure,
                inference_count=count,
                mean_request_s=_mean_s(a.request_duration_us - b.request_duration_us, success),
                mean_queue_s=_mean_s(a.queue_duration_us - b.queue_duration_us, success),
                mean_compute_infer_s=_mean_s(a.compute_infer_duration_us - b.compute_infer_duration_us, success),
            )
        )
    return ServerSide(metrics_url=metrics_url, models=models)
