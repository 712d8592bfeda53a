"""Rewrite a few top-level fields of a config.pbtxt and keep everything else as written.

The user's file keeps its order, layout and comments: only the spans of the fields that
tune changed are cut out, and their new text (printed by protobuf's text format, so it
parses back exactly) goes where the first of them was, under comments saying why.
"""
from __future__ import annotations

from dataclasses import dataclass

_OPEN = {"{": "}", "[": "]", "<": ">"}


@dataclass
class Span:
    name: str
    start: int
    end: int          # exclusive; includes a trailing ',' or ';'
    text: str


def _skip_string(text: str, i: int) -> int:
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _skip_blank(text: str, i: int) -> int:
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        else:
            break
    return i


def _skip_block(text: str, i: int) -> int:
    """From an opening bracket to just past its match (strings and comments skipped)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _skip_string(text, i)
            continue
        if c == "#":
            i = _skip_blank(text, i)
            continue
        if c in _OPEN:
            depth += 1
        elif c in _OPEN.values():
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets in config.pbtxt")


def top_level_fields(text: str) -> list[Span]:
    spans: list[Span] = []
    i = _skip_blank(text, 0)
    while i < len(text):
        start = i
        if text[i] == "[":  # an extension's name: [pkg.ext]
            i = text.index("]", i) + 1
        while i < len(text) and (text[i].isalnum() or text[i] == "_"):
            i += 1
        name = text[start:i]
        if not name:
            raise ValueError(f"unexpected {text[i]!r} in config.pbtxt at offset {i}")
        i = _skip_blank(text, i)
        if i < len(text) and text[i] == ":":
            i = _skip_blank(text, i + 1)
        if i < len(text) and text[i] in _OPEN:
            i = _skip_block(text, i)
        elif i < len(text) and text[i] in "\"'":
            i = _skip_string(text, i)
            while True:  # adjacent string literals concatenate
                j = _skip_blank(text, i)
                if j < len(text) and text[j] in "\"'":
                    i = _skip_string(text, j)
                else:
                    break
        else:
            while i < len(text) and not text[i].isspace() and text[i] not in ",;#{}[]<>":
                i += 1
        j = _skip_blank(text, i)
        if j < len(text) and text[j] in ",;":
            i = j + 1
        spans.append(Span(name, start, i, text[start:i]))
        i = _skip_blank(text, i)
    return spans


def _cut(text: str, start: int, end: int) -> tuple[str, int]:
    """Remove [start, end) with its line's indentation, and its end-of-line (and a trailing
    comment) when it is alone on it; returns the new text and where the cut was."""
    line_start = text.rfind("\n", 0, start) + 1
    if text[line_start:start].strip() == "":
        start = line_start
    rest = text[end:]
    stripped = rest.lstrip(" \t")
    if stripped.startswith("#"):  # the old value's own comment goes with it
        eol = stripped.find("\n")
        stripped = stripped[eol:] if eol >= 0 else ""
    if stripped.startswith("\n") or not stripped:
        end = len(text) - len(stripped) + (1 if stripped else 0)
    return text[:start] + text[end:], start


def replace_fields(text: str, remove: list[Span], new_text: str) -> str:
    """``text`` without the ``remove`` spans, ``new_text`` where the first of them was (at the end
    when there is none)."""
    at = None
    for span in sorted(remove, key=lambda s: s.start, reverse=True):
        text, at = _cut(text, span.start, span.end)
    if not new_text:
        return text
    block = new_text if new_text.endswith("\n") else new_text + "\n"
    if at is None:
        if text and not text.endswith("\n"):
            text += "\n"
        return text + block
    return text[:at] + block + text[at:]
