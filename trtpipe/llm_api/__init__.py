"""The LLM-API backend's tables: the pinned releases' TorchLlmArgs (`args`) and what a spec implies for `LLM()`
(`derive`). Plain data and rules, no TensorRT-LLM import: they run on any host."""
