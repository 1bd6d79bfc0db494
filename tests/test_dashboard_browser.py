"""The dashboard in a real headless browser (Debian's chromium driven by Playwright)
during a live loopback round (``anonml demo``: relay, aggregator and peer processes),
its figures checked against the aggregator's own JSON; then the final report page.
Both must fit a phone's 390 px width without sideways scrolling, and the ROC
plot must show its two axis titles.

``.ci/run`` installs chromium when it is missing. Screenshots go to
``$ANONML_SCREENSHOTS`` when set (else the test's temporary directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from anonml.base.process import anonml_command
from anonml.demo import schedule_seconds

# System suite: a whole demo round and a browser.
pytestmark = [pytest.mark.system, pytest.mark.usefixtures("machine_share")]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags that work on this kind of machine (root, no GPU, no network beyond loopback).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


def _browser() -> Any:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"BROWSER TEST NOT RUN: no chromium at {CHROMIUM}; `apt-get install -y chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    return playwright, playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)


def _text(page: Any, figure: str) -> str:
    return str(page.evaluate(f"document.querySelector('[data-figure=\"{figure}\"]').textContent")).strip()


PHONE = {"width": 390, "height": 844}
"""A phone's viewport (CSS pixels): the page must fit its width."""


def _fits_a_phone(page: Any) -> None:
    """At the phone's width nothing overflows sideways (no horizontal scrolling)."""
    page.set_viewport_size(PHONE)
    # Plotly redraws its charts a moment after the window's resize (debounced): give the page a few
    # seconds to settle, then measure whatever it came to.
    try:
        page.wait_for_function(f"document.documentElement.scrollWidth <= {PHONE['width']}", timeout=5_000)
    except Exception:  # noqa: BLE001 - Playwright's timeout: the assertion below says how wide it stayed
        pass
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide in a {PHONE['width']} px window"


def _axis_titles(page: Any, chart: str) -> list[str]:
    """The x and y axis titles the browser drew on ``chart`` (empty where one is missing)."""
    return [
        str(page.evaluate(f"(document.querySelector('#{chart} .{axis}title') || {{textContent: ''}}).textContent"))
        for axis in ("x", "y")
    ]


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    target = Path(os.environ.get("ANONML_SCREENSHOTS", tmp_path))
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / name), full_page=True)


@pytest.mark.whole_round
def test_the_live_dashboard_shows_the_aggregators_figures_and_the_report_reuses_it(tmp_path: Path) -> None:
    playwright, browser = _browser()
    work = tmp_path / "work"
    demo = subprocess.Popen(
        anonml_command("demo", "--peers", "40", "--work-dir", str(work), "--json", str(tmp_path / "summary.json"), "--linger", "20"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # A readiness signal, bounded only against a hang: on a loaded machine
        # the demo's start (operator commands, measuring costs) takes minutes.
        deadline = time.monotonic() + 900
        while not (work / "round.toml").is_file():
            assert demo.poll() is None and time.monotonic() < deadline, "the demo did not write its round spec"
            time.sleep(0.2)
        spec = tomllib.loads((work / "round.toml").read_text())
        port = int(spec["network"]["http_port"])
        url = f"http://127.0.0.1:{port}"
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        while True:
            try:
                page.goto(url + "/dashboard")
                break
            except Exception:  # noqa: BLE001 - the aggregator is still starting
                assert time.monotonic() < deadline and demo.poll() is None
                time.sleep(0.5)
        page.wait_for_selector("body[data-rendered-at]", timeout=30_000)
        checked_live = False
        final: dict[str, Any] | None = None
        # The demo sizes its round from what it measures on this machine: wait as long as its schedule says.
        deadline = time.monotonic() + schedule_seconds(spec["schedule"]) + 300
        while time.monotonic() < deadline:
            # The page polls every 2 s: wait for a render at least as new as the JSON just read.
            truth = httpx.get(url + "/v1/dashboard", timeout=10).json()
            page.wait_for_function(f"Number(document.body.getAttribute('data-rendered-at')) >= {truth['now']}", timeout=15_000)
            shown_phase = _text(page, "phase")
            if truth["phase"] in ("data", "median") and not checked_live:
                again = httpx.get(url + "/v1/dashboard", timeout=10).json()
                # After issuance the roster and credentials no longer change: the page must show the same figures.
                assert _text(page, "registered") == str(truth["counts"]["registered"]) == str(again["counts"]["registered"])
                assert _text(page, "credentials") == str(truth["counts"]["credentials"])
                assert _text(page, "min-participation") == str(truth["min_participation"])
                assert shown_phase.split()[0] in (truth["phase"], again["phase"])
                rows = page.evaluate("Array.from(document.querySelectorAll('#relay-table tbody tr')).map(r => [r.dataset.relay, r.children[2].textContent])")
                assert rows == [[relay["node_id"], relay["status"]] for relay in again["relays"]] or rows == [[relay["node_id"], relay["status"]] for relay in truth["relays"]]
                lines = page.evaluate("document.getElementById('chart-participation').data.length")
                assert lines == 2 + len(truth["series"]["accepted"]) or lines == 2 + len(again["series"]["accepted"])
                _shot(page, tmp_path, "dashboard-live.png")
                checked_live = True
            if truth["phase"] == "done" and truth["report"] is not None:
                final = truth
                break
            time.sleep(1.0)
        assert checked_live, "never saw the round's median or data phase"
        assert final is not None, "the round did not finish while the dashboard was watched"
        page.wait_for_function("document.querySelector('[data-figure=\"phase\"]').textContent === 'done'", timeout=15_000)
        utility = final["report"]["utility"]
        assert _text(page, "accepted") == str(final["counts"]["accepted"])
        assert _text(page, "rejected-total") == str(sum(final["rejected"].values()))
        assert page.evaluate("document.getElementById('chart-rejected').hidden") == (not final["rejected"])
        assert _text(page, "auc") == f"{utility['auc']:.3f}"
        assert page.evaluate("document.getElementById('chart-roc').data[0].x.length") == len(utility["roc"]["fpr"])
        assert _axis_titles(page, "chart-roc") == ["false positive rate", "true positive rate"]
        _shot(page, tmp_path, "dashboard-done.png")
        _fits_a_phone(page)
        _shot(page, tmp_path, "dashboard-phone.png")
        page.set_viewport_size({"width": 1200, "height": 900})
        assert demo.wait(timeout=180) == 0
        # The report is the same page, readable from the file alone.
        [round_dir] = (work / "aggregator" / "rounds").iterdir()
        report = json.loads((round_dir / "report.json").read_text())
        page.goto((round_dir / "report.html").as_uri())
        page.wait_for_selector("body[data-rendered-at]", timeout=30_000)
        assert _text(page, "phase") == "done"
        assert _text(page, "auc") == f"{report['utility']['auc']:.3f}"
        assert _text(page, "accepted") == str(report["counts"]["accepted"])
        assert "Unix" not in page.content() and str(report["schedule"]["t_register_end"]) not in page.inner_text("body")
        _shot(page, tmp_path, "report.png")
        # The report read on a phone: opened at its width, not only resized to it.
        phone = browser.new_page(viewport=PHONE)
        phone.goto((round_dir / "report.html").as_uri())
        phone.wait_for_selector("body[data-rendered-at]", timeout=30_000)
        assert _axis_titles(phone, "chart-roc") == ["false positive rate", "true positive rate"]
        _fits_a_phone(phone)
        _shot(phone, tmp_path, "report-phone.png")
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(timeout=60)
        browser.close()
        playwright.stop()
