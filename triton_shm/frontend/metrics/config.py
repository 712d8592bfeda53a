"""``--metrics-config <setting>=<value>``: the settings this server honours."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False  # nv_inference_first_response_histogram_ms
    summary_quantiles: tuple[float, ...] = DEFAULT_QUANTILES

    @classmethod
    def parse(cls, items: Iterable[str]) -> "MetricsConfig":
        """Raises ValueError with the flag's text on anything it does not understand."""
        counter, summary, quantiles = cls.counter_latencies, cls.summary_latencies, cls.summary_quantiles
        histogram = cls.histogram_latencies
        for item in items:
            key, sep, value = (x.strip() for x in item.partition("="))
            if not sep or not key:
                raise ValueError(f"--metrics-config: expected <setting>=<value>, got '{item}'")
            if key == "counter_latencies":
                counter = _parse_bool(item, value)
            elif key == "summary_latencies":
                summary = _parse_bool(item, value)
            elif key == "histogram_latencies":
                histogram = _parse_bool(item, value)
            elif key == "summary_quantiles":
                quantiles = _parse_quantiles(item, value)
            else:
                raise ValueError(f"--metrics-config: unknown setting '{key}' (known: counter_latencies, "
                                 "histogram_latencies, summary_latencies, summary_quantiles)")
        return cls(counter_latencies=counter, summary_latencies=summary, summary_quantiles=quantiles,
                   histogram_latencies=histogram)


def _parse_bool(item: str, value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"--metrics-config {item}: expected true or false")
    return value.lower() in ("true", "1")


def _parse_quantiles(item: str, value: str) -> tuple[float, ...]:
    """``<quantile>:<error>,...`` (the error is the allowed rank error of a streaming
    estimate; quantiles here are exact over the window, so it is checked and not needed)."""
    quantiles = []
    for part in value.strip("\"'").split(","):
        q, _, err = part.partition(":")
        try:
            qv, ev = float(q), float(err or 0)
        except ValueError:
            raise ValueError(f"--metrics-config {item}: expected <quantile>:<error>,...") from None
        if not 0 <= qv <= 1 or not 0 <= ev <= 1:
            raise ValueError(f"--metrics-config {item}: quantiles and errors must be within [0, 1]")
        quantiles.append(qv)
    return tuple(quantiles)
