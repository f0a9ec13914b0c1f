"""The HTML report renders in a real browser (headless Chromium) with its plots visible."""

import shutil
import subprocess

import pytest
from PIL import Image

from rhlab.report import build_report
from test_report import final, make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html, png, tmp_path, height=2400):
    """Chromium as the workplace runs it: no sandbox (root), no background networking."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chrome-profile'}", f"--window-size=1280,{height}",
           f"--screenshot={png}", html.as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make test installs it)")
def test_report_html_renders_with_plots(tmp_path):
    root = tmp_path / "runs"
    for seed, (p, h) in enumerate([(0.5, 0.6), (0.6, 0.5), (0.55, 0.7)]):
        make_run(root, f"vanilla_s{seed}", "vanilla", seed, final(p, h), steps=20)
        make_run(root, f"kl_s{seed}", "kl", seed, final(p + 0.1, h - 0.4), steps=20)
    out = tmp_path / "report"
    build_report([root], out)
    png = tmp_path / "shot.png"
    screenshot(out / "report.html", png, tmp_path)
    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 2400)
    px = list(img.getdata())
    # the plots are the only strongly coloured things on the page (matplotlib's C0/C1 lines, points, bands)
    coloured = sum(1 for r, g, b in px if max(r, g, b) - min(r, g, b) > 80)
    assert coloured > 2000, f"only {coloured} coloured pixels: plots not rendered?"
    dark = sum(1 for r, g, b in px if max(r, g, b) < 100)  # text and axes
    assert dark > 20000, "page looks blank"
