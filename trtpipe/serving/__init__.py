"""Serving: Triton model repositories (publish, validate), the server launcher and the gRPC client.

Submodules are imported on demand (`trtpipe.serving.inflight_repository`, `.validate`, `.server`, `.client`,
`.smoke`, `.identity`, `.serving_copy`) so that importing one never pulls in torch or tritonclient needlessly.
"""
