"""``triton-shm tune``: find the best config of one model on this machine, and say why.

It loads candidate configs of the model through the model-control API (config overrides,
on its own explicit-mode server or on a running one with ``--url``), measures each with the
``perf`` engine over a concurrency sweep, searches with a hill climb (every candidate when
the space is small) within a time budget, and writes the best config under the latency
budget (the user's config.pbtxt with only the tuned fields changed), a self-contained HTML
report and the raw measurements as CSV. It is a client of the server, like ``perf``.

Run ``triton-shm tune --help``.
"""
from __future__ import annotations


class TuneError(Exception):
    """A failure to report as one clear line with a non-zero exit."""

    exit_code = 1


class UsageError(TuneError):
    exit_code = 2


__all__ = ["TuneError", "UsageError"]
