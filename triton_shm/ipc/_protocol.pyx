# cython: language_level=3, boundscheck=False, wraparound=False
"""The frames of ``protocol`` in C. Twin of ``protocol_py``; same API, results and errors."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_1BYTE_DATA, PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    object PyType_GenericAlloc(type t, Py_ssize_t nitems)


# Little-endian integers of 1 to 8 bytes. A fixed-size memcpy on a little-endian host (one
# load or store once inlined with a constant size), bytes shifted one at a time elsewhere.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define TSHM_LITTLE_ENDIAN 1
    #else
    #define TSHM_LITTLE_ENDIAN 0
    #endif
    static inline void tshm_store_le(char *d, uint64_t v, int n) {
        if (TSHM_LITTLE_ENDIAN) {
            switch (n) {
            case 1: d[0] = (char)v; return;
            case 2: { uint16_t x = (uint16_t)v; memcpy(d, &x, 2); return; }
            case 4: { uint32_t x = (uint32_t)v; memcpy(d, &x, 4); return; }
            case 8: memcpy(d, &v, 8); return;
            }
        }
        for (int i = 0; i < n; i++) d[i] = (char)((v >> (8 * i)) & 0xFF);
    }
    static inline uint64_t tshm_load_le(const uint8_t *p, int n) {
        uint64_t v = 0;
        if (TSHM_LITTLE_ENDIAN) {
            switch (n) {
            case 1: return p[0];
            case 2: { uint16_t x; memcpy(&x, p, 2); return x; }
            case 4: { uint32_t x; memcpy(&x, p, 4); return x; }
            case 8: memcpy(&v, p, 8); return v;
            }
        }
        for (int i = 0; i < n; i++) v |= ((uint64_t)p[i]) << (8 * i);
        return v;
    }
    """
    void tshm_store_le(char *d, uint64_t v, int n) noexcept nogil
    uint64_t tshm_load_le(const uint8_t *p, int n) noexcept nogil

import orjson

from ..errors import Internal, InvalidArgument
from .protocol_py import (_ID_TOO_LONG, DATATYPES, MAX_DIMS, MAX_ID, SEQ_BITS, SEQ_END, SEQ_NUMERIC_ID, SEQ_START,
                          SEQ_STRING_ID, TRACED, Message, Op, ProtocolError, RegionDesc, Status)

cdef dict _DTYPE_CODE = {name: i for i, name in enumerate(DATATYPES)}
cdef tuple _DTYPES = DATATYPES
cdef int _N_DTYPES = len(DATATYPES)
cdef type _REGION_DESC = RegionDesc
cdef int _MAX_DIMS = MAX_DIMS
cdef Py_ssize_t _MAX_ID = MAX_ID
cdef int _SEQ_START = SEQ_START, _SEQ_END = SEQ_END, _SEQ_NUMERIC_ID = SEQ_NUMERIC_ID, _SEQ_STRING_ID = SEQ_STRING_ID
cdef int _SEQ_BITS = SEQ_BITS, _TRACED = TRACED
cdef str _ID_TOO_LONG_MESSAGE = _ID_TOO_LONG

# -- encoding: a growing C buffer (Buf), little-endian by construction ----------------------
cdef inline void _init(Buf *b) noexcept:
    b.data, b.len, b.cap = b.small, 0, BUF_SMALL


cdef inline void _drop(Buf *b) noexcept:
    if b.data != b.small:
        free(b.data)


cdef int _reserve(Buf *b, size_t n) except -1:
    cdef size_t cap
    cdef char *data
    if b.len + n <= b.cap:
        return 0
    cap = b.cap * 2
    while cap < b.len + n:
        cap *= 2
    if b.data == b.small:  # leaves the stack: its bytes move to the heap
        data = <char *>malloc(cap)
        if data != NULL:
            memcpy(data, b.small, b.len)
    else:
        data = <char *>realloc(b.data, cap)
    if data == NULL:
        raise MemoryError()
    b.data, b.cap = data, cap
    return 0


cdef inline int _put(Buf *b, const char *p, size_t n) except -1:
    _reserve(b, n)
    memcpy(b.data + b.len, p, n)
    b.len += n
    return 0


cdef inline void _set(Buf *b, uint64_t v, int nbytes) noexcept:
    """``_uint`` where the caller has reserved the room."""
    tshm_store_le(b.data + b.len, v, nbytes)
    b.len += nbytes


cdef inline int _uint(Buf *b, uint64_t v, int nbytes) except -1:
    _reserve(b, nbytes)
    _set(b, v, nbytes)
    return 0


cdef int _str(Buf *b, str s, int len_bytes) except -1:
    """Length then UTF-8 bytes."""
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(s, &n)
    _uint(b, <uint64_t>n, len_bytes)
    _put(b, p, n)
    return 0


cdef int _start(Buf *b, int op, uint64_t msg_id, uint32_t count, object frees) except -1:
    cdef Py_ssize_t nfree = len(frees)
    _uint(b, op, 1)
    _uint(b, 0, 3)
    _uint(b, count, 4)
    _uint(b, <uint64_t>nfree, 4)
    _uint(b, msg_id, 8)
    for seg, offset, size in frees:
        _uint(b, seg, 4)
        _uint(b, offset, 8)
        _uint(b, size, 8)
    return 0


cdef int _tensor(Buf *b, str name, str datatype, object shape, int place, uint32_t seg, uint64_t offset,
                 uint64_t size) except -1:
    cdef Py_ssize_t n, ndim = len(shape)
    cdef const char *p = PyUnicode_AsUTF8AndSize(name, &n)
    cdef uint64_t dtype
    if ndim > _MAX_DIMS:
        raise Internal(f"tensor '{name}' has more than {MAX_DIMS} dimensions")
    dtype = _DTYPE_CODE[datatype]
    _reserve(b, TENSOR_SIZE + 8 * ndim + n)  # the record's room at once
    _set(b, dtype, 1)
    _set(b, <uint64_t>ndim, 1)
    _set(b, place, 1)
    _set(b, 0, 1)
    _set(b, <uint64_t>n, 2)
    _set(b, seg, 4)
    _set(b, offset, 8)
    _set(b, size, 8)
    for d in shape:
        _set(b, <uint64_t><int64_t>d, 8)
    memcpy(b.data + b.len, p, n)
    b.len += n
    return 0


cdef int _output(Buf *b, str name, int place, uint32_t region, uint64_t offset, uint64_t size) except -1:
    cdef Py_ssize_t n
    cdef const char *p = PyUnicode_AsUTF8AndSize(name, &n)
    _uint(b, place, 1)
    _uint(b, <uint64_t>n, 2)
    _uint(b, region, 4)
    _uint(b, offset, 8)
    _uint(b, size, 8)
    _put(b, p, n)
    return 0


cdef int _error(Buf *b, dict error) except -1:
    cdef Py_ssize_t nc, nm
    code = str(error.get("code", "INTERNAL"))
    message = str(error.get("message", ""))
    cdef const char *pc = PyUnicode_AsUTF8AndSize(code, &nc)
    cdef const char *pm = PyUnicode_AsUTF8AndSize(message, &nm)
    _uint(b, <uint64_t>nc, 2)
    _uint(b, <uint64_t>nm, 4)
    _put(b, pc, nc)
    _put(b, pm, nm)
    return 0


cdef int _response(Buf *b, object response) except -1:
    if response is None:
        _uint(b, ST_NONE, 1)
        _uint(b, 0, 2)
    elif "error" in response:
        _uint(b, ST_ANSWERED if response.get("answered") else ST_ERROR, 1)
        _uint(b, 0, 2)
        _error(b, response["error"])
    elif "outputs" in response:
        outputs = response["outputs"]
        parameters = response.get("parameters")
        if parameters:
            _uint(b, ST_PARAMS, 1)
            _uint(b, <uint64_t>len(outputs), 2)
            pb = orjson.dumps(parameters)
            _uint(b, <uint64_t>len(pb), 4)
            _put(b, <const char *>pb, len(pb))
        else:
            _uint(b, ST_OK, 1)
            _uint(b, <uint64_t>len(outputs), 2)
        for name, datatype, shape, desc in outputs:
            _tensor(b, name, datatype, shape, 1 if type(desc) is _REGION_DESC else 0, desc[0], desc[1], desc[2])
    else:
        _uint(b, ST_DECOUPLED if response.get("decoupled") else ST_NONE, 1)
        _uint(b, 0, 2)
    return 0


cdef bytes _finish(Buf *b):
    try:
        return PyBytes_FromStringAndSize(b.data, b.len)
    finally:
        _drop(b)


def encode_infer(uint64_t msg_id, str key, uint32_t instance, requests, frees=()):
    cdef Buf b
    cdef Py_ssize_t id_len
    cdef const char *id_utf8
    cdef int seq
    _init(&b)
    try:
        _start(&b, OP_INFER, msg_id, len(requests), frees)
        _uint(&b, instance, 4)
        _str(&b, key, 2)
        for request in requests:
            request_id, parameters, inputs, outputs = request[0], request[1], request[2], request[3]
            sequence = request[4] if len(request) > 4 else None
            trace = request[5] if len(request) > 5 else None
            pb = orjson.dumps(parameters) if parameters else b""
            id_utf8 = PyUnicode_AsUTF8AndSize(<str>request_id, &id_len)  # the str's own UTF-8: no copy
            if id_len > _MAX_ID:
                raise InvalidArgument(_ID_TOO_LONG_MESSAGE)
            seq = 0
            if sequence is not None:
                corrid, start, end = sequence
                seq = (_SEQ_STRING_ID if isinstance(corrid, str) else _SEQ_NUMERIC_ID) \
                    | (_SEQ_START if start else 0) | (_SEQ_END if end else 0)
            if trace is not None:
                seq |= _TRACED
            _reserve(&b, 11)
            _set(&b, <uint64_t>len(inputs), 2)
            _set(&b, <uint64_t>len(outputs), 2)
            _set(&b, <uint64_t>id_len, 2)
            _set(&b, <uint64_t>len(pb), 4)
            _set(&b, <uint64_t>seq, 1)
            _put(&b, id_utf8, id_len)
            _put(&b, <const char *>pb, len(pb))
            if seq & _SEQ_NUMERIC_ID:
                _uint(&b, <uint64_t>corrid, 8)
            elif seq & _SEQ_STRING_ID:
                _str(&b, corrid, 2)
            if trace is not None:
                trace_id, context = trace
                _uint(&b, <uint64_t>trace_id, 8)
                _str(&b, context, 2)
            for name, datatype, shape, place, seg, offset, size in inputs:
                _tensor(&b, name, datatype, shape, place, seg, offset, size)
            for o in outputs:
                if type(o) is str:  # the common case: into the worker's arena
                    _output(&b, o, 0, 0, 0, 0)
                else:
                    name, place, region, offset, size = o
                    _output(&b, name, place, region, offset, size)
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


def encode_reply(uint64_t msg_id, responses, timing):
    cdef Buf b
    _init(&b)
    try:
        _start(&b, OP_REPLY, msg_id, len(responses), ())
        t0, t1, t2 = timing
        _uint(&b, t0, 8)
        _uint(&b, t1, 8)
        _uint(&b, t2, 8)
        for r in responses:
            _response(&b, r)
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


def encode_stream(uint64_t msg_id, uint32_t index, final, response):
    cdef Buf b
    _init(&b)
    try:
        _start(&b, OP_STREAM, msg_id, 1, ())
        _uint(&b, index, 4)
        _uint(&b, 1 if final else 0, 1)
        _response(&b, response)
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


def encode_fail(uint64_t msg_id, dict error):
    cdef Buf b
    _init(&b)
    try:
        _start(&b, OP_FAIL, msg_id, 0, ())
        _error(&b, error)
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


def encode_control(uint64_t msg_id, dict message, frees=()):
    cdef Buf b
    cdef bytes body = orjson.dumps(message)
    _init(&b)
    try:
        _start(&b, OP_CONTROL, msg_id, 0, frees)
        _put(&b, <const char *>body, len(body))
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


cdef bytes _bare(int op, uint64_t msg_id, frees):
    cdef Buf b
    _init(&b)
    try:
        _start(&b, op, msg_id, 0, frees)
    except BaseException:
        _drop(&b)
        raise
    return _finish(&b)


def encode_free(frees):
    return _bare(OP_FREE, 0, frees)


def encode_ping(uint64_t msg_id, frees=()):
    return _bare(OP_PING, msg_id, frees)


def encode_pong(uint64_t msg_id):
    return _bare(OP_PONG, msg_id, ())


# -- decoding ---------------------------------------------------------------------------------
cdef object _fail(Reader *r, str what):
    return ProtocolError(f"malformed message from peer: {what}", r.msg_id)


cdef inline int _need(Reader *r, size_t n) except -1:
    if <size_t>(r.end - r.p) < n:
        raise _fail(r, "truncated record")
    return 0


cdef inline uint64_t _get(Reader *r, int nbytes) noexcept:
    """Caller has checked the room."""
    cdef uint64_t v = tshm_load_le(r.p, nbytes)
    r.p += nbytes
    return v


# Names (model keys, tensor names) recur in every frame: ``_text`` keeps the last short ASCII
# string decoded into each slot of a small table hashed by its bytes, and returns that string
# again when the same bytes come (equal bytes, ASCII: an equal str), so a recurring name costs a
# hash and a memcmp, not a new str. Bounded (NAME_SLOTS strings of at most NAME_MAX bytes);
# runs under the GIL, and dropping a replaced str runs no Python code.
cdef enum:
    NAME_SLOTS = 256   # a power of two
    NAME_MAX = 64

cdef PyObject *_names[NAME_SLOTS]


cdef str _text(Reader *r, size_t n):
    cdef size_t i, slot = 0
    cdef uint32_t h = 2166136261u
    cdef PyObject *cached
    _need(r, n)
    if n <= NAME_MAX:
        for i in range(n):  # FNV-1a
            h = (h ^ r.p[i]) * 16777619u
        slot = h & (NAME_SLOTS - 1)
        cached = _names[slot]
        if cached != NULL and <size_t>PyUnicode_GET_LENGTH(<object>cached) == n \
                and memcmp(PyUnicode_1BYTE_DATA(<object>cached), r.p, n) == 0:
            r.p += n
            return <str>cached
    try:
        s = PyUnicode_DecodeUTF8(<const char *>r.p, n, NULL)
    except UnicodeDecodeError:
        raise _fail(r, "invalid UTF-8") from None
    r.p += n
    if n <= NAME_MAX and PyUnicode_IS_ASCII(s):  # ASCII: its 1-byte data is the UTF-8
        Py_INCREF(s)
        Py_XDECREF(_names[slot])
        _names[slot] = <PyObject *>s
    return s


cdef object _json(Reader *r, size_t n):
    _need(r, n)
    data = PyBytes_FromStringAndSize(<const char *>r.p, n)
    r.p += n
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _fail(r, "invalid JSON") from None


cdef object _region_desc(uint64_t region, uint64_t offset, uint64_t size):
    """A RegionDesc made in C, as ``_message`` makes a Message: the subtype's allocation,
    then its three items."""
    cdef object d = PyType_GenericAlloc(_REGION_DESC, 3)
    cdef object item = region
    Py_INCREF(item)
    PyTuple_SET_ITEM(d, 0, item)
    item = offset
    Py_INCREF(item)
    PyTuple_SET_ITEM(d, 1, item)
    item = size
    Py_INCREF(item)
    PyTuple_SET_ITEM(d, 2, item)
    return d


cdef list _tensor_rec(Reader *r):
    cdef uint64_t dtype, ndim, place, name_len, seg, offset, size
    cdef int64_t d
    cdef list shape = []
    _need(r, TENSOR_SIZE)
    dtype, ndim, place = _get(r, 1), _get(r, 1), _get(r, 1)
    _get(r, 1)
    name_len, seg, offset, size = _get(r, 2), _get(r, 4), _get(r, 8), _get(r, 8)
    if dtype >= <uint64_t>_N_DTYPES or ndim > <uint64_t>_MAX_DIMS or place > 1:
        raise _fail(r, "bad tensor record")
    _need(r, 8 * ndim)
    for _ in range(ndim):
        d = <int64_t>_get(r, 8)
        if d < 0:
            raise _fail(r, "negative dimension")
        shape.append(d)
    name = _text(r, name_len)
    desc = _region_desc(seg, offset, size) if place == 1 else [seg, offset, size]
    return [name, _DTYPES[dtype], shape, desc]


cdef dict _error_rec(Reader *r):
    _need(r, 6)
    cdef uint64_t code_len = _get(r, 2), message_len = _get(r, 4)
    code = _text(r, code_len)
    return {"code": code, "message": _text(r, message_len)}


cdef object _S_OK = Status.OK, _S_ERROR = Status.ERROR, _S_DECOUPLED = Status.DECOUPLED, _S_NONE = Status.NONE
cdef object _S_PARAMS = Status.PARAMS, _S_ANSWERED = Status.ANSWERED
cdef tuple _DECOUPLED_ENTRY = (Status.DECOUPLED, None), _NONE_ENTRY = (Status.NONE, None)


cdef tuple _response_rec(Reader *r):
    """``(status, payload)``: the output records (OK), the error record (ERROR), else None."""
    _need(r, 3)
    cdef uint64_t status = _get(r, 1), n = _get(r, 2)
    cdef list outputs
    if status == ST_OK:
        outputs = []
        for _ in range(n):
            outputs.append(_tensor_rec(r))
        return (_S_OK, outputs)
    if status == ST_PARAMS:
        _need(r, 4)
        parameters = _json(r, _get(r, 4))
        if not isinstance(parameters, dict):
            raise _fail(r, "response parameters are not an object")
        outputs = []
        for _ in range(n):
            outputs.append(_tensor_rec(r))
        return (_S_PARAMS, (outputs, parameters))
    if n:
        raise _fail(r, "response without outputs has an output count")
    if status == ST_ERROR:
        return (_S_ERROR, _error_rec(r))
    if status == ST_ANSWERED:
        return (_S_ANSWERED, _error_rec(r))
    if status == ST_DECOUPLED:
        return _DECOUPLED_ENTRY
    if status == ST_NONE:
        return _NONE_ENTRY
    raise _fail(r, f"unknown response status {status}")


cdef dict _request_rec(Reader *r):
    cdef uint64_t n_inputs, n_outputs, id_len, params_len, seq, place, name_len, region, offset, size
    _need(r, 11)
    n_inputs, n_outputs, id_len, params_len, seq = _get(r, 2), _get(r, 2), _get(r, 2), _get(r, 4), _get(r, 1)
    if seq & ~(_SEQ_BITS | _TRACED) or (seq & _SEQ_BITS and bool(seq & SEQ_NUMERIC_ID) == bool(seq & SEQ_STRING_ID)):
        raise _fail(r, "bad sequence flags")
    request_id = _text(r, id_len)
    params = _json(r, params_len) if params_len else {}
    if not isinstance(params, dict):
        raise _fail(r, "parameters are not an object")
    corrid = 0
    if seq & SEQ_NUMERIC_ID:
        _need(r, 8)
        corrid = _get(r, 8)
    elif seq & SEQ_STRING_ID:
        _need(r, 2)
        corrid = _text(r, _get(r, 2))
    trace = None
    if seq & _TRACED:
        _need(r, 8)
        trace_id = _get(r, 8)
        _need(r, 2)
        trace = [trace_id, _text(r, _get(r, 2))]
    inputs = [_tensor_rec(r) for _ in range(n_inputs)]
    cdef list outputs = []
    cdef dict shm_outputs = {}
    for _ in range(n_outputs):
        _need(r, OUTPUT_SIZE)
        place, name_len, region, offset, size = _get(r, 1), _get(r, 2), _get(r, 4), _get(r, 8), _get(r, 8)
        name = _text(r, name_len)
        if place == 1:
            shm_outputs[name] = _region_desc(region, offset, size)
        elif place != 0:
            raise _fail(r, "bad output record")
        outputs.append(name)
    request = {"request_id": request_id, "inputs": inputs, "outputs": outputs, "shm_outputs": shm_outputs,
               "parameters": params}
    if seq & _SEQ_BITS:
        request["sequence"] = [corrid, bool(seq & SEQ_START), bool(seq & SEQ_END)]
    if trace is not None:
        request["trace"] = trace
    return request


_OPS = {int(op): op for op in Op}
cdef type _MESSAGE = Message


cdef object _message(object op, object msg_id, object frees, object body):
    """A Message made in C, as ``tuple.__new__(Message, ...)`` makes it (namedtuple's own
    ``__new__`` is Python code): the subtype's allocation, then its four items."""
    cdef object m = PyType_GenericAlloc(_MESSAGE, 4)
    Py_INCREF(op)
    PyTuple_SET_ITEM(m, 0, op)
    Py_INCREF(msg_id)
    PyTuple_SET_ITEM(m, 1, msg_id)
    Py_INCREF(frees)
    PyTuple_SET_ITEM(m, 2, frees)
    Py_INCREF(body)
    PyTuple_SET_ITEM(m, 3, body)
    return m


def decode(data):
    """One frame from the other process, fully checked (see ``protocol``)."""
    cdef Py_buffer view
    cdef Reader r
    cdef uint64_t op, flags, count, nfree, i
    cdef bint missing
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        r.p = <const uint8_t *>view.buf
        r.end = r.p + view.len
        r.msg_id = 0
        if view.len < HEADER_SIZE:
            raise ProtocolError("malformed message from peer: truncated header")
        op, flags = _get(&r, 1), _get(&r, 3)
        count, nfree, r.msg_id = _get(&r, 4), _get(&r, 4), _get(&r, 8)
        if op not in _OPS:
            raise _fail(&r, f"unknown op {op}")
        if flags:
            raise _fail(&r, "reserved header bits set")
        if nfree > <uint64_t>(r.end - r.p) // FREE_SIZE:
            raise _fail(&r, "truncated record")
        frees = []
        for i in range(nfree):
            frees.append((_get(&r, 4), _get(&r, 8), _get(&r, 8)))
        body = None
        if op == OP_INFER:
            _need(&r, 6)
            instance, key_len = _get(&r, 4), _get(&r, 2)
            key = _text(&r, key_len)
            body = {"model": key, "instance": instance, "requests": [_request_rec(&r) for _ in range(count)]}
        elif op == OP_REPLY:
            _need(&r, 24)
            timing = (_get(&r, 8), _get(&r, 8), _get(&r, 8))
            responses = []
            missing = False  # a NONE entry: the reply fails, after the rest is checked as before
            for i in range(count):
                entry = _response_rec(&r)
                if (<tuple>entry)[0] is _S_NONE:
                    missing = True
                responses.append(entry)
            body = (responses, timing)
            if missing:
                raise _fail(&r, "reply entry without a status")
        elif op == OP_STREAM:
            _need(&r, 5)
            index, final = _get(&r, 4), _get(&r, 1)
            body = {"index": index, "final": bool(final)}
            status, payload = _response_rec(&r)
            if status is _S_OK:
                body["outputs"] = payload
            elif status is _S_PARAMS:
                body["outputs"], body["parameters"] = payload
            elif status is _S_ERROR or status is _S_ANSWERED:
                body["error"] = payload
            elif status is _S_DECOUPLED:
                body["decoupled"] = True
        elif op == OP_FAIL:
            body = {"error": _error_rec(&r)}
        elif op == OP_CONTROL:
            body = _json(&r, r.end - r.p)
            if not isinstance(body, dict) or not isinstance(body.get("op"), str):
                raise _fail(&r, "control message is not an object with an op")
        if r.p != r.end:
            raise _fail(&r, "trailing bytes")
        return _message(_OPS[op], r.msg_id, frees, body)
    finally:
        PyBuffer_Release(&view)
