"""The engine stage's implementation: the build plan rendered as a command, the executors (local, docker,
reference), checkpoint conversion where the engine is built, engine validation, the log doctor. The
trtllm-build flag and rule tables it follows live a layer below, in trtpipe.trtllm_build."""
