"""TLS and mutual TLS on the HTTP, gRPC and metrics ports, end to end with the real
tritonclient (http, grpc, grpc.aio) and perf_analyzer, over both gRPC transports;
certificates reloaded on SIGHUP without dropping open connections."""
from __future__ import annotations

import asyncio
import http.client
import shutil
import signal
import socket
import ssl
import time
import urllib.request
import warnings

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from triton_shm.frontend.tls import ServerTls, TlsError, TlsFiles

from .certs import Pki, make_pki, server_cert
from .harness import ServerProcess, free_port
from .models import python_identity

MODEL = "identity_fp32"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _client_context(pki: Pki, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
    return ctx


def _start(tmp_path_factory, pki: Pki, transport: str, mutual: bool, metrics_port: int | None = None,
           cert=None, key=None) -> ServerProcess:
    root = tmp_path_factory.mktemp(f"tls-{transport}-{'mutual' if mutual else 'tls'}")
    python_identity(root / "models", MODEL, "FP32")
    cert, key = cert or pki.server_cert, key or pki.server_key
    args = ["--grpc-transport", transport,
            f"--grpc-use-ssl{'-mutual' if mutual else ''}=true", "--grpc-server-cert", str(cert),
            "--grpc-server-key", str(key),
            f"--http-use-ssl{'-mutual' if mutual else ''}=true", "--http-server-cert", str(cert),
            "--http-server-key", str(key)]
    if mutual:
        args += ["--grpc-root-cert", str(pki.ca), "--http-root-cert", str(pki.ca)]
    server = ServerProcess(root / "models", root / "server.log", extra_args=args,
                           https=_client_context(pki, cert=mutual))
    if metrics_port is not None:  # metrics over TLS with the HTTP port's certificate
        server.extra_args += ["--allow-metrics", "true", "--metrics-port", str(metrics_port),
                              "--metrics-address", "127.0.0.1", "--metrics-use-ssl", "true"]
    return server.start()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def tls_server(request, tmp_path_factory, pki):
    metrics_port = free_port()
    server = _start(tmp_path_factory, pki, request.param, mutual=False, metrics_port=metrics_port)
    server.metrics_port = metrics_port
    yield server
    server.stop_cleanly()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def mutual_server(request, tmp_path_factory, pki):
    server = _start(tmp_path_factory, pki, request.param, mutual=True)
    yield server
    server.stop_cleanly()


def _inputs(module, data: np.ndarray):
    inp = module.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return [inp]


DATA = np.arange(8, dtype=np.float32)
# a short measurement that always counts as stable: the test is that requests succeed over TLS
PERF_WINDOW = ["--measurement-mode", "count_windows", "--measurement-request-count", "20", "--max-trials", "3",
               "--stability-percentage", "1000"]


def _http_client(server: ServerProcess, pki: Pki, cert: bool = False, key=None, chain=None):
    import gevent.ssl
    options = {"ca_certs": str(pki.ca)}
    if cert or chain:
        options.update(certfile=str(chain or pki.client_cert), keyfile=str(key or pki.client_key))
    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options,
                                            ssl_context_factory=gevent.ssl.create_default_context)


def _grpc_client(server: ServerProcess, pki: Pki, cert: bool = False, module=grpcclient, key=None, chain=None):
    kwargs = {}
    if cert or chain:
        kwargs = dict(private_key=str(key or pki.client_key), certificate_chain=str(chain or pki.client_cert))
    return module.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(pki.ca), **kwargs)


def _peer_common_name(port: int, pki: Pki, alpn: list[str] | None = None, cert: bool = False) -> str:
    ctx = _client_context(pki, cert)
    if alpn:
        ctx.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            subject = dict(x[0] for x in tls.getpeercert()["subject"])
            return subject["commonName"]


# -- TLS --------------------------------------------------------------------------------------
def test_http_over_tls(tls_server, pki):
    client = _http_client(tls_server, pki)
    assert client.is_server_ready()
    result = client.infer(MODEL, _inputs(httpclient, DATA))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
    client.close()


def test_http_aio_over_tls(tls_server, pki):
    async def main():
        client = httpaio.InferenceServerClient(tls_server.http_url, ssl=True, ssl_context=_client_context(pki))
        try:
            result = await client.infer(MODEL, _inputs(httpaio, DATA))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
        finally:
            await client.close()
    asyncio.run(main())


def test_grpc_over_tls(tls_server, pki):
    client = _grpc_client(tls_server, pki)
    assert client.is_server_live()
    result = client.infer(MODEL, _inputs(grpcclient, DATA))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
    client.close()


def test_grpc_16_mib_both_ways_over_tls(tls_server, pki):
    data = np.random.default_rng(0).random((4 << 20) + 1, dtype=np.float32)  # 16 MiB + 4 B
    client = _grpc_client(tls_server, pki)
    result = client.infer(MODEL, _inputs(grpcclient, data))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    client.close()


def test_grpc_aio_over_tls(tls_server, pki):
    async def main():
        client = _grpc_client(tls_server, pki, module=grpcaio)
        try:
            result = await client.infer(MODEL, _inputs(grpcaio, DATA))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
        finally:
            await client.close()
    asyncio.run(main())


def test_plaintext_http_client_is_refused(tls_server):
    conn = http.client.HTTPConnection("127.0.0.1", tls_server.http_port, timeout=10)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine)):
        conn.request("GET", "/v2/health/ready")
        conn.getresponse()
    conn.close()


def test_plaintext_grpc_client_is_refused(tls_server):
    client = grpcclient.InferenceServerClient(tls_server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.is_server_live(client_timeout=10)
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    client.close()


def test_a_client_that_does_not_trust_the_server_fails(tls_server, pki, tmp_path):
    """The server certificate is checked by the client (another CA: verification fails)."""
    from .certs import make_ca
    other_ca, _ = make_ca(tmp_path, "other")
    ctx = ssl.create_default_context(cafile=str(other_ca))
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=10) as raw:
            ctx.wrap_socket(raw, server_hostname="localhost")


def test_grpc_port_selects_alpn_h2(tls_server, pki):
    ctx = _client_context(pki)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_tls_1_1_is_refused(tls_server, pki):
    """TLS 1.2 is the oldest served: a client that offers only TLS 1.1 is refused by the server."""
    ctx = _client_context(pki)
    with warnings.catch_warnings():  # TLS 1.1 is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("ALL:@SECLEVEL=0")
    with pytest.raises(ssl.SSLError) as e:  # the server's alert: this client could speak TLS 1.1
        with socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=10) as raw:
            ctx.wrap_socket(raw, server_hostname="localhost")
    # uvloop's transport sends the alert; asyncio's (the pure-Python run) closes without one
    assert e.value.reason in ("TLSV1_ALERT_PROTOCOL_VERSION", "UNEXPECTED_EOF_WHILE_READING")
    ctx = _client_context(pki)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # 1.2 itself works
    with socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() == "TLSv1.2"


def test_metrics_over_tls_with_the_http_certificate(tls_server, pki):
    url = f"https://127.0.0.1:{tls_server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=_client_context(pki)) as r:
        assert r.status == 200
        assert b"nv_inference_request_success" in r.read()
    assert _peer_common_name(tls_server.metrics_port, pki) == "localhost"


def test_perf_analyzer_over_https_and_grpc_tls(tls_server, pki, perf_analyzer):
    common = ["-m", MODEL, "--shape", "INPUT0:8", *PERF_WINDOW]
    _perf(perf_analyzer, tls_server, "-u", f"https://{tls_server.http_url}", "-i", "http", *common,
          "--ssl-https-ca-certificates-file", str(pki.ca), "--ssl-https-verify-peer", "1",
          "--ssl-https-verify-host", "2")
    _perf(perf_analyzer, tls_server, "-u", tls_server.grpc_url, "-i", "grpc", *common, "--ssl-grpc-use-ssl", "true",
          "--ssl-grpc-root-certifications-file", str(pki.ca))


def _perf(perf_analyzer, server: ServerProcess, *args: str) -> None:
    """perf_analyzer's requests all succeed (its exit code), shown with the server's log if not."""
    out = perf_analyzer.run(*args, timeout=180)
    assert out.returncode == 0 and "Throughput" in out.stdout, \
        f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}\n{server.log()[-3000:]}"


# -- mutual TLS ---------------------------------------------------------------------------------
def test_mutual_tls_http(mutual_server, pki):
    client = _http_client(mutual_server, pki, cert=True)
    result = client.infer(MODEL, _inputs(httpclient, DATA))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
    client.close()


@pytest.mark.parametrize("who", ["no certificate", "a certificate the CA did not sign"])
def test_mutual_tls_http_refuses_clients_without_a_signed_certificate(mutual_server, pki, who):
    ctx = _client_context(pki)
    if who != "no certificate":
        ctx.load_cert_chain(pki.rogue_cert, pki.rogue_key)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection(("127.0.0.1", mutual_server.http_port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                # TLS 1.3: the client's handshake ends before the server has checked its certificate
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                if not tls.recv(100):
                    raise ConnectionError("closed")


def test_mutual_tls_issues_no_session_tickets(mutual_server, pki):
    """TLS 1.3 connections are never resumed: each presents its certificate, so a root
    certificate reloaded on SIGHUP applies to them all."""
    ctx = _client_context(pki, cert=True)
    session = None
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", mutual_server.http_port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls:
                assert tls.version() == "TLSv1.3"
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(100).startswith(b"HTTP/1.1 200")  # tickets, if any, came before
                assert not tls.session_reused
                assert not tls.session.has_ticket
                session = tls.session


def test_mutual_tls_grpc(mutual_server, pki):
    client = _grpc_client(mutual_server, pki, cert=True)
    result = client.infer(MODEL, _inputs(grpcclient, DATA))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
    client.close()

    async def aio():
        client = _grpc_client(mutual_server, pki, cert=True, module=grpcaio)
        try:
            assert await client.is_server_ready()
        finally:
            await client.close()
    asyncio.run(aio())


@pytest.mark.parametrize("who", ["no certificate", "a certificate the CA did not sign"])
def test_mutual_tls_grpc_refuses_clients_without_a_signed_certificate(mutual_server, pki, who):
    kwargs = {} if who == "no certificate" else dict(key=pki.rogue_key, chain=pki.rogue_cert)
    client = _grpc_client(mutual_server, pki, **kwargs)
    with pytest.raises(InferenceServerException) as e:
        client.is_server_live(client_timeout=10)
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    client.close()


def test_perf_analyzer_with_a_client_certificate(mutual_server, pki, perf_analyzer):
    common = ["-m", MODEL, "--shape", "INPUT0:8", *PERF_WINDOW]
    _perf(perf_analyzer, mutual_server, "-u", f"https://{mutual_server.http_url}", "-i", "http", *common,
          "--ssl-https-ca-certificates-file", str(pki.ca),
          "--ssl-https-client-certificate-file", str(pki.client_cert), "--ssl-https-client-certificate-type", "PEM",
          "--ssl-https-private-key-file", str(pki.client_key), "--ssl-https-private-key-type", "PEM")
    _perf(perf_analyzer, mutual_server, "-u", mutual_server.grpc_url, "-i", "grpc", *common,
          "--ssl-grpc-use-ssl", "true", "--ssl-grpc-root-certifications-file", str(pki.ca),
          "--ssl-grpc-private-key-file", str(pki.client_key), "--ssl-grpc-certificate-chain-file", str(pki.client_cert))


# -- reload on SIGHUP -----------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_sighup_reloads_certificates_and_keeps_open_connections(tmp_path_factory, pki, transport):
    live = tmp_path_factory.mktemp("live-cert")
    cert, key = live / "server.pem", live / "server.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    server = _start(tmp_path_factory, pki, transport, mutual=False, cert=cert, key=key)
    try:
        assert _peer_common_name(server.http_port, pki) == "localhost"
        kept = http.client.HTTPSConnection("127.0.0.1", server.http_port, timeout=10, context=_client_context(pki))
        kept.request("GET", "/v2/health/ready")
        assert kept.getresponse().read() == b""
        grpc_kept = _grpc_client(server, pki)
        assert grpc_kept.is_server_live()

        new_cert, new_key = server_cert(pki.dir, f"second-{transport}", pki.ca, pki.dir / "ca.key", cn="second")
        shutil.copy(new_cert, cert)
        shutil.copy(new_key, key)
        server.proc.send_signal(signal.SIGHUP)
        _wait_for_log(server, "gRPC TLS: certificate reloaded")

        assert _peer_common_name(server.http_port, pki) == "second"
        assert _peer_common_name(server.grpc_port, pki, alpn=["h2"]) == "second"
        kept.request("GET", "/v2/health/ready")  # the open connection still works
        response = kept.getresponse()
        assert response.status == 200
        response.read()
        assert grpc_kept.is_server_live()
        fresh = _grpc_client(server, pki)  # a new gRPC connection with the new certificate works
        result = fresh.infer(MODEL, _inputs(grpcclient, DATA))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), DATA)
        for c in (grpc_kept, fresh):
            c.close()
        kept.close()

        (live / "server.key").write_text("not a key")  # a broken reload keeps the last good certificate
        server.proc.send_signal(signal.SIGHUP)
        _wait_for_log(server, "still serving the previous certificate")
        assert _peer_common_name(server.http_port, pki) == "second"
    finally:
        server.stop_cleanly()


def _wait_for_log(server: ServerProcess, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"'{text}' not logged:\n{server.log()[-3000:]}"
        time.sleep(0.1)


# -- start-up -------------------------------------------------------------------------------------
def test_unusable_certificate_files_stop_the_server_at_start(tmp_path, pki):
    python_identity(tmp_path / "models", MODEL, "FP32")
    server = ServerProcess(tmp_path / "models", tmp_path / "server.log", extra_args=[
        "--grpc-use-ssl=true", "--grpc-server-cert", str(tmp_path / "missing.pem"),
        "--grpc-server-key", str(pki.server_key)])
    with pytest.raises(RuntimeError, match="exited with 1"):
        server.start(timeout=60)
    assert f"gRPC TLS: cannot read the certificate '{tmp_path / 'missing.pem'}': No such file or directory" \
        in server.log()


def test_server_context_is_tls_1_2_or_later_and_checks_key_and_files(pki, tmp_path):
    tls = ServerTls(TlsFiles(pki.server_cert, pki.server_key, pki.ca), "HTTP")
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.current.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.current.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TlsError) as e:
        ServerTls(TlsFiles(pki.server_cert, pki.client_key), "HTTP")  # a key of another certificate
    assert e.value.message.startswith(f"HTTP TLS: the certificate '{pki.server_cert}' and key '{pki.client_key}' "
                                      "cannot be used: ")
    (tmp_path / "garbage.pem").write_text("garbage")
    with pytest.raises(TlsError) as e:
        ServerTls(TlsFiles(pki.server_cert, pki.server_key, tmp_path / "garbage.pem"), "gRPC")
    assert e.value.message.startswith(f"gRPC TLS: the root certificate '{tmp_path / 'garbage.pem'}' cannot be used")

