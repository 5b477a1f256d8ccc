"""The engine stage: build plan, trtllm-build flag contracts, executors, engine validation, log doctor."""
