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
