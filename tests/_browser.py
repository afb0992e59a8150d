"""Open an HTML file in headless Chromium: the DOM after scripts ran, the console, a screenshot."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# Notices of the browser's own software GL, not messages of the page's scripts.
BROWSER_NOTICES = re.compile(r"^\[\.WebGL-|^\[\]Automatic fallback to software WebGL")
_CONSOLE = re.compile(r':CONSOLE(?:\(\d+\)|:\d+)\] "(.*)", source: (.*)$')


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("SCANSNAP_REQUIRE_BROWSER"):
        pytest.fail("no Chromium found, and SCANSNAP_REQUIRE_BROWSER is set (CI installs it)")
    pytest.skip("no Chromium on this machine (apt install chromium)")


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    return subprocess.run(
        base + list(args), capture_output=True, text=True, timeout=timeout, check=False
    )


def open_page(path: Path, budget_ms: int = 10000) -> tuple[str, list[str]]:
    """(DOM after the page's scripts ran, console messages of the page)."""
    done = _run(
        "--enable-logging=stderr",
        "--v=0",
        f"--virtual-time-budget={budget_ms}",
        "--dump-dom",
        path.resolve().as_uri(),
    )
    messages = []
    for line in done.stderr.splitlines():
        match = _CONSOLE.search(line)
        if match and not BROWSER_NOTICES.search(match.group(1)):
            messages.append(match.group(1))
    return done.stdout, messages


def screenshot(path: Path, png: Path, size: str = "1200,4000", budget_ms: int = 10000) -> Path:
    _run(
        f"--window-size={size}",
        f"--virtual-time-budget={budget_ms}",
        f"--screenshot={png}",
        path.resolve().as_uri(),
    )
    return png


_PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const width = window.innerWidth, height = window.innerHeight;
  const box = (el) => { const r = el.getBoundingClientRect();
    return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right}; };
  const wide = [];
  for (const el of document.body.querySelectorAll("*")) {
    // inside a box that scrolls on its own, an element may be wider than the page
    if (el.parentElement.closest("div.table") || el.tagName === "SCRIPT") continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > width + 1 || r.left < -1))
      wide.push(el.tagName + "." + el.className + " " + Math.round(r.right));
  }
  const found = document.querySelector("div.findings");
  // beside the findings: the map, then the loss under it (the loss alone without a map)
  const figs = found ? found.querySelectorAll(":scope > div.aside > figure") : [];
  const out = {width, height, page_width: document.documentElement.scrollWidth, wide,
               findings: found ? box(found) : null,
               findings_items: found ? found.querySelectorAll("li").length : 0,
               map: figs[0] ? box(figs[0].querySelector("img")) : null,
               beside: figs[0] ? figs[0].querySelector("figcaption").textContent : "",
               under: figs[1] ? box(figs[1].querySelector("img")) : null,
               under_caption: figs[1] ? figs[1].querySelector("figcaption").textContent : ""};
  const pre = document.createElement("pre");
  pre.id = "layout-probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500));
</script>"""


def layout(path: Path, size: tuple[int, int] = (1300, 900), budget_ms: int = 10000) -> dict:
    """How a page lays out in a window of `size`: the elements wider than the window (outside
    boxes that scroll on their own), and where the findings, the figure beside them (``map``,
    ``beside``: its caption) and the figure under that one (``under``, ``under_caption``)
    are (page pixels)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        probed = Path(folder) / path.name
        probed.write_text(path.read_text().replace("</body>", _PROBE + "</body>"))
        done = _run(
            f"--window-size={size[0]},{size[1]}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            probed.as_uri(),
        )
    match = re.search(r'<pre id="layout-probe">(.*?)</pre>', done.stdout, re.S)
    assert match, "the layout probe did not run"
    import html

    return json.loads(html.unescape(match.group(1)))
