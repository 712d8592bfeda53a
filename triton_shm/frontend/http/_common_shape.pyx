# cython: language_level=3, boundscheck=False, wraparound=False
"""The infer request and response in their common shape, in C. Twin of ``common_shape_py``
(its docstring says what the common shape is); same API and results.

It reads and builds the core types as the C classes of ``core/data/_types`` (cimported: fields
are struct members, an object is built without a Python call), so it serves only where
``core.data.types`` picked those classes (``common_shape`` sees to it); given other objects it
leaves the response to the general encoder."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_Next
from cpython.long cimport PyLong_AsLongLong
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_1BYTE_KIND, PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.string cimport memcmp, memcpy

import orjson

from ...core.data.datatypes import DATATYPES
from ...core.data._types cimport InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from .common_shape_py import INPUT_KEYS, INT64_MAX, JSON_OPTS, OUTPUT_KEYS, REQUEST_KEYS, UINT64_MAX

cdef frozenset _REQUEST_KEYS = REQUEST_KEYS
cdef frozenset _INPUT_KEYS = INPUT_KEYS
cdef frozenset _OUTPUT_KEYS = OUTPUT_KEYS
cdef frozenset _DATATYPES = DATATYPES
cdef object _INT64_MAX = INT64_MAX
cdef object _UINT64_MAX = UINT64_MAX
cdef object _dumps = orjson.dumps
cdef object _loads = orjson.loads
cdef object _JSONDecodeError = orjson.JSONDecodeError
cdef object _JSON_OPTS = JSON_OPTS


# Builders of the core types: tp_new (each field None) and the fields as __init__ sets them.
cdef inline InputTensor _input(object name, object datatype, object shape, object data, dict parameters):
    cdef InputTensor t = InputTensor.__new__(InputTensor)
    t.name, t.datatype, t.shape, t.data, t.parameters = name, datatype, shape, data, parameters
    return t


cdef inline RequestedOutput _requested(object name, dict parameters):
    cdef RequestedOutput r = RequestedOutput.__new__(RequestedOutput)
    r.name, r.parameters = name, parameters
    return r


cdef inline InferRequest _request(str model, str version, object id, dict parameters, list inputs, list outputs):
    cdef InferRequest r = InferRequest.__new__(InferRequest)
    r.model_name, r.model_version, r.id = model, version, id
    r.parameters, r.inputs, r.outputs = parameters, inputs, outputs
    return r


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


cdef bint _controls_ok(dict params):
    """Whether the sequence controls among the parameters have types they take, and no key
    starts with "triton_" (the general parser refuses the others in Triton's words)."""
    for key in params:
        if type(key) is str and (<str>key).startswith("triton_"):
            return False
    value = _get(params, "sequence_id")
    if value is not None and type(value) is not str and (type(value) is not int or value < 0
                                                         or value > _UINT64_MAX):
        return False
    value = _get(params, "sequence_start")
    if value is not None and type(value) is not bool:
        return False
    value = _get(params, "sequence_end")
    return value is None or type(value) is bool


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
    if params and not _controls_ok(<dict>params):
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
        tensors.append(_input(name, datatype, shape, view[offset:offset + n], rest))
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
            requested.append(_requested(name, <dict>p))
    return _request(model_name, model_version, request_id, <dict>params, tensors, requested)


def encode_common(response, request):
    cdef InferResponse res
    cdef InferRequest asked
    cdef OutputTensor out
    cdef RequestedOutput r
    cdef list listed
    cdef dict requested = None
    cdef dict entry, params
    cdef list outputs = [], parts = [b""]
    cdef bint default_binary
    cdef Py_ssize_t nbytes
    if type(response) is not InferResponse or type(request) is not InferRequest:
        return None  # not the C classes (the twins'): the general encoder
    res, asked = <InferResponse>response, <InferRequest>request
    listed = asked.outputs
    if listed:
        requested = {}
        for item in listed:
            if type(item) is not RequestedOutput:
                return None
            r = <RequestedOutput>item
            requested[r.name] = r.parameters
    default_binary = (<dict>asked.parameters).get("binary_data_output", False) is True
    for item in res.outputs:
        if type(item) is not OutputTensor:
            return None
        out = <OutputTensor>item
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
    if res.id:
        doc["id"] = res.id
    doc["model_name"] = res.model_name
    doc["model_version"] = res.model_version
    if res.parameters:
        doc["parameters"] = res.parameters
    doc["outputs"] = outputs
    header = _dumps(doc, option=_JSON_OPTS)
    parts[0] = header
    return b"".join(parts), len(<bytes>header)



# -- one infer route of the lean HTTP path (RouteCodec; the twin's docstring says what it does) --
cdef enum:
    _MAX_SHAPES = 8       # request headers kept per route (a client sends one or a few) ...
    _MAX_KEPT_HEADER = 4096  # ... each of at most this size: at most 32 KiB of them per route
    _MAX_NAMES = 64       # output names kept per route
    _MAX_OUTPUTS = 16     # binary outputs one response is built for here
    _JSON_CAP = 4096      # the response's JSON header, at most (else the general encoder)
    _HEAD_CAP = 512       # the response head
    _COPY_BELOW = 4096    # an input up to this size is copied out of the body, a larger one viewed

cdef bytes _HEAD_START = b"HTTP/1.1 200 OK\r\nDate: "
cdef bytes _HEAD_TYPE = b"\r\nContent-Type: application/octet-stream\r\nContent-Length: "
cdef bytes _HEAD_JSON = b"\r\nInference-Header-Content-Length: "


cdef Py_ssize_t _digits(object s) noexcept:
    """The value of a str of 1 to 18 ASCII digits, else -1."""
    cdef Py_ssize_t n, i, v = 0
    cdef const unsigned char* d
    if type(s) is not str:
        return -1
    n = PyUnicode_GET_LENGTH(s)
    if n == 0 or n > 18 or PyUnicode_KIND(s) != PyUnicode_1BYTE_KIND:
        return -1
    d = <const unsigned char*>PyUnicode_DATA(s)
    for i in range(n):
        if d[i] < 48 or d[i] > 57:
            return -1
        v = v * 10 + (d[i] - 48)
    return v


cdef inline dict _fresh(dict d):
    return PyDict_Copy(d) if d else {}


cdef class _RequestShape:
    """A common-shape request decoded once: what the next body with the same JSON header
    (and size) decodes to, bar the tensors' data. Each request gets fresh shape lists and
    parameter dicts, as parsing would give it."""
    cdef bytes key       # the JSON header
    cdef Py_ssize_t size
    cdef dict parameters
    cdef list inputs     # (name, datatype, shape, parameters, nbytes)
    cdef list outputs    # (name, parameters)

    cdef object build(self, str model, str version, bytes body, Py_ssize_t offset):
        cdef tuple t
        cdef Py_ssize_t n
        view = None
        tensors = []
        for entry in self.inputs:
            t = <tuple>entry
            n = t[4]
            if n <= _COPY_BELOW:  # a copy of a few bytes costs less than a view of them
                data = PyBytes_FromStringAndSize(PyBytes_AS_STRING(body) + offset, n)
            else:
                if view is None:
                    view = memoryview(body)
                data = view[offset:offset + n]
            tensors.append(_input(t[0], t[1], list(<list>t[2]), data, _fresh(<dict>t[3])))
            offset += n
        requested = [_requested(<str>(<tuple>o)[0], _fresh(<dict>(<tuple>o)[1])) for o in self.outputs]
        return _request(model, version, "", _fresh(self.parameters), tensors, requested)


cdef _RequestShape _shape_of(InferRequest request, bytes key, Py_ssize_t size):
    """What ``request`` (as decode_common built it) keeps for the next body like it."""
    cdef _RequestShape s = _RequestShape.__new__(_RequestShape)
    cdef InputTensor t
    cdef RequestedOutput o
    s.key = key
    s.size = size
    s.parameters = _fresh(request.parameters)
    s.inputs = []
    for item in <list>request.inputs:
        t = <InputTensor>item
        s.inputs.append((t.name, t.datatype, list(t.shape), _fresh(t.parameters), len(t.data)))
    s.outputs = []
    for item in <list>request.outputs:
        o = <RequestedOutput>item
        s.outputs.append((o.name, _fresh(o.parameters)))
    return s


cdef struct _Out:
    char* buf
    Py_ssize_t pos
    Py_ssize_t cap
    bint full           # something did not fit: the result is not used


cdef inline void _put(_Out* o, const char* s, Py_ssize_t n) noexcept:
    if o.pos + n > o.cap:
        o.full = True
        return
    memcpy(o.buf + o.pos, s, n)
    o.pos += n


cdef inline void _put_bytes(_Out* o, bytes b) noexcept:
    _put(o, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


cdef void _put_int(_Out* o, long long v) noexcept:
    """``v`` in decimal, as JSON (and orjson) write it."""
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long u = <unsigned long long>(-(v + 1)) + 1 if v < 0 else <unsigned long long>v
    while True:
        i -= 1
        digits[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if v < 0:
        i -= 1
        digits[i] = b'-'
    _put(o, digits + i, 24 - i)


cdef class RouteCodec:
    cdef readonly str model, version
    cdef dict _requests        # JSON header bytes -> _RequestShape
    cdef _RequestShape _last   # the one decoded last
    cdef dict _names           # output name -> (datatype, b'{"name":...,"datatype":...,"shape":[')
    cdef object _reply_model, _reply_version
    cdef bytes _reply_prefix   # b'"model_name":...,"model_version":...'

    def __init__(self, str model, str version):
        self.model = model
        self.version = version
        self._requests = {}
        self._names = {}

    def decode(self, body, header_length):
        cdef Py_ssize_t n, size
        cdef PyObject* known
        cdef _RequestShape shape
        if header_length is None or type(body) is not bytes:
            return None
        size = PyBytes_GET_SIZE(body)
        n = _digits(header_length)
        if n < 0:  # not plain digits: int() reads it, as the general path does
            try:
                length = int(header_length)
            except ValueError:
                return None
            if not 0 < length < size:
                return None
            n = length
        elif not 0 < n < size:
            return None
        # The header decoded last first (a client sends one again and again), then the others.
        shape = self._last
        if shape is None or PyBytes_GET_SIZE(shape.key) != n or \
                memcmp(PyBytes_AS_STRING(shape.key), PyBytes_AS_STRING(body), n) != 0:
            key = PyBytes_FromStringAndSize(PyBytes_AS_STRING(body), n)
            known = PyDict_GetItem(self._requests, key)
            if known is NULL:
                return self._decode_new(key, body, size)
            shape = <_RequestShape>known
            self._last = shape
        # The same header decodes alike; a body of another size is not the common shape.
        if shape.size != size:
            return None
        return shape.build(self.model, self.version, body, n)

    cdef object _decode_new(self, bytes key, bytes body, Py_ssize_t size):
        """A header not seen before: parsed, decoded and, unless it has an id (new with every
        request), kept."""
        try:
            doc = _loads(key)
        except _JSONDecodeError:
            return None
        request = decode_common(doc, self.model, self.version, memoryview(body), PyBytes_GET_SIZE(key))
        if request is not None and "id" not in <dict>doc and PyBytes_GET_SIZE(key) <= _MAX_KEPT_HEADER:
            if len(self._requests) >= _MAX_SHAPES:
                self._requests.clear()
            shape = _shape_of(request, key, size)
            self._requests[key] = shape
            self._last = shape
        return request

    def respond(self, response, request, bytes date, bytes connection):
        cdef char json[_JSON_CAP]
        cdef char head[_HEAD_CAP]
        cdef _Out o
        cdef _Out h
        cdef Py_buffer blobs[_MAX_OUTPUTS]
        cdef int nblobs = 0, i
        cdef Py_ssize_t body_size
        cdef char* at
        if type(response) is not InferResponse or type(request) is not InferRequest:
            return None  # not the C classes (the twins'): the general encoder
        o.buf, o.pos, o.cap, o.full = json, 0, _JSON_CAP, False
        try:
            if not self._json(&o, <InferResponse>response, <InferRequest>request, blobs, &nblobs) or o.full:
                return None
            body_size = o.pos
            for i in range(nblobs):
                body_size += blobs[i].len
            h.buf, h.pos, h.cap, h.full = head, 0, _HEAD_CAP, False
            _put_bytes(&h, _HEAD_START)
            _put_bytes(&h, date)
            _put_bytes(&h, _HEAD_TYPE)
            _put_int(&h, body_size)
            _put_bytes(&h, _HEAD_JSON)
            _put_int(&h, o.pos)
            _put(&h, b"\r\n", 2)
            _put_bytes(&h, connection)
            _put(&h, b"\r\n", 2)
            if h.full:
                return None
            result = PyBytes_FromStringAndSize(NULL, h.pos + body_size)
            at = PyBytes_AS_STRING(result)
            memcpy(at, head, h.pos)
            at += h.pos
            memcpy(at, json, o.pos)
            at += o.pos
            for i in range(nblobs):
                memcpy(at, blobs[i].buf, blobs[i].len)
                at += blobs[i].len
            return result
        finally:
            for i in range(nblobs):
                PyBuffer_Release(&blobs[i])

    cdef bint _json(self, _Out* o, InferResponse response, InferRequest request, Py_buffer* blobs,
                    int* nblobs) except -1:
        """The JSON header into ``o`` and each output's buffer into ``blobs``: what
        ``encode_common`` writes, the fixed parts of it kept per model and output name.
        False for what is left to the general encoder: an output sent as JSON data, or
        what is not built here (a shape of other than ints, more outputs or JSON than fits)."""
        cdef PyObject* found
        cdef bint first = True, binary, default_binary
        cdef Py_ssize_t dims
        cdef OutputTensor out
        cdef RequestedOutput r
        params = request.parameters
        listed = request.outputs
        outputs = response.outputs
        if type(params) is not dict or type(listed) is not list or type(outputs) is not list:
            return False
        default_binary = _get(<dict>params, "binary_data_output") is True
        _put(o, b"{", 1)
        response_id = response.id
        if response_id:
            _put(o, b'"id":', 5)
            _put_bytes(o, _dumps(response_id, option=_JSON_OPTS))
            _put(o, b",", 1)
        model, version = response.model_name, response.model_version
        if self._reply_prefix is None or model != self._reply_model or version != self._reply_version:
            if type(model) is not str or type(version) is not str:
                return False
            self._reply_prefix = b'"model_name":' + _dumps(model) + b',"model_version":' + _dumps(version)
            self._reply_model, self._reply_version = model, version
        _put_bytes(o, self._reply_prefix)
        response_params = response.parameters
        if response_params:
            _put(o, b',"parameters":', 14)
            _put_bytes(o, _dumps(response_params, option=_JSON_OPTS))
        _put(o, b',"outputs":[', 12)
        for item in <list>outputs:
            if type(item) is not OutputTensor:
                return False
            out = <OutputTensor>item
            name = out.name
            shm = out.in_shared_memory
            if not shm:
                binary = default_binary
                if listed:
                    wanted = None
                    for entry in <list>listed:  # the last one of a name counts, as in a dict of them
                        if type(entry) is not RequestedOutput:
                            return False
                        r = <RequestedOutput>entry
                        if r.name == name:
                            wanted = r.parameters
                    if wanted is not None:
                        if type(wanted) is not dict:
                            return False
                        flag = _get(<dict>wanted, "binary_data")
                        binary = flag is not None and bool(flag)
                if not binary:
                    return False  # JSON data: the general encoder
                if nblobs[0] == _MAX_OUTPUTS:
                    return False
            datatype = out.datatype
            found = PyDict_GetItem(self._names, name) if type(name) is str else NULL
            if found is NULL or (<tuple>found)[0] != datatype:
                if type(name) is not str or type(datatype) is not str:
                    return False
                if len(self._names) >= _MAX_NAMES:
                    self._names.clear()
                self._names[name] = (datatype, b'{"name":' + _dumps(name) + b',"datatype":' + _dumps(datatype)
                                     + b',"shape":[')
                found = PyDict_GetItem(self._names, name)
            if not first:
                _put(o, b",", 1)
            first = False
            _put_bytes(o, <bytes>(<tuple>found)[1])
            shape = out.shape
            if type(shape) is not list and type(shape) is not tuple:
                return False
            dims = 0
            for d in shape:
                if type(d) is not int:
                    return False
                if dims:
                    _put(o, b",", 1)
                dims += 1
                try:
                    _put_int(o, PyLong_AsLongLong(d))
                except OverflowError:
                    return False
            out_params = out.parameters
            if shm:  # the data went to the client's region: no data, as Triton
                if out_params:
                    _put(o, b'],"parameters":', 15)
                    _put_bytes(o, _dumps(out_params, option=_JSON_OPTS))
                    _put(o, b"}", 1)
                else:
                    _put(o, b"]}", 2)
                continue
            try:
                PyObject_GetBuffer(out.data, &blobs[nblobs[0]], PyBUF_SIMPLE)
            except (BufferError, TypeError):  # not one contiguous buffer
                return False
            nblobs[0] += 1
            if out_params:
                sized = dict(out_params)
                sized["binary_data_size"] = blobs[nblobs[0] - 1].len
                _put(o, b'],"parameters":', 15)
                _put_bytes(o, _dumps(sized, option=_JSON_OPTS))
                _put(o, b"}", 1)
            else:
                _put(o, b'],"parameters":{"binary_data_size":', 35)
                _put_int(o, blobs[nblobs[0] - 1].len)
                _put(o, b"}}", 2)
        if nblobs[0] == 0:
            return False
        _put(o, b"]}", 2)
        return True
