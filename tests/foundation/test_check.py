"""`trtpipe check`: this GPU-less host for real, and recorded NVML answers of A100 and H100 hosts vs specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpipe.gpu import NvmlProbe, RecordedProbe, probe_host
from trtpipe.hostcheck import EXIT_FAIL, EXIT_NO_GPU, EXIT_OK, DockerStatus, run_checks
from trtpipe.resolve import resolve
from trtpipe.spec_loader import load_spec

HOST_HAS_GPU = probe_host(NvmlProbe()).has_gpu
no_gpu_here = pytest.mark.skipif(HOST_HAS_GPU, reason="this test describes a host without an NVIDIA GPU")


def _rows(report: dict) -> dict[str, dict]:
    return {row["item"]: row for row in report["rows"]}


def _cfg_spec(tmp_path: Path, models_dir: Path, extra: str, model: str = "llama-3-8b") -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model:\n  config: {models_dir / model / 'config.json'}\n{extra}")
    return spec


@no_gpu_here
def test_check_json_without_gpu_says_what_is_possible(cli) -> None:
    result = cli("check", "--json")
    assert result.code == EXIT_NO_GPU == 3
    report = result.json()
    assert report["exit_code"] == 3
    assert "cpu-reference" in report["exit_meaning"] and "not built" in report["exit_meaning"]
    assert report["host"]["gpus"] == [] and report["host"]["error"]
    assert _rows(report)["gpu"]["status"] == "WARN"
    assert any("cpu-reference" in line for line in report["possible_here"])
    assert any("no NVIDIA GPU" in line for line in report["not_possible_here"])
    assert set(report["packages"]) == {"tensorrt_llm", "tensorrt", "torch", "nvidia-modelopt", "transformers", "tritonclient"}
    assert report["packages"]["torch"]  # the venv has torch
    assert report["docker"]["available"] in (True, False)


@no_gpu_here
def test_check_cpu_reference_spec_passes_without_gpu(cli, tmp_path: Path, models_dir: Path) -> None:
    spec = _cfg_spec(tmp_path, models_dir, "target:\n  gpu: cpu-reference\nquantization:\n  algo: fp8\n")
    result = cli("check", "--spec", spec, "--json")
    assert result.code == EXIT_OK, result.out
    assert result.json()["target"] == "cpu-reference"


@no_gpu_here
def test_check_gpu_spec_without_gpu_exits_3(cli, examples_dir: Path) -> None:
    result = cli("check", "--spec", examples_dir / "llama3-8b-fp8-h100.yaml")
    assert result.code == EXIT_NO_GPU
    assert "checked and planned here but not built" in " ".join(result.out.split())


def test_recorded_a100_matches_int4awq_a100_spec(cli, examples_dir: Path, recorded_a100: Path) -> None:
    result = cli("check", "--spec", examples_dir / "llama3-8b-int4awq-a100.yaml", "--recorded-probe", recorded_a100, "--json")
    report = result.json()
    rows = _rows(report)
    assert report["host"]["probe"] == "recorded:a100-sxm4-80gb-x2.nvml.json"
    assert rows["target"]["status"] == "OK" and "NVIDIA A100-SXM4-80GB" in rows["target"]["found"]
    assert rows["gpu"]["status"] == "OK"
    if report["packages"]["tensorrt_llm"] is None and not report["docker"]["available"]:
        # an A100 here could build only with tensorrt_llm installed or the pinned container
        assert rows["tensorrt_llm"]["status"] == "FAIL" and "Docker" in rows["tensorrt_llm"]["fix"]
        assert result.code == EXIT_FAIL


def test_recorded_a100_refuses_h100_target(cli, examples_dir: Path, recorded_a100: Path) -> None:
    result = cli("check", "--spec", examples_dir / "llama3-8b-fp8-h100.yaml", "--recorded-probe", recorded_a100, "--json")
    target = _rows(result.json())["target"]
    assert result.code == EXIT_FAIL
    assert target["status"] == "FAIL" and "SM80" in target["found"] and "SM90" in target["expected"]


def test_recorded_a100_driver_too_old_for_toolchain(cli, tmp_path: Path, models_dir: Path, recorded_a100: Path) -> None:
    spec = _cfg_spec(tmp_path, models_dir, "target:\n  gpu: a100-80gb\ntoolchain: trtllm-1.1.0\n")
    report = cli("check", "--spec", spec, "--recorded-probe", recorded_a100, "--json").json()
    driver = _rows(report)["driver"]
    assert driver["status"] == "FAIL" and driver["found"] == "535.129.03" and "580.95.05" in driver["expected"]
    assert report["exit_code"] == EXIT_FAIL


def test_fp8_spec_is_refused_before_probing(cli, tmp_path: Path, models_dir: Path, recorded_a100: Path) -> None:
    spec = _cfg_spec(tmp_path, models_dir, "target:\n  gpu: a100-80gb\nquantization:\n  algo: fp8\n")
    result = cli("check", "--spec", spec, "--recorded-probe", recorded_a100)
    assert result.code == 2 and "SM80" in result.err and "int4_awq" in result.err


def test_recorded_h100_matches_70b_on_four_gpus(cli, examples_dir: Path, recorded_h100: Path) -> None:
    report = cli(
        "check", "--spec", examples_dir / "llama3-70b-fp8-4xh100.yaml", "--recorded-probe", recorded_h100, "--json"
    ).json()
    rows = _rows(report)
    assert rows["target"]["status"] == "OK" and rows["target"]["found"].startswith("4 x NVIDIA H100 80GB HBM3")
    assert [g["sm"] for g in report["host"]["gpus"]] == [90, 90, 90, 90]


def test_recorded_h100_has_too_few_gpus_for_tp8(cli, tmp_path: Path, models_dir: Path, recorded_h100: Path) -> None:
    spec = _cfg_spec(tmp_path, models_dir, "target:\n  gpu: h100-sxm\n  tp: 8\n", model="llama-3-70b")
    result = cli("check", "--spec", spec, "--recorded-probe", recorded_h100, "--json")
    target = _rows(result.json())["target"]
    assert result.code == EXIT_FAIL and target["status"] == "FAIL" and "8" in target["expected"]


def test_fully_provisioned_h100_host_passes(examples_dir: Path, recorded_h100: Path) -> None:
    """The same recorded H100 host with the pinned packages, a Docker daemon and the 1.2.1 containers' driver (the
    recorded 580.95.05 is below it, see the next test): nothing fails."""
    resolved = resolve(load_spec(examples_dir / "llama3-8b-fp8-h100.yaml"), need_weights=False)
    tc = resolved.toolchain
    packages = {
        "tensorrt_llm": tc.trtllm_version,
        "tensorrt": tc.tensorrt_version,
        "torch": f"{tc.torch_version}+cu130",
        "nvidia-modelopt": f"{tc.modelopt_version}.0",
        "transformers": tc.transformers_version,
        "tritonclient": "2.60.0",
    }
    host = RecordedProbe(recorded_h100).probe().model_copy(update={"driver_version": tc.min_driver})
    report = run_checks(host, packages, DockerStatus(available=True, detail="up"), resolved)
    statuses = {row.item: row.status for row in report.rows}
    assert "FAIL" not in statuses.values(), report.rows
    assert statuses["target"] == statuses["tensorrt_llm"] == statuses["torch"] == statuses["driver"] == "OK"
    assert report.exit_code == EXIT_OK


@pytest.mark.parametrize(("driver", "status"), [("580.95.05", "FAIL"), ("580.159.04", "FAIL"), ("590.44.00", "FAIL"),
                                                ("590.44.01", "OK"), ("595.58.03", "OK")])
def test_driver_against_the_1_2_1_minimum(examples_dir: Path, recorded_h100: Path, driver: str, status: str) -> None:
    """trtllm-1.2.1's containers (26.04-26.07) need CUDA driver 590.44.01 (Triton's compatibility matrix): an R580
    host fails the check for a 1.2.1 spec, 590.44.01 and newer pass."""
    resolved = resolve(load_spec(examples_dir / "llama3-8b-fp8-h100.yaml"), need_weights=False)
    assert resolved.toolchain.name == "trtllm-1.2.1" and resolved.toolchain.min_driver == "590.44.01"
    host = RecordedProbe(recorded_h100).probe().model_copy(update={"driver_version": driver})
    report = run_checks(host, {}, DockerStatus(available=True, detail="up"), resolved)
    row = next(row for row in report.rows if row.item == "driver")
    assert row.status == status and row.found == driver and "590.44.01" in row.expected
    if status == "FAIL":
        assert report.exit_code == EXIT_FAIL and "590.44.01" in row.fix


def test_wrong_tensorrt_llm_version_fails_with_local_executor(examples_dir: Path, recorded_h100: Path, tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text((examples_dir / "llama3-8b-fp8-h100.yaml").read_text().replace("tp: 1", "tp: 1\n  executor: local"))
    spec_dir_models = examples_dir.parent / "models"
    spec.write_text(spec.read_text().replace("../models", str(spec_dir_models)))
    resolved = resolve(load_spec(spec), need_weights=False)
    packages = {"tensorrt_llm": "1.1.0", "tensorrt": "10.13.3.9", "torch": "2.9.1", "nvidia-modelopt": "0.37.0",
                "transformers": "4.57.3", "tritonclient": "2.60.0"}
    report = run_checks(RecordedProbe(recorded_h100).probe(), packages, DockerStatus(available=False, detail="no"), resolved)
    rows = {row.item: row for row in report.rows}
    assert rows["tensorrt_llm"].status == "FAIL" and "1.2.1" in rows["tensorrt_llm"].fix
    assert report.exit_code == EXIT_FAIL


def test_record_probe_writes_a_replayable_answer(cli, tmp_path: Path) -> None:
    out = tmp_path / "this-host.nvml.json"
    result = cli("check", "--record-probe", out, "--json")
    assert result.code in (EXIT_OK, EXIT_FAIL, EXIT_NO_GPU)
    replayed = RecordedProbe(out).probe()
    live = result.json()["host"]
    assert [g.name for g in replayed.gpus] == [g["name"] for g in live["gpus"]]
    assert replayed.driver_version == live["driver_version"]


def test_recorded_probe_in_a_wrong_format_is_one_line(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"name": "x"}]}')
    result = cli("check", "--recorded-probe", bad)
    # InvalidInput (exit 2): a file the user gave is wrong (exit 1, untyped, before issue 13)
    assert result.code == 2 and "recorded format" in result.err and "Traceback" not in result.err


def test_a_captured_h200_answer_matches_the_catalog_and_an_fp8_spec(cli, tmp_path: Path, models_dir: Path) -> None:
    """The only probe file here captured on a real host (an H200 device machine): the catalog entry its product
    string selects, SM 90, and memory a little under the nominal 141 GiB (the driver reserves some)."""
    from trtpipe.gpu import catalog_entry_for

    recorded = Path(__file__).parent / "data" / "h200-x1.nvml.json"
    host = RecordedProbe(recorded).probe()
    [gpu] = host.gpus
    entry = catalog_entry_for(gpu)
    assert entry is not None and entry.name == "h200" and gpu.sm == entry.sm == 90
    assert 0.98 * entry.memory_gib < gpu.memory_gib < entry.memory_gib
    assert entry.has_precision("fp8") and entry.architecture == "hopper"
    spec = _cfg_spec(tmp_path, models_dir, "target:\n  gpu: h200\nquantization:\n  algo: fp8\n  kv_cache: fp8\n")
    report = cli("check", "--spec", spec, "--recorded-probe", recorded, "--json").json()
    rows = _rows(report)
    assert rows["target"]["status"] == "OK" and "NVIDIA H200" in rows["target"]["found"]
    assert rows["gpu"]["status"] == "OK"


def test_a_host_without_the_nvml_library_answers_as_pynvml_would_without_importing_it() -> None:
    """Where libnvidia-ml.so.1 does not load, the probe says what nvmlInit would have said (the same words), and a
    warm build's record does not pay for importing the bindings."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this host has NVIDIA's driver library: the probe asks NVML")
    import pynvml

    with pytest.raises(pynvml.NVMLError) as raised:
        pynvml.nvmlInit()
    script = ("import sys, json\nfrom trtpipe.gpu import NvmlProbe\nrecord = NvmlProbe().record()\n"
              "print(json.dumps([record, 'pynvml' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    import json

    record, imported = json.loads(done.stdout)
    assert imported is False
    assert record == {"error": f"NVML is not available: {raised.value} (no NVIDIA driver or GPU on this host)", "gpus": []}
