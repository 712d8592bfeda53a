"""Instance-group placement on GPUs, checked without one: KIND_AUTO/KIND_GPU resolution
against the GPUs a server serves (``--gpus``), and what a CPU-only server does with a
KIND_GPU model (Triton's message; its CPU models are served)."""
from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from triton_shm.core.models.config import fill_defaults, mc
from triton_shm.errors import InvalidArgument

from .harness import ServerProcess
from .helpers import assert_serving
from .models import python_identity, write_model


def _config(*groups: dict) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", backend="python")
    for g in groups:
        config.instance_group.add(**g)
    return config


def _groups(config: mc.ModelConfig) -> list[tuple[str, list[int]]]:
    return [(mc.ModelInstanceGroup.Kind.Name(g.kind), list(g.gpus)) for g in config.instance_group]


@pytest.mark.parametrize("gpus, expected", [([], [("KIND_CPU", [])]), ([1, 3], [("KIND_GPU", [1, 3])])])
def test_kind_auto_is_gpu_where_the_server_has_one(gpus, expected):
    config = _config()
    fill_defaults(config, "m", "python", gpus)
    assert _groups(config) == expected


def test_kind_gpu_places_on_the_listed_gpus_of_the_server():
    config = _config({"kind": mc.ModelInstanceGroup.KIND_GPU, "gpus": [3]},
                     {"kind": mc.ModelInstanceGroup.KIND_CPU, "count": 2})
    fill_defaults(config, "m", "python", [1, 3])
    assert _groups(config) == [("KIND_GPU", [3]), ("KIND_CPU", [])]


def test_kind_gpu_naming_a_gpu_not_served():
    config = _config({"kind": mc.ModelInstanceGroup.KIND_GPU, "gpus": [0]})
    with pytest.raises(InvalidArgument) as info:
        fill_defaults(config, "m", "python", [1, 3])
    assert info.value.message == ("instance group m_0 of model m specifies invalid or unsupported gpu id 0. "
                                  "GPUs served (--gpus) are: 1, 3")


def test_kind_gpu_without_gpu():
    config = _config({"kind": mc.ModelInstanceGroup.KIND_GPU})
    with pytest.raises(InvalidArgument) as info:
        fill_defaults(config, "m", "python", [])
    assert info.value.message == "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"


def test_cpu_server_fails_a_kind_gpu_model_and_serves_the_rest(tmp_path):
    repo = tmp_path / "models"
    python_identity(repo, "identity_fp32", "FP32")
    write_model(repo, "on_gpu", config="""
        backend: "python"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_GPU count: 1 } ]
        """, model_py=(repo / "identity_fp32" / "1" / "model.py").read_text())
    # --gpus none: a CPU-only server, also on a machine with a GPU (it would serve it otherwise)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--exit-on-error=false", "--gpus", "none"])
    srv.start(wait_ready=False)  # not ready: a model failed to load (strict readiness)
    try:
        srv.wait_repository_loaded()
        cl = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in cl.get_model_repository_index()}
        assert index["on_gpu"]["state"] == "UNAVAILABLE"
        assert index["on_gpu"]["reason"] == ("instance group on_gpu_0 of model on_gpu has kind KIND_GPU but no "
                                             "GPUs are available")
        assert index["identity_fp32"]["state"] == "READY"
        assert not cl.is_server_ready()
        cl.close()
        assert_serving(srv)
    finally:
        srv.stop_cleanly()
