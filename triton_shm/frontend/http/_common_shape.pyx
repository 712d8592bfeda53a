# cython: language_level=3, boundscheck=False, wraparound=False
"""The infer request and response in their common shape, in C. Twin of ``common_shape_py``
(its docstring says what the common shape is); same API and results."""
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.object cimport PyObject

import orjson

from ...core.datatypes import DATATYPES
from ...core.types import InferRequest, InputTensor, RequestedOutput
from .common_shape_py import INPUT_KEYS, INT64_MAX, JSON_OPTS, OUTPUT_KEYS, REQUEST_KEYS

cdef object _InferRequest = InferRequest
cdef object _InputTensor = InputTensor
cdef object _RequestedOutput = RequestedOutput
cdef frozenset _REQUEST_KEYS = REQUEST_KEYS
cdef frozenset _INPUT_KEYS = INPUT_KEYS
cdef frozenset _OUTPUT_KEYS = OUTPUT_KEYS
cdef frozenset _DATATYPES = DATATYPES
cdef object _INT64_MAX = INT64_MAX
cdef object _dumps = orjson.dumps
cdef object _JSON_OPTS = JSON_OPTS


cdef inline object _get(dict d, str key):
    cdef PyObject *v = PyDict_GetItem(d, key)
    return <object>v if v is not NULL else None


cdef bint _keys_within(dict d, frozenset known):
    cdef Py_ssize_t pos = 0
    cdef PyObject *k
    cdef PyObject *v
    while PyDict_Next(d, &pos, &k, &v):
        if <object>k not in known:
            return False
    return True


cdef object _scalar_params(object value):
    """``value`` as parameters (None -> {}), or None when it is not an object of scalars."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *k
    cdef PyObject *v
    cdef type t
    if value is None:
        return {}
    if type(value) is not dict:
        return None
    while PyDict_Next(value, &pos, &k, &v):
        t = type(<object>v)
        if t is not bool and t is not int and t is not float and t is not str:
            return None
    return value


cdef object _shape(object value):
    if type(value) is not list:
        return None
    for d in <list>value:
        if type(d) is not int or d < 0 or d > _INT64_MAX:
            return None
    return value


def decode_common(doc, str model_name, str model_version, view, Py_ssize_t header_length):
    cdef dict d, item, tensor_params
    cdef Py_ssize_t size, offset, n
    if type(doc) is not dict:
        return None
    d = <dict>doc
    if not _keys_within(d, _REQUEST_KEYS):
        return None
    request_id = d.get("id", "")
    params = _scalar_params(_get(d, "parameters"))
    if type(request_id) is not str or params is None:
        return None
    flag = _get(<dict>params, "binary_data_output")
    if flag is not None and type(flag) is not bool:
        return None
    inputs = _get(d, "inputs")
    if type(inputs) is not list:
        return None
    size = len(view)
    offset = header_length
    tensors = []
    for entry in <list>inputs:
        if type(entry) is not dict:
            return None
        item = <dict>entry
        if not _keys_within(item, _INPUT_KEYS):
            return None
        name = _get(item, "name")
        datatype = _get(item, "datatype")
        shape = _shape(_get(item, "shape"))
        p = _scalar_params(_get(item, "parameters"))
        if (type(name) is not str or type(datatype) is not str or datatype not in _DATATYPES or shape is None
                or p is None):
            return None
        tensor_params = <dict>p
        if "shared_memory_region" in tensor_params:
            return None
        nbytes = _get(tensor_params, "binary_data_size")
        if type(nbytes) is not int or nbytes < 0 or nbytes > size - offset:
            return None
        n = nbytes
        # binary_data_size is framing only: the tensor keeps the other parameters.
        if len(tensor_params) > 1:
            rest = {k: v for k, v in tensor_params.items() if k != "binary_data_size"}
        else:
            rest = {}
        tensors.append(_InputTensor(name, datatype, shape, view[offset:offset + n], rest))
        offset += n
    if offset != size:
        return None
    outputs = _get(d, "outputs")
    requested = []
    if outputs is not None:
        if type(outputs) is not list:
            return None
        for entry in <list>outputs:
            if type(entry) is not dict:
                return None
            item = <dict>entry
            if not _keys_within(item, _OUTPUT_KEYS):
                return None
            name = _get(item, "name")
            p = _scalar_params(_get(item, "parameters"))
            if type(name) is not str or p is None:
                return None
            flag = _get(<dict>p, "binary_data")
            if flag is not None and type(flag) is not bool:
                return None
            requested.append(_RequestedOutput(name, p))
    return _InferRequest(model_name, model_version, request_id, params, tensors, requested)


def encode_common(response, request):
    cdef list listed = request.outputs
    cdef dict requested = None
    cdef dict entry, params
    cdef list outputs = [], parts = [b""]
    cdef bint default_binary
    cdef Py_ssize_t nbytes
    if listed:
        requested = {o.name: o.parameters for o in listed}
    default_binary = (<dict>request.parameters).get("binary_data_output", False) is True
    for out in response.outputs:
        shape = out.shape
        entry = {"name": out.name, "datatype": out.datatype, "shape": shape if type(shape) is list else list(shape)}
        if out.in_shared_memory:  # the data went to the client's region: no data, as Triton
            if out.parameters:
                entry["parameters"] = out.parameters
        else:
            req = requested.get(out.name) if requested is not None else None
            if not (req.get("binary_data", False) if req is not None else default_binary):
                return None
            data = out.data
            nbytes = len(<bytes>data) if type(data) is bytes else memoryview(data).nbytes
            if out.parameters:
                params = dict(out.parameters)
                params["binary_data_size"] = nbytes
            else:
                params = {"binary_data_size": nbytes}
            entry["parameters"] = params
            parts.append(data)
        outputs.append(entry)
    if len(parts) == 1:
        return None
    doc = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = _dumps(doc, option=_JSON_OPTS)
    parts[0] = header
    return b"".join(parts), len(<bytes>header)
