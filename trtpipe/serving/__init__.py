"""Serving: Triton model repositories (publish, validate), the server launcher and the gRPC client.

Submodules are imported on demand (`trtpipe.serving.publish`, `.validate`, `.server`, `.client`,
`.smoke`, `.identity`, `.serving_dir`) so that importing one never pulls in torch or tritonclient needlessly.
"""
