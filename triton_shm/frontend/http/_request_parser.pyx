# cython: language_level=3
"""The lean connection's request parser: llhttp (csrc/llhttp) with C callbacks.

The URL, the header fields and the body are gathered here, in C, and the sink (the
connection) is called once per complete message, plus only for the events it acts on
(the same interface and refusals as :mod:`.request_parser_py`, documented there).
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from libc.string cimport memset

from .lean_request import (BODY, HEADERS, IDLE, MAX_FIELD, MAX_HEADERS, MAX_URL, ROUTES, Field, HttpLimit,
                           RequestUpgrade, infer_route, too_large_message)

cdef extern from "llhttp.h":
    ctypedef struct llhttp_t:
        unsigned long long content_length
        unsigned short flags
        unsigned char method
        unsigned char http_major
        unsigned char http_minor
        unsigned char upgrade
        void* data
    ctypedef int (*llhttp_data_cb)(llhttp_t*, const char* at, size_t length) noexcept
    ctypedef int (*llhttp_cb)(llhttp_t*) noexcept
    ctypedef struct llhttp_settings_t:
        llhttp_cb on_message_begin
        llhttp_data_cb on_url
        llhttp_data_cb on_header_field
        llhttp_data_cb on_header_value
        llhttp_cb on_header_value_complete
        llhttp_cb on_headers_complete
        llhttp_data_cb on_body
        llhttp_cb on_message_complete
    ctypedef enum llhttp_errno_t:
        HPE_OK
        HPE_PAUSED_UPGRADE
    ctypedef enum llhttp_type_t:
        HTTP_REQUEST
    ctypedef enum llhttp_flags:
        F_CONTENT_LENGTH
    void llhttp_settings_init(llhttp_settings_t* settings)
    void llhttp_init(llhttp_t* parser, llhttp_type_t type, const llhttp_settings_t* settings)
    llhttp_errno_t llhttp_execute(llhttp_t* parser, const char* data, size_t len)
    int llhttp_should_keep_alive(const llhttp_t* parser)
    void llhttp_resume_after_upgrade(llhttp_t* parser)
    const char* llhttp_get_error_reason(const llhttp_t* parser)
    const char* llhttp_method_name(int method)

cdef int _IDLE = IDLE, _HEADERS = HEADERS, _BODY = BODY
cdef Py_ssize_t _MAX_URL = MAX_URL, _MAX_FIELD = MAX_FIELD, _MAX_HEADERS = MAX_HEADERS
cdef dict _ROUTES = ROUTES
cdef object _infer_route = infer_route
# The fields read (lean_request.Field), matched in C: no dict lookup, no lower() per field.
# Content-Length is llhttp's to read (the declared size is checked at the headers' end).
cdef enum _Read:
    _OTHER, _HEADER_LENGTH, _CONTENT_ENCODING, _ACCEPT_ENCODING, _EXPECT
cdef bytes _N_HEADER_LENGTH = Field.HEADER_LENGTH.value, _N_EXPECT = Field.EXPECT.value
cdef bytes _N_CONTENT_ENCODING = Field.CONTENT_ENCODING.value, _N_ACCEPT_ENCODING = Field.ACCEPT_ENCODING.value
cdef dict _METHODS = {}    # llhttp method number -> its name, as bytes
cdef dict _VERSIONS = {}   # (major << 8 | minor) -> "major.minor"
cdef llhttp_settings_t _SETTINGS


cdef class Message:
    """:class:`.lean_request.Message` (which documents it) as a C class: made per request
    without a Python ``__init__``."""
    cdef public object method, url, version, body, size, keep_alive, route, error, refusal
    cdef public object header_length, content_encoding, accept_encoding, expect_continue
    cdef list _fields  # name, value, name, value...: one list, the pairs made only when read

    def __cinit__(self):
        self.method = b""
        self.version = "1.1"
        self.url = b""
        self._fields = []
        self.body = b""
        self.size = 0
        self.expect_continue = False
        self.keep_alive = False

    @property
    def headers(self):
        """The header fields as (name, value) pairs, in order (read by the bridge and the
        restricted-API check only)."""
        fields = self._fields
        return list(zip(fields[::2], fields[1::2]))


cdef bint _named(bytes name, bytes lower) noexcept:
    """``name`` is ``lower`` bar the case of ASCII letters (as ``name.lower() == lower``)."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(name), i
    cdef const char* a = PyBytes_AS_STRING(name)
    cdef const char* b = PyBytes_AS_STRING(lower)
    cdef char c
    if n != PyBytes_GET_SIZE(lower):
        return False
    for i in range(n):
        c = a[i]
        if b'A' <= c <= b'Z':
            c += 32
        if c != b[i]:
            return False
    return True


cdef _Read _field(bytes name) noexcept:
    if _named(name, _N_HEADER_LENGTH):
        return _HEADER_LENGTH
    if _named(name, _N_CONTENT_ENCODING):
        return _CONTENT_ENCODING
    if _named(name, _N_ACCEPT_ENCODING):
        return _ACCEPT_ENCODING
    if _named(name, _N_EXPECT):
        return _EXPECT
    return _OTHER


cdef class RequestParser:
    cdef llhttp_t _parser
    cdef object _sink
    cdef object _on_complete  # the sink's message_complete, looked up once
    cdef Py_ssize_t _max_input_size
    cdef bint _headers_hook
    cdef public object msg
    cdef readonly int state
    cdef readonly bint began
    cdef bytes _url
    cdef bytes _name
    cdef bytes _value
    cdef list _headers      # the message's fields, flat
    cdef list _parts        # the body so far (kept across messages, emptied when one completes)
    cdef Py_ssize_t _size
    cdef bint _dropping      # the body is read and dropped (the message is refused)
    cdef object _error       # raised in a callback, re-raised by feed_data

    def __cinit__(self, sink, Py_ssize_t max_input_size, bint headers_hook):
        self._sink = sink
        self._on_complete = sink.message_complete
        self._max_input_size = max_input_size
        self._headers_hook = headers_hook
        self.msg = None
        self.state = _IDLE
        self._parts = []
        llhttp_init(&self._parser, HTTP_REQUEST, &_SETTINGS)
        self._parser.data = <void*>self

    def feed_data(self, data):
        cdef const unsigned char[::1] view
        cdef const char* buf
        cdef Py_ssize_t size
        cdef llhttp_errno_t err
        self.began = False
        if type(data) is bytes:  # what asyncio hands data_received, without a buffer view
            buf, size = PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        else:
            view = data
            size = view.shape[0]
            buf = <const char*>&view[0] if size else NULL
        if size == 0:
            return
        err = llhttp_execute(&self._parser, buf, size)
        if err == HPE_OK:
            return
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if err == HPE_PAUSED_UPGRADE:
            llhttp_resume_after_upgrade(&self._parser)
            raise RequestUpgrade()
        reason = llhttp_get_error_reason(&self._parser)
        raise HttpLimit(400, f"malformed HTTP request: {reason.decode('latin-1')}")

    # -- what the C callbacks do (an exception stops the parser; feed_data raises it) ------
    cdef int _message_begin(self) except -1:
        msg = Message.__new__(Message)
        self.msg = msg
        self._headers = (<Message>msg)._fields
        if self._parts:  # left by a message that was refused half-way
            del self._parts[:]
        self._url = b""
        self._name = self._value = None
        self._size = 0
        self._dropping = False
        self.state = _HEADERS
        self.began = True
        return 0

    cdef int _on_url(self, const char* at, size_t length) except -1:
        self._url += at[:length]
        if len(self._url) > _MAX_URL:
            raise HttpLimit(414, f"request line is longer than {MAX_URL} bytes")
        return 0

    cdef int _on_field(self, const char* at, size_t length) except -1:
        piece = PyBytes_FromStringAndSize(at, length)
        self._name = piece if self._name is None else self._name + piece
        self._check_field()
        return 0

    cdef int _on_value(self, const char* at, size_t length) except -1:
        piece = PyBytes_FromStringAndSize(at, length)
        self._value = piece if self._value is None else self._value + piece
        self._check_field()
        return 0

    cdef int _check_field(self) except -1:
        cdef Py_ssize_t size = (0 if self._name is None else len(self._name)) + \
            (0 if self._value is None else len(self._value))
        if size > _MAX_FIELD:  # refused while it arrives, not once it is whole
            raise HttpLimit(431, f"a header field is longer than {MAX_FIELD} bytes")
        return 0

    cdef int _value_complete(self) except -1:
        cdef bytes name = self._name if self._name is not None else b""
        cdef bytes value = self._value if self._value is not None else b""
        self._name = self._value = None
        self._headers.append(name)
        self._headers.append(value)
        if len(self._headers) > 2 * _MAX_HEADERS:
            raise HttpLimit(431, f"more than {MAX_HEADERS} header fields")
        cdef _Read field = _field(name)
        if field == _OTHER:
            return 0
        cdef Message msg = self.msg
        if field == _HEADER_LENGTH:
            msg.header_length = value.decode("latin-1")
        elif field == _CONTENT_ENCODING:
            msg.content_encoding = value.decode("latin-1")
        elif field == _ACCEPT_ENCODING:
            msg.accept_encoding = value.decode("latin-1")
        elif value.lower() == b"100-continue":
            msg.expect_continue = True
        return 0

    cdef int _headers_complete(self) except -1:
        cdef llhttp_t* p = &self._parser
        cdef Message msg = self.msg
        if p.flags & F_CONTENT_LENGTH and p.content_length > <unsigned long long>self._max_input_size:
            msg.error = (413, too_large_message(self._max_input_size))
        msg.url = self._url
        method = _METHODS.get(p.method)
        if method is None:
            method = _METHODS[p.method] = <bytes>llhttp_method_name(p.method)
        msg.method = method
        version = _VERSIONS.get(p.http_major << 8 | p.http_minor)
        if version is None:
            version = _VERSIONS[p.http_major << 8 | p.http_minor] = f"{p.http_major}.{p.http_minor}"
        msg.version = version
        msg.keep_alive = llhttp_should_keep_alive(p) != 0
        self.state = _BODY
        if msg.error is not None or msg.expect_continue or self._headers_hook:
            self._sink.headers_complete(msg)
            self._dropping = msg.error is not None or msg.refusal is not None
        return 0

    cdef int _on_body(self, const char* at, size_t length) except -1:
        if self._dropping:
            return 0  # read and dropped, so the answer can follow
        self._size += length
        cdef Message msg = self.msg
        msg.size = self._size
        if self._size > self._max_input_size:
            self._dropping = True
            msg.error = (413, too_large_message(self._max_input_size))
            del self._parts[:]
            self._sink.body_too_large(msg)
            return 0
        self._parts.append(PyBytes_FromStringAndSize(at, length))
        return 0

    cdef int _message_complete(self) except -1:
        cdef PyObject* route
        cdef Message msg = self.msg
        self.msg = None
        self._headers = None
        parts = self._parts
        if parts:
            msg.body = parts[0] if len(parts) == 1 else b"".join(parts)
            del parts[:]
        method = msg.method
        if method == b"POST":
            url = msg.url
            route = PyDict_GetItem(_ROUTES, url)
            msg.route = <object>route if route is not NULL else _infer_route(method, url)
        self.state = _IDLE
        self._on_complete(msg)
        return 0


# -- llhttp's callbacks: a nonzero return stops it with an error. llhttp runs only inside
# feed_data, which holds the GIL, so they do not take it again. ----------------------------
cdef inline int _failed(RequestParser self, BaseException error) noexcept:
    self._error = error
    return -1


cdef int _cb_message_begin(llhttp_t* p) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._message_begin()
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_url(llhttp_t* p, const char* at, size_t length) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._on_url(at, length)
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_header_field(llhttp_t* p, const char* at, size_t length) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._on_field(at, length)
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_header_value(llhttp_t* p, const char* at, size_t length) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._on_value(at, length)
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_header_value_complete(llhttp_t* p) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._value_complete()
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_headers_complete(llhttp_t* p) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        self._headers_complete()
    except BaseException as e:
        return _failed(self, e)
    return 1 if p.upgrade else 0  # 1: no body; llhttp then pauses for the upgrade


cdef int _cb_body(llhttp_t* p, const char* at, size_t length) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._on_body(at, length)
    except BaseException as e:
        return _failed(self, e)


cdef int _cb_message_complete(llhttp_t* p) noexcept:
    cdef RequestParser self = <RequestParser>p.data
    try:
        return self._message_complete()
    except BaseException as e:
        return _failed(self, e)


memset(&_SETTINGS, 0, sizeof(_SETTINGS))
llhttp_settings_init(&_SETTINGS)
_SETTINGS.on_message_begin = _cb_message_begin
_SETTINGS.on_url = _cb_url
_SETTINGS.on_header_field = _cb_header_field
_SETTINGS.on_header_value = _cb_header_value
_SETTINGS.on_header_value_complete = _cb_header_value_complete
_SETTINGS.on_headers_complete = _cb_headers_complete
_SETTINGS.on_body = _cb_body
_SETTINGS.on_message_complete = _cb_message_complete
