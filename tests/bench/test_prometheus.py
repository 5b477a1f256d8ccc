"""Parsing Triton's Prometheus text and the before/after difference."""

from __future__ import annotations

import pytest

from trtpipe.bench.prometheus import counters_by_model, delta, parse_prometheus_text

BEFORE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 10
nv_inference_request_success{model="preprocessing",version="1"} 10
nv_inference_request_failure{model="ensemble",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="ensemble",reason="REJECTED",version="1"} 0
nv_inference_count{model="ensemble",version="1"} 10
nv_inference_request_duration_us{model="ensemble",version="1"} 100000
nv_inference_queue_duration_us{model="ensemble",version="1"} 5000
nv_inference_compute_infer_duration_us{model="ensemble",version="1"} 80000
nv_cpu_utilization 0.25
"""

AFTER = """\
nv_inference_request_success{model="ensemble",version="1"} 30
nv_inference_request_success{model="preprocessing",version="1"} 10
nv_inference_request_failure{model="ensemble",reason="BACKEND",version="1"} 3
nv_inference_request_failure{model="ensemble",reason="REJECTED",version="1"} 1
nv_inference_count{model="ensemble",version="1"} 30
nv_inference_request_duration_us{model="ensemble",version="1"} 500000
nv_inference_queue_duration_us{model="ensemble",version="1"} 25000
nv_inference_compute_infer_duration_us{model="ensemble",version="1"} 380000
nv_inference_request_success{model="tensorrt_llm",version="1"} 20
malformed line without value
"""


def test_parse_labels_and_values() -> None:
    samples = parse_prometheus_text(BEFORE)
    assert len(samples) == 9
    first = samples[0]
    assert first.name == "nv_inference_request_success"
    assert first.labels == {"model": "ensemble", "version": "1"} and first.value == 10.0
    assert samples[-1].labels == {} and samples[-1].value == pytest.approx(0.25)


def test_delta_per_model() -> None:
    before = counters_by_model(parse_prometheus_text(BEFORE))
    after = counters_by_model(parse_prometheus_text(AFTER))
    assert before["ensemble"].request_failure == 1  # summed over reasons
    side = delta(before, after, "http://x/metrics")
    names = [m.model for m in side.models]
    assert names == ["ensemble", "tensorrt_llm"]  # preprocessing did nothing in between
    ens = side.for_model("ensemble")
    assert (ens.request_success, ens.request_failure, ens.inference_count) == (20, 3, 20)
    assert ens.mean_request_s == pytest.approx(0.02)
    assert ens.mean_queue_s == pytest.approx(0.001)
    assert ens.mean_compute_infer_s == pytest.approx(0.015)
    assert side.for_model("tensorrt_llm").mean_request_s == 0.0
