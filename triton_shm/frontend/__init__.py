"""Protocol adapters, thin translators to the core: HTTP on the lean path (the infer route
parsed in C by llhttp) with aiohttp serving the other routes on the same port and, alone,
as the fallback; gRPC on our native HTTP/2 server (libnghttp2) with grpc.aio as the
fallback (``transports.py`` picks)."""
