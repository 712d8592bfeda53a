"""What tune writes besides the config: the raw measurements as CSV (rewritten after every
candidate, so an interrupted run keeps what it measured) and ``report.html``, one file with
inline SVG plots: every candidate's throughput-latency curve over the concurrency sweep, the
latency budget as a line, and the chosen config beside the default."""
from __future__ import annotations

import csv
import html
from dataclasses import dataclass, field
from pathlib import Path

from .measure import Point
from .space import Knobs

CSV_COLUMNS = ["candidate", "label", "instances", "kind", "max_batch_size", "dynamic_batching",
               "max_queue_delay_us", "preferred_batch_size", "process_per_instance", "status", "concurrency",
               "throughput_infer_per_s", "p50_ms", "p99_ms", "avg_ms", "stable", "errors",
               "server_cpu_ms_per_infer", "server_rss_mib", "meets_budget"]


@dataclass
class Candidate:
    index: int                # 0 is the default (the config as served), measured first
    knobs: Knobs
    status: str = "pending"   # ok | load failed: … | measure failed: … | skipped: …
    points: list[Point] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return "default" if self.index == 0 else f"#{self.index + 1}"


def _fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def write_csv(path: Path, candidates: list[Candidate], budget_ms: float | None) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for c in candidates:
            k = c.knobs
            head = [c.name, k.label(), k.instances, k.kind, k.max_batch_size,
                    "yes" if k.dynamic_batching else "no", "" if k.queue_delay_us is None else k.queue_delay_us,
                    k.max_batch_size if k.preferred_max else "",
                    "" if k.process_per_instance is None else ("yes" if k.process_per_instance else "no"), c.status]
            if not c.points:
                w.writerow(head + [""] * (len(CSV_COLUMNS) - len(head)))
            for p in c.points:
                meets = "" if budget_ms is None else ("yes" if p.p99_ms <= budget_ms else "no")
                w.writerow(head + [p.concurrency, _fmt(p.throughput), _fmt(p.p50_ms, 3), _fmt(p.p99_ms, 3),
                                   _fmt(p.avg_ms, 3), "yes" if p.stable else "no", p.errors,
                                   _fmt(p.cpu_ms_per_inf, 3), _fmt(p.rss_mib, 1), meets])
    tmp.replace(path)


# ------------------------------------------------------------------------------- SVG

_W, _H, _PAD = 640, 380, 52


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** len(str(int(v))) / 10
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= v:
            return m * mag
    return v


def svg_curves(curves: list[tuple[str, list[Point], str, float]], budget_ms: float | None,
               title: str, width: int = _W, height: int = _H) -> str:
    """Throughput (y) against p99 latency (x), one polyline per (label, points, colour, stroke width)."""
    pts = [p for _, ps, _, _ in curves for p in ps]
    xmax = _nice_max(max([p.p99_ms for p in pts] + [budget_ms * 1.1 if budget_ms else 0.0, 1e-3]))
    ymax = _nice_max(max([p.throughput for p in pts] + [1e-3]))
    pw, ph = width - 2 * _PAD, height - 2 * _PAD

    def xy(p99: float, tp: float) -> tuple[float, float]:
        return _PAD + pw * p99 / xmax, height - _PAD - ph * tp / ymax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
           f'<rect x="{_PAD}" y="{_PAD}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for i in range(6):
        gx, gy = _PAD + pw * i / 5, height - _PAD - ph * i / 5
        out.append(f'<line x1="{gx}" y1="{_PAD}" x2="{gx}" y2="{height - _PAD}" stroke="#eee"/>')
        out.append(f'<line x1="{_PAD}" y1="{gy}" x2="{width - _PAD}" y2="{gy}" stroke="#eee"/>')
        out.append(f'<text x="{gx}" y="{height - _PAD + 14}" text-anchor="middle">{xmax * i / 5:g}</text>')
        out.append(f'<text x="{_PAD - 4}" y="{gy + 4}" text-anchor="end">{ymax * i / 5:g}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">p99 latency (ms)</text>')
    out.append(f'<text x="14" y="{height / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {height / 2})">throughput (infer/s)</text>')
    if budget_ms is not None:
        bx = xy(budget_ms, 0)[0]
        out.append(f'<line x1="{bx}" y1="{_PAD}" x2="{bx}" y2="{height - _PAD}" stroke="#d22" '
                   'stroke-dasharray="6 4"/>')
        out.append(f'<text x="{bx + 3}" y="{_PAD + 12}" fill="#d22">budget {budget_ms:g} ms</text>')
    for label, ps, colour, sw in curves:
        if not ps:
            continue
        coords = [xy(p.p99_ms, p.throughput) for p in ps]
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{sw}" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + f'"><title>{html.escape(label)}</title>'
                   '</polyline>')
        for (x, y), p in zip(coords, ps):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{sw + 1.5}" fill="{colour}"><title>'
                       f'{html.escape(label)}: concurrency {p.concurrency}, {p.throughput:.1f} infer/s, '
                       f'p99 {p.p99_ms:.2f} ms</title></circle>')
            if sw >= 2:
                out.append(f'<text x="{x + 5:.1f}" y="{y - 5:.1f}" fill="{colour}">c{p.concurrency}</text>')
    out.append("</svg>")
    return "\n".join(out)


# ------------------------------------------------------------------------------- HTML

_DEFAULT_COLOUR, _CHOSEN_COLOUR, _OTHER_COLOUR = "#1f5fbf", "#1a9641", "#bbbbbb"


def _table(rows: list[list[str]], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{x}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def write_html(path: Path, *, model: str, candidates: list[Candidate], chosen: Candidate | None,
               budget_ms: float | None, objective: str, summary: list[str], machine: str,
               score_text: dict[int, str]) -> None:
    default = candidates[0] if candidates else None
    measured = [c for c in candidates if c.points]
    curves = [(f"{c.name} {c.knobs.label()}", c.points, _OTHER_COLOUR, 1.0) for c in measured
              if c is not default and c is not chosen]
    if default is not None and default.points:
        curves.append((f"default: {default.knobs.label()}", default.points, _DEFAULT_COLOUR, 2.5))
    if chosen is not None and chosen is not default:
        curves.append((f"chosen {chosen.name}: {chosen.knobs.label()}", chosen.points, _CHOSEN_COLOUR, 2.5))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>triton-shm tune: {html.escape(model)}"
             "</title><style>body{font-family:sans-serif;margin:24px;max-width:1400px}"
             "table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ccc;"
             "padding:3px 6px;text-align:right}th{background:#f4f4f4}.grid{display:flex;flex-wrap:wrap;gap:8px}"
             ".chosen{background:#e6f5ea}.default{background:#e8eefa}</style></head><body>",
             f"<h1>triton-shm tune: {html.escape(model)}</h1>",
             "<p>" + "<br>".join(html.escape(s) for s in summary) + "</p>",
             f"<p>Machine: {html.escape(machine)}. Objective: {html.escape(objective)}"
             + (f", p99 latency budget {budget_ms:g} ms" if budget_ms is not None else ", no latency budget")
             + ". Curves: one point per concurrency; <span style='color:#1a9641'>chosen</span>, "
             "<span style='color:#1f5fbf'>default</span>, the other candidates in grey.</p>",
             svg_curves(curves, budget_ms, "throughput vs p99 latency, every candidate")]
    if default is not None and chosen is not None and default.points and chosen.points:
        parts.append("<h2>Default and chosen, side by side</h2><div class='grid'>")
        parts.append(svg_curves([(f"default: {default.knobs.label()}", default.points, _DEFAULT_COLOUR, 2.5)],
                                budget_ms, f"default: {default.knobs.label()}", 460, 300))
        parts.append(svg_curves([(f"chosen: {chosen.knobs.label()}", chosen.points, _CHOSEN_COLOUR, 2.5)],
                                budget_ms, f"chosen {chosen.name}: {chosen.knobs.label()}", 460, 300))
        parts.append("</div>")
        by_c = {p.concurrency: p for p in chosen.points}
        rows = []
        for p in default.points:
            q = by_c.get(p.concurrency)
            rows.append([str(p.concurrency), f"{p.throughput:.1f}", f"{p.p99_ms:.2f}",
                         f"{q.throughput:.1f}" if q else "", f"{q.p99_ms:.2f}" if q else "",
                         f"{q.throughput / p.throughput:.2f}x" if q and p.throughput > 0 else ""])
        parts.append(_table(rows, ["concurrency", "default infer/s", "default p99 ms", "chosen infer/s",
                                   "chosen p99 ms", "gain"]))
    rows = []
    for c in candidates:
        best = max(c.points, key=lambda p: p.throughput) if c.points else None
        cls = " class='chosen'" if c is chosen else (" class='default'" if c is default else "")
        rows.append([f"<span{cls}>{html.escape(c.name)}</span>", html.escape(c.knobs.label()),
                     html.escape(c.status), html.escape(score_text.get(c.index, "")),
                     f"{best.throughput:.1f}" if best else "",
                     _fmt(best.cpu_ms_per_inf, 3) if best else "", _fmt(best.rss_mib, 1) if best else "",
                     f"{c.seconds:.1f}"])
    parts.append("<h2>Candidates, in the order measured</h2>")
    parts.append(_table(rows, ["", "config", "status", "score (best point within the budget)", "max infer/s",
                               "server CPU ms/infer at max", "server RSS MiB", "seconds"]))
    if measured:
        parts.append("<h2>Each candidate</h2><div class='grid'>")
        for c in measured:
            colour = _CHOSEN_COLOUR if c is chosen else (_DEFAULT_COLOUR if c is default else "#555")
            parts.append(svg_curves([(c.knobs.label(), c.points, colour, 2.0)], budget_ms,
                                    f"{c.name}: {c.knobs.label()}", 330, 230))
        parts.append("</div>")
    parts.append("<p>Raw measurements: measurements.csv, next to this file.</p></body></html>")
    path.write_text("\n".join(parts))
