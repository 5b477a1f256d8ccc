"""Streams `max_tokens` responses of one token each ("tok"), then the final flag; no other work.

Token i has id 100 + (i % 100). The last data response carries the final flag, as TensorRT-LLM's
streaming does; tokens are sent from `execute` without a thread, so the server-side request
duration covers the whole stream.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            n = max(n, 1)
            for i in range(n):
                outputs = [
                    pb_utils.Tensor("text_output", np.array([[b"tok"]], dtype=np.object_)),
                    pb_utils.Tensor("output_ids", np.array([[[100 + i % 100]]], dtype=np.int32)),
                    pb_utils.Tensor("sequence_length", np.array([[1]], dtype=np.int32)),
                    pb_utils.Tensor("cum_log_probs", np.zeros((1, 1), dtype=np.float32)),
                    pb_utils.Tensor("output_log_probs", np.zeros((1, 1, 1), dtype=np.float32)),
                ]
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)
        return None
