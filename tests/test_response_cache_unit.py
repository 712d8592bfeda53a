"""The response cache on its own: keys, LRU eviction, sizes, and the flags that size it."""
from __future__ import annotations

from pathlib import Path

import pytest

from triton_shm.core.models.config import ModelConfig
from triton_shm.core.models.version import ModelVersion
from triton_shm.core.data.response_cache import (CachedTensor, ResponseCache, check_cache_config, entry_size,
                                            parse_cache_config, request_key, response_size, to_cached)
from triton_shm.core.data.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from triton_shm.core.models.validation import RequestPlan, ShmRef
from triton_shm.errors import InvalidArgument

MODEL = ModelVersion("m", 1, Path("/nonexistent"), ModelConfig())
DATA = bytes(range(16))


def key(*, model=MODEL, shape=(4,), data=DATA, outputs=("OUT",), out_params=None, params=None, inputs=None,
        shm_inputs=None, read=None) -> bytes:
    request = InferRequest("m", inputs=inputs or [InputTensor("IN", "FP32", list(shape), data)],
                           outputs=[RequestedOutput(o, dict(out_params or {})) for o in outputs],
                           parameters=dict(params or {}))
    plan = RequestPlan(outputs=list(outputs), batch_size=0, shm_inputs=shm_inputs or {})
    return request_key(model, request, plan, read or (lambda name: pytest.fail("no shm input")))


def tensor(data: bytes, name: str = "OUT") -> tuple[CachedTensor, ...]:
    return (CachedTensor(name, "FP32", (len(data) // 4,), data),)


# -- keys ------------------------------------------------------------------------------------
def test_same_request_same_key():
    assert key() == key()
    assert len(key()) == 32


@pytest.mark.parametrize("change", [
    {"shape": (2, 2)},                                  # the same bytes under another shape
    {"data": DATA[:-1] + b"\xff"},
    {"outputs": ("OUT", "OTHER")},                      # other outputs asked for
    {"outputs": ()},
    {"out_params": {"classification": 2}},              # changes what the output holds
    {"params": {"temperature": 1}},                     # a parameter the model sees
    {"params": {"temperature": "1"}},
    {"model": ModelVersion("m", 2, Path("/x"), ModelConfig())},
    {"model": ModelVersion("n", 1, Path("/x"), ModelConfig())},
    {"inputs": [InputTensor("IN", "INT32", [4], DATA)]},
    {"inputs": [InputTensor("IN2", "FP32", [4], DATA)]},
])
def test_what_changes_the_answer_changes_the_key(change):
    assert key(**change) != key()


def test_int_and_float_and_bool_parameters_differ():
    assert len({key(params={"p": 1}), key(params={"p": 1.0}), key(params={"p": True})}) == 3


@pytest.mark.parametrize("same", [
    {"out_params": {"binary_data": True}},              # only the wire encoding
    {"out_params": {"shared_memory_region": "r", "shared_memory_byte_size": 64, "shared_memory_offset": 8}},
    {"params": {"priority": 1, "timeout": 100, "binary_data_output": True}},  # scheduling / encoding
])
def test_delivery_does_not_change_the_key(same):
    assert key(**same) == key()


def test_input_order_is_part_of_the_key():
    a, b = InputTensor("A", "FP32", [1], b"\0\0\0\0"), InputTensor("B", "FP32", [1], b"\0\0\0\0")
    assert key(inputs=[a, b]) != key(inputs=[b, a])


def test_boundaries_between_fields_are_unambiguous():
    zeros = b"\0" * 4
    assert key(inputs=[InputTensor("AB", "FP32", [1], zeros)]) != key(inputs=[InputTensor("A", "BFP32", [1], zeros)])


def test_shared_memory_input_is_keyed_on_its_bytes():
    ref = {"IN": ShmRef("region", 0, 16)}
    shm_key = key(inputs=[InputTensor("IN", "FP32", [4], None)], shm_inputs=ref, read=lambda name: DATA)
    assert shm_key == key()
    assert key(inputs=[InputTensor("IN", "FP32", [4], None)], shm_inputs=ref, read=lambda name: bytes(16)) != key()


# -- LRU and sizes -----------------------------------------------------------------------------
def test_entry_size_counts_key_names_shape_and_data():
    t = (CachedTensor("OUT", "FP32", (2, 2), bytes(16)), CachedTensor("O2", "INT8", (), b"x"))
    assert entry_size(t) == 32 + (3 + 4 + 16 + 16) + (2 + 4 + 0 + 1)


def test_a_responses_size_is_known_before_it_is_copied():
    response = InferResponse("m", "1", outputs=[
        OutputTensor("OUT", "FP32", [2, 2], memoryview(bytes(16))),
        OutputTensor("SHM", "INT8", [3], b"", in_shared_memory=True, shm_byte_size=3)])
    tensors = to_cached(response, lambda o: b"abc")
    assert tensors == (CachedTensor("OUT", "FP32", (2, 2), bytes(16)), CachedTensor("SHM", "INT8", (3,), b"abc"))
    assert response_size(response) == entry_size(tensors)


def test_hit_miss_counters():
    cache = ResponseCache(1000)
    assert cache.lookup(b"k") is None
    assert cache.insert(b"k", tensor(bytes(8)))
    assert cache.lookup(b"k") == tensor(bytes(8))
    assert (cache.lookups, cache.hits, cache.misses, cache.entries) == (2, 1, 1, 1)
    assert cache.used == entry_size(tensor(bytes(8)))
    assert cache.utilization == cache.used / 1000


def test_least_recently_used_is_evicted_first():
    one = entry_size(tensor(bytes(8)))
    cache = ResponseCache(2 * one)
    cache.insert(b"a", tensor(bytes(8)))
    cache.insert(b"b", tensor(b"\1" * 8))
    assert cache.lookup(b"a") is not None  # a is now the most recently used
    cache.insert(b"c", tensor(b"\2" * 8))
    assert cache.lookup(b"b") is None
    assert cache.lookup(b"a") is not None and cache.lookup(b"c") is not None
    assert (cache.entries, cache.evictions, cache.used) == (2, 1, 2 * one)


def test_a_big_entry_evicts_as_many_as_it_needs():
    one = entry_size(tensor(bytes(8)))
    cache = ResponseCache(3 * one)
    for k in (b"a", b"b", b"c"):
        cache.insert(k, tensor(bytes(8)))
    big = tensor(bytes(8 + 2 * one))  # needs the room of all three
    assert cache.insert(b"big", big)
    assert (cache.entries, cache.evictions, cache.used) == (1, 3, entry_size(big))


def test_larger_than_the_cache_is_not_stored_and_evicts_nothing():
    cache = ResponseCache(100)
    cache.insert(b"a", tensor(bytes(8)))
    assert not cache.insert(b"big", tensor(bytes(100)))
    assert cache.lookup(b"big") is None
    assert (cache.entries, cache.evictions) == (1, 0)


def test_reinserting_a_key_replaces_it():
    cache = ResponseCache(1000)
    cache.insert(b"a", tensor(bytes(8)))
    cache.insert(b"a", tensor(bytes(16)))
    assert (cache.entries, cache.used) == (1, entry_size(tensor(bytes(16))))


def test_zero_sized_cache_stores_nothing():
    cache = ResponseCache(0)
    assert not cache.insert(b"a", tensor(b""))
    assert cache.utilization == 0.0


# -- flags and config ------------------------------------------------------------------------
def test_cache_config_forms():
    assert parse_cache_config([], None) is None
    assert parse_cache_config(["local,size=1048576"], None) == 1048576
    assert parse_cache_config(["local,size=1", "local,size=2"], None) == 2
    assert parse_cache_config([], 4096) == 4096


@pytest.mark.parametrize("settings, byte_size, message", [
    (["local,size=10"], 10, "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                            "Please provide one or the other."),
    (["size=10"], None, "--cache-config option format is '<cache name>,<setting>=<value>'. Got size=10"),
    (["redis,host=x"], None, "cache 'redis' is not available"),
    (["local,bytes=10"], None, "the local cache has no setting 'bytes'"),
    (["local,size=ten"], None, "size must be a whole number of bytes"),
    (["local,size=-1"], None, "size must not be negative"),
    ([], -1, "--response-cache-byte-size must not be negative"),
])
def test_cache_config_errors(settings, byte_size, message):
    with pytest.raises(ValueError) as info:
        parse_cache_config(settings, byte_size)
    assert message in str(info.value)


def test_decoupled_model_with_cache_is_refused():
    config = ModelConfig(name="dec")
    config.response_cache.enable = True
    config.model_transaction_policy.decoupled = True
    with pytest.raises(InvalidArgument) as info:
        check_cache_config(config)
    assert info.value.message == ("Response Cache does not currently support model dec with 'decoupled' "
                                  "transaction policy. Please disable the response cache.")
    config.response_cache.enable = False
    check_cache_config(config)
