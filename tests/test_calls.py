"""``ipc.calls.Calls``, the requests in flight on a link (a worker's, a peer's): ids, a
reply taken once, a stream until it ends, withdrawing, and handing everything back when
the link drops."""
from __future__ import annotations

from triton_shm.ipc.calls import Calls


def test_ids_count_up_per_link():
    a, b = Calls[str, str](), Calls[str, str]()
    assert [a.next_id(), a.next_id(), b.next_id()] == [1, 2, 1]


def test_a_reply_is_taken_once_and_a_stream_lasts_until_it_ends():
    calls = Calls[str, str]()
    calls.open(1, "reply-1")
    calls.open(2, "reply-2", "stream-2")
    assert calls.take(1) == "reply-1" and calls.take(1) is None and not calls.is_open(1)
    assert calls.take(2) == "reply-2" and calls.is_open(2)  # its stream goes on
    assert calls.streams[2] == "stream-2"
    assert calls.end_stream(2) == "stream-2" and not calls.is_open(2)


def test_withdraw_hands_back_what_waited():
    calls = Calls[str, str]()
    calls.open(1, "reply", "stream")
    assert calls.withdraw(1) == ("reply", "stream")
    assert calls.withdraw(1) == (None, None) and not calls.is_open(1)


def test_drop_hands_back_everything_open_and_keeps_the_dicts():
    calls = Calls[str, str]()
    replies, streams = calls.replies, calls.streams
    calls.open(1, "r1")
    calls.open(2, "r2", "s2")
    calls.open(3, "r3", "s3")
    calls.take(3)
    assert calls.drop() == ({1: "r1", 2: "r2"}, {2: "s2", 3: "s3"})
    assert calls.replies is replies and calls.streams is streams  # a hot path may hold them
    assert not replies and not streams
