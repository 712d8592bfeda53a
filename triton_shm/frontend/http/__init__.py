"""HTTP/REST front end (aiohttp): KServe V2 plus Triton's extensions."""
from .app import DEFAULT_MAX_INPUT_SIZE, create_app, start_http
from .codec import decode_infer_request, encode_infer_response

__all__ = [
    "DEFAULT_MAX_INPUT_SIZE",
    "create_app",
    "decode_infer_request",
    "encode_infer_response",
    "start_http",
]
