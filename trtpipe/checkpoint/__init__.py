"""Checkpoint stage: Hugging Face model -> TensorRT-LLM checkpoint (ModelOpt), calibration data, validation.

Modules: `example_model` (the tiny trained test model), `calibration` (calibration text and sample
selection), `hf_source` (safe loading and input checks of an HF directory), `convert` (quantize + export
with ModelOpt), `schema` (validation of the exported checkpoint), `recipes` (convert with keyword
arguments instead of a spec file: tests, benchmarks).
"""
