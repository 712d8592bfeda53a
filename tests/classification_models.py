"""Models of the classification tests (tests/test_classification.py), written the same way
for triton-shm and for the reference Triton that made tests/golden/triton-2.51-classification.json."""
from __future__ import annotations

from pathlib import Path

from .models import write_model

# Every output is INPUT0 as its datatype; BYTES and FP16 ones are there to be refused.
CLS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PROB", x),
                pb_utils.Tensor("DPROB", x.astype(np.float64)),
                pb_utils.Tensor("IPROB", (x * 100).astype(np.int32)),
                pb_utils.Tensor("UPROB", (x * 100).astype(np.uint8)),
                pb_utils.Tensor("HPROB", x.astype(np.float16)),
                pb_utils.Tensor("STR", x.astype(np.bytes_).astype(np.object_)),
            ]))
        return responses
"""

# Six classes; the file names five, its third line is empty (no label for index 2), and
# its fourth keeps the carriage return a Windows editor left (Triton keeps it too).
LABELS = "cat\ndog\n\nbird\r\nfish\n"


def cls_model(repo: Path, name: str, max_batch_size: int, dims: str) -> None:
    outputs = ", ".join(
        f'{{ name: "{out}" data_type: {dt} dims: {dims}{label} }}'
        for out, dt, label in (("PROB", "TYPE_FP32", ' label_filename: "labels.txt"'),
                               ("DPROB", "TYPE_FP64", ""),
                               ("IPROB", "TYPE_INT32", ' label_filename: "labels.txt"'),
                               ("UPROB", "TYPE_UINT8", ""),
                               ("HPROB", "TYPE_FP16", ""),
                               ("STR", "TYPE_STRING", "")))
    model_dir = write_model(repo, name, config=f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {outputs} ]
        """, model_py=CLS_PY)
    (model_dir / "labels.txt").write_text(LABELS)


def build_classification_repository(repo: Path) -> Path:
    cls_model(repo, "cls_batched", 4, "[ 6 ]")
    cls_model(repo, "cls_flat", 0, "[ 2, 3 ]")
    cls_model(repo, "cls_any", 0, "[ -1 ]")
    return repo
