# cython: language_level=3, boundscheck=False, wraparound=False
"""ModelInferRequest/ModelInferResponse in their common shape, in C. Twin of
``infer_wire_py`` (its docstring says what the common shape is); same API and results."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from ...core.data.types import InferRequest, InputTensor, RequestedOutput
from .infer_wire_py import FRAMED, PLAIN, SPLIT_THRESHOLD, STREAM

cdef Py_ssize_t _SPLIT = SPLIT_THRESHOLD
cdef int _FRAMED = FRAMED
cdef int _STREAM = STREAM
cdef object _InputTensor = InputTensor
cdef object _RequestedOutput = RequestedOutput
cdef object _InferRequest = InferRequest
cdef bytes _FINAL_KEY = b"triton_final_response"


# -- decoding: each reader returns the new position, or -1 for "not the common shape" ----------
cdef inline Py_ssize_t _varint(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, uint64_t *out) noexcept:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while pos < end:
        b = p[pos]
        pos += 1
        if shift == 63 and b > 1:  # past 64 bits: the protobuf parser's call
            return -1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = result
            return pos
        shift += 7
    return -1


cdef inline Py_ssize_t _length(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *start) noexcept:
    """A length-delimited field: its start in ``start``, its end returned."""
    cdef uint64_t size
    pos = _varint(p, pos, end, &size)
    if pos < 0 or size > <uint64_t>(end - pos):
        return -1
    start[0] = pos
    return pos + <Py_ssize_t>size


cdef inline object _text(const unsigned char *p, Py_ssize_t start, Py_ssize_t end):
    """The UTF-8 text, or None when it is not valid UTF-8."""
    try:
        return PyUnicode_DecodeUTF8(<const char *>p + start, end - start, NULL)
    except UnicodeDecodeError:
        return None


cdef object _input(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end):
    cdef object name = "", datatype = "", text
    cdef list shape = []
    cdef uint64_t tag, value
    cdef Py_ssize_t start
    while pos < end:
        pos = _varint(p, pos, end, &tag)
        if pos < 0:
            return None
        if tag == 0x18:  # shape, one unpacked element
            pos = _varint(p, pos, end, &value)
            if pos < 0:
                return None
            shape.append(<int64_t>value)
            continue
        if tag & 7 != 2:
            return None
        pos = _length(p, pos, end, &start)
        if pos < 0:
            return None
        if tag == 0x1A:  # shape, packed
            while start < pos:
                start = _varint(p, start, pos, &value)
                if start < 0:
                    return None
                shape.append(<int64_t>value)
        elif tag == 0x0A or tag == 0x12:
            text = _text(p, start, pos)
            if text is None:
                return None
            if tag == 0x0A:
                name = text
            else:
                datatype = text
        else:  # parameters, contents, unknown fields
            return None
    return _InputTensor(name, datatype, shape, None, {})


cdef object _output(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end):
    cdef object name = ""
    cdef uint64_t tag
    cdef Py_ssize_t start
    while pos < end:
        pos = _varint(p, pos, end, &tag)
        if pos < 0 or tag != 0x0A:  # parameters, unknown fields
            return None
        pos = _length(p, pos, end, &start)
        if pos < 0:
            return None
        name = _text(p, start, pos)
        if name is None:
            return None
    return _RequestedOutput(name, {})


cdef object _decode(object message, const unsigned char *p, Py_ssize_t end):
    cdef Py_ssize_t pos = 0, start, i
    cdef uint64_t tag
    cdef object model = "", version = "", request_id = "", item, view
    cdef list inputs = [], outputs = [], raw = []
    while pos < end:
        pos = _varint(p, pos, end, &tag)
        if pos < 0 or tag & 7 != 2:
            return None
        pos = _length(p, pos, end, &start)
        if pos < 0:
            return None
        if tag == 0x3A:
            raw.append((start, pos))
            continue
        if tag == 0x2A:
            item = _input(p, start, pos)
            if item is None:
                return None
            inputs.append(item)
        elif tag == 0x32:
            item = _output(p, start, pos)
            if item is None:
                return None
            outputs.append(item)
        elif tag == 0x0A or tag == 0x12 or tag == 0x1A:
            item = _text(p, start, pos)
            if item is None:
                return None
            if tag == 0x0A:
                model = item
            elif tag == 0x12:
                version = item
            else:
                request_id = item
        else:  # parameters, unknown fields
            return None
    if raw:
        if len(raw) != len(inputs):  # the protobuf path words the error
            return None
        if end >= _SPLIT:
            view = memoryview(message).cast("B")
            for i in range(len(raw)):
                inputs[i].data = view[raw[i][0]:raw[i][1]]
        else:
            for i in range(len(raw)):
                start, pos = raw[i]
                inputs[i].data = PyBytes_FromStringAndSize(<const char *>p + start, pos - start)
    return _InferRequest(model, version, request_id, {}, inputs, outputs)


def decode_request(message):
    """The InferRequest of a ModelInferRequest in the common shape, else None."""
    cdef Py_buffer buf
    PyObject_GetBuffer(message, &buf, PyBUF_SIMPLE)
    try:
        return _decode(message, <const unsigned char *>buf.buf, buf.len)
    finally:
        PyBuffer_Release(&buf)


# -- encoding ---------------------------------------------------------------------------------
cdef inline Py_ssize_t _varint_size(uint64_t v) noexcept:
    cdef Py_ssize_t n = 1
    while v > 0x7F:
        v >>= 7
        n += 1
    return n


cdef inline char *_put_varint(char *w, uint64_t v) noexcept:
    while v > 0x7F:
        w[0] = <char>((v & 0x7F) | 0x80)
        w += 1
        v >>= 7
    w[0] = <char>v
    return w + 1


cdef inline Py_ssize_t _field_size(Py_ssize_t n) noexcept:
    """A length-delimited field of ``n`` bytes with a one-byte tag; proto3 leaves an empty one out."""
    return 1 + _varint_size(n) + n if n else 0


cdef inline char *_put_field(char *w, char tag, const char *data, Py_ssize_t n) noexcept:
    if n:
        w[0] = tag
        w = _put_varint(w + 1, n)
        memcpy(w, data, n)
        w += n
    return w


cdef inline const char *_utf8(object text, Py_ssize_t *n) except? NULL:
    """The UTF-8 of a str, or NULL (no exception set) for anything else."""
    if type(text) is not str:
        return NULL
    try:
        return PyUnicode_AsUTF8AndSize(text, n)
    except UnicodeEncodeError:
        return NULL


cdef struct OutputPlan:
    const char *name
    Py_ssize_t name_len
    const char *datatype
    Py_ssize_t datatype_len
    Py_ssize_t shape_len  # bytes of the packed shape
    Py_ssize_t tensor_len  # bytes of the InferOutputTensor message
    Py_buffer data
    bint has_data


cdef Py_ssize_t _plan_output(OutputPlan *o, object out) except -2:
    """Fill ``o`` from ``out``; its bytes in the message, or -1 when it is not the common shape."""
    cdef int64_t d
    o.name = _utf8(out.name, &o.name_len)
    o.datatype = _utf8(out.datatype, &o.datatype_len)
    if o.name == NULL or o.datatype == NULL or out.parameters:
        return -1
    o.shape_len = 0
    for dim in out.shape:
        try:
            d = dim.__index__()
        except (AttributeError, TypeError, OverflowError):
            return -1
        o.shape_len += _varint_size(<uint64_t>d)
    try:
        PyObject_GetBuffer(out.data, &o.data, PyBUF_SIMPLE)
    except (TypeError, BufferError):
        return -1
    o.has_data = True
    o.tensor_len = _field_size(o.name_len) + _field_size(o.datatype_len) + _field_size(o.shape_len)
    return (1 + _varint_size(o.tensor_len) + o.tensor_len) + (1 + _varint_size(o.data.len) + o.data.len)


cdef char *_put_output(char *w, OutputPlan *o, object out):
    cdef int64_t d
    w[0] = b"\x2a"
    w = _put_varint(w + 1, o.tensor_len)
    w = _put_field(w, b"\x0a", o.name, o.name_len)
    w = _put_field(w, b"\x12", o.datatype, o.datatype_len)
    if o.shape_len:
        w[0] = b"\x1a"
        w = _put_varint(w + 1, o.shape_len)
        for dim in out.shape:
            d = dim.__index__()
            w = _put_varint(w, <uint64_t>d)
    return w


def encode_response(resp, final, int mode):
    """The ModelInferResponse of ``resp`` (``mode``: PLAIN, FRAMED or STREAM) with the
    final flag when ``final`` is not None, or None when ``resp`` carries parameters
    or data that is not a flat buffer. Does not release ``resp``."""
    cdef Py_ssize_t model_len, version_len, id_len, size, total, i, n, part
    cdef Py_ssize_t final_entry = 0
    cdef const char *model
    cdef const char *version
    cdef const char *rid
    cdef OutputPlan *plans
    cdef char *w
    cdef bytes result
    if resp.parameters:
        return None
    model = _utf8(resp.model_name, &model_len)
    version = _utf8(resp.model_version, &version_len)
    rid = _utf8(resp.id, &id_len)
    if model == NULL or version == NULL or rid == NULL:
        return None
    outputs = resp.outputs
    n = len(outputs)
    plans = <OutputPlan *>malloc(sizeof(OutputPlan) * n if n else 1)
    if plans == NULL:
        raise MemoryError()
    for i in range(n):
        plans[i].has_data = False
    try:
        size = _field_size(model_len) + _field_size(version_len) + _field_size(id_len)
        if final is not None:  # parameters{"triton_final_response": bool_param}
            final_entry = _field_size(len(_FINAL_KEY)) + 4
            size += 1 + _varint_size(final_entry) + final_entry
        for i in range(n):
            part = _plan_output(&plans[i], outputs[i])
            if part < 0:
                return None
            size += part
        if mode == _FRAMED:
            total = 5 + size
        elif mode == _STREAM:
            total = 1 + _varint_size(size) + size
        else:
            total = size
        result = PyBytes_FromStringAndSize(NULL, total)
        w = PyBytes_AS_STRING(result)
        if mode == _FRAMED:
            w[0] = 0
            w[1] = <char>((size >> 24) & 0xFF)
            w[2] = <char>((size >> 16) & 0xFF)
            w[3] = <char>((size >> 8) & 0xFF)
            w[4] = <char>(size & 0xFF)
            w += 5
        elif mode == _STREAM:
            w[0] = b"\x12"
            w = _put_varint(w + 1, size)
        w = _put_field(w, b"\x0a", model, model_len)
        w = _put_field(w, b"\x12", version, version_len)
        w = _put_field(w, b"\x1a", rid, id_len)
        if final is not None:
            w[0] = b"\x22"
            w = _put_varint(w + 1, final_entry)
            w = _put_field(w, b"\x0a", PyBytes_AS_STRING(_FINAL_KEY), len(_FINAL_KEY))
            w[0], w[1], w[2], w[3] = 0x12, 0x02, 0x08, 1 if final else 0
            w += 4
        for i in range(n):
            w = _put_output(w, &plans[i], outputs[i])
        for i in range(n):  # one entry per output, even empty ones: tritonclient indexes by position
            w[0] = b"\x32"
            w = _put_varint(w + 1, plans[i].data.len)
            memcpy(w, plans[i].data.buf, plans[i].data.len)
            w += plans[i].data.len
        return result
    finally:
        for i in range(n):
            if plans[i].has_data:
                PyBuffer_Release(&plans[i].data)
        free(plans)
