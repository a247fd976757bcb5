"""The gRPC server on WARMPOOL_GRPC_PORT: grpc.aio on the HTTP server's own event loop (started by
LifecycleServer.startup; the drain turns health NOT_SERVING at once and closes the port once the calls
in flight are answered), TEI's services, gRPC health (SERVING while /health/ready would answer 200)
and reflection."""

from __future__ import annotations

import asyncio

import structlog
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio
from grpc_health.v1.health_pb2_grpc import add_HealthServicer_to_server
from grpc_reflection.v1alpha import reflection

from server.core.services import Services
from server.grpc.messages import SERVICES, pool
from server.grpc.service import TeiServices

log = structlog.get_logger("warmpool.grpc")

READY_POLL_S = 0.2  # how soon health follows /health/ready (a watcher on the loop: a flag read)


class GrpcServer:
    """TEI's gRPC API beside the HTTP port, on the same loop, pipeline and limits."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        settings = svc.settings
        limits = [
            ("grpc.max_receive_message_length", settings.max_body_bytes),  # HTTP's body limit
            ("grpc.max_send_message_length", settings.max_response_bytes),
            ("grpc.so_reuseport", 0),  # a port another server holds fails the start, never shared silently
        ]
        self.server = aio.server(options=limits)
        self.server.add_generic_rpc_handlers(TeiServices(svc).handlers())
        self.health = health_aio.HealthServicer()
        add_HealthServicer_to_server(self.health, self.server)
        self.names = [s.full_name for s in SERVICES.values()]
        reflection.enable_server_reflection(
            [*self.names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server,
            pool=pool,
        )
        self.port = self.server.add_insecure_port(f"{settings.host}:{settings.grpc_port}")
        self._serving: bool | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        await self._set(False)
        self._watcher = asyncio.ensure_future(self._watch())
        log.info("grpc_listening", host=self.svc.settings.host, port=self.port)

    async def _watch(self) -> None:
        while True:
            await self._set(self.svc.ready())
            await asyncio.sleep(READY_POLL_S)

    async def _set(self, serving: bool) -> None:
        if serving == self._serving:
            return
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.names):
            await self.health.set(name, status)

    async def draining(self) -> None:
        """NOT_SERVING from now on; new calls are answered UNAVAILABLE by the pipeline, as HTTP's 503."""
        if self._watcher is not None:
            self._watcher.cancel()
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace_s: float) -> None:
        """The port closed; calls still in flight (health watches among them: they never end by
        themselves) are cancelled after `grace_s`."""
        await self.draining()
        await self.server.stop(grace_s)
        log.info("grpc_stopped")
