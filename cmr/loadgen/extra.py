"""The ``loadgen`` extra: what the load generator needs beyond cmr itself (pyproject.toml's
``[project.optional-dependencies] loadgen``), which a word count neither imports nor installs.

``cmr loadgen`` asks ``missing`` before a test starts, so that without the extra it ends on
one line saying what to install; a worker without it that is handed a load task fails to
import ``cmr.loadgen.recorder`` with the same advice (``INSTALL``) in its error.
"""

from __future__ import annotations

import importlib.util

__all__ = ["INSTALL", "missing"]

INSTALL = "pip install 'cmr[loadgen]' (in a checkout: scripts/setup.sh loadgen)"
# The extra's modules, and the distribution that installs each
DISTRIBUTIONS = {"hdrh": "hdrhistogram", "matplotlib": "matplotlib"}


def missing(what: str, *modules: str) -> str | None:
    """One line saying that ``what`` needs the modules of the extra that are not installed,
    and how to install them; None when all of ``modules`` are."""
    absent = [DISTRIBUTIONS[m] for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (
        f"{what} needs the loadgen extra ({' and '.join(absent)} "
        f"{'is' if len(absent) == 1 else 'are'} not installed): {INSTALL}"
    )
