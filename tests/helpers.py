"""What the end-to-end tests share, one of each: a tritonclient for either protocol, the
check that a call fails with one status and message, and the check that a server still
serves after whatever a test did to it."""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from .harness import ServerProcess, children

PROTOCOLS = ("http", "grpc")


def twin_params(python_twin: Any, extension: Any, reason: str = "extension not built") -> list:
    """The two implementations of a C piece to parametrize a test over: its pure-Python twin
    and the extension (skipped where ``extension`` is None: not built, or not in use)."""
    return [pytest.param(python_twin, id="python"),
            pytest.param(extension, id="c", marks=pytest.mark.skipif(extension is None, reason=reason))]

# A gRPC status name -> the HTTP status Triton answers with for the same error
# (Triton's HttpCodeFromError).
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "UNAVAILABLE": 503, "UNIMPLEMENTED": 501,
               "ALREADY_EXISTS": 400, "INTERNAL": 500, "UNKNOWN": 400, "CANCELLED": 400}


def client_module(proto: str) -> Any:
    """``tritonclient.http`` or ``tritonclient.grpc``."""
    return httpclient if proto == "http" else grpcclient


def connect(srv: ServerProcess, proto: str, timeout: float = 60.0) -> Any:
    """A fresh tritonclient for ``proto``; HTTP waits up to ``timeout`` for connection and answer
    (gRPC calls take ``client_timeout`` each)."""
    if proto == "http":
        return httpclient.InferenceServerClient(srv.http_url, network_timeout=timeout, connection_timeout=timeout)
    return grpcclient.InferenceServerClient(srv.grpc_url)


def expect_error(proto: str, fn: Callable[[], object], code: str, *fragments: str) -> InferenceServerException:
    """``fn()`` fails with the gRPC status ``code`` (over HTTP: the status Triton maps it to)
    and a message holding every fragment."""
    with pytest.raises(InferenceServerException) as info:
        fn()
    e = info.value
    want = str(HTTP_STATUS[code]) if proto == "http" else f"StatusCode.{code}"
    assert e.status() == want, (e.status(), e.message())
    for fragment in fragments:
        assert fragment in (e.message() or ""), (fragment, e.message())
    return e


def assert_serving(srv: ServerProcess, model: str = "identity_fp32", *, datatype: str = "FP32",
                   input_name: str = "INPUT0", output_name: str = "OUTPUT0",
                   values: np.ndarray | None = None, workers: list[int] | None = None) -> None:
    """The server still answers a correct request with the correct values, over both protocols,
    each on a fresh connection (``model`` echoes ``input_name`` as ``output_name``), and, given
    the worker pids from before, no worker died and was replaced meanwhile."""
    assert srv.proc is not None and srv.proc.poll() is None, srv.log()[-4000:]
    data = np.arange(1, 5).astype(triton_to_np_dtype(datatype)) if values is None else values
    for proto in PROTOCOLS:
        mod = client_module(proto)
        inp = mod.InferInput(input_name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        with connect(srv, proto) as c:
            assert c.is_server_live()
            result = c.infer(model, [inp])
        np.testing.assert_array_equal(result.as_numpy(output_name), data)
    if workers is not None:
        assert children(srv.proc.pid) == workers, "a worker died (and was replaced)"


SHM_DIR = "/dev/shm"
SHM_NAMES = itertools.count()  # a test's /dev/shm objects: tshm_<pid>_<n>...


class Regions:
    """/dev/shm objects this test created; all destroyed (and the server's registrations
    dropped) when the test ends, whatever its outcome."""

    def __init__(self, srv: ServerProcess):
        self.srv = srv
        self.handles = []
        self.paths: list[str] = []  # other things made under /dev/shm (links, dirs, fifos)

    @staticmethod
    def unique(tag: str = "r") -> str:
        return f"tshm_{os.getpid()}_{next(SHM_NAMES)}_{tag}"

    def create(self, byte_size: int, tag: str = "r"):
        """(handle, object name, key)."""
        name = self.unique(tag)
        handle = shm.create_shared_memory_region(name, "/" + name, byte_size)
        self.handles.append(handle)
        return handle, name, "/" + name

    def path(self, name: str) -> str:
        p = os.path.join(SHM_DIR, name)
        self.paths.append(p)
        return p

    def cleanup(self) -> None:
        try:
            cl = httpclient.InferenceServerClient(self.srv.http_url)
            cl.unregister_system_shared_memory()
            cl.close()
        except Exception:  # noqa: BLE001 - the server may be the thing that failed
            pass
        for h in self.handles:
            try:
                shm.destroy_shared_memory_region(h)
            except Exception:  # noqa: BLE001 - e.g. the test unlinked it already
                pass
        for p in self.paths:
            try:
                if os.path.isdir(p) and not os.path.islink(p):
                    os.rmdir(p)
                else:
                    os.unlink(p)
            except FileNotFoundError:
                pass
