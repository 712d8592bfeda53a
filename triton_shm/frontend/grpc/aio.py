"""The grpc.aio transport: the fallback, and the one used without C extensions."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, AsyncIterator, Callable

import grpc

from .rpc import Method, rpc_status


_CODES = {c.value[0]: c for c in grpc.StatusCode}


# Responses are serialized inside the handler (grpcio's serializer hook is not used): a
# ModelInfer response holds arena blocks until it is encoded, and the handler is the one
# place sure to run to the end or be cancelled as a whole.
def _unary(method: Method) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:  # decoded here, not by grpcio, so a malformed message is answered like any bad input
            return method.serialize(await method.handler(method.deserialize(request)), False)
        except grpc.aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 - the client must get an answer
            code, message = rpc_status(e, method.path)
        await context.abort(_CODES[code], message)
    return handler


def _stream(method: Method) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        serialize, deserialize = method.serialize, method.deserialize
        decoded = (deserialize(r) async for r in requests)
        async for reply in method.handler(decoded):
            yield serialize(reply, False)
    return handler


def generic_handlers(methods: list[Method]) -> list[grpc.GenericRpcHandler]:
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = defaultdict(dict)
    for m in methods:
        service, name = m.path[1:].split("/")
        kwargs = dict(request_deserializer=None, response_serializer=None)
        by_service[service][name] = (
            grpc.stream_stream_rpc_method_handler(_stream(m), **kwargs) if m.streaming
            else grpc.unary_unary_rpc_method_handler(_unary(m), **kwargs))
    return [grpc.method_handlers_generic_handler(s, handlers) for s, handlers in by_service.items()]


async def start_aio(methods: list[Method], host: str, port: int, options: list[tuple[str, int]]) -> grpc.aio.Server:
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers(generic_handlers(methods))
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:  # some grpcio versions raise instead of returning 0
        bound = 0
        cause: Exception | None = e
    else:
        cause = None
    if bound == 0:
        await server.stop(None)
        raise OSError(f"gRPC server could not bind {address} (address in use or invalid?)") from cause
    await server.start()
    return server
