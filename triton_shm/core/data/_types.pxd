# The C classes of _types.pyx, for other extension modules to cimport: they then read and
# set the fields as struct members and build objects without a Python call (a
# ``T.__new__(T)`` is the type's tp_new, every field None, and skips ``__init__``: the
# builder sets each field as ``__init__`` would).

cdef class InputTensor:
    cdef public object name, datatype, shape, data, parameters


cdef class RequestedOutput:
    cdef public object name, parameters


cdef class InferRequest:
    cdef public object model_name, model_version, id, parameters, inputs, outputs


cdef class OutputTensor:
    cdef public object name, datatype, shape, data, parameters, in_shared_memory, shm_byte_size


cdef class InferResponse:
    cdef public object model_name, model_version, id, parameters, outputs, _release


cdef class BatchRequest:
    cdef public object request, plan, regions, stream


cdef class Pending(BatchRequest):
    cdef public object rows, priority, enqueued_ns, deadline_ns, reject_on_timeout, future, seq, result, trace
    cdef public object count_on_answer
