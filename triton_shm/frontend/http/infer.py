"""``POST /v2/models/{m}[/versions/{v}]/infer``, written once for both HTTP servers.

The aiohttp handler and the lean path hand in the raw body and the three headers that
matter; the reply is the finished body (already compressed per Accept-Encoding), its
content type and the extra headers.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import InvalidArgument
from .codec import decode_infer_request, encode_infer_response
from .encoding import accepted_coding, compress, decode_body

if TYPE_CHECKING:
    from typing import Iterable

    from ..header_forward import HeaderForward
    from ...core.observability.otel import RequestSpan
    from ...core.service import InferenceService
    from ...core.data.types import InferRequest, InferResponse

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
_THREAD_COMPRESS_BYTES = 1 << 20  # compress larger bodies off the event loop


@dataclass(slots=True)
class InferReply:
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


async def serve_infer(
    service: "InferenceService", model: str, version: str, body: bytes, *,
    header_length: str | None, content_encoding: str | None, accept_encoding: str | None,
    max_input_size: int, span: "RequestSpan | None" = None,
    forward: "tuple[HeaderForward, Iterable[tuple[str, str]]] | None" = None,
) -> InferReply:
    """Decode, infer, encode. Raises :class:`TritonShmError` for every refusal. ``span``:
    the request's InferRequest span (OpenTelemetry tracing); ``forward``: the
    --http-header-forward-pattern and the request's headers."""
    if content_encoding is not None:
        body = decode_body(body, content_encoding, max_input_size)
    length: int | None = None
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise InvalidArgument(
                f"inference header size should be in range (0, {len(body)}), got: {header_length}") from None
    request = decode_infer_request(model, version, body, length)
    if forward is not None:
        request.parameters = forward[0].parameters(forward[1], request.parameters)
    response = await service.infer(request, span)
    try:
        reply = reply_of(response, request)
    finally:
        response.release()  # outputs may be views into shared memory
    if accept_encoding:
        payload = reply.body
        coding = accepted_coding(accept_encoding)
        if coding is not None and payload:  # only inference responses are compressed, as in Triton
            if len(payload) > _THREAD_COMPRESS_BYTES:
                reply.body = await asyncio.to_thread(compress, payload, coding)
            else:
                reply.body = compress(payload, coding)
            reply.headers["Content-Encoding"] = coding
    return reply


def reply_of(response: "InferResponse", request: "InferRequest") -> InferReply:
    """The uncompressed reply to ``request``; the caller releases ``response`` after."""
    payload, json_length = encode_infer_response(response, request)
    if json_length is None:
        return InferReply(payload, JSON_TYPE, {})
    return InferReply(payload, BINARY_TYPE, {HEADER_LENGTH: str(json_length)})
