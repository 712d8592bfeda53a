"""The request and response types, both twins (``core/data/types_py.py`` and the C classes
of ``core/data/_types.pyx``): the same fields, defaults (a fresh dict or list per object),
equality, repr, parameter filtering and one-shot release."""
from __future__ import annotations

import pytest

from triton_shm.core.data import types_py

from .helpers import twin_params

try:
    from triton_shm.core.data import _types
except ImportError:  # not built
    _types = None

IMPLEMENTATIONS = twin_params(types_py, _types)


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_defaults_are_fresh_per_object(m):
    a, b = m.InferRequest("add_sub"), m.InferRequest("add_sub")
    assert (a.model_version, a.id, a.parameters, a.inputs, a.outputs) == ("", "", {}, [], [])
    a.parameters["k"] = 1
    a.inputs.append(m.InputTensor("INPUT0", "FP32", [16]))
    assert b.parameters == {} and b.inputs == []
    t = m.InputTensor("INPUT0", "FP32", [16])
    assert (t.data, t.parameters) == (None, {})
    o = m.OutputTensor("OUTPUT0", "FP32", [16], b"")
    assert (o.parameters, o.in_shared_memory, o.shm_byte_size) == ({}, False, 0)
    r = m.InferResponse("add_sub", "1")
    assert (r.id, r.parameters, r.outputs, r._release) == ("", {}, [], None)
    assert m.RequestedOutput("OUTPUT0").parameters == {}


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_keywords_equality_and_repr_match_the_dataclasses(m):
    args = dict(model_name="add_sub", model_version="1", id="7", parameters={"p": True},
                inputs=[m.InputTensor(name="INPUT0", datatype="FP32", shape=[2], data=b"\0" * 8, parameters={"x": 1})],
                outputs=[m.RequestedOutput(name="OUTPUT0", parameters={"binary_data": True})])
    reference = types_py.InferRequest(**{**args, "inputs": [types_py.InputTensor("INPUT0", "FP32", [2], b"\0" * 8,
                                                                                 {"x": 1})],
                                         "outputs": [types_py.RequestedOutput("OUTPUT0", {"binary_data": True})]})
    request = m.InferRequest(**args)
    assert repr(request) == repr(reference)
    assert request == m.InferRequest(**args)
    assert request != m.InferRequest(**{**args, "id": "8"})
    assert request != reference or m is types_py  # another class is never equal
    out = m.OutputTensor("OUTPUT0", "FP32", [2], b"", in_shared_memory=True, shm_byte_size=8)
    assert repr(out) == repr(types_py.OutputTensor("OUTPUT0", "FP32", [2], b"", in_shared_memory=True,
                                                   shm_byte_size=8))
    with pytest.raises(TypeError):
        hash(out)
    with pytest.raises(AttributeError):
        out.other = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_model_parameters_leave_out_the_reserved(m):
    request = m.InferRequest("add_sub", parameters={"priority": 1, "sequence_id": 2, "triton_x": 3, "mine": "v",
                                                    "binary_data_output": True})
    assert request.model_parameters() == {"mine": "v"}
    assert m.InferRequest("add_sub").model_parameters() == {}


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_release_runs_once(m):
    calls: list[int] = []
    response = m.InferResponse(model_name="add_sub", model_version="1", _release=lambda: calls.append(1))
    response.release()
    response.release()
    assert calls == [1] and response._release is None
