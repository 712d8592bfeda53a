"""gRPC protocol adapter: inference.GRPCInferenceService, on our own HTTP/2 server
(``native/``) or on grpc.aio (``aio.py``), one set of method bodies (``servicer.py``).
Start it with ``server.start_grpc``. Nothing is imported here, so ``native.framing``
can be used (and tested) without loading the generated protobuf modules."""
