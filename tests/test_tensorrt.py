"""The TensorRT backend's logic, without TensorRT or a GPU: config completion from an
engine's I/O description and optimization profiles, profile selection, the clear errors
where TensorRT or a GPU is missing, and a CPU-only server with a plan in its repository.
(A plan built and run on a GPU needs TensorRT there: not on the project's GPU machine yet; there,
without TensorRT, a GPU server fails the plan with the missing-TensorRT message.)"""
from __future__ import annotations

import importlib.util

import pytest
import tritonclient.http as httpclient

from triton_shm.backends import tensorrt as trt_backend
from triton_shm.backends.base import ModelContext
from triton_shm.backends.tensorrt import (TENSORRT_MISSING, EngineDescription, EngineTensor, complete_config,
                                          engine_max_batch, select_profile)
from triton_shm.errors import InvalidArgument, Unsupported

from .harness import ServerProcess
from .helpers import assert_serving
from .models import python_identity, write_model
from .test_gpu import _missing

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None

P_IN = (((1, 3), (8, 3), (32, 3)),)  # one profile: batch 1..32 of 3 features
BATCHING = EngineDescription((
    EngineTensor("x", "TYPE_FP32", (-1, 3), True, P_IN),
    EngineTensor("y", "TYPE_FP16", (-1, 2), False),
))
FIXED = EngineDescription((
    EngineTensor("image", "TYPE_UINT8", (3, 224, 224), True, (((3, 224, 224),) * 3,)),
    EngineTensor("logits", "TYPE_FP32", (1000,), False),
))
TWO_PROFILES = EngineDescription((
    EngineTensor("x", "TYPE_INT32", (-1, -1), True, (((1, 1), (1, 8), (4, 16)), ((1, 17), (4, 64), (16, 128)))),
    EngineTensor("y", "TYPE_INT32", (-1, -1), False),
), num_profiles=2)


def test_max_batch_comes_from_the_smallest_profile_maximum():
    assert engine_max_batch(BATCHING) == 32
    assert engine_max_batch(TWO_PROFILES) == 4
    assert engine_max_batch(FIXED) == 0


def test_complete_an_empty_config_from_a_batching_engine():
    config = complete_config("m", {"name": "m", "max_batch_size": 0}, BATCHING)
    assert config == {"name": "m", "max_batch_size": 32, "dynamic_batching": {},
                      "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}],
                      "output": [{"name": "y", "data_type": "TYPE_FP16", "dims": [2]}]}


def test_complete_a_partial_config_keeps_what_it_states():
    given = {"name": "m", "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]}
    config = complete_config("m", given, BATCHING)
    assert config["max_batch_size"] == 8 and config["input"] == given["input"]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP16", "dims": [2]}]
    assert "output" not in given  # the caller's config is not changed


def test_complete_a_fixed_shape_engine():
    config = complete_config("m", {"name": "m", "max_batch_size": 0}, FIXED)
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"] == [{"name": "image", "data_type": "TYPE_UINT8", "dims": [3, 224, 224]}]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1000]}]


@pytest.mark.parametrize("desc, config, message", [
    (FIXED, {"max_batch_size": 4, "input": [{"name": "image"}]},
     "unable to autofill for 'm': model does not support batching while non-zero max_batch_size is specified"),
    (BATCHING, {"max_batch_size": 64, "input": [{"name": "x"}]},
     "unexpected configuration maximum batch size 64 for 'm', model maximum is 32"),
    (BATCHING, {"max_batch_size": 8, "input": [{"name": "z"}]},
     "unexpected input 'z' in the configuration of 'm': the engine's inputs are ['x']"),
    (BATCHING, {"max_batch_size": 8, "output": [{"name": "y", "data_type": "TYPE_FP32"}]},
     "unexpected datatype TYPE_FP32 for output 'y' of 'm', the engine has TYPE_FP16"),
])
def test_config_that_contradicts_the_engine(desc, config, message):
    with pytest.raises(InvalidArgument) as info:
        complete_config("m", config, desc)
    assert info.value.message == message


def test_profile_selection():
    assert select_profile(TWO_PROFILES, {"x": [2, 10]}) == 0
    assert select_profile(TWO_PROFILES, {"x": [2, 100]}) == 1
    assert select_profile(TWO_PROFILES, {"x": [2, 10]}, first=1) == 0  # the instance's own first, then the rest
    with pytest.raises(InvalidArgument, match=r"lie outside every optimization profile"):
        select_profile(TWO_PROFILES, {"x": [32, 100]})
    with pytest.raises(InvalidArgument, match=r"lie outside every optimization profile"):
        select_profile(BATCHING, {"x": [2, 3, 1]})  # wrong rank
    with pytest.raises(InvalidArgument, match=r"the engine needs input\(s\) \['x'\]"):
        select_profile(BATCHING, {})


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_missing_tensorrt_is_a_clear_error(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.plan").write_bytes(b"not a plan")
    context = ModelContext("m", 1, tmp_path / "m", {"name": "m", "backend": "tensorrt"})
    with pytest.raises(Unsupported, match=r"the tensorrt backend needs a GPU and the TensorRT Python package"):
        trt_backend.TensorRTBackend.auto_complete(context)


def _plan_repository(repo):
    """identity_fp32 and a 64-byte plan that is no engine."""
    python_identity(repo, "identity_fp32", "FP32")
    write_model(repo, "plan", config='platform: "tensorrt_plan"\nmax_batch_size: 8\n')
    (repo / "plan" / "1" / "model.plan").write_bytes(b"\0" * 64)
    return repo


def test_cpu_server_with_a_plan_serves_its_other_models(tmp_path):
    repo = _plan_repository(tmp_path / "models")
    # --gpus none: a CPU-only server, also on a machine with a GPU (it would serve it otherwise)
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--exit-on-error=false", "--gpus", "none"])
    srv.start(wait_ready=False)
    try:
        srv.wait_repository_loaded()
        cl = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in cl.get_model_repository_index()}
        assert (index["plan"]["state"], index["plan"]["reason"]) == (
            "UNAVAILABLE", "model 'plan' is a TensorRT plan, which needs a GPU; this server runs none")
        cl.close()
        assert_serving(srv)
    finally:
        srv.stop_cleanly()


@pytest.mark.skipif(_missing() is not None, reason=f"needs a GPU server: {_missing()}")
@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here: the plan would be read")
def test_gpu_server_without_tensorrt_fails_the_plan_and_serves_the_rest(tmp_path):
    """A GPU, no TensorRT: the plan's config is completed on the GPU worker, which says what is
    missing; the other models serve."""
    repo = _plan_repository(tmp_path / "models")
    srv = ServerProcess(repo, tmp_path / "server.log", extra_args=["--exit-on-error=false", "--gpus", "0"])
    srv.start(wait_ready=False)
    try:
        srv.wait_repository_loaded()
        cl = httpclient.InferenceServerClient(srv.http_url)
        index = {m["name"]: m for m in cl.get_model_repository_index()}
        assert index["plan"]["state"] == "UNAVAILABLE"
        assert TENSORRT_MISSING in index["plan"]["reason"], index["plan"]
        assert index["identity_fp32"]["state"] == "READY"
        cl.close()
        assert_serving(srv)
    finally:
        srv.stop_cleanly()
