"""This process's part in the server's start-up and shutdown, whatever the number of
front-end processes: ``server.py: serve`` is one sequence that calls these steps, and
``Alone`` (``--frontend-processes 1``) does nothing at each, ``cluster/member.py: Member``
(one of several) what makes the processes one server.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    from ..core.models.manager import ModelManager
    from ..core.models.version import ModelVersion
    from ..core.scheduling.interface import Scheduler
    from ..core.service import InferenceService
    from ..options import ServerOptions
    from .processes import Place
    from .share import FrontendShare


class Role(Protocol):
    place: "Place"
    # process 0 (or the only one): prints the model table, serves the metrics, decides
    # --exit-on-error for the server
    leads: bool
    # the model manager's share of the instances, and the scheduler of a model another owns
    share: "FrontendShare | None"
    forwarding: "Callable[[ModelVersion, int], Scheduler] | None"
    # the metrics page's counters of the other processes (None: there are none)
    peer_snapshots: "Callable[[], Awaitable[list[dict[str, Any]]]] | None"

    def startup_models(self) -> list[str]:
        """The models to load at start (--load-model)."""

    def join(self, service: "InferenceService", models: "ModelManager") -> None:
        """The service and the model manager are built: replicate what changes them."""

    def signal(self, sig: int) -> None:
        """A signal this process received, passed on to the others."""

    async def start(self) -> None:
        """Before the workers: the links to the other processes, and those processes."""

    async def loaded(self, failed: list[str]) -> list[str]:
        """This process's models are loaded (``failed``: those that failed here): wait until
        every process may serve; the server's failed models."""

    def bind_ports(self) -> None:
        """About to serve: the HTTP and gRPC sockets this process has not bound yet."""

    async def frontends_stopped(self, timeout: float) -> None:
        """Shutdown: this process's front-ends are done; wait (up to ``timeout``) until no
        other process may still send it a request."""

    async def stop_others(self, timeout: float) -> None:
        """Shutdown, the workers stopped: the other processes stop (process 0's part)."""

    async def close(self) -> None:
        """Last: the links to the other processes."""


class Alone:
    """The server's only front-end process: nothing to do at any step."""
    leads = True
    share: "FrontendShare | None" = None
    forwarding: "Callable[[ModelVersion, int], Scheduler] | None" = None
    peer_snapshots: "Callable[[], Awaitable[list[dict[str, Any]]]] | None" = None

    def __init__(self, place: "Place", options: "ServerOptions"):
        self.place, self.options = place, options

    def startup_models(self) -> list[str]:
        return self.options.load_model

    def join(self, service: "InferenceService", models: "ModelManager") -> None:
        pass

    def signal(self, sig: int) -> None:
        pass

    async def start(self) -> None:
        pass

    async def loaded(self, failed: list[str]) -> list[str]:
        return failed

    def bind_ports(self) -> None:
        pass  # the front-ends bind their own

    async def frontends_stopped(self, timeout: float) -> None:
        pass

    async def stop_others(self, timeout: float) -> None:
        pass

    async def close(self) -> None:
        pass


def role_for(place: "Place", options: "ServerOptions") -> Role:
    """This process's role; process 0 of several binds its ports here, first, so a port in
    use fails the start before anything else."""
    if not place.several:
        return Alone(place, options)
    from .member import Member
    return Member(place, options)
