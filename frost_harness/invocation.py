"""How frost's runners (``frost-report``, ``frost-fuzz``, ``frost-mutate``) start pytest on the suites.

The suites travel inside the package (``frost_harness/suites``), so a runner finds them from
the package itself, in a checkout or in site-packages alike, and works from any directory:

- pytest runs in the current directory (nothing runs or is written inside site-packages);
- its rootdir is ``ROOT``, the folder that holds ``frost_harness`` (the checkout, or
  site-packages), so test ids read ``frost_harness/suites/...`` wherever the package lies;
- its settings are ``frost_harness/suites/runner.ini`` (``-c``), never a configuration file
  found around the installed package or the current directory;
- its cache goes to ``./frost-out/pytest-cache`` (runners write under ``./frost-out`` only);
- when the arguments name no tests of their own, the runner's default tests run (the whole
  suites, or ``suites/fuzz``), given as absolute paths.

``missing_extra`` / ``require_extra``: the harness extra (pytest, pytest-xdist, Hypothesis,
pandas) is not a dependency of the kernels; a runner without it stops with one line that
says what to install instead of a traceback.
"""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

HARNESS = Path(__file__).resolve().parent
ROOT = HARNESS.parent
SUITES = HARNESS / "suites"
INI = "runner.ini"  # inside the suites folder

# module -> distribution of the harness extra (pyproject.toml's [project.optional-dependencies])
EXTRA = {"pytest": "pytest", "xdist": "pytest-xdist", "hypothesis": "hypothesis", "pandas": "pandas"}

# pytest options whose separate value may name an existing path without selecting tests
_PATH_VALUED = frozenset({"--deselect", "--ignore", "--ignore-glob", "--rootdir", "--basetemp", "--confcutdir",
                          "-c", "--config-file", "--junitxml", "--junit-xml", "--log-file"})  # fmt: skip


def missing_extra() -> list[str]:
    """The distributions of the harness extra whose modules cannot be imported."""
    return [dist for module, dist in EXTRA.items() if importlib.util.find_spec(module) is None]


def require_extra(prog: str) -> None:
    """Exit with one line naming the extra when it is not installed."""
    missing = missing_extra()
    if missing:
        raise SystemExit(f"{prog}: needs frost's harness extra ({', '.join(missing)} missing): "
                         "pip install 'frost[harness]'")  # fmt: skip


def check_suites(prog: str, root: Path = ROOT) -> None:
    """Exit with one line when the suites are not where the package says they are."""
    suites = root / "frost_harness" / "suites"
    if not (suites / "conftest.py").is_file() or not (suites / INI).is_file():
        raise SystemExit(f"{prog}: the test suites are missing from {suites} (an installation without "
                         "frost_harness/suites); reinstall frost, or run from a checkout")  # fmt: skip


def selects_tests(args: Sequence[str]) -> bool:
    """Whether pytest arguments name tests of their own: ``--pyargs``, or an argument that
    names an existing file or folder (before any ``::``; relative to the current directory,
    or absolute) and is not the value of a path-valued option such as ``--deselect``."""
    previous = ""
    for arg in args:
        if arg == "--pyargs":
            return True
        if not arg.startswith("-") and previous not in _PATH_VALUED and Path(arg.split("::")[0]).exists():
            return True
        previous = arg
    return False


def pytest_command(options: Sequence[str], args: Sequence[str], default_tests: Sequence[Path], *,
                   root: Path = ROOT, cache_dir: Path | None = None) -> list[str]:  # fmt: skip
    """``python -m pytest`` on the suites under ``root``: the runner's ``options``, the user's
    ``args``, then ``default_tests`` unless ``args`` name tests of their own (``options`` never
    do). ``cache_dir`` None: pytest's cache is off."""
    command = [sys.executable, "-m", "pytest", "-c", str(root / "frost_harness" / "suites" / INI),
               f"--rootdir={root}"]  # fmt: skip
    if cache_dir is None:
        command += ["-p", "no:cacheprovider"]
    elif "no:cacheprovider" not in args:  # else pytest would warn of an unknown setting
        command += ["-o", f"cache_dir={cache_dir}"]
    command += [*options, *args]
    if not selects_tests(args):
        command += [str(path) for path in default_tests]
    return command


def output_folder() -> Path:
    """Where runners write by default: ``frost-out`` in the current directory."""
    return Path.cwd() / "frost-out"
