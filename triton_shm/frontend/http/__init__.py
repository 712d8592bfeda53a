"""HTTP/REST front end: KServe V2 plus Triton's extensions. The infer route runs on a lean
llhttp connection (:mod:`.lean`), every other route on aiohttp behind it (:mod:`.bridge`)."""
from .app import DEFAULT_MAX_INPUT_SIZE, create_app, start_http
from .codec import decode_infer_request, encode_infer_response

__all__ = [
    "DEFAULT_MAX_INPUT_SIZE",
    "create_app",
    "decode_infer_request",
    "encode_infer_response",
    "start_http",
]
