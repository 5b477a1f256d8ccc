"""The trtllm-build backend's per-version contract tables, and the build configuration derived from them.

flags.py     which flags and values each pinned trtllm-build accepts (build_configs/trtllm_build_flags/)
rules.py     what each pinned trtllm-build then refuses or silently overrides (rules.yaml)
profiles.py  trtpipe's build profiles per GPU family and goal
config.py    a spec's complete build configuration following all of them (read by trtpipe.resolve)

A low layer: resolve reads it to refuse what a build would refuse; the engine renders its commands.
"""
