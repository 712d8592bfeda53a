"""The receive path's walk over HTTP/2 frame headers. Twin of ``_frames.pyx``."""
from __future__ import annotations


def whole_frames_end(buf: memoryview, pos: int, end: int) -> int:
    """The end of the whole frames in ``buf[pos:end]`` (``pos`` is a frame header): the
    start of the one cut short by ``end``, or ``end``."""
    end = min(end, len(buf))
    while end - pos >= 9:
        after = pos + 9 + (buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2])
        if after > end:
            break
        pos = after
    return pos
