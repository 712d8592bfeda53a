"""Request validation in-process, for shapes no config that loads can reach end to end."""
from __future__ import annotations

from pathlib import Path

import pytest

from triton_shm._proto import model_config_pb2 as mc
from triton_shm.core.repository import ModelVersion
from triton_shm.core.types import InferRequest, InputTensor
from triton_shm.core.validation import format_shape, validate_request
from triton_shm.errors import InvalidArgument


def _model(dims: list[int], max_batch_size: int) -> ModelVersion:
    config = mc.ModelConfig(name="m", max_batch_size=max_batch_size,
                            input=[mc.ModelInput(name="INPUT0", data_type=mc.TYPE_FP32, dims=dims)],
                            output=[mc.ModelOutput(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=dims)])
    mv = ModelVersion("m", 1, Path("."), config)
    mv.set_config(config)
    return mv


@pytest.mark.parametrize("shape,text", [([], "[]"), ([-1], "[-1]"), ([-1, 16], "[-1,16]"), ([2, 3, 4], "[2,3,4]")])
def test_format_shape(shape, text):
    assert format_shape(shape) == text


def test_batched_shape_error_with_only_the_batch_dimension():
    request = InferRequest("m", inputs=[InputTensor("INPUT0", "FP32", [1, 3], bytes(12))])
    with pytest.raises(InvalidArgument) as e:
        validate_request(_model([], 8), request)
    assert "Expected [-1], got [1,3]. NOTE:" in e.value.message, e.value.message
