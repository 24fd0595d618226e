"""The marimo notebooks: each runs headless as a script on the demo store and ends in assertions;
each exports to HTML; an exported page, opened in headless Chromium, renders its plots."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("phase_effects", "replay_lab")
CHARTS = {  # the altair charts each notebook draws, by title
    "phase_effects": ("Rows touched per phase per night", "Importance before and after the runs",
                      "CO_OCCURRED degree distribution (cap 5)", "What was deleted, and why", "Quarantine reasons",
                      "Conflicts over time"),
    "replay_lab": ("Rows that differ per phase", "Counter deltas (B"),
}
SCREENSHOTS = ROOT / ".deep_sleep" / "screenshots"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


@pytest.fixture(scope="session")
def demo_args(admin_dsn, tmp_path_factory) -> list[str]:
    """The notebooks' demo store on the tests' server, its runs under this session's tmp dir."""
    return ["--dsn", admin_dsn, "--runs-dir", str(tmp_path_factory.mktemp("notebook-runs"))]


def _run(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_as_a_script(name, demo_args):
    done = _run([sys.executable, str(ROOT / "notebooks" / f"{name}.py"), *demo_args])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert done.stdout.strip().endswith("ok")


@pytest.fixture(scope="session")
def exported(demo_args, tmp_path_factory) -> dict[str, Path]:
    """Both notebooks exported to HTML (outputs only: the plots, not the code)."""
    out = tmp_path_factory.mktemp("notebook-html")
    marimo = Path(sys.executable).parent / "marimo"
    pages = {}
    for name in NOTEBOOKS:
        page = out / f"{name}.html"
        done = _run([str(marimo), "export", "html", "--no-include-code", "-f", str(ROOT / "notebooks" / f"{name}.py"),
                     "-o", str(page), "--", *demo_args])
        assert done.returncode == 0 and page.is_file(), done.stderr[-4000:]
        pages[name] = page
    return pages


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_exported_html_holds_the_plot_specs(name, exported):
    html = exported[name].read_text()
    assert html.count("application/vnd.vegalite.v6+json") >= len(CHARTS[name]) - 1  # mo.ui.altair_chart: its own element
    # a spec's '"title": "…"', however the page escapes its quotes (JSON in JSON in HTML)
    missing = [t for t in CHARTS[name] if not re.search(r"title(?:\W|u0026|quot|#92){1,40}" + re.escape(t), html)]
    assert not missing, f"no chart spec titled {missing} in the exported page"
    assert "AssertionError" not in html and "Traceback" not in html


def _chromium() -> str:
    """The Debian ``chromium`` package, installed on first use (as root, as CI runs)."""
    found = shutil.which("chromium")
    if found is None:
        if os.geteuid() != 0:
            pytest.fail("chromium is missing: install Debian's chromium package (apt-get install -y chromium)")
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, capture_output=True, timeout=1200,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("chromium")
    assert found, "chromium did not install"
    return found


def _served(directory: Path):
    """A static server on 127.0.0.1 for ``directory`` (the page loads its scripts by URL: an ES module
    is not loaded from file://)."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _offline_page(page: Path, site: Path, with_frontend: bool = True) -> str:
    """The exported page with marimo's frontend served from the installed wheel instead of its CDN
    (``notebooks/offline.py``: this machine reaches no CDN); without it (the control) the page
    cannot render anything."""
    sys.path.insert(0, str(ROOT / "notebooks"))
    from offline import offline

    copy = site / (page.name if with_frontend else f"{page.stem}-bare.html")
    shutil.copy(page, copy)
    return offline(copy, "/dist/" if with_frontend else "/missing/").name


def _screenshot(chromium: str, url: str, png: Path, profile: Path) -> None:
    done = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                           "--window-size=1280,2200", "--virtual-time-budget=20000", "--hide-scrollbars", url],
                          capture_output=True, text=True, timeout=300)
    assert png.is_file(), done.stderr[-3000:]


def _plot_pixels(png: Path) -> tuple[float, float]:
    """(share of strongly coloured pixels, grey-level variance): marimo's page is white and grey;
    the charts' marks are the saturated colours."""
    from PIL import Image, ImageStat

    im = Image.open(png).convert("RGB")
    small = im.resize((im.width // 4, im.height // 4))
    pixels = list(small.getdata())
    saturated = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 90) / len(pixels)
    return saturated, ImageStat.Stat(im.convert("L")).var[0]


def test_exported_html_renders_its_plots_in_headless_chromium(exported, tmp_path):
    chromium = _chromium()
    site = tmp_path / "site"
    site.mkdir()
    pages = {name: _offline_page(exported[name], site) for name in NOTEBOOKS}
    bare = _offline_page(exported["phase_effects"], site, with_frontend=False)
    server = _served(site)
    shots = {name: tmp_path / f"{name}.png" for name in NOTEBOOKS}
    control = tmp_path / "phase_effects-bare.png"
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for name, page in pages.items():
            _screenshot(chromium, f"{base}/{page}", shots[name], tmp_path / f"profile-{name}")
        _screenshot(chromium, f"{base}/{bare}", control, tmp_path / "profile-bare")
    finally:
        server.shutdown()
        server.server_close()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, shot in shots.items():
        shutil.copy(shot, SCREENSHOTS / shot.name)
        coloured, variance = _plot_pixels(shot)
        assert variance > 100, f"{name}: the page looks blank (grey-level variance {variance:.1f})"
        # measured: 0.6-3 % for these pages (white space and tables around the charts), 0.0 % for the control
        assert coloured > 0.003, f"{name}: only {coloured:.2%} of the page is chart colour: the plots did not render"
    bare_coloured, _ = _plot_pixels(control)
    assert bare_coloured < 0.0003, \
        "the control page without marimo's frontend shows as much colour: this test cannot tell"
