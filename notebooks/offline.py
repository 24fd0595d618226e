"""Make exported notebook pages viewable without internet access.

``marimo export html`` writes a page that loads marimo's frontend from a CDN.  This writes, beside
each ``<name>.html`` in DIR, a ``<name>.offline.html`` that loads it from ``dist/`` — a link to the
frontend the installed ``marimo`` wheel ships — so that

    python notebooks/offline.py DIR && python -m http.server -d DIR -b 127.0.0.1 8000

serves them at http://127.0.0.1:8000/<name>.offline.html (a browser loads the page's ES modules
over HTTP, not from file://).  Not a notebook: a helper of ``make notebooks`` and the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import marimo

CDN = f"https://cdn.jsdelivr.net/npm/@marimo-team/frontend@{marimo.__version__}/dist/"


def offline(page: Path, local: str = "/dist/") -> Path:
    """Write ``<page>.offline.html`` loading the frontend from ``local``; link ``dist`` beside it."""
    html = page.read_text(encoding="utf-8")
    if CDN not in html:
        raise SystemExit(f"{page}: no {CDN} in it — not a page of this marimo version's export")
    dist = page.parent / "dist"
    if not dist.exists():
        dist.symlink_to(Path(marimo.__file__).parent / "_static")
    out = page.with_name(f"{page.stem}.offline.html")
    out.write_text(html.replace(CDN, local), encoding="utf-8")
    return out


if __name__ == "__main__":
    for directory in sys.argv[1:] or ["."]:
        for page in sorted(Path(directory).glob("*.html")):
            if not page.name.endswith(".offline.html"):
                print(offline(page))
