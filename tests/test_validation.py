"""Request validation in-process, for shapes no config that loads can reach end to end."""
from __future__ import annotations

from pathlib import Path

import pytest

from triton_shm._proto import model_config_pb2 as mc
from triton_shm.core.models.version import ModelVersion
from triton_shm.core.data.types import InferRequest, InputTensor, RequestedOutput
from triton_shm.core.models.validation import checked_plan, format_shape, plain_plan, validate_request
from triton_shm.errors import InvalidArgument, TritonShmError


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


# -- the plain-request path ------------------------------------------------------------
def _two_input_model(dims: list[int], max_batch_size: int, datatype: int = mc.TYPE_FP32,
                     optional: bool = False) -> ModelVersion:
    config = mc.ModelConfig(name="m", max_batch_size=max_batch_size,
                            input=[mc.ModelInput(name="A", data_type=datatype, dims=dims),
                                   mc.ModelInput(name="B", data_type=datatype, dims=dims, optional=optional)],
                            output=[mc.ModelOutput(name="X", data_type=datatype, dims=dims),
                                    mc.ModelOutput(name="Y", data_type=datatype, dims=dims)])
    mv = ModelVersion("m", 1, Path("."), config)
    mv.set_config(config)
    return mv


def _inp(name: str, shape: list[int], nbytes: int | None = None, datatype: str = "FP32", view: bool = False,
         **parameters) -> InputTensor:
    data = bytes(nbytes if nbytes is not None else 4 * _count(shape))
    return InputTensor(name, datatype, shape, memoryview(data) if view else data, dict(parameters))


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


FLAT, BATCHED = _two_input_model([4], 0), _two_input_model([4], 8)
OPTIONAL_B = _two_input_model([4], 0, optional=True)
VARIABLE, STRINGS = _two_input_model([-1], 0), _two_input_model([4], 0, datatype=mc.TYPE_STRING)
SHM = {"shared_memory_region": "r", "shared_memory_byte_size": 16}

# (model, inputs, outputs, takes the plain path)
CASES = [
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [], True),
    (FLAT, [_inp("B", [4]), _inp("A", [4], view=True)], [], True),
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("Y"), RequestedOutput("X", {"binary_data": True})], True),
    (FLAT, [_inp("A", [4]), _inp("B", [4], binary_data=True)], [], True),
    (OPTIONAL_B, [_inp("A", [4])], [], True),
    (OPTIONAL_B, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("X")], True),
    (BATCHED, [_inp("A", [3, 4]), _inp("B", [3, 4])], [], True),
    (BATCHED, [_inp("A", [8, 4]), _inp("B", [8, 4], view=True)], [], True),
    # everything else goes through every check (and most fail)
    (FLAT, [_inp("A", [4]), _inp("A", [4])], [], False),
    (FLAT, [_inp("A", [4])], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4]), _inp("C", [4])], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4], datatype="INT32")], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [5])], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [1, 4])], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4], nbytes=12)], [], False),
    (FLAT, [_inp("A", [4]), InputTensor("B", "FP32", [4])], [], False),
    (FLAT, [_inp("A", [4]), InputTensor("B", "FP32", [4], parameters=dict(SHM))], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4], **SHM)], [], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("Z")], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("X"), RequestedOutput("X")], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("X", {"classification": 2})], False),
    (FLAT, [_inp("A", [4]), _inp("B", [4])], [RequestedOutput("X", dict(SHM))], False),
    (BATCHED, [_inp("A", [0, 4]), _inp("B", [0, 4])], [], False),
    (BATCHED, [_inp("A", [9, 4]), _inp("B", [9, 4])], [], False),
    (BATCHED, [_inp("A", [2, 4]), _inp("B", [3, 4])], [], False),
    (BATCHED, [_inp("A", [4]), _inp("B", [4])], [], False),
    (BATCHED, [_inp("A", []), _inp("B", [])], [], False),
    (BATCHED, [_inp("A", [2, 4]), _inp("B", [2, 4], nbytes=16)], [], False),
    (VARIABLE, [_inp("A", [4]), _inp("B", [4])], [], False),
    (VARIABLE, [_inp("A", [-1], nbytes=4), _inp("B", [-1], nbytes=4)], [], False),
    (STRINGS, [_inp("A", [4], nbytes=16, datatype="BYTES"), _inp("B", [4], nbytes=16, datatype="BYTES")], [], False),
]


def _outcome(check, model: ModelVersion, request: InferRequest):
    try:
        return check(model, request)
    except TritonShmError as e:
        return type(e), e.message


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_plain_request_gets_the_plan_every_check_gives(case):
    """plain_plan only skips checks: where it answers, checked_plan gives the same plan;
    validate_request always answers (or fails) as checked_plan does."""
    model, inputs, outputs, plain = CASES[case]
    request = InferRequest("m", id="r1", inputs=inputs, outputs=outputs)
    fast = plain_plan(model, request)
    assert (fast is not None) == plain
    full = _outcome(checked_plan, model, request)
    if fast is not None:
        assert fast == full
    assert _outcome(validate_request, model, request) == full
