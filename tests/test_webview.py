"""The web view in headless Chromium (Debian's package, driven by Python playwright; no browser download).

Saves a screenshot of each panel as webview-*.png in $SPECDEC_SCREENSHOT_DIR (docs/img to refresh the
docs' pictures) or else in a temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.server_tiny_model import SPECIALS, shared_server, tree_server

CHROMIUM = "/usr/bin/chromium"
WEB_SERVER = ("--speculation", "3")  # a fixed K: every round drafts, and a seed draws the same sample again
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
IMG_DIR = Path(os.environ.get("SPECDEC_SCREENSHOT_DIR") or Path(tempfile.gettempdir()) / "specdec-webview")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, one for the module (Playwright's sync API runs one instance at a time)."""
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Debian's chromium is not installed (make install runs scripts/install-chromium.sh as root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def open_page(browser, server):
    """The web view of `server` in a new page."""
    page = browser.new_page(viewport={"width": 1320, "height": 900})
    page.goto(server.url + "/")
    return page


@pytest.fixture(scope="module")
def page(browser):
    return open_page(browser, shared_server(*WEB_SERVER))


@pytest.fixture(scope="module")
def tree_page(browser):
    """The web view of a server whose default draft is a tree draft (every round a tree round)."""
    return open_page(browser, tree_server())


def shoot(page, selector: str, name: str) -> None:
    IMG_DIR.mkdir(parents=True, exist_ok=True)
    page.locator(selector).screenshot(path=str(IMG_DIR / f"webview-{name}.png"))


def test_page_loads_with_the_served_drafters(page):
    assert page.title().startswith("specdec")
    page.wait_for_function("document.querySelectorAll('#draft option').length >= 3")
    options = page.locator("#draft option").all_inner_texts()
    assert "none" in options and "lookup" in options


def test_prompt_streams_tokens_coloured_by_origin(page):
    page.fill("#prompt", "hello what is the draft token")
    page.fill("#temperature", "1")
    page.fill("#max-tokens", "60")
    page.fill("#seed", "7")  # a sampled answer that is not cut short by an early end token
    page.click("#generate")
    page.wait_for_function("document.body.dataset.done === '1'", timeout=60_000)
    assert page.locator("#error").is_hidden()
    spans = page.locator("#output span.tok")
    assert spans.count() > 0
    classes = set(page.eval_on_selector_all("#output span.tok", "els => els.map(e => e.classList[1])"))
    assert classes <= {"accepted", "recovered", "bonus"} and "accepted" in classes
    assert spans.first.get_attribute("title").startswith("round ")
    assert page.locator("#tree g.node").count() == 0  # a chain draft: the tree panel draws nothing
    assert re.match(r"round \d+: (a chain round|a plain step), no tree", page.inner_text("#tree-caption"))
    alpha = float(page.inner_text("#stat-alpha"))
    assert 0.0 <= alpha <= 1.0 and float(page.inner_text("#stat-tau")) >= 1.0
    shoot(page, "#live", "live")
    first = page.inner_text("#output")
    page.click("#generate")  # the same seed draws the same sample again
    page.wait_for_function("document.body.dataset.done === '1'", timeout=60_000)
    assert page.inner_text("#output") == first


def test_the_engine_steps_speculation_decision_is_shown(page):
    """Batch size and K per sequence of the engine's latest step, as /speculation (and /metrics) say."""
    import httpx

    page.fill("#prompt", "hello what is the draft token")
    page.wait_for_function("document.getElementById('k').disabled", timeout=10_000)  # the server picks K: none sent
    page.fill("#max-tokens", "20")
    page.click("#generate")
    page.wait_for_function("document.body.dataset.done === '1'", timeout=60_000)
    batch, ks = int(page.inner_text("#spec-batch")), [int(k) for k in page.inner_text("#spec-ks").split()]
    assert batch >= 1 and 1 <= len(ks) <= batch and all(0 <= k <= 3 for k in ks)
    decision = httpx.get(shared_server(*WEB_SERVER).url + "/speculation").json()
    assert (decision["batch_size"], decision["ks"]) == (batch, ks)  # nothing else ran since
    assert page.inner_text("#spec-mode") == "K: the server's, fixed"
    assert page.inner_text("#spec-reason") == decision["reason"] == "fixed K = 3"


def test_dragging_a_bar_changes_the_distribution(page):
    page.select_option("#toy-preset", "far")
    before = page.inner_text("#toy-alpha")
    box = page.locator("#toy-q").bounding_box()
    # drag the draft's "sat" bar (third of six) up: q moves toward p's peak, so alpha grows
    pad, slot = 18, (300 - 2 * 18) / 6  # toy.js layout on a 300-pixel-wide canvas
    x = box["x"] + box["width"] * (pad + 2.5 * slot) / 300
    page.mouse.move(x, box["y"] + box["height"] - 20)
    page.mouse.down()
    page.mouse.move(x, box["y"] + 30, steps=4)
    page.mouse.up()
    assert float(page.inner_text("#toy-alpha")) > float(before)


def chi_square_after_10k(page) -> float:
    page.click("#toy-many")
    return float(page.get_attribute("#toy-chi2", "data-value"))


def test_toy_chi_square_is_small_and_the_bug_makes_it_explode(page):
    page.select_option("#toy-preset", "far")
    page.click("#toy-one")
    assert "draft proposed" in page.inner_text("#toy-trace")
    correct = chi_square_after_10k(page)
    assert correct < 40  # 5 degrees of freedom: above 40 has odds of about 1e-7 when exact
    page.check("#toy-bug")
    buggy = chi_square_after_10k(page)
    assert buggy > 500
    page.uncheck("#toy-bug")  # the shown histogram is redrawn at once: no stale verdict
    assert float(page.get_attribute("#toy-chi2", "data-value")) < 40
    page.check("#toy-bug")
    assert float(page.get_attribute("#toy-chi2", "data-value")) > 500
    page.uncheck("#toy-bug")
    chi_square_after_10k(page)  # the screenshot shows the exact sampler
    page.fill("#toy-mix", "0.3")
    page.dispatch_event("#toy-mix", "input")
    page.click("#toy-one")
    shoot(page, "#toy", "toy")


def test_speedup_calculator_follows_the_formula(page):
    page.fill("#calc-alpha", "0.8")
    page.dispatch_event("#calc-alpha", "input")
    page.fill("#calc-k", "4")
    page.dispatch_event("#calc-k", "input")
    page.fill("#calc-c", "0.05")
    page.dispatch_event("#calc-c", "input")
    from specdec.speedup import best_k, expected_speedup, expected_tokens_per_round

    assert page.inner_text("#calc-tau") == f"{expected_tokens_per_round(0.8, 4):.2f}"
    assert page.inner_text("#calc-speedup") == f"{expected_speedup(0.8, 4, 0.05):.2f}x"
    assert page.inner_text("#calc-best").startswith(f"{best_k(0.8, 0.05).k} ")
    shoot(page, "#calc", "calc")


def test_the_tree_panel_draws_each_rounds_tree_with_the_kept_path_highlighted(tree_page):
    page = tree_page
    page.fill("#prompt", "hello what is the draft token")
    page.fill("#temperature", "1")
    page.fill("#max-tokens", "40")
    page.fill("#seed", "3")
    page.click("#generate")
    page.wait_for_function("document.body.dataset.done === '1'", timeout=60_000)
    assert page.locator("#error").is_hidden()
    latest = page.get_attribute("#tree", "data-round")  # the newest tree round (the last rounds may not draft)
    assert latest is not None and page.locator("#tree g.node").count() > 1
    page.locator(f"#output span.tok[data-round='{latest}']").first.click()  # its caption back
    check_drawn_tree(page)
    first = page.locator("#output span.tok").first  # a click shows the tree of the token's round
    first.click()
    assert "selected" in first.get_attribute("class").split()
    assert page.get_attribute("#tree", "data-round") == first.get_attribute("data-round") != latest
    check_drawn_tree(page)
    shoot(page, "#live", "tree")


def check_drawn_tree(page) -> None:
    """The drawing matches its caption ("round R: N nodes, M kept, then ORIGIN"): one root, N draft
    nodes, the M kept ones highlighted and joined by highlighted edges, the token after them coloured by
    its origin, and the kept nodes' text is how round R's text starts in the output."""
    round_index = page.get_attribute("#tree", "data-round")
    caption = page.inner_text("#tree-caption")
    assert caption.startswith(f"round {round_index}: ")
    nodes, kept = (int(caption.split(": ")[1].split()[i]) for i in (0, 2))
    assert page.locator("#tree g.node.root").count() == 1
    assert page.locator("#tree g.node:not(.root):not(.next)").count() == nodes >= 1
    labels = page.locator("#tree g.node.kept text").all_text_contents()  # in node order: the path, root first
    assert len(labels) == kept <= nodes
    following = page.locator("#tree g.node.next")
    assert following.count() == ("then " in caption)
    if following.count():
        assert following.get_attribute("class").split()[-1] == caption.rsplit(" ", 1)[-1]
    assert page.locator("#tree path.edge.kept").count() == kept + following.count()
    span = page.locator(f"#output span.tok[data-round='{round_index}']").first
    words = [label for label in labels if label not in SPECIALS]  # specials are not part of the text
    assert span.inner_text().split()[:len(words)] == words
