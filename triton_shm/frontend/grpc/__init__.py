"""gRPC protocol adapter: inference.GRPCInferenceService on grpc.aio."""
from .server import MAX_GRPC_MESSAGE_BYTES, start_grpc
from .servicer import GRPCInferenceServicer

__all__ = ["GRPCInferenceServicer", "MAX_GRPC_MESSAGE_BYTES", "start_grpc"]
