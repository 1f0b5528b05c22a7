"""The page `tica report --html` writes, as a person sees it in headless Chromium (driven through
Playwright, launched on the Debian chromium the other browser test uses: no browser is
downloaded). Two tracks of one ledger side by side: the false-pass suite's accepted track (the
negative control: it must show as accepted, in green) and one that is not accepted (one item
accepted, one fail, one inconclusive, the rest not run). The page's first lines are the headlines;
each verdict is coloured by its state (accepted green, fail red, anything else amber), read as the
browser computes it; a track or cell that is not accepted is never shown as accepted. The page
loads nothing but itself and runs no script (a summary's markup is shown as text). A screenshot is
kept under .tica/artifacts/browser/."""

from __future__ import annotations

import pytest
from dagster_browser import CHROMIUM, CHROMIUM_FLAGS

from tests.core.test_report_cli import REFUSED, TwoTracks, two_tracks  # noqa: F401 (fixtures; `baseline`: tests/conftest.py)
from tests.false_pass.test_acceptance import TRACK
from tica.acceptance import TITLES
from tica.cli import EXIT_NO, main
from tica_assets.settings import PROJECT_ROOT

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the browser tests skip where the browser (or its driver) is not installed
    sync_playwright = None

pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
              pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed")]
ARTIFACTS = PROJECT_ROOT / ".tica" / "artifacts" / "browser"

# What the browser computes for each verdict cell, and for each track's answer and headline.
CELLS = """() => [...document.querySelectorAll('table.items td.verdict')].map(td => ({
    track: td.dataset.track, item: td.dataset.item, text: td.innerText.trim(),
    accepted: td.dataset.accepted, background: getComputedStyle(td).backgroundColor}))"""
ANSWERS = """() => [...document.querySelectorAll('section.track')].map(s => {
    const a = s.querySelector('.answer');
    return {track: s.dataset.track, text: a.innerText.trim(), background: getComputedStyle(a).backgroundColor};
})"""
HEADLINES = """() => [...document.querySelectorAll('header .headline')].map(h => ({
    track: h.dataset.track, border: getComputedStyle(h).borderLeftColor}))"""


def rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(float(v)) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    return r, g, b


def tone(css: str) -> str:
    """The colour a person sees: green, red, amber, or other."""
    r, g, b = rgb(css)
    if g > r + 40 and g > b + 40:
        return "green"
    if r > 150 and g < 90 and b < 90:
        return "red"
    if r > 200 and 120 <= g <= 220 and b < 80:
        return "amber"
    return "other"


def expected(state: str) -> str:
    return {"accepted": "green", "fail": "red"}.get(state, "amber")


@pytest.fixture(scope="module")
def page_file(two_tracks: TwoTracks, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    page = tmp_path_factory.mktemp("report-html") / "report.html"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TICA_CACHE_DIR", str(page.parent / "fingerprint-cache"))
        assert main(two_tracks.argv(TRACK, REFUSED, html=page)) == EXIT_NO
    return page


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=[f for f in CHROMIUM_FLAGS if f != "--headless"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser, page_file):
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, java_script_enabled=True)
    view = context.new_page()
    view.requests = []  # type: ignore[attr-defined]
    view.on("request", lambda r: view.requests.append(r.url))  # type: ignore[attr-defined]
    view.goto(page_file.as_uri())
    yield view
    context.close()


def test_the_first_lines_are_the_headlines(page, two_tracks):
    lines = [line.strip() for line in page.inner_text("body").splitlines() if line.strip()]
    assert lines[:2] == [two_tracks.report(TRACK).headline, two_tracks.report(REFUSED).headline]
    assert lines[0] == f"{TRACK}: accepted — 7 of 7 pass"
    assert lines[1].startswith(f"{REFUSED}: not accepted — 1 of 7 pass; 1 fail (backward)")


def test_each_verdict_is_coloured_by_its_state(page, two_tracks):
    shown = page.evaluate(CELLS)
    assert len(shown) == 2 * len(TITLES)
    for cell in shown:
        want = {c.item.value: c for c in two_tracks.report(cell["track"]).cells}[cell["item"]]
        assert cell["text"] == want.state and cell["accepted"] == str(want.accepted).lower(), cell
        assert tone(cell["background"]) == expected(want.state), (cell, want.state)
    states = {(c["track"], c["item"]): c["text"] for c in shown}
    # every kind of colour is on the page: the check above is not vacuous
    assert {expected(s) for s in states.values()} == {"green", "red", "amber"}
    assert states[(REFUSED, "backward")] == "fail" and states[(REFUSED, "update")] == "inconclusive"
    assert states[(REFUSED, "clean_exit")] == "not run"
    grid = page.evaluate("() => [...document.querySelectorAll('table.verdict-grid td.verdict')]"
                         ".map(td => [td.dataset.track, td.dataset.item, td.innerText.trim(), "
                         "getComputedStyle(td).backgroundColor])")
    assert {(t, i): s for t, i, s, _ in grid} == states  # the grid shows the same verdicts side by side
    assert all(tone(bg) == expected(s) for _, _, s, bg in grid)


def test_a_track_not_accepted_is_never_shown_as_accepted(page, two_tracks):
    answers = {a["track"]: a for a in page.evaluate(ANSWERS)}
    assert answers[TRACK]["text"] == "accepted" and tone(answers[TRACK]["background"]) == "green"  # negative control
    assert answers[REFUSED]["text"] == "not accepted" and tone(answers[REFUSED]["background"]) == "red"
    borders = {h["track"]: tone(h["border"]) for h in page.evaluate(HEADLINES)}
    assert borders == {TRACK: "green", REFUSED: "red"}
    refused = {c.item.value: c for c in two_tracks.report(REFUSED).cells}
    for cell in page.evaluate(CELLS):
        if cell["track"] == REFUSED and not refused[cell["item"]].accepted:
            assert cell["text"] != "accepted" and tone(cell["background"]) != "green", f"FALSE PASS shown: {cell}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-html-two-tracks.png"), full_page=True)


def test_the_tracks_stand_side_by_side(page):
    boxes = page.evaluate("() => [...document.querySelectorAll('section.track')].map(s => {"
                          "const r = s.getBoundingClientRect(); return [s.dataset.track, r.left, r.top]; })")
    (first, left_a, top_a), (second, left_b, top_b) = boxes
    assert (first, second) == (TRACK, REFUSED)
    assert left_b > left_a + 400 and abs(top_a - top_b) < 5, boxes


def test_details_are_one_level_down_and_markup_in_them_is_text(page, two_tracks):
    details = page.locator(f'section.track[data-track="{REFUSED}"] details[data-item="backward"]')
    assert details.get_attribute("open") is None  # folded until asked for
    details.locator("summary").click()
    text = details.inner_text()
    assert "<img src=x onerror=window.pwned=1>" in text and "leg-0/grads.safetensors" in text
    assert str(two_tracks.root) not in page.content()
    assert page.evaluate("() => window.pwned") is None  # shown, never run
    assert page.evaluate("() => document.scripts.length") == 0


def test_the_page_loads_nothing_but_itself(page, page_file):
    assert page.requests == [page_file.as_uri()], page.requests  # type: ignore[attr-defined]
