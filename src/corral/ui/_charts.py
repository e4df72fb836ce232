"""The Overview page's charts: small SVG drawn on the server (no script, no CDN).

Each chart is a function from plain data to :class:`markupsafe.Markup`; every
label is escaped. The page puts the same numbers in a table beside each chart
for screen readers and for people who prefer to read them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from markupsafe import Markup

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._runs import Run

__all__ = [
    "DURATION_BUCKETS",
    "Overview",
    "bar_chart",
    "duration_chart",
    "overview",
    "timeline",
]

#: upper bounds (seconds) of the duration histogram's buckets; the last is open
DURATION_BUCKETS: tuple[tuple[float, str], ...] = (
    (0.01, "<10ms"),
    (0.03, "10-30ms"),
    (0.1, "30-100ms"),
    (0.3, "0.1-0.3s"),
    (1.0, "0.3-1s"),
    (3.0, "1-3s"),
    (10.0, "3-10s"),
    (float("inf"), ">10s"),
)
_BOUNDS = [b for b, _ in DURATION_BUCKETS]


@dataclass(frozen=True, slots=True)
class Overview:
    """The numbers behind the charts."""

    total: int
    per_backend: list[tuple[str, int]]
    recent: list[int]  # duration histogram of the recent runs
    baseline: list[int]  # ... and of the runs before them
    recent_label: str
    baseline_label: str
    blocked: list[tuple[str, int]]  # (period, blocked attempts)
    top_hosts: list[tuple[str, int]]


def _histogram(runs: Sequence[Run]) -> list[int]:
    counts = [0] * len(DURATION_BUCKETS)
    for run in runs:
        counts[bisect.bisect_left(_BOUNDS, run.duration)] += 1
    return counts


def overview(runs: Sequence[Run]) -> Overview:
    """Aggregate *runs* (oldest first).

    The duration baseline is the log's history: the runs of the last day
    present in the log are compared with every run before that day (with a
    single day, the newer half with the older half).
    """
    per_backend = Counter(r.backend for r in runs).most_common()
    last_day = runs[-1].time[:10] if runs else ""
    recent = [r for r in runs if r.time[:10] == last_day]
    if runs and len(recent) == len(runs):
        half = len(runs) // 2
        recent, older = list(runs[half:]), list(runs[:half])
        recent_label, baseline_label = "newer half", "older half"
    else:
        older = list(runs[: len(runs) - len(recent)])
        recent_label, baseline_label = f"{last_day}", "earlier days (baseline)"
    days = {r.time[:10] for r in runs}
    width = 13 if len(days) <= 2 else 10  # per hour over a day or two, else per day

    def period(run: Run) -> str:
        return run.time[:width] + ("h" if width == 13 else "")

    blocked: Counter[str] = Counter()
    for run in runs:
        if run.violations or run.denied:
            blocked[period(run)] += run.violations + run.denied
        else:
            blocked.setdefault(period(run), 0)
    hosts: Counter[str] = Counter()
    for run in runs:
        hosts.update(run.denied_hosts)
    return Overview(
        total=len(runs),
        per_backend=per_backend,
        recent=_histogram(recent),
        baseline=_histogram(older),
        recent_label=recent_label,
        baseline_label=baseline_label,
        blocked=sorted(blocked.items())[-48:],
        top_hosts=hosts.most_common(10),
    )


def _svg(width: int, height: int, title: str, body: list[str]) -> Markup:
    return Markup(  # noqa: S704 - every label below is escaped
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="xMinYMin meet">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def bar_chart(title: str, rows: Sequence[tuple[str, int]], *, css: str = "bar") -> Markup:
    """Horizontal bars, one per ``(label, value)``."""
    if not rows:
        return Markup("<p>No data yet.</p>")
    top = max(v for _, v in rows) or 1
    row_h, label_w, width = 24, 180, 600
    body = []
    for i, (label, value) in enumerate(rows):
        y = i * row_h
        w = round((width - label_w - 60) * value / top)
        body.append(
            f'<text x="{label_w - 6}" y="{y + 16}" text-anchor="end">{escape(label[:28])}</text>'
            f'<rect class="{css}" x="{label_w}" y="{y + 4}" width="{max(w, 1)}" height="16"/>'
            f'<text x="{label_w + w + 6}" y="{y + 16}">{value}</text>'
        )
    return _svg(width, row_h * len(rows) + 4, title, body)


def duration_chart(data: Overview) -> Markup:
    """Grouped columns: the share of runs per duration bucket, recent against the baseline."""
    if not data.total:
        return Markup("<p>No data yet.</p>")
    recent_n, base_n = sum(data.recent) or 1, sum(data.baseline) or 1
    shares = [
        (label, r / recent_n, b / base_n)
        for (_, label), r, b in zip(DURATION_BUCKETS, data.recent, data.baseline, strict=True)
    ]
    top = max(max(r, b) for _, r, b in shares) or 1.0
    col_w, plot_h, width = 70, 160, 70 * len(shares) + 20
    body = [
        f'<rect class="recent" x="10" y="4" width="12" height="12"/>'
        f'<text x="26" y="15">{escape(data.recent_label)}</text>'
        f'<rect class="baseline" x="250" y="4" width="12" height="12"/>'
        f'<text x="266" y="15">{escape(data.baseline_label)}</text>'
    ]
    for i, (label, r, b) in enumerate(shares):
        x = 10 + i * col_w
        for j, (share, css) in enumerate(((r, "recent"), (b, "baseline"))):
            h = round(plot_h * share / top)
            body.append(
                f'<rect class="{css}" x="{x + 8 + j * 24}" y="{30 + plot_h - h}" '
                f'width="22" height="{h}"><title>{escape(label)}: {share:.0%}</title></rect>'
            )
        body.append(
            f'<text x="{x + 32}" y="{plot_h + 48}" text-anchor="middle">{escape(label)}</text>'
        )
    return _svg(width, plot_h + 56, "Duration distribution, recent runs against the baseline", body)


def columns(title: str, rows: Sequence[tuple[str, int]]) -> Markup:
    """Vertical columns over time (e.g. blocked attempts per day)."""
    if not rows:
        return Markup("<p>No data yet.</p>")
    top = max(v for _, v in rows) or 1
    plot_h, width = 140, 640
    col_w = max(4, min(48, (width - 20) // len(rows)))
    body = []
    for i, (label, value) in enumerate(rows):
        h = round(plot_h * value / top)
        x = 10 + i * col_w
        body.append(
            f'<rect class="blocked" x="{x + 2}" y="{10 + plot_h - h}" width="{col_w - 4}" '
            f'height="{h}"><title>{escape(label)}: {value}</title></rect>'
        )
    body.append(f'<text x="10" y="{plot_h + 28}">{escape(rows[0][0])}</text>')
    if len(rows) > 1:
        body.append(
            f'<text x="{width - 10}" y="{plot_h + 28}" text-anchor="end">{escape(rows[-1][0])}</text>'
        )
    return _svg(width, plot_h + 36, title, body)


def timeline(runs: Sequence[Run]) -> Markup:
    """A strip of the given runs (oldest left): one tick each, coloured by outcome."""
    if not runs:
        return Markup("")
    width, tick = 800, max(2, min(16, 800 // len(runs)))
    body = []
    for i, run in enumerate(runs):
        body.append(
            f'<rect class="{run.status}" x="{i * tick}" y="0" width="{max(tick - 1, 1)}" '
            f'height="24"><title>#{run.seq} {escape(run.time)} {run.status}</title></rect>'
        )
    return _svg(width, 24, f"Timeline of the last {len(runs)} runs, oldest first", body)
