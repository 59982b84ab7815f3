"""Each detection's signal against its threshold, as an SVG written by hand.

One panel per probe that read anything: the signal's readings from the
fault's apply on (a line), its threshold (dashed), its value before the
fault (a hollow dot left of the apply line) and the reading that detected
it (a filled dot). No plotting library: a report has its picture on any
node, where matplotlib (the timeline's) is not installed.
"""
from __future__ import annotations

from xml.sax.saxutils import escape

from .detection import parse_predicate

WIDTH, PANEL, PAD_L, PAD_R, PAD_T, PAD_B = 640, 150, 70, 20, 28, 30


def _threshold(d: dict) -> float | None:
    try:
        return parse_predicate(d.get("predicate") or "")[1]
    except ValueError:
        return None


def _number(v) -> str:
    return f"{v:.4g}"


def _panel(d: dict, top: float) -> list[str]:
    samples = [(t, v) for t, v in d.get("samples") or [] if isinstance(v, (int, float))]
    before, limit = d.get("before"), _threshold(d)
    values = [v for _, v in samples] + [x for x in (before, limit) if isinstance(x, (int, float))]
    lo, hi = min(values + [0.0]), max(values + [0.0])
    hi = hi if hi > lo else lo + 1.0
    t_end = max([t for t, _ in samples] + [1.0])
    # the apply line sits a tenth of the way in: room for "before" left of it
    x0, span = PAD_L + (WIDTH - PAD_L - PAD_R) * 0.1, (WIDTH - PAD_L - PAD_R) * 0.9
    height = PANEL - PAD_T - PAD_B

    def x(t: float) -> float:
        return x0 + span * t / t_end

    def y(v: float) -> float:
        return top + PAD_T + height * (1 - (v - lo) / (hi - lo))

    seen = "detected" if d.get("detected") else "not detected"
    title = f"{d.get('probe', '?')}: {d.get('signal', '')} {d.get('predicate') or ''} ({seen})"
    out = [f'<text x="{PAD_L}" y="{top + 16}" font-size="12">{escape(title)}</text>',
           f'<line x1="{PAD_L}" y1="{y(lo):.1f}" x2="{WIDTH - PAD_R}" y2="{y(lo):.1f}" '
           'stroke="#999"/>',
           f'<line x1="{x0:.1f}" y1="{top + PAD_T}" x2="{x0:.1f}" y2="{y(lo):.1f}" stroke="red"/>',
           f'<text x="{x0 + 3:.1f}" y="{top + PAD_T + 10}" font-size="10" fill="red">fault</text>',
           f'<text x="{PAD_L - 4}" y="{y(hi) + 4:.1f}" font-size="10" '
           f'text-anchor="end">{_number(hi)}</text>',
           f'<text x="{PAD_L - 4}" y="{y(lo) + 4:.1f}" font-size="10" '
           f'text-anchor="end">{_number(lo)}</text>',
           f'<text x="{WIDTH - PAD_R}" y="{y(lo) + 14:.1f}" font-size="10" '
           f'text-anchor="end">{_number(t_end)} s after the fault</text>']
    if limit is not None:
        out.append(f'<line class="threshold" x1="{PAD_L}" y1="{y(limit):.1f}" '
                   f'x2="{WIDTH - PAD_R}" y2="{y(limit):.1f}" stroke="#d80" '
                   'stroke-dasharray="4 3"/>')
    if isinstance(before, (int, float)):
        out.append(f'<circle class="before" cx="{PAD_L + 12}" cy="{y(before):.1f}" r="3.5" '
                   'fill="none" stroke="#36c"/>')
        out.append(f'<text x="{PAD_L + 18}" y="{y(before) - 5:.1f}" font-size="10" '
                   'fill="#36c">before</text>')
    if samples:
        points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in samples)
        out.append(f'<polyline class="signal" points="{points}" fill="none" stroke="#36c"/>')
    mttd = d.get("mttd_seconds")
    hit = next((v for t, v in samples if mttd is not None and t == mttd), None)
    if hit is not None:
        out.append(f'<circle class="detected" cx="{x(mttd):.1f}" cy="{y(hit):.1f}" r="3.5" '
                   'fill="#36c"/>')
    return out


def draw(detections: list[dict], path: str) -> str | None:
    """The picture of every probe that has a reading; None when none has."""
    shown = [d for d in detections if d.get("samples") or d.get("before") is not None]
    if not shown:
        return None
    body = []
    for i, d in enumerate(shown):
        body += _panel(d, i * PANEL)
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                f'height="{PANEL * len(shown)}" font-family="sans-serif">\n'
                + "\n".join(body) + "\n</svg>\n")
    return path
