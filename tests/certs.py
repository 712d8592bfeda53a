"""Test certificates made with the openssl command line: a CA, a server certificate for
127.0.0.1 and localhost, and client certificates (one signed by the CA, one self-signed)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path            # the CA certificate (trusted by clients, and by the server for mutual TLS)
    server_cert: Path
    server_key: Path
    client_cert: Path   # signed by the CA
    client_key: Path
    rogue_cert: Path    # self-signed: not signed by the CA
    rogue_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _leaf(dir: Path, name: str, ca: str, ca_key: str, subject: str, ext: str) -> tuple[Path, Path]:
    (dir / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=dir)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=dir)
    return dir / f"{name}.pem", dir / f"{name}.key"


def make_ca(dir: Path, name: str = "ca") -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-sha256",
             "-subj", f"/CN=triton-shm test {name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=dir)
    return dir / f"{name}.pem", dir / f"{name}.key"


def server_cert(dir: Path, name: str, ca: Path, ca_key: Path, cn: str = "localhost") -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 and localhost signed by ``ca``."""
    return _leaf(dir, name, ca.name, ca_key.name, f"/CN={cn}",
                 "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                 "basicConstraints=CA:FALSE\n")


def make_pki(dir: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is not installed")
    dir.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca(dir)
    cert, key = server_cert(dir, "server", ca, ca_key)
    client, client_key = _leaf(dir, "client", ca.name, ca_key.name, "/CN=client",
                               "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rogue",
             "-keyout", "rogue.key", "-out", "rogue.pem", cwd=dir)
    return Pki(dir, ca, cert, key, client, client_key, dir / "rogue.pem", dir / "rogue.key")
