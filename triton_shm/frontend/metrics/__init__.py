"""Prometheus metrics on the metrics port, under Triton's names, labels and HELP texts,
so dashboards and ``perf_analyzer --collect-metrics`` written for tritonserver work.

- ``config.py``: ``--metrics-config`` (what is exported);
- ``collect.py``: what the page holds: per-model families derived from each loaded
  version's :class:`ModelStats` at scrape time (nothing is counted twice, so ``/metrics``
  and the statistics endpoint always agree), and the latest CPU/GPU readings;
- ``exposition.py``: the Prometheus text format;
- ``service.py``: ``GET /metrics`` and the sampler that reads CPU/GPU every
  ``--metrics-interval-ms``.
"""
from .collect import MetricsCollector
from .config import DEFAULT_QUANTILES, MetricsConfig
from .service import CONTENT_TYPE, create_metrics_app, start_metrics

__all__ = ["CONTENT_TYPE", "DEFAULT_QUANTILES", "MetricsCollector", "MetricsConfig", "create_metrics_app",
           "start_metrics"]
