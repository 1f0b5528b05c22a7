"""The acceptance report of one or more tracks as ONE self-contained HTML page (`tica report --html`).

No script, no external resource: inline CSS only. The page's first lines are the tracks'
headlines (`Report.headline`), then a verdict grid (one row per evidence item, one column per
track), then each track side by side: its candidate, one row per item (verdict coloured by
state, why in one sentence, next step, the question hash), and the details of each item one
level down in a `<details>` element. Every text is HTML-escaped, and every text read from the
ledger is shown plain (`tica.messages.plain`: no absolute path, digests shortened).

A cell is coloured green only when `ReportCell.accepted` holds, and a track's answer only when
`Report.accepted` holds: the colour is never read from a word. Standard library and the pure
core only (no Dagster).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from tica.acceptance import TITLES, EarlierVerdict, Report, ReportCell
from tica.evidence import EvidenceItem
from tica.messages import clip, digest, plain

# Tone -> (background, text colour). Accepted green, fail red, everything else not yet accepted amber.
ACCEPTED, FAIL, PENDING = "accepted", "fail", "pending"
TONES: dict[str, tuple[str, str]] = {
    ACCEPTED: ("#1e7b34", "#ffffff"),
    FAIL: ("#c62828", "#ffffff"),
    PENDING: ("#f2a900", "#1a1a1a"),
}
SUMMARY_LIMIT = 2000

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #1a1a1a;
       background: #ffffff; line-height: 1.35; }
header { margin-bottom: 1.2rem; }
.headline { font-size: 1.1rem; font-weight: 600; margin: 0 0 .35rem 0; padding: .3rem .6rem;
            border-left: .45rem solid; }
h2 { font-size: 1.05rem; margin: 1.2rem 0 .4rem 0; }
table { border-collapse: collapse; width: 100%; margin-bottom: .6rem; }
th, td { border: 1px solid #c8c8c8; padding: .3rem .5rem; text-align: left; vertical-align: top; }
thead th { background: #f1f1f1; }
table.verdict-grid { width: auto; }
table.verdict-grid td { min-width: 9rem; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: .92em; }
.tracks { display: grid; gap: 1.5rem; align-items: start; }
.track { min-width: 0; }
.meta { margin: .2rem 0; color: #444444; }
details { margin: .25rem 0; border: 1px solid #dddddd; padding: .25rem .5rem; }
summary { cursor: pointer; }
details ul { margin: .3rem 0; padding-left: 1.2rem; }
footer { margin-top: 1.5rem; color: #555555; font-size: .9rem; }
""" + "".join(
    f".tone-{tone} {{ background: {bg}; color: {fg}; }}\n.headline.tone-{tone} {{ background: #ffffff; "
    f"color: #1a1a1a; border-left-color: {bg}; }}\n" for tone, (bg, fg) in TONES.items())


def esc(text: object) -> str:
    """HTML-escaped text (quotes too: safe in an attribute)."""
    return html.escape("" if text is None else str(text), quote=True)


def shown(text: object) -> str:
    """Text read from the ledger as the page shows it: plain (no absolute path), then escaped."""
    return esc(plain("" if text is None else str(text)))


def cell_tone(cell: ReportCell) -> str:
    """Green only for an accepted cell; red for a fail; amber for anything else not accepted."""
    if cell.accepted:
        return ACCEPTED
    return FAIL if cell.state == FAIL else PENDING


def report_tone(rep: Report) -> str:
    if rep.accepted:
        return ACCEPTED
    return FAIL if any(c.state == FAIL for c in rep.cells) else PENDING


def short_hash(value: str | None) -> str:
    """A question hash or head by its first 12 hex digits ("sha256:0123456789ab…"); "—" for none."""
    return digest(value) if value else "—"


def _cell_of(rep: Report, item: EvidenceItem) -> ReportCell | None:
    return next((c for c in rep.cells if c.item is item), None)


def _verdict_td(rep: Report, cell: ReportCell | None) -> str:
    if cell is None:
        return '<td class="verdict tone-pending" data-state="absent">not in this report</td>'
    tone = cell_tone(cell)
    return (f'<td class="verdict tone-{tone}" data-track="{esc(rep.track)}" data-item="{esc(cell.item.value)}" '
            f'data-state="{esc(cell.state)}" data-accepted="{str(cell.accepted).lower()}">{esc(cell.state)}</td>')


def headlines(reports: Sequence[Report]) -> str:
    return "\n".join(f'<p class="headline tone-{report_tone(r)}" data-track="{esc(r.track)}" '
                     f'data-accepted="{str(r.accepted).lower()}">{esc(r.headline)}</p>' for r in reports)


def verdict_grid(reports: Sequence[Report]) -> str:
    """One row per evidence item, one column per track: the verdicts side by side."""
    head = "".join(f"<th>{esc(r.track)}</th>" for r in reports)
    rows = "".join(f"<tr><th>{esc(TITLES[item])}</th>" + "".join(_verdict_td(r, _cell_of(r, item)) for r in reports)
                   + "</tr>\n" for item in EvidenceItem)
    return (f'<section class="grid"><h2>Verdicts</h2>\n<table class="verdict-grid"><thead><tr><th>evidence</th>{head}'
            f"</tr></thead>\n<tbody>\n{rows}</tbody></table></section>")


def _answer(rep: Report) -> str:
    word = "accepted" if rep.accepted else "not accepted"
    return f'<span class="answer tone-{report_tone(rep)}" data-accepted="{str(rep.accepted).lower()}">{word}</span>'


def item_table(rep: Report) -> str:
    rows = []
    for c in rep.cells:
        rows.append(f"<tr><th>{esc(TITLES[c.item])}</th>{_verdict_td(rep, c)}<td>{shown(c.deciding or '—')}</td>"
                    f"<td>{shown(c.next_step or '—')}</td>"
                    f"<td><code>{esc(short_hash(c.question_hash))}</code></td></tr>")
    return ('<table class="items"><thead><tr><th>evidence</th><th>verdict</th><th>why</th><th>next step</th>'
            "<th>question</th></tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody></table>")


def _li(items: Iterable[str]) -> str:
    listed = "".join(f"<li>{x}</li>" for x in items)
    return f"<ul>{listed}</ul>" if listed else ""


def _earlier(e: EarlierVerdict) -> str:
    return (f"{esc(e.verdict)} <code>{esc(e.verdict_id)}</code> for <code>{esc(e.candidate_id)}</code> under "
            f"{shown(e.question)} ({esc(e.relation)}): {shown(clip(e.summary, 300))}")


def cell_details(rep: Report, c: ReportCell) -> str:
    """The item's details, one level down: its summary, what it was judged for and under, and why."""
    facts = [f"summary: {shown(clip(c.summary, SUMMARY_LIMIT) or 'none')}",
             f"question judged under: <code>{esc(short_hash(c.question_hash))}</code>; the track asks now: "
             f"<code>{esc(short_hash(c.question_in_force))}</code>"]
    if c.candidate_id:
        other = "" if c.candidate_id == rep.candidate_id else " (not the candidate the manifest names now)"
        facts.append(f"judged for <code>{esc(c.candidate_id)}</code>{other}")
    if c.verdict_id:
        facts.append(f"verdict <code>{esc(c.verdict_id)}</code>, judge <code>{esc(c.judge_version or '—')}</code>")
    if c.stale_cause:
        facts.append(f"stale: {shown(c.stale_cause)}")
    facts += [f"blocks acceptance: {shown(b)}" for b in c.blocking]
    facts += [f"reason: {shown(r)}" for r in c.reasons]
    facts += [f"earlier non-pass: {_earlier(e)}" for e in c.earlier]
    facts += [f"legs of {esc(item)} not judged by it: {shown(', '.join(legs) or 'unreadable')}"
              for item, legs in c.uncovered.items()]
    facts += [f"canary switched off: <code>{esc(name)}</code>: {shown(why)}" for name, why in c.switched_off.items()]
    return (f'<details data-item="{esc(c.item.value)}"><summary>{esc(TITLES[c.item])}: {esc(c.state)}</summary>'
            f"{_li(facts)}</details>")


def track_section(rep: Report) -> str:
    candidate = (f"<code>{esc(rep.candidate_id)}</code>" if rep.candidate_id
                 else "unknown (no manifest was read: no verdict is shown as current)")
    conditions = f'<p class="meta">shown under: {shown(rep.conditions)}</p>' if rep.conditions else ""
    head = rep.verified_head
    verified = (f'<p class="meta">read from a ledger whose chain verified, head seq {esc(head.seq)} '
                f"<code>{esc(short_hash(head.row_hash))}</code></p>") if head is not None else ""
    details = "\n".join(cell_details(rep, c) for c in rep.cells)
    return (f'<section class="track" data-track="{esc(rep.track)}">\n<h2>{esc(rep.track)}: {_answer(rep)}</h2>\n'
            f'<p class="meta">candidate {candidate}</p>\n{conditions}{verified}\n{item_table(rep)}\n'
            f'<h2>Details</h2>\n{details}\n</section>')


def render(reports: Sequence[Report], generated_by: str = "tica report") -> str:
    """The page: the headlines first, the verdict grid, then the tracks side by side."""
    if not reports:
        raise ValueError("a report page needs at least one track")
    title = "TICA acceptance: " + ", ".join(r.track for r in reports)
    columns = f"grid-template-columns: repeat({len(reports)}, minmax(0, 1fr));"
    sections = "\n".join(track_section(r) for r in reports)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{esc(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<header>\n{headlines(reports)}\n</header>\n"
            f'{verdict_grid(reports)}\n<div class="tracks" style="{columns}">\n{sections}\n</div>\n'
            f"<footer>Written by {esc(generated_by)}: a cell is green only when it is accepted for the candidate "
            "the manifest names now.</footer>\n</body>\n</html>\n")
