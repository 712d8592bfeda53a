"""The grpc.aio transport: the fallback, and the one used without C extensions."""
from __future__ import annotations

import asyncio
import socket
from collections import defaultdict
from typing import Any, AsyncIterator, Callable, Iterator

import grpc

from ...core.observability.otel import RequestSpan
from ...errors import TritonShmError
from ..header_forward import HeaderForward
from ..restricted import Restrictions
from .rpc import Method, rpc_status


_CODES = {c.value[0]: c for c in grpc.StatusCode}
QUIET_SECS = 0.05  # stopping: no new call for this long, so grpc core holds none unhandled


class CallGate:
    """Counts the calls in the handlers, and refuses new ones once the server is stopping.

    grpc core cancels (CANCELLED) the calls it has received but not yet handed to the
    handlers when the server stops; so a stopping server first answers new calls with
    UNAVAILABLE, which clients may retry elsewhere, and stops grpc core once it is quiet:
    no call in a handler, and none begun or ended for QUIET_SECS (a client answered just
    now sends its next call at once: it is refused, not cancelled).
    """

    def __init__(self) -> None:
        self.stopping = False
        self.in_flight = 0
        self.last_activity = 0.0  # a call entered or left

    def enter(self) -> bool:
        """False: the call is to be refused."""
        self.last_activity = asyncio.get_running_loop().time()
        if self.stopping:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        self.last_activity = asyncio.get_running_loop().time()

    async def quiesce(self, timeout: float) -> None:
        self.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and (self.in_flight or loop.time() - self.last_activity < QUIET_SECS):
            await asyncio.sleep(0.01)


class AioServer:
    """The grpc.aio server, stopped so that the calls it took are answered."""

    def __init__(self, server: grpc.aio.Server, gate: CallGate):
        self.server = server
        self.gate = gate

    async def stop(self, grace: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0.0)
        await self.gate.quiesce(grace or 0.0)
        await self.server.stop(max(deadline - loop.time(), 0.0))


def _refusal(restrictions: Restrictions | None, method: Method, context: grpc.aio.ServicerContext) -> str | None:
    """The restricted-API check, before the body runs; metadata keys arrive lower case."""
    if restrictions is None:
        return None

    def lookup(name: str) -> bytes | None:
        for key, value in context.invocation_metadata() or ():
            if key == name:
                return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
        return None
    return restrictions.refusal(method.group, lookup)


# Responses are serialized inside the handler (grpcio's serializer hook is not used): a
# ModelInfer response holds arena blocks until it is encoded, and the handler is the one
# place sure to run to the end or be cancelled as a whole.
def _unary(method: Method, restrictions: Restrictions | None, gate: CallGate,
           header_forward: "HeaderForward | None" = None) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    forward = header_forward if method.forwards_headers else None

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (refusal := _refusal(restrictions, method, context)) is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        if not gate.enter():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            # decoded here, not by grpcio, so a malformed message is answered like any bad input
            decoded = method.deserialize(request)
            if forward is not None:
                decoded.parameters = forward.parameters(_metadata(context), decoded.parameters)
            if method.spans is not None and method.spans.tracer.spans:
                return await _traced(method, decoded, context)
            return method.serialize(await method.handler(decoded), False)
        except grpc.aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 - the client must get an answer
            code, message = rpc_status(e, method.path)
        finally:
            gate.leave()
        await context.abort(_CODES[code], message)
    return handler


async def _traced(method: Method, request: Any, context: grpc.aio.ServicerContext) -> Any:
    """ModelInfer (``request`` decoded) with its InferRequest span; grpcio sends what it
    returns (GRPC_SEND_END is when it has it)."""
    span = RequestSpan(_traceparent(context))
    span.stamp("GRPC_WAITREAD_START")
    span.stamp("GRPC_WAITREAD_END")
    try:
        response = await method.handler(request, span)
        span.stamp("INFER_RESPONSE_COMPLETE")
        span.stamp("GRPC_SEND_START")
        return method.serialize(response, False)
    finally:
        span.stamp("GRPC_SEND_END")
        method.spans.tracer.end_request(span)


def _traceparent(context: grpc.aio.ServicerContext) -> str | None:
    return next((v for k, v in context.invocation_metadata() or () if k == "traceparent"), None)


def _stream(method: Method, restrictions: Restrictions | None, gate: CallGate,
            header_forward: "HeaderForward | None" = None
            ) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    forward = header_forward if method.forwards_headers else None

    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if (refusal := _refusal(restrictions, method, context)) is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        if not gate.enter():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        try:
            serialize, deserialize = method.serialize, method.deserialize
            decoded = (deserialize(r) async for r in requests)
            if forward is None:
                replies = method.handler(decoded) if method.spans is None else \
                    method.handler(decoded, RequestSpan(_traceparent(context)))
            else:
                replies = method.handler(decoded, RequestSpan(_traceparent(context)), _forwarded(forward, context))
            async for reply in replies:
                yield serialize(reply, False)
        finally:
            gate.leave()
    return handler


def _metadata(context: grpc.aio.ServicerContext) -> Iterator[tuple[str, str]]:
    for k, v in context.invocation_metadata() or ():
        yield k, v if isinstance(v, str) else v.decode("latin-1")


def _forwarded(forward: "HeaderForward", context: grpc.aio.ServicerContext) -> "dict[str, str] | TritonShmError":
    """A stream's forwarded headers, or the error each of its requests is answered."""
    try:
        return forward.parameters(_metadata(context), {})
    except TritonShmError as e:
        return e


def generic_handlers(methods: list[Method], restrictions: Restrictions | None = None,
                     gate: CallGate | None = None, header_forward: "HeaderForward | None" = None
                     ) -> list[grpc.GenericRpcHandler]:
    restrictions = restrictions or None
    gate = gate or CallGate()
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = defaultdict(dict)
    for m in methods:
        service, name = m.path[1:].split("/")
        kwargs = dict(request_deserializer=None, response_serializer=None)
        by_service[service][name] = (
            grpc.stream_stream_rpc_method_handler(_stream(m, restrictions, gate, header_forward), **kwargs)
            if m.streaming
            else grpc.unary_unary_rpc_method_handler(_unary(m, restrictions, gate, header_forward), **kwargs))
    return [grpc.method_handlers_generic_handler(s, handlers) for s, handlers in by_service.items()]


async def start_aio(methods: list[Method], host: str, port: int, options: list[tuple[str, int]], *,
                    restrictions: Restrictions | None = None, credentials: Any = None,
                    sock: socket.socket | None = None, header_forward: "HeaderForward | None" = None) -> AioServer:
    """``credentials``: grpcio server credentials (TLS), else plaintext. grpcio binds its
    ports itself: it cannot serve on a listening socket made elsewhere (``sock``)."""
    if sock is not None:
        raise ValueError("the grpcio gRPC transport can not serve on an inherited socket: "
                         "use --grpc-transport native")
    server = grpc.aio.server(options=options)
    gate = CallGate()
    server.add_generic_rpc_handlers(generic_handlers(methods, restrictions, gate, header_forward))
    address = f"{host}:{port}"
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError as e:  # some grpcio versions raise instead of returning 0
        bound = 0
        cause: Exception | None = e
    else:
        cause = None
    if bound == 0:
        await server.stop(None)
        raise OSError(f"gRPC server could not bind {address} (address in use or invalid?)") from cause
    await server.start()
    return AioServer(server, gate)
