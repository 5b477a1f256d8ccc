"""CPU reference runtime for TensorRT-LLM checkpoints: validation only, never fast, never TensorRT.

`runtime.ReferenceModel.load(path)` runs a checkpoint or a cpu-reference engine; `parity.check_parity`
compares it with transformers. Submodules are imported explicitly (this package imports nothing heavy).
"""
