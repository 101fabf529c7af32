"""Store faults as the API shows them: a status a caller can act on, and a health status that tells the
truth while the store fails (``service/store.py``'s ``StoreError``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from service.store import StoreError

log = logging.getLogger(__name__)


class StoreHealth:
    """Keeps the API services' health true to the store: NOT_SERVING while store calls fail (the fault
    logged once, when it starts), SERVING again on the first call that succeeds. The overall status
    (``""``) stays SERVING: the process is alive, and restarting it would not free another's lock.
    ``faults`` counts every failed store call by its kind (``rayft_store_faults_total``, what an alert watches)."""

    def __init__(self, health_servicer: Any, names: list[str], faults: Any = None):
        self.health, self.names, self.fault, self.faults = health_servicer, names, None, faults

    async def watch(self, fault: StoreError | None) -> None:
        if fault is not None and self.faults is not None:
            self.faults.labels(fault.kind).inc()
        if (fault is None) == (self.fault is None):
            return
        self.fault = fault
        if fault is not None:
            log.error("job store fault (%s): %s; the API reports NOT_SERVING until it clears", fault.kind, fault)
        else:
            log.info("job store answers again; the API reports SERVING")
        status = health_pb2.HealthCheckResponse.NOT_SERVING if fault else health_pb2.HealthCheckResponse.SERVING
        for name in self.names:
            await self.health.set(name, status)


class StoreFaults(grpc.aio.ServerInterceptor):
    """A ``StoreError`` from any call leaves as a status the caller can act on, with a plain message:
    UNAVAILABLE (busy, broken: retry later) or RESOURCE_EXHAUSTED (disk full), never UNKNOWN with
    SQLite's text. Hand-written: grpc.aio has no ready-made mapping of exceptions to statuses."""

    CODES = {"full": grpc.StatusCode.RESOURCE_EXHAUSTED}

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not (handler.unary_unary or handler.unary_stream):
            return handler
        codes = self.CODES

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await handler.unary_unary(request, context)
            except StoreError as exc:
                await context.abort(codes.get(exc.kind, grpc.StatusCode.UNAVAILABLE), str(exc))

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in handler.unary_stream(request, context):
                    yield item
            except StoreError as exc:
                await context.abort(codes.get(exc.kind, grpc.StatusCode.UNAVAILABLE), str(exc))

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
            )
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
