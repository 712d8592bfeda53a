"""Property-based fuzzing (hypothesis) of every parser of untrusted bytes, bounded and
deterministic (a fixed number of examples, derandomized): random bytes and mutations of
valid inputs, each parser raising only its own error, twin implementations agreeing.
The long run is bench/fuzz.py (docs/benchmarks.md)."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz_targets import SEEDS, TARGETS, mutate

BOUNDED = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def inputs(name: str) -> st.SearchStrategy[bytes]:
    mutated = st.builds(mutate, st.sampled_from(SEEDS[name]), st.randoms(use_true_random=False))
    return st.one_of(st.binary(max_size=512), mutated)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_are_accepted(name):
    """The mutations start from inputs that parse: a target that rejects its own seeds
    would fuzz only its first check."""
    for seed in SEEDS[name]:
        outcome = TARGETS[name](seed)
        assert outcome is not None and not isinstance(outcome, Exception), outcome
        assert not (isinstance(outcome, tuple) and outcome[0] == "error"), outcome


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz(name):
    @BOUNDED
    @given(inputs(name))
    def run(data: bytes) -> None:
        TARGETS[name](data)
    run()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)
DATATYPES = st.sampled_from(["BOOL", "UINT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BF16",
                             "BYTES", "NOPE"])


@st.composite
def infer_documents(draw) -> bytes:
    """Well-formed JSON shaped like an infer request, with anything in each field."""
    def maybe(strategy):
        return draw(st.one_of(strategy, JSON_VALUES))
    tensor = {"name": maybe(st.text(max_size=6)), "datatype": maybe(DATATYPES),
              "shape": maybe(st.lists(st.integers(-2, 2**63), max_size=4)),
              "data": draw(JSON_VALUES), "parameters": maybe(st.dictionaries(
                  st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size",
                                   "shared_memory_offset", "x"]), JSON_VALUES, max_size=3))}
    doc = {"id": maybe(st.text(max_size=4)), "inputs": maybe(st.lists(st.just(tensor), max_size=2)),
           "outputs": maybe(st.lists(st.fixed_dictionaries({"name": JSON_VALUES, "parameters": JSON_VALUES}),
                                     max_size=2)),
           "parameters": maybe(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3))}
    body = json.dumps(doc).encode()  # NaN and Infinity included: not JSON, so refused
    return struct.pack("<i", -1) + body + draw(st.binary(max_size=16))


@settings(BOUNDED, max_examples=100)
@given(infer_documents())
def test_fuzz_http_infer_structured(data):
    TARGETS["http_infer"](data)
