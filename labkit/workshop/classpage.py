"""The class view as one self-contained HTML page (no scripts or files from elsewhere).

``refresh`` seconds adds a meta refresh, so the page served by the hub follows the class while it works.
Every learner's text in it is HTML-escaped (``html.escape``, quotes too: it also goes in attributes), and the
page is always UTF-8 text: a lone surrogate (a file name that is no UTF-8) is replaced, never an encoding error.
"""

from __future__ import annotations

import html

from labkit.workshop.classview import View, first_line, when

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#1f2328}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:center}
th.who,td.who{text-align:left}td.pass{background:#dafbe1;color:#1a7f37}td.fail{background:#ffebe9;color:#cf222e}
td.none{color:#8c959f}small{color:#57606a}.fails li{margin:2px 0}h2{margin-top:1.5em}"""


def _cell(view: View, who: str, col) -> str:
    x = view.cell(who, col)
    if x is None:
        return "<td class='none'>&middot;</td>"
    mark, cls = ("&#10004;", "pass") if x.passed else ("&#10008;", "fail")
    tip = html.escape(first_line(x.message, 300), quote=True)
    return f"<td class='{cls}' title='{tip}'>{mark}<small> &times;{x.attempts}</small></td>"


def html_page(view: View, title: str = "Class view", refresh: int | None = None) -> str:
    """The grid (learners x steps), each step's pass rate, commonest failures and median minutes to pass."""
    meta = f"<meta http-equiv='refresh' content='{int(refresh)}'>" if refresh else ""
    stamp = when(view.updated, "%Y-%m-%d %H:%M:%S") if view.updated else "no record yet"
    head = "".join(f"<th title='{html.escape(c.title, quote=True)}'>{html.escape(c.key)}</th>" for c in view.columns)
    rows = []
    for who in view.learners:
        stuck = view.stuck_at(who)
        note = f"<small> stuck at {html.escape(stuck.key)}</small>" if stuck else ""
        cells = "".join(_cell(view, who, c) for c in view.columns)
        rows.append(f"<tr><td class='who'>{html.escape(who)}{note}</td>{cells}</tr>")
    rates = "".join(f"<td>{c.pass_rate:.0%}</td>" for c in view.columns)
    mins = "".join(f"<td>{'&ndash;' if c.minutes is None else f'{c.minutes:.1f}'}</td>" for c in view.columns)
    grid = (f"<table id='grid'><tr><th class='who'>learner</th>{head}</tr>{''.join(rows)}"
            f"<tr><th class='who'>pass rate</th>{rates}</tr><tr><th class='who'>median minutes to pass</th>{mins}</tr>"
            "</table>") if view.columns else "<p id='grid'>No check has been recorded yet.</p>"
    fails = []
    for c in view.columns:
        if c.failures:
            items = "".join(f"<li>{n} learner{'s' if n > 1 else ''}: <code>{html.escape(m)}</code></li>"
                            for m, n in c.failures)
            fails.append(f"<h3>{html.escape(c.key)}: {html.escape(c.title)}</h3><ul class='fails'>{items}</ul>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'>" + meta + f"<title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p><small>{len(view.learners)} learners; newest record {stamp}</small></p>{grid}"
            "<h2>Commonest failures</h2>" + ("".join(fails) or "<p>None.</p>") + _revealed(view) + _skipped(view)
            + "</body></html>\n")
    return page if page.isascii() else page.encode("utf-8", "replace").decode("utf-8")


def _revealed(view: View) -> str:
    """The steps whose solutions were revealed to the class (``labkit workshop reveal``): who, when."""
    if not view.reveals:
        return ""
    items = "".join(f"<li><b>{html.escape(f'{r.lab}/{r.step}')}</b> revealed by {html.escape(r.by)} at "
                    f"{html.escape(when(r.time))}</li>" for r in view.reveals)
    return f"<h2>Solutions revealed to the class</h2><ul id='revealed'>{items}</ul>"


def _skipped(view: View) -> str:
    """The records the view skipped (a learner's file that is not a regular file, a bad or forged line)."""
    if not view.problems:
        return ""
    items = "".join(f"<li><code>{html.escape(p)}</code></li>" for p in view.shown_problems())
    return f"<h2>Skipped records</h2><ul id='skipped'>{items}</ul>"
