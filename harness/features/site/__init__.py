"""The results site: ``make site`` -> a folder of static HTML pages built from the records alone.

The matrix of FEATURES.md with filters and a search box, one page per record (verdicts, controls,
timings, device, the plots beside it, the command that reproduces it, the trend of every cell it
stands in), what changed between two SHAs, the first bad commit or release of every failing cell a
bisect record explains, the KV round trip per vLLM release, and the sampling and API tables. It
opens from ``file://``: no server, no CDN, nothing fetched; the data a page's script needs is
embedded in the page. It lives beside the page generators because it renders the same cells
(:class:`~harness.features.cells.Judge`): a cell reads the same here and in FEATURES.md.

Templates: Jinja2 (``templates/``); trends: inline SVG drawn in Python (:mod:`.svg`); the filters:
one small script (``static/site.js``), no library.
"""

from __future__ import annotations

from harness.features.site.build import SITE_DIR, Built, build_site

__all__ = ["SITE_DIR", "Built", "build_site"]
