"""The tiny example, built and published for real: for tests, the bench tests and the README demo.

`publish_example(tmp_dir)` writes the tiny Llama, a cpu-reference spec, runs the real pipeline
(`trtpipe.pipeline.run_build`: resolve -> plan -> checkpoint -> engine -> publish) with a store
under `tmp_dir`, and returns the published repository.
"""

from __future__ import annotations

from pathlib import Path

from trtpipe.errors import TrtpipeError

EXAMPLE_LIMITS = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128}


def write_example_spec(
    spec_dir: Path, model_dir: Path, *, streaming: bool = True, name: str = "tiny-llama-cpu"
) -> Path:
    """A cpu-reference build spec for the tiny model (small limits, so tests can exceed them)."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    limits = EXAMPLE_LIMITS
    text = (
        f"name: {name}\n"
        "model:\n"
        f"  path: {model_dir.resolve()}\n"
        "  dtype: float16\n"
        "target:\n"
        "  gpu: cpu-reference\n"
        "engine:\n"
        f"  max_batch_size: {limits['max_batch_size']}\n"
        f"  max_input_len: {limits['max_input_len']}\n"
        f"  max_seq_len: {limits['max_seq_len']}\n"
        "triton:\n"
        f"  streaming: {'true' if streaming else 'false'}\n"
    )
    path = spec_dir / f"{name}.yaml"
    path.write_text(text)
    return path


def publish_example(tmp_dir: Path, *, streaming: bool = True, model_dir: Path | None = None) -> Path:
    """Build and publish the tiny example under `tmp_dir`; returns the model repository path.

    The spec is written to `tmp_dir/spec/tiny-llama-cpu.yaml` (`tiny-llama-cpu-unary.yaml` with
    streaming=False) and the store is `tmp_dir/store` (the repository lives in it).
    """
    from trtpipe.pipeline import run_build

    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    if model_dir is None:
        from trtpipe.checkpoint.example_model import write_example_model

        model_dir = tmp_dir / "tiny-llama"
        if not (model_dir / "config.json").is_file():
            write_example_model(model_dir, arch="llama")
    # One store per tmp_dir: a second call (say streaming=False) reuses the checkpoint and engine.
    name = "tiny-llama-cpu" if streaming else "tiny-llama-cpu-unary"
    spec_path = write_example_spec(tmp_dir / "spec", Path(model_dir), streaming=streaming, name=name)
    report = run_build(spec_path, store=tmp_dir / "store", progress=False)
    if report.repository_path:
        return Path(report.repository_path)
    raise TrtpipeError(
        f"building the example stopped after {report.stopped_after or 'an early stage'}: "
        f"{report.error or report.message or report.status}",
        fix="install the complete trtpipe package (every stage module) and retry",
    )
