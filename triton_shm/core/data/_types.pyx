# cython: language_level=3, boundscheck=False, wraparound=False
"""The request and response types as C classes: the same fields, defaults, equality
(the same class and equal fields) and repr as their twins in ``types_py.py``, which
define them. Constructing one is a C call instead of a Python ``__init__`` frame. The
fields are declared in ``_types.pxd`` (other extensions cimport them)."""

from asyncio import get_running_loop

from .types_py import RESERVED_PARAMETERS

# "no argument given": a fresh dict or list per object, as the twins' default factories
cdef object _FRESH = object()


cdef str _repr(object obj, tuple names):
    return f"{type(obj).__qualname__}(" + ", ".join([f"{n}={getattr(obj, n)!r}" for n in names]) + ")"


cdef class InputTensor:
    def __init__(self, name, datatype, shape, data=None, parameters=_FRESH):
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.data = data
        self.parameters = {} if parameters is _FRESH else parameters

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef InputTensor o = other
        return (self.name, self.datatype, self.shape, self.data, self.parameters) == \
            (o.name, o.datatype, o.shape, o.data, o.parameters)

    def __repr__(self):
        return _repr(self, ("name", "datatype", "shape", "data", "parameters"))


cdef class RequestedOutput:
    def __init__(self, name, parameters=_FRESH):
        self.name = name
        self.parameters = {} if parameters is _FRESH else parameters

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef RequestedOutput o = other
        return (self.name, self.parameters) == (o.name, o.parameters)

    def __repr__(self):
        return _repr(self, ("name", "parameters"))


cdef class InferRequest:
    def __init__(self, model_name, model_version="", id="", parameters=_FRESH, inputs=_FRESH, outputs=_FRESH):
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = {} if parameters is _FRESH else parameters
        self.inputs = [] if inputs is _FRESH else inputs
        self.outputs = [] if outputs is _FRESH else outputs

    def model_parameters(self):
        """The parameters a model may see (``request.parameters()`` in Python models)."""
        params = self.parameters
        cdef dict seen = {}
        if not params:
            return seen
        for k, v in params.items():
            if k not in RESERVED_PARAMETERS and not k.startswith("triton_"):
                seen[k] = v
        return seen

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef InferRequest o = other
        return (self.model_name, self.model_version, self.id, self.parameters, self.inputs, self.outputs) == \
            (o.model_name, o.model_version, o.id, o.parameters, o.inputs, o.outputs)

    def __repr__(self):
        return _repr(self, ("model_name", "model_version", "id", "parameters", "inputs", "outputs"))


cdef class OutputTensor:
    def __init__(self, name, datatype, shape, data, parameters=_FRESH, in_shared_memory=False, shm_byte_size=0):
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self.data = data
        self.parameters = {} if parameters is _FRESH else parameters
        self.in_shared_memory = in_shared_memory
        self.shm_byte_size = shm_byte_size

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef OutputTensor o = other
        return (self.name, self.datatype, self.shape, self.data, self.parameters, self.in_shared_memory,
                self.shm_byte_size) == \
            (o.name, o.datatype, o.shape, o.data, o.parameters, o.in_shared_memory, o.shm_byte_size)

    def __repr__(self):
        return _repr(self, ("name", "datatype", "shape", "data", "parameters", "in_shared_memory", "shm_byte_size"))


cdef class InferResponse:
    def __init__(self, model_name, model_version, id="", parameters=_FRESH, outputs=_FRESH, _release=None):
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.parameters = {} if parameters is _FRESH else parameters
        self.outputs = [] if outputs is _FRESH else outputs
        self._release = _release

    def release(self):
        """Give the output buffers back. Call once the wire message is built."""
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        cdef InferResponse o = other
        return (self.model_name, self.model_version, self.id, self.parameters, self.outputs, self._release) == \
            (o.model_name, o.model_version, o.id, o.parameters, o.outputs, o._release)

    def __repr__(self):
        return _repr(self, ("model_name", "model_version", "id", "parameters", "outputs", "_release"))


cdef class BatchRequest:
    """One request of a batch as the scheduler hands it to the worker pool (see the twin).
    Compared by identity, as the twin (``eq=False``)."""

    def __init__(self, request, plan, regions, stream):
        self.request = request
        self.plan = plan
        self.regions = regions
        self.stream = stream

    def __repr__(self):
        return _repr(self, ("request", "plan", "regions", "stream"))


cdef class Pending(BatchRequest):
    """A queued request (the scheduler's): what the pool needs and the queue's own state.
    A subclass may add attributes (it gets a ``__dict__`` or its own ``__slots__``)."""

    def __init__(self, request, plan, regions, stream, rows, priority, enqueued_ns, deadline_ns, reject_on_timeout,
                 future=_FRESH, seq=0, result=None, trace=None, count_on_answer=False):
        self.request = request
        self.plan = plan
        self.regions = regions
        self.stream = stream
        self.rows = rows
        self.priority = priority
        self.enqueued_ns = enqueued_ns
        self.deadline_ns = deadline_ns
        self.reject_on_timeout = reject_on_timeout
        self.future = get_running_loop().create_future() if future is _FRESH else future
        self.seq = seq
        self.result = result
        self.trace = trace
        self.count_on_answer = count_on_answer

    def __repr__(self):
        return _repr(self, ("request", "plan", "regions", "stream", "rows", "priority", "enqueued_ns", "deadline_ns",
                            "reject_on_timeout", "future", "seq", "result", "trace", "count_on_answer"))
