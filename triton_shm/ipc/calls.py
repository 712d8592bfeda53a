"""Requests in flight on one link, and where their answers go.

The one request/response multiplexer of the server's links: a front-end's link to a worker
(``supervisor.handle``) and its link to another front-end process (``cluster.peers``). Each
request gets an id (a counter per link); its sender registers what takes the reply, and,
for a request answered by several frames (a decoupled model's responses), what takes the
stream of them. A reply is taken once (``take``); a stream lasts until ``end_stream``. A
request its caller gives up is withdrawn (``withdraw``); when the link drops, ``drop``
hands back everything still open, for the link to fail.

The dicts are the link's own, never replaced: a reader on the per-request path may use
``replies`` and ``streams`` directly (a dict operation, no call).
"""
from __future__ import annotations

import itertools
from typing import Callable, Generic, TypeVar

R = TypeVar("R")  # what takes a reply: a callback, a future
S = TypeVar("S")  # what takes a stream's frames

__all__ = ["Calls"]


class Calls(Generic[R, S]):
    __slots__ = ("replies", "streams", "next_id")

    def __init__(self) -> None:
        self.replies: dict[int, R] = {}   # request id -> what takes its reply
        self.streams: dict[int, S] = {}   # request id -> what takes its stream, until it ends
        # the next request id: the counter's own method (a C call, no Python frame per request)
        self.next_id: Callable[[], int] = itertools.count(1).__next__

    def open(self, call_id: int, reply: R, stream: S | None = None) -> None:
        self.replies[call_id] = reply
        if stream is not None:
            self.streams[call_id] = stream

    def take(self, call_id: int) -> R | None:
        """What takes ``call_id``'s reply, which ends its wait (None: withdrawn or unknown)."""
        return self.replies.pop(call_id, None)

    def end_stream(self, call_id: int) -> S | None:
        return self.streams.pop(call_id, None)

    def is_open(self, call_id: int) -> bool:
        """Its reply, or a frame of its stream, is still to come."""
        return call_id in self.replies or call_id in self.streams

    def withdraw(self, call_id: int) -> tuple[R | None, S | None]:
        """Nobody waits for ``call_id`` any more: what took its answers (to be told)."""
        return self.replies.pop(call_id, None), self.streams.pop(call_id, None)

    def drop(self) -> tuple[dict[int, R], dict[int, S]]:
        """The link is gone: every open reply and stream, by id, for the link to fail (the
        same request may be in both)."""
        replies, streams = dict(self.replies), dict(self.streams)
        self.replies.clear()
        self.streams.clear()
        return replies, streams
