"""report.html in headless Chromium: it renders, its plots are visible and it fetches nothing.

Needs Debian's chromium (`apt-get install -y chromium`). Chromium is driven through the DevTools
protocol over a pipe (fixtures/cdp.py): the page's Network domain sees every request the page
makes, so "nothing but the file itself and its data: images" is checked directly. (A --log-net-log
capture is not used: it also holds the browser's own background traffic, which is not the page's.)
The screenshot is kept in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from fixtures.cdp import Chromium, find_chromium
from fixtures.report_records import rich_results

from repro.report.build import build_report

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation',
    e => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));
"""
PAGE_FACTS = """JSON.stringify({
  images: Array.from(document.images).map(i => {
    const r = i.getBoundingClientRect();
    return {w: i.naturalWidth, h: i.naturalHeight, complete: i.complete,
            x: r.left + window.scrollX, y: r.top + window.scrollY, cw: r.width, ch: r.height};
  }),
  headline: Array.from(document.querySelectorAll('li.headline-env')).map(li =>
      ({env: li.dataset.env, reproduces: li.dataset.reproduces, visible: li.offsetHeight > 0})),
  violations: window.__cspViolations,
  dpr: window.devicePixelRatio,
})"""


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = find_chromium()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    return exe


def test_report_renders_offline_with_visible_plots(chromium: str, tmp_path: Path) -> None:
    from PIL import Image

    folders = rich_results(tmp_path)
    paths = build_report(folders, tmp_path / "out", gpu_env_hint=("rocm56",))
    data = json.loads(paths.data.read_text())
    page_url = paths.html.resolve().as_uri()

    with Chromium(chromium) as browser:
        session = browser.open_page()
        browser.send("Network.enable", session)
        browser.send("Page.enable", session)
        browser.send("Page.addScriptToEvaluateOnNewDocument", session, source=RECORD_VIOLATIONS)
        browser.send("Page.navigate", session, url=page_url)
        browser.wait_event("Page.loadEventFired")
        facts = json.loads(
            browser.send("Runtime.evaluate", session, expression=PAGE_FACTS, returnByValue=True)["result"][
                "value"
            ]
        )
        shot = base64.b64decode(
            browser.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)["data"]
        )
        events = list(browser.events)

    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "report-browser.png").write_bytes(shot)

    requested = [
        e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert page_url in requested
    assert [u for u in requested if u != page_url and not u.startswith("data:")] == []
    assert [e for e in events if e.get("method") == "Network.loadingFailed"] == []
    assert facts["violations"] == []

    assert [h["env"] for h in facts["headline"]] == [h["env"] for h in data["headline"]]
    assert [h["reproduces"] for h in facts["headline"]] == [h["reproduces"] for h in data["headline"]]
    assert all(h["visible"] for h in facts["headline"])

    assert len(facts["images"]) == len(data["plots"]) > 0
    assert all(i["complete"] and i["w"] > 0 and i["h"] > 0 and i["cw"] > 0 for i in facts["images"])
    page = Image.open(io.BytesIO(shot)).convert("L")
    scale = facts["dpr"]
    for img in facts["images"]:
        box = tuple(int(v * scale) for v in (img["x"], img["y"], img["x"] + img["cw"], img["y"] + img["ch"]))
        area = page.crop(box).tobytes()
        dark = sum(1 for px in area if px < 160)
        assert dark > 0.01 * len(area), f"plot at {box} looks empty in the screenshot"
