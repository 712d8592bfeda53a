"""Route handlers: each translates one Triton HTTP endpoint into InferenceService calls.

Handlers raise; the error middleware in :mod:`.app` turns every exception into the
``{"error": ...}`` body. Add endpoints by extending :func:`build_routes`.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ...core.observability.otel import RequestSpan
from ...core.data.types import InferRequest
from ...errors import InvalidArgument, TritonShmError
from .encoding import decode_body
from .generate import decode_generate_request, encode_generate_response
from .infer import HEADER_LENGTH, JSON_TYPE, serve_infer

if TYPE_CHECKING:
    from ...core.service import InferenceService
    from ..header_forward import HeaderForward

log = logging.getLogger(__name__)

# Path tails shared by the "/v2/models/{m}" and "/v2/models/{m}/versions/{v}" forms.
# Versions are digits, as in Triton's route regex: anything else is a plain 404.
_MODEL_PREFIXES = ("/v2/models/{model}", r"/v2/models/{model}/versions/{version:\d+}")


class HttpHandlers:
    def __init__(self, service: "InferenceService", max_input_size: int,
                 header_forward: "HeaderForward | None" = None):
        self.service = service
        self.max_input_size = max_input_size
        self.header_forward = header_forward  # --http-header-forward-pattern

    # -- health and metadata -------------------------------------------------------------
    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.service.live() else 400)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if await self.service.ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(request, self.service.server_metadata())

    async def model_metadata(self, request: web.Request) -> web.Response:
        model, version = _model(request)
        return _json(request, self.service.model_metadata(model, version))

    async def model_ready(self, request: web.Request) -> web.Response:
        model, version = _model(request)
        if await self.service.model_ready(model, version):
            return web.Response(status=200)
        return _json(request, {"error": "Model version not ready"}, status=400)  # as Triton

    async def model_config(self, request: web.Request) -> web.Response:
        model, version = _model(request)
        return _json(request, self.service.model_config_json(model, version))

    async def repository_index(self, request: web.Request) -> web.Response:
        ready_only = _json_object(await self._read_body(request)).get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidArgument("Invalid value for 'ready': expected a boolean")  # Triton's words
        return _json(request, self.service.repository_index(ready_only))

    # -- inference -----------------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.StreamResponse:
        if self.service.tracer.spans:
            return await self._infer_traced(request)
        model, version = _model(request)
        headers = request.headers
        # read() enforces client_max_size (413) on what arrives on the wire.
        reply = await serve_infer(
            self.service, model, version, await request.read(), header_length=headers.get(HEADER_LENGTH),
            content_encoding=headers.get("Content-Encoding"), accept_encoding=headers.get("Accept-Encoding"),
            max_input_size=self.max_input_size, forward=self._forward(request))
        return web.Response(body=reply.body, content_type=reply.content_type, headers=reply.headers)

    async def _infer_traced(self, request: web.Request) -> web.StreamResponse:
        """``infer`` with its InferRequest span (OpenTelemetry tracing): the response is
        sent here, between HTTP_SEND_START and HTTP_SEND_END."""
        model, version = _model(request)
        headers = request.headers
        span = _open_span(request)
        try:
            body = await request.read()
            span.stamp("HTTP_RECV_END")
            reply = await serve_infer(
                self.service, model, version, body, header_length=headers.get(HEADER_LENGTH),
                content_encoding=headers.get("Content-Encoding"), accept_encoding=headers.get("Accept-Encoding"),
                max_input_size=self.max_input_size, span=span, forward=self._forward(request))
            return await _send_traced(
                request, web.Response(body=reply.body, content_type=reply.content_type, headers=reply.headers), span)
        finally:
            span.stamp("HTTP_SEND_END")
            self.service.tracer.end_request(span)

    def _forward(self, request: web.Request) -> "tuple[HeaderForward, Any] | None":
        if self.header_forward is None:
            return None
        # the names as sent (aiohttp's parsed names spell a known header its own way)
        return self.header_forward, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]

    async def model_stats(self, request: web.Request) -> web.Response:
        info = request.match_info
        return _json(request, await self.service.model_statistics(info.get("model", ""), info.get("version", "")))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        span = self._span(request)
        try:
            infer_request = await self._generate_request(request, span)
            response = await self.service.infer(infer_request, span)
            try:
                doc = encode_generate_response(response)
            finally:
                response.release()
            return _json(request, doc) if span is None else await _send_traced(request, _json(request, doc), span)
        finally:
            if span is not None:
                span.stamp("HTTP_SEND_END")
                self.service.tracer.end_request(span)

    def _span(self, request: web.Request) -> RequestSpan | None:
        """A generate request's InferRequest span (Triton's generate endpoints take the
        caller's traceparent too) while OpenTelemetry spans are traced."""
        return _open_span(request) if self.service.tracer.spans else None

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events, one per response; an error ends the stream as an event."""
        span = self._span(request)
        try:
            return await self._generate_stream(request, span)
        finally:
            if span is not None:
                span.stamp("HTTP_SEND_END")
                self.service.tracer.end_request(span)

    async def _generate_stream(self, request: web.Request, span: RequestSpan | None) -> web.StreamResponse:
        infer_request = await self._generate_request(request, span)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        try:
            async for response, final in self.service.infer_stream(infer_request, span=span):
                if final and span is not None:  # the last event goes out now
                    span.stamp("INFER_RESPONSE_COMPLETE")
                    span.stamp("HTTP_SEND_START")
                if isinstance(response, TritonShmError):
                    await stream.write(b"data: " + orjson.dumps({"error": response.message}) + b"\n\n")
                    continue
                if response is None:
                    continue
                try:
                    doc = encode_generate_response(response)
                finally:
                    response.release()
                await stream.write(b"data: " + orjson.dumps(doc) + b"\n\n")
        except TritonShmError as e:
            await stream.write(b"data: " + orjson.dumps({"error": e.message}) + b"\n\n")
        await stream.write_eof()
        return stream

    async def _generate_request(self, request: web.Request, span: RequestSpan | None = None) -> InferRequest:
        model, version = _model(request)
        metadata = self.service.model_metadata(model, version)
        body = await self._read_body(request)
        if span is not None:
            span.stamp("HTTP_RECV_END")
        return decode_generate_request(model, version, body, metadata)

    async def load_model(self, request: web.Request) -> web.Response:
        params = _parameters(_json_object(await self._read_body(request)))
        await self.service.load_model(request.match_info["model"], params)
        return web.Response(status=200)

    async def unload_model(self, request: web.Request) -> web.Response:
        params = _parameters(_json_object(await self._read_body(request)))
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidArgument("'unload_dependents' must be a boolean")
        await self.service.unload_model(request.match_info["model"], dependents)
        return web.Response(status=200)

    # -- shared-memory extensions ---------------------------------------------------------
    async def shm_status(self, request: web.Request) -> web.Response:
        return _json(request, self.service.shm_status(_shm_kind(request), request.match_info.get("region", "")))

    async def shm_register(self, request: web.Request) -> web.Response:
        # perf_analyzer sends these JSON bodies as application/x-www-form-urlencoded: read as JSON.
        doc = _json_object(await self._read_body(request))
        name = request.match_info["region"]
        if _shm_kind(request) == "system":
            await self.service.register_system_shm(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))
        else:
            handle = doc.get("raw_handle")
            b64 = handle.get("b64") if isinstance(handle, dict) else None
            if not isinstance(b64, str):
                raise InvalidArgument("'raw_handle' must be an object with a base64 'b64' string")
            await self.service.register_cuda_shm(name, b64, doc.get("device_id", 0), doc.get("byte_size"))
        return web.Response(status=200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        await self.service.unregister_shm(_shm_kind(request), request.match_info.get("region", ""))
        return web.Response(status=200)

    # -- trace and logging extensions -------------------------------------------------------
    async def trace_setting(self, request: web.Request) -> web.Response:
        log.debug("HTTP request: %s %s", request.method, request.path)
        model = request.match_info.get("model", "")
        if request.method == "GET":
            return _json(request, self.service.trace_settings(model))
        changes = _json_object(await self._read_body(request))
        return _json(request, await self.service.update_trace_settings(model, changes))

    async def log_settings(self, request: web.Request) -> web.Response:
        log.debug("HTTP request: %s %s", request.method, request.path)
        if request.method == "GET":
            return _json(request, self.service.get_log_settings())
        changes = _json_object(await self._read_body(request))
        return _json(request, await self.service.update_log_settings(changes))

    # -- helpers -------------------------------------------------------------------------
    async def _read_body(self, request: web.Request) -> bytes:
        # read() enforces client_max_size (413) on what arrives on the wire; the runner does
        # not inflate (auto_decompress=False), so compressed bodies are capped here.
        return decode_body(await request.read(), request.headers.get("Content-Encoding"), self.max_input_size)


def build_routes(h: HttpHandlers) -> list[web.RouteDef]:
    """Triton's HTTP routes, in match order (fixed paths before ``{model}`` patterns)."""
    routes = [
        web.get("/v2/health/live", h.live),
        web.get("/v2/health/ready", h.ready),
        web.get("/v2", h.server_metadata),
        web.get("/v2/models/stats", h.model_stats),
        web.post("/v2/repository/index", h.repository_index),
        web.post("/v2/repository/models/{model}/load", h.load_model),
        web.post("/v2/repository/models/{model}/unload", h.unload_model),
        web.get("/v2/trace/setting", h.trace_setting),
        web.post("/v2/trace/setting", h.trace_setting),
        web.get("/v2/models/{model}/trace/setting", h.trace_setting),  # no versioned form, as in Triton
        web.post("/v2/models/{model}/trace/setting", h.trace_setting),
        web.get("/v2/logging", h.log_settings),
        web.post("/v2/logging", h.log_settings),
    ]
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        base = f"/v2/{kind}"
        routes += [
            web.get(f"{base}/status", h.shm_status),
            web.get(f"{base}/region/{{region}}/status", h.shm_status),
            web.post(f"{base}/region/{{region}}/register", h.shm_register),
            web.post(f"{base}/unregister", h.shm_unregister),
            web.post(f"{base}/region/{{region}}/unregister", h.shm_unregister),
        ]
    for prefix in _MODEL_PREFIXES:
        routes += [
            web.get(prefix, h.model_metadata),
            web.get(prefix + "/ready", h.model_ready),
            web.get(prefix + "/config", h.model_config),
            web.get(prefix + "/stats", h.model_stats),
            web.post(prefix + "/infer", h.infer),
            web.post(prefix + "/generate", h.generate),
            web.post(prefix + "/generate_stream", h.generate_stream),
        ]
    return routes


def _json_object(body: bytes) -> dict[str, Any]:
    """A small JSON request body (empty means ``{}``)."""
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the request JSON must be an object")
    return doc


def _parameters(doc: dict[str, Any]) -> dict[str, Any]:
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidArgument("'parameters' must be an object")
    return params


def _shm_kind(request: web.Request) -> str:
    return "system" if request.path.startswith("/v2/systemsharedmemory") else "cuda"



def _open_span(request: web.Request) -> RequestSpan:
    """The request's InferRequest span, under the caller's W3C traceparent, from its arrival."""
    span = RequestSpan(request.headers.get("traceparent"))
    span.stamp("HTTP_RECV_START")
    return span


async def _send_traced(request: web.Request, response: web.StreamResponse, span: RequestSpan) -> web.StreamResponse:
    """Send ``response`` now, between the span's response events (the caller stamps
    HTTP_SEND_END and ends the span, also when this fails)."""
    span.stamp("INFER_RESPONSE_COMPLETE")
    span.stamp("HTTP_SEND_START")
    await response.prepare(request)
    await response.write_eof()
    return response

def _model(request: web.Request) -> tuple[str, str]:
    info = request.match_info
    return info["model"], info.get("version", "")


def _json(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type=JSON_TYPE)
