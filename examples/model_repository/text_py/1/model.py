import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            decoded = [[s.decode("utf-8") for s in row] for row in text]
            upper = np.array([[s.upper().encode("utf-8") for s in row] for row in decoded], dtype=np.object_)
            length = np.array([[len(s) for s in row] for row in decoded], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]))
        return responses
