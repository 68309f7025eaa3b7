"""The page needs no network: every file it loads is served from the package, and the
vendored chart library is the file its README names, byte for byte."""

from __future__ import annotations

import hashlib
import re
from importlib.resources import files

STATIC = files("cmr.dashboard") / "static"


def test_chart_js_is_the_file_its_readme_names() -> None:
    readme = (STATIC / "vendor" / "README.md").read_text(encoding="utf-8")
    named = re.search(r"chart\.umd\.min\.js\s+([0-9a-f]{64})", readme)
    assert named is not None
    data = (STATIC / "vendor" / "chart.umd.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == named[1]
    assert data.startswith(b"/*!\n * Chart.js v4.6.1\n")
    assert "MIT License" in (STATIC / "vendor" / "chart.js-LICENSE.md").read_text()


def test_the_page_loads_nothing_from_elsewhere() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    loaded = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert loaded and all(u.startswith(("/static/", "#", "data:")) for u in loaded), loaded
    for name in ("index.html", "board.js", "board.css"):
        assert not re.search(r"https?://", (STATIC / name).read_text(encoding="utf-8")), name
