"""TLS for the HTTP, gRPC and metrics ports: one :class:`ServerTls` per port.

The listening socket is given a base context whose SNI callback (OpenSSL calls it for
every handshake, with or without a server name) hands each new connection the current
context. A reload (SIGHUP) builds a fresh context from the files and makes it current:
new connections get the new certificate, key and client CA; open connections keep the
context they were made with, so none is dropped. A reload that fails keeps the old one.
grpc.aio gets the same through grpcio's dynamic server credentials.
"""
from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument

log = logging.getLogger(__name__)


class TlsError(InvalidArgument):
    """A certificate, key or CA file that cannot be used (at start-up: exit 1)."""


@dataclass(frozen=True)
class TlsFiles:
    """What one port serves: its certificate chain and key, and for mutual TLS the CA
    whose certificates clients must present."""
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None


def _read(path: Path, what: str, port: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TlsError(f"{port} TLS: cannot read the {what} '{path}': {e.strerror}") from None


def build_context(files: TlsFiles, port: str, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the files' certificate and key, and with a
    client CA, client certificates required and verified against it."""
    for path, what in ((files.cert, "certificate"), (files.key, "private key"), (files.client_ca, "root certificate")):
        if path is not None:
            _read(path, what, port)  # a clear message for a missing or unreadable file
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as e:
        raise TlsError(f"{port} TLS: the certificate '{files.cert}' and key '{files.key}' cannot be used: "
                       f"{e.reason or e}") from None
    if files.client_ca is not None:
        # No session tickets: a TLS 1.3 connection always presents its certificate, so a
        # reloaded root certificate applies to it. (TLS 1.2 session IDs stay in OpenSSL's
        # server cache, which Python offers no way to turn off; docs/security.md says so.)
        ctx.options |= ssl.OP_NO_TICKET
        ctx.num_tickets = 0
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_verify_locations(cafile=files.client_ca)
        except ssl.SSLError as e:
            raise TlsError(f"{port} TLS: the root certificate '{files.client_ca}' cannot be used: "
                           f"{e.reason or e}") from None
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


class ServerTls:
    """One port's TLS, reloadable. ``port`` names it in messages ("HTTP", "gRPC", "metrics")."""

    def __init__(self, files: TlsFiles, port: str, alpn: list[str] | None = None):
        self.files = files
        self.port = port
        self.alpn = alpn
        self.generation = 0  # bumped by every successful reload
        self.current = build_context(files, port, alpn)
        self.context = build_context(files, port, alpn)  # the listening socket's
        self.context.sni_callback = self._select

    def _select(self, ssl_object: Any, server_name: str | None, context: ssl.SSLContext) -> None:
        if self.current is not context:
            ssl_object.context = self.current
        return None

    def reload(self) -> bool:
        """Read the files again; new connections use them. False (logged) if they cannot be used."""
        try:
            self.current = build_context(self.files, self.port, self.alpn)
        except TlsError as e:
            log.error("%s; still serving the previous certificate", e.message)
            return False
        self.generation += 1
        log.info("%s TLS: certificate reloaded from '%s'", self.port, self.files.cert)
        return True

    # -- grpc.aio -----------------------------------------------------------------------
    def grpc_credentials(self) -> Any:
        """grpcio server credentials that follow :meth:`reload`."""
        import grpc

        def configuration() -> Any:
            files = self.files
            root = _read(files.client_ca, "root certificate", self.port) if files.client_ca else None
            return grpc.ssl_server_certificate_configuration(
                [(_read(files.key, "private key", self.port), _read(files.cert, "certificate", self.port))],
                root_certificates=root)

        served = [self.generation]

        def fetch() -> Any:  # grpcio asks at every handshake; None keeps what it has
            if served[0] == self.generation:
                return None
            served[0] = self.generation
            try:
                return configuration()
            except TlsError as e:
                log.error("%s", e.message)
                return None

        return grpc.dynamic_ssl_server_credentials(configuration(), fetch,
                                                   require_client_authentication=self.files.mutual)
