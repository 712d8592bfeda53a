"""Writes the ONNX model of the example repository (run once; the result is committed).

    python examples/make_models.py
"""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).parent / "model_repository"


def add_sub(path: Path) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over [batch, 16] FP32 tensors."""
    def io(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 16])
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub", [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


if __name__ == "__main__":
    add_sub(HERE / "add_sub_onnx" / "1" / "model.onnx")
    print("wrote", HERE / "add_sub_onnx" / "1" / "model.onnx")
