"""gRPC protocol adapter: inference.GRPCInferenceService, on our own HTTP/2 server
(``native/``) or on grpc.aio (``aio.py``), one set of method bodies (``servicer.py``)."""
from .server import MAX_GRPC_MESSAGE_BYTES, start_grpc
from .servicer import InferenceRpcs

__all__ = ["InferenceRpcs", "MAX_GRPC_MESSAGE_BYTES", "start_grpc"]
