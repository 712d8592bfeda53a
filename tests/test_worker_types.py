"""A worker's request and response as backends see them, both twins
(``backends/types_py.py`` and the C classes of ``backends/_types.pyx``): the same fields,
defaults (a fresh dict per object), keywords, equality and repr."""
from __future__ import annotations

import numpy as np
import pytest

from triton_shm.backends import base, types_py
from triton_shm.errors import Internal

from .helpers import twin_params

try:
    from triton_shm.backends import _types
except ImportError:  # not built
    _types = None

IMPLEMENTATIONS = twin_params(types_py, _types)


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_defaults_are_fresh_per_object(m):
    a, b = m.WorkerRequest("1", {}, {}, []), m.WorkerRequest("2", {}, {}, [])
    assert (a.parameters, a.sender, a.is_cancelled, a.correlation_id, a.flags) == ({}, None, None, 0, 0)
    a.parameters["k"] = 1
    assert b.parameters == {}
    r, s = m.WorkerResponse(), m.WorkerResponse()
    assert (r.outputs, r.error) == ({}, None)
    r.outputs["OUTPUT0"] = np.zeros(1)
    assert s.outputs == {}


@pytest.mark.parametrize("m", IMPLEMENTATIONS)
def test_keywords_equality_and_repr_match_the_dataclasses(m):
    args = dict(id="7", inputs={"INPUT0": "a"}, datatypes={"INPUT0": "FP32"}, requested_outputs=["OUTPUT0"],
                parameters={"p": True}, sender=print, is_cancelled=bool, correlation_id="seq", flags=3)
    request = m.WorkerRequest(**args)
    assert repr(request) == repr(types_py.WorkerRequest(**args))
    assert request == m.WorkerRequest(**args)
    assert request != m.WorkerRequest(**{**args, "flags": 1})
    assert request != types_py.WorkerRequest(**args) or m is types_py  # another class is never equal
    request.correlation_id, request.flags = 5, 2  # the worker sets a sequence's after construction
    assert (request.correlation_id, request.flags) == (5, 2)
    error = Internal("failed")
    response = m.WorkerResponse(error=error)
    assert repr(response) == repr(types_py.WorkerResponse(error=error))
    assert response == m.WorkerResponse({}, error) and response != m.WorkerResponse()
    assert m.WorkerResponse({"OUTPUT0": 1}).outputs == {"OUTPUT0": 1}
    with pytest.raises(TypeError):
        hash(response)
    with pytest.raises(AttributeError):
        response.other = 1  # type: ignore[attr-defined]


def test_base_serves_the_built_classes_unless_told_not_to():
    chosen = _types if base.USING_EXTENSION else types_py
    assert (base.WorkerRequest, base.WorkerResponse) == (chosen.WorkerRequest, chosen.WorkerResponse)
