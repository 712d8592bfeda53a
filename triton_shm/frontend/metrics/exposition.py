"""The Prometheus text exposition format (version 0.0.4), as prometheus-cpp (Triton) prints it."""
from __future__ import annotations

from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Sample:
    labels: dict[str, str]
    value: float | int
    suffix: str = ""  # a summary's or histogram's "_count" / "_sum", a histogram's "_bucket"


@dataclass
class Family:
    name: str
    kind: str  # counter, gauge, histogram, summary
    help: str
    samples: list[Sample] = field(default_factory=list)


def render(families: list[Family]) -> str:
    """The page: every family with samples, HELP and TYPE first."""
    out: list[str] = []
    for family in families:
        if not family.samples:
            continue
        out.append(f"# HELP {family.name} {family.help}")
        out.append(f"# TYPE {family.name} {family.kind}")
        out.extend(f"{family.name}{s.suffix}{_labels(s.labels)} {_number(s.value)}" for s in family.samples)
    return "\n".join(out) + "\n" if out else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    # sorted by name (model, reason, version), a summary's quantile or a bucket's le last
    names = sorted(labels, key=lambda k: (k in ("quantile", "le"), k))
    return "{" + ",".join(f'{k}="{_escape(str(labels[k]))}"' for k in names) + "}"


def _number(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)
