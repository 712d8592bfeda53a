# cython: language_level=3, boundscheck=False, wraparound=False
"""A worker's request and response as C classes: the same fields, defaults, equality
(the same class and equal fields) and repr as their twins in ``types_py.py``, which
define them. The worker builds one of each per request; as C classes that is a C call
instead of a Python ``__init__`` frame."""

# "no argument given": a fresh dict per object, as the twins' default factories
cdef object _FRESH = object()


cdef str _repr(object obj, tuple names):
    return f"{type(obj).__qualname__}(" + ", ".join([f"{n}={getattr(obj, n)!r}" for n in names]) + ")"


cdef class WorkerRequest:
    cdef public object id, inputs, datatypes, requested_outputs, parameters, sender, is_cancelled, correlation_id, flags, trace

    def __init__(self, id, inputs, datatypes, requested_outputs, parameters=_FRESH, sender=None, is_cancelled=None,
                 correlation_id=0, flags=0, trace=None):
        self.id = id
        self.inputs = inputs
        self.datatypes = datatypes
        self.requested_outputs = requested_outputs
        self.parameters = {} if parameters is _FRESH else parameters
        self.sender = sender
        self.is_cancelled = is_cancelled
        self.correlation_id = correlation_id
        self.flags = flags
        self.trace = trace

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef WorkerRequest o = other
        return (self.id, self.inputs, self.datatypes, self.requested_outputs, self.parameters, self.sender,
                self.is_cancelled, self.correlation_id, self.flags, self.trace) == \
            (o.id, o.inputs, o.datatypes, o.requested_outputs, o.parameters, o.sender, o.is_cancelled,
             o.correlation_id, o.flags, o.trace)

    def __repr__(self):
        return _repr(self, ("id", "inputs", "datatypes", "requested_outputs", "parameters", "sender", "is_cancelled",
                            "correlation_id", "flags", "trace"))


cdef class WorkerResponse:
    cdef public object outputs, error, parameters

    def __init__(self, outputs=_FRESH, error=None, parameters=None):
        self.outputs = {} if outputs is _FRESH else outputs
        self.error = error
        self.parameters = parameters

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef WorkerResponse o = other
        return (self.outputs, self.error, self.parameters) == (o.outputs, o.error, o.parameters)

    def __repr__(self):
        return _repr(self, ("outputs", "error", "parameters"))
