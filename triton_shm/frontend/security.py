"""What the ports are guarded with: each port's TLS and each protocol's restricted APIs,
built once at start-up from the command line and reloaded together on SIGHUP."""
from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from .restricted import RestrictionError, Restrictions, parse_restrictions
from .tls import ServerTls

if TYPE_CHECKING:
    from ..options import ServerOptions

log = logging.getLogger(__name__)


@dataclass
class Security:
    """Each port's TLS and each protocol's restricted APIs; SIGHUP reloads them."""
    tls: dict[str, ServerTls]
    http_restrictions: Restrictions
    grpc_restrictions: Restrictions

    @classmethod
    def from_options(cls, options: "ServerOptions") -> "Security":
        tls = {}
        for port, name, alpn in (("http", "HTTP", None), ("grpc", "gRPC", ["h2"]), ("metrics", "metrics", None)):
            files = options.tls_files(port)
            if files is not None and getattr(options, f"allow_{port}"):
                tls[port] = ServerTls(files, name, alpn)
        try:
            http = parse_restrictions(options.http_restricted_api, "--http-restricted-api")
            grpc = parse_restrictions(options.grpc_restricted_protocol, "--grpc-restricted-protocol", grpc=True)
        except RestrictionError as e:
            raise InvalidArgument(str(e)) from None
        return cls(tls, http, grpc)

    def context(self, port: str) -> ssl.SSLContext | None:
        tls = self.tls.get(port)
        return None if tls is None else tls.context

    def reload(self) -> None:
        log.info("SIGHUP: reloading TLS certificates and restricted-API values read from files")
        for tls in self.tls.values():
            tls.reload()
        self.http_restrictions.reload()
        self.grpc_restrictions.reload()
