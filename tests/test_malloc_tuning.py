"""The front-end keeps large in-band buffers in glibc's heap (server.keep_large_buffers), so a
repeated 16 MiB HTTP request does not page-fault its body in again; TRITON_SHM_MALLOC_DEFAULTS=1
turns that off. Counted from /proc/PID/stat (minor faults), not timed."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from triton_shm._twins import NO_EXTENSIONS

from .harness import ServerProcess
from .models import python_identity

PAGES_16MIB = (16 << 20) // 4096
REQUESTS = 10

pytestmark = pytest.mark.skipif(os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc only")


def minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # field 10 of stat; the list starts at field 3


def faults_of_16mib_requests(tmp_path: Path, env: dict[str, str]) -> int:
    """Front-end minor faults over REQUESTS sequential 16 MiB in-band requests after warm-up."""
    python_identity(tmp_path / "repo", "identity_fp32", "FP32")
    server = ServerProcess(tmp_path / "repo", tmp_path / "server.log", env=env).start()
    try:
        client = http.InferenceServerClient(server.http_url)
        data = np.arange(4 << 20, dtype=np.float32)
        tensor = http.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        outputs = [http.InferRequestedOutput("OUTPUT0", binary_data=True)]
        for _ in range(5):
            client.infer("identity_fp32", [tensor], outputs=outputs)
        before = minor_faults(server.proc.pid)
        for _ in range(REQUESTS):
            result = client.infer("identity_fp32", [tensor], outputs=outputs)
        faults = minor_faults(server.proc.pid) - before
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        client.close()
    finally:
        server.stop_cleanly()
    return faults


def test_large_requests_reuse_heap_memory(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("MALLOC_") or k == "TRITON_SHM_MALLOC_DEFAULTS"]:
        monkeypatch.delenv(name)
    # Over all ten requests, fewer faults than four 16 MiB bodies have pages: the heap may still
    # grow now and then (the pure-Python parser's buffers); without it, every request faults its
    # body in again.
    assert faults_of_16mib_requests(tmp_path, {}) < 4 * PAGES_16MIB


@pytest.mark.skipif(NO_EXTENSIONS,
                    reason="the pure-Python parser's allocations sometimes let glibc's own dynamic "
                           "threshold keep the buffers, so the faults have no lower bound there")
def test_malloc_defaults_switch_turns_it_off(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    # glibc's defaults mmap each body afresh and unmap it on free: every request faults in at
    # least one body (about three, for the copies on the way).
    assert faults_of_16mib_requests(tmp_path, {"TRITON_SHM_MALLOC_DEFAULTS": "1"}) > REQUESTS * PAGES_16MIB
