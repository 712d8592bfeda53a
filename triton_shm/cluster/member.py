"""One of several front-end processes (``--frontend-processes N``, N > 1): its steps of the
server's start-up and shutdown (``cluster/role.py: Role``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .control import Cluster
from .forwarding import forwarding_to
from .peers import Peers
from .processes import FrontendProcesses
from .share import FrontendShare

if TYPE_CHECKING:
    from ..core.models.manager import ModelManager
    from ..core.models.version import ModelVersion
    from ..core.scheduling.interface import Scheduler
    from ..core.service import InferenceService
    from ..options import ServerOptions
    from .processes import Place


class Member:
    def __init__(self, place: "Place", options: "ServerOptions"):
        self.place, self.options = place, options
        self.leads = place.index == 0
        self.processes: FrontendProcesses | None = None
        if self.leads:
            self._bind_ports()  # a port in use fails the start before anything else
            self.processes = FrontendProcesses(place, options.command_line)
        assert place.directory is not None
        self.own = FrontendShare(place.index, place.count)
        self.share: FrontendShare | None = self.own
        self.peers = Peers(place.index, place.count, place.directory)
        self.forwarding: Callable[[ModelVersion, int], Scheduler] | None = forwarding_to(self.peers)
        self.cluster: Cluster | None = None
        self.peer_snapshots: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None

    def startup_models(self) -> list[str]:
        """A restarted process loads what the server has now (``Cluster.rejoin``), not the
        start-up list."""
        if self.place.restarted and self.options.model_control_mode == "explicit":
            return []
        return self.options.load_model

    def join(self, service: "InferenceService", models: "ModelManager") -> None:
        cluster = self.cluster = Cluster(self.own, self.peers, service)
        service.replicate(cluster)
        cluster.share_trace_file(self.place.restarted)
        self.peer_snapshots = cluster.metrics_snapshots
        if self.leads:
            models.after_poll = cluster.after_poll
        else:
            models.polls = False  # process 0 polls, then has the others apply what changed

    def signal(self, sig: int) -> None:
        if self.processes is not None:
            # the others drain (or stop) alike; SIGHUP: they serve the renewed TLS files
            self.processes.signal(sig)

    async def start(self) -> None:
        assert self.cluster is not None
        await self.peers.start(self.cluster.handlers())  # forwarded requests: once every model is loaded
        if self.processes is not None:
            await self.processes.start()  # they load their models while this one does

    async def loaded(self, failed: list[str]) -> list[str]:
        assert self.cluster is not None
        self.cluster.loaded.set()
        if self.leads:
            return await self.cluster.startup()  # every process has loaded; then all serve
        if self.place.restarted:
            await self.cluster.rejoin()
        else:
            await self.cluster.serving.wait()
        return failed

    def bind_ports(self) -> None:
        if not self.leads:  # now: the kernel sends this process connections once it listens
            self._bind_ports()

    def _bind_ports(self) -> None:
        """Bind the HTTP and gRPC ports with SO_REUSEPORT (each process its own socket; the
        server listens once it serves)."""
        from ..frontend.listeners import bind_listener
        options, listeners = self.options, self.place.listeners
        if options.allow_http:
            listeners["http"] = bind_listener(options.http_address, options.http_port, reuse_port=True, listen=False)
        if options.allow_grpc:
            listeners["grpc"] = bind_listener(options.grpc_address, options.grpc_port, reuse_port=True, listen=False)

    async def frontends_stopped(self, timeout: float) -> None:
        """The others may forward requests here yet (if this process served)."""
        assert self.cluster is not None
        await self.cluster.frontends_stopped(timeout=timeout, wait=self.cluster.serving.is_set())

    async def stop_others(self, timeout: float) -> None:
        if self.processes is not None:  # they drain since the signal reached them
            await self.processes.stop(timeout=timeout)

    async def close(self) -> None:
        await self.peers.close()
