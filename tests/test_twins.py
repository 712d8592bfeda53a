"""The one switch between the C extensions and their twins (``triton_shm._twins``): what
``pick`` binds, and that the switch changes the C pieces only, never the transports."""
from __future__ import annotations

import os
import subprocess
import sys


from triton_shm import _twins
from triton_shm.core.data import _codec, codec_py

SELECTORS = ["core.data.codec", "core.data.types", "backends.base", "ipc.protocol", "ipc.arena", "ipc.ring",
             "frontend.grpc.infer_wire", "frontend.http.common_shape", "frontend.http.request_parser",
             "worker.assembler"]


def _namespace() -> dict:
    return {"__package__": "triton_shm.core.data", "count_bytes": codec_py.count_bytes}


def test_pick_rebinds_the_named_definitions_to_the_extension(monkeypatch):
    monkeypatch.setattr(_twins, "NO_EXTENSIONS", False)
    namespace = _namespace()
    assert _twins.pick(namespace, "._codec", "count_bytes")
    assert namespace["count_bytes"] is _codec.count_bytes


def test_pick_keeps_the_twin_under_the_switch_when_unbuilt_or_unusable(monkeypatch):
    monkeypatch.setattr(_twins, "NO_EXTENSIONS", True)
    namespace = _namespace()
    assert not _twins.pick(namespace, "._codec", "count_bytes")
    monkeypatch.setattr(_twins, "NO_EXTENSIONS", False)
    assert not _twins.pick(namespace, "._not_built", "count_bytes")
    assert not _twins.pick(namespace, "._codec", "count_bytes", usable=lambda module: False)
    assert namespace["count_bytes"] is codec_py.count_bytes


def _selected(no_extensions: str) -> list[str]:
    code = ("import importlib; from triton_shm.frontend.transports import default_grpc_transport as g; "
            "from triton_shm.frontend.http.app import default_http_transport as h; import sys; "
            f"print(*[importlib.import_module('triton_shm.' + m).USING_EXTENSION for m in {SELECTORS!r}], h(), g(), "
            "'httptools' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_SHM_FALLBACK_TRANSPORTS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "TRITON_SHM_NO_EXTENSIONS": no_extensions})
    return out.stdout.split()


def test_the_switch_swaps_every_selector_and_nothing_else():
    # built (this suite's checkout is): every selector serves its extension, and the C path never
    # imports httptools; under the switch every one its twin, on the same transports
    assert _selected("0") == ["True"] * len(SELECTORS) + ["lean", "native", "False"]
    assert _selected("1") == ["False"] * len(SELECTORS) + ["lean", "native", "True"]
