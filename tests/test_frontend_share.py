"""Which front-end process serves a model (``cluster/share.py``), from its completed config:
partitioned (None: every process serves its share of the instances) or one owner."""
from __future__ import annotations

import zlib

import pytest
from google.protobuf import text_format

from triton_shm._proto import model_config_pb2 as mc
from triton_shm.cluster.share import FrontendShare


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def owner(name: str, count: int) -> int:
    return zlib.crc32(name.encode()) % count


@pytest.mark.parametrize("text", [
    'backend: "python" instance_group [{ count: 2 kind: KIND_CPU }]',  # instance processes
    'backend: "python" parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } } '
    'instance_group [{ count: 2 kind: KIND_CPU }]',  # threads of each process's CPU worker
    'backend: "onnxruntime" instance_group [{ count: 3 kind: KIND_CPU }]',
    'backend: "python" instance_group [{ count: 1 kind: KIND_GPU gpus: [0, 1] }]',  # one per GPU, processes
    # a Python KIND_GPU instance runs in a process of its own whatever PROCESS_PER_INSTANCE says
    'backend: "python" parameters { key: "PROCESS_PER_INSTANCE" value { string_value: "no" } } '
    'instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }]',
    'backend: "python" instance_group [{ count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_CPU }]',
])
def test_partitioned(text):
    assert FrontendShare(1, 2).owner_of("m", config(text)) is None


@pytest.mark.parametrize("text", [
    'backend: "onnxruntime" instance_group [{ count: 1 kind: KIND_CPU }]',  # fewer instances than processes
    'backend: "onnxruntime" instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }]',  # threads of a GPU worker
    'backend: "python" instance_group [{ count: 2 kind: KIND_CPU }] dynamic_batching { }',
    'backend: "python" instance_group [{ count: 2 kind: KIND_CPU }] sequence_batching { }',
    'backend: "python" instance_group [{ count: 2 kind: KIND_CPU }] response_cache { enable: true }',
])
def test_owned(text):
    assert FrontendShare(1, 2).owner_of("m", config(text)) == owner("m", 2)


def test_rate_limited_models_belong_to_process_0():
    limited = config('backend: "python" instance_group [{ count: 4 kind: KIND_CPU '
                     'rate_limiter { resources [{ name: "R" count: 1 }] } }]')
    assert FrontendShare(1, 2).owner_of("m", limited, rate_limited=True) == 0
    assert FrontendShare(1, 2).owner_of("m", limited, rate_limited=False) is None


def test_one_process_owns_nothing():
    assert FrontendShare(0, 1).owner_of("m", config('backend: "onnxruntime" dynamic_batching { }')) is None


def test_owners_are_spread_the_same_in_every_process():
    batching = config('backend: "python" dynamic_batching { }')
    owners = {FrontendShare(i, 4).owner_of(name, batching) for i in range(4) for name in ("m",)}
    assert owners == {owner("m", 4)}
    assert len({FrontendShare(0, 4).owner_of(f"model_{k}", batching) for k in range(32)}) == 4
