"""The config's JSON form in-process: what the auto-complete round trip (config -> JSON ->
backend -> JSON -> config) and the ModelConfig APIs print. It walks the config's descriptors,
so it runs under both protobuf majors the pins allow (make test: .venv and .venv-pb7)."""
from __future__ import annotations

import json
from pathlib import Path

from triton_shm.backends.base import ModelContext
from triton_shm.backends.onnxruntime import OnnxRuntimeBackend
from triton_shm.core.models import config as mcfg

from .models import onnx_add_sub

# 64-bit integers at every depth the descriptor walk handles: a repeated scalar inside a
# repeated message (dims), a singular message (dynamic_batching), a map of messages keyed by
# uint64 (priority_queue_policy), a oneof (version_policy), a map inside a repeated message.
CONFIG = """
name: "m"
backend: "onnxruntime"
max_batch_size: 8
version_policy { specific { versions: [ 1, 3 ] } }
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "B" data_type: TYPE_INT64 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 2
  priority_queue_policy { key: 1 value: { default_timeout_microseconds: 5000 } }
}
model_warmup [ { name: "w" batch_size: 1
                 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 1, 4 ] zero_data: true } } } ]
"""


def test_config_to_json_writes_int64_as_numbers_at_every_depth():
    data = mcfg.config_to_json(mcfg.parse_pbtxt(CONFIG))
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert data["input"][0]["dims"] == [-1, 4]
    assert data["output"][0]["dims"] == [4] and data["output"][0]["reshape"] == {"shape": [2, 2]}
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100 and batching["priority_levels"] == 2
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 5000
    assert data["model_warmup"][0]["inputs"]["A"]["dims"] == [1, 4]
    # Triton prints numbers, not json_format's strings, and the fields left at their defaults
    assert '"' not in json.dumps([data["input"][0]["dims"], batching["max_queue_delay_microseconds"]])
    assert data["input"][0]["optional"] is False and data["input"][0]["format"] == "FORMAT_NONE"
    assert data["platform"] == "" and data["instance_group"] == []


def test_config_json_round_trips():
    config = mcfg.parse_pbtxt(CONFIG)
    assert mcfg.config_from_json(mcfg.config_to_json(config)) == config


def test_onnx_auto_complete_round_trip(tmp_path: Path):
    """What the model manager does for a config-less ONNX model: defaults, JSON to the
    backend, its completed JSON back into a config that passes the I/O checks."""
    model_dir = tmp_path / "add_sub"
    onnx_add_sub(model_dir / "1" / "model.onnx")
    base = mcfg.read_config(model_dir)
    backend = mcfg.backend_of(base, model_dir)
    mcfg.fill_defaults(base, "add_sub", backend, gpus=[])
    completed = OnnxRuntimeBackend.auto_complete(ModelContext("add_sub", 1, model_dir, mcfg.config_to_json(base)))
    config = mcfg.config_from_json(completed, "auto-completed config")
    mcfg.check_io(config)
    assert backend == "onnxruntime" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size > 0 and config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert config.instance_group[0].kind == mcfg.mc.ModelInstanceGroup.KIND_CPU
    assert mcfg.config_to_json(config)["input"][0]["dims"] == [16]
