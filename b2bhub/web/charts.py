"""The dashboard's charts as inline SVG, drawn on the server from the per-minute series
(``b2bhub.engine.stats``, the same figures as ``GET /api/v1/stats``): no chart library,
no JavaScript, and the live dashboard redraws them when it fetches its section again."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask_babel import gettext as _
from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 600, 170, 34
#: label sizes in the drawing's units: a chart is drawn 450-650 px wide on a laptop,
#: so 13 units read as 10-14 px
LABEL, LEGEND = 13, 14
COLOURS = ("#1f5fbf", "#1e7b3a", "#b3261e", "#a15c00")


def line_chart(points: list, series: list[tuple[str, str]], start: datetime,
               span: timedelta, unit: str = "") -> Markup:
    """One line per ``(attribute, label)`` over ``[start, start + span]``; a minute with
    no sample leaves a gap in time, not a jump."""
    values = [getattr(p, key) or 0 for p in points for key, _label in series]
    top = max(values, default=0) or 1
    plot_w, plot_h = WIDTH - PAD - 8, HEIGHT - 2 * PAD + 10
    lines, legend = [], []
    for n, (key, label) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        coords = " ".join(
            f"{PAD + plot_w * (p.minute - start) / span:.1f},"
            f"{PAD - 10 + plot_h * (1 - (getattr(p, key) or 0) / top):.1f}" for p in points)
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" '
                     f'points="{coords}"/>')
        legend.append(f'<tspan fill="{colour}">■ {escape(label)}</tspan> ')
    axis = (f'<line x1="{PAD}" y1="{PAD + plot_h - 10}" x2="{WIDTH - 8}" '
            f'y2="{PAD + plot_h - 10}" stroke="#999"/>'
            f'<text x="2" y="{PAD - 6}" font-size="{LABEL}">'
            f'{_number(top)}{escape(unit)}</text>'
            f'<text x="2" y="{PAD + plot_h - 10}" font-size="{LABEL}">0</text>'
            f'<text x="{PAD}" y="{HEIGHT - 4}" font-size="{LABEL}">{start:%H:%M}</text>'
            f'<text x="{WIDTH - 8}" y="{HEIGHT - 4}" font-size="{LABEL}" text-anchor="end">'
            f'{start + span:%H:%M} UTC</text>'
            f'<text x="{PAD + 56}" y="{HEIGHT - 4}" font-size="{LEGEND}">{"".join(legend)}</text>')
    nothing = escape(_("no figures yet"))  # outside the f-string: extraction reads it
    empty = "" if points else (f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" font-size="{LEGEND}" '
                               f'text-anchor="middle" fill="#777">{nothing}</text>')
    return Markup(f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
                  f'{axis}{"".join(lines)}{empty}</svg>')


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or float(value).is_integer() else f"{value:.1f}"
