"""Protocol adapters: HTTP (aiohttp) and gRPC (grpc.aio), thin translators to the core."""
