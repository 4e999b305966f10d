"""Where the frost under test comes from: a source checkout, or an installed distribution.

The suites travel with the wheel, so they run in both. A few tests are about the checkout
itself (its pyproject.toml, README, .ci/run, building the wheel); ``needs_checkout`` skips
them, with that reason, on an installed package, where there is nothing of the kind to check.
"""
from __future__ import annotations

import tomllib
from importlib import metadata

import pytest

from frost_harness.invocation import ROOT

PYPROJECT = ROOT / "pyproject.toml"
CHECKOUT = PYPROJECT.is_file() and (ROOT / "frost" / "__init__.py").is_file()

needs_checkout = pytest.mark.skipif(not CHECKOUT, reason=f"needs frost's source checkout (no pyproject.toml in {ROOT})")


def pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def console_scripts() -> dict[str, str]:
    """``name -> module:function`` of frost's console scripts: the checkout's pyproject.toml,
    else the installed distribution's entry points."""
    if CHECKOUT:
        return dict(pyproject()["project"]["scripts"])
    return {ep.name: ep.value for ep in metadata.distribution("frost").entry_points if ep.group == "console_scripts"}
