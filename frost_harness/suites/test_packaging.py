"""What a wheel of frost installs and declares, and what the checkout tells its users.

- the wheel holds exactly two top-level packages, ``frost`` and ``frost_harness`` (no generic
  names such as ``fuzz`` or ``reports``, no ``frost-out`` picked up as a namespace package),
  with ``py.typed``, the suites' runner settings and the licence;
- its metadata: the version is ``frost.__version__``, the licence BSD-3-Clause, and the
  requirements without an extra are the kernels' (torch, the CuTe DSL, apache-tvm-ffi); the
  harness's (pytest, xdist, Hypothesis, pandas) come with the ``harness`` extra only;
- the kernels run without any of the harness's packages importable;
- the public API is fully annotated;
- the README installs what the tests need, .ci/run runs what the README says, and every
  link of the README (and of docs/) stays inside the repository;
- every citation of a design decision (``docs/DECISIONS.md, "<heading>"``) names a heading
  that page has.
"""
from __future__ import annotations

import ast
import configparser
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import frost
from frost_harness.invocation import ROOT, SUITES
from frost_harness.suites.source import needs_checkout, pyproject

KERNEL_REQUIREMENTS = {"torch", "nvidia-cutlass-dsl", "apache-tvm-ffi"}
HARNESS_REQUIREMENTS = {"pytest", "pytest-xdist", "hypothesis", "pandas"}
HARNESS_MODULES = ("pytest", "xdist", "hypothesis", "pandas", "_pytest")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built offline from a copy of the checkout's sources, with junk beside them that
    a loose package pattern would pick up (a run folder, an egg-info)."""
    from setuptools import __version__ as setuptools_version

    assert int(setuptools_version.split(".")[0]) >= 77, (
        f"setuptools {setuptools_version}: the build backend needs >= 77 (pip install -e '.[harness]')")
    tree = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    for name in ("frost", "frost_harness"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (tree / "frost-out" / "L0-1").mkdir(parents=True)
    (tree / "frost-out" / "L0-1" / "stray.py").write_text("")
    (tree / "frost.egg-info").mkdir()
    dist = tree / "dist"
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(dist)!r}))"
    done = subprocess.run([sys.executable, "-c", build], cwd=tree, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return dist / done.stdout.strip().splitlines()[-1]


@pytest.mark.L0
@needs_checkout
def test_the_wheel_installs_frost_and_frost_harness_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"frost", "frost_harness"}
    for needed in ("frost/py.typed", "frost_harness/py.typed", "frost_harness/suites/conftest.py",
                   "frost_harness/suites/runner.ini", "frost_harness/suites/sm80/test_fwd_compile.py"):
        assert needed in names, needed
    assert any(re.fullmatch(r"frost-[^/]+\.dist-info/licenses/LICENSE", name) for name in names), names[-8:]


@pytest.mark.L0
@needs_checkout
def test_the_wheel_declares_version_licence_classifiers_and_the_kernels_requirements(wheel):
    archive = zipfile.ZipFile(wheel)
    meta_name = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(archive.read(meta_name).decode())
    assert meta["Version"] == frost.__version__
    assert meta["License-Expression"] == "BSD-3-Clause"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    requirements = meta.get_all("Requires-Dist")
    plain = {_requirement_name(r) for r in requirements if "extra ==" not in r}
    assert plain == KERNEL_REQUIREMENTS
    harness = {_requirement_name(r) for r in requirements if re.search(r"extra\s*==\s*['\"]harness['\"]", r)}
    assert HARNESS_REQUIREMENTS <= harness


def _imports(path: Path) -> set[str]:
    """Every module name an ``import`` / ``from ... import`` in the file names (absolute ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.L0
def test_the_kernels_import_nothing_of_the_harness():
    """frost may use the oracle (a dev check does) and nothing else of frost_harness; the oracle
    itself needs only torch; neither imports a package of the harness extra."""
    kernel_files = sorted((ROOT / "frost").rglob("*.py"))
    oracle_files = sorted((ROOT / "frost_harness" / "oracle").rglob("*.py"))
    assert kernel_files and oracle_files
    for path in kernel_files + oracle_files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in HARNESS_MODULES, f"{path.relative_to(ROOT)} imports {name}"
            if top == "frost_harness":
                assert name.startswith("frost_harness.oracle"), f"{path.relative_to(ROOT)} imports {name}"


@pytest.mark.L0
def test_the_kernels_run_without_the_harness_packages(tmp_path):
    """A fresh process where pytest, xdist, Hypothesis and pandas cannot be imported serves a call."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({HARNESS_MODULES!r}))\n"
            "import torch, frost\n"
            "q = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)\n"
            "o, lse = frost.sdpa_forward(q, q, q, causal=True, engine='unfused')\n"
            "assert o.shape == q.shape and frost.__version__\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _public_callables():
    for name in frost.__all__:
        thing = getattr(frost, name)
        if inspect.isfunction(thing):
            yield name, thing
        elif inspect.isclass(thing):
            for attr, member in vars(thing).items():
                if attr.startswith("_"):
                    continue
                member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                member = member.fget if isinstance(member, property) else member
                if inspect.isfunction(member):
                    yield f"{name}.{attr}", member


@pytest.mark.L0
def test_the_public_api_is_fully_annotated():
    checked = []
    for name, function in _public_callables():
        signature = inspect.signature(function, eval_str=True)  # the annotations also resolve
        bare = [p.name for p in signature.parameters.values()
                if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")]  # fmt: skip
        assert not bare, f"{name}: parameters without a type: {bare}"
        assert signature.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
        checked.append(name)
    assert {"sdpa_forward", "sdpa_backward", "attention", "route"} <= set(checked)


@pytest.mark.L0
@needs_checkout
def test_the_runners_settings_are_the_checkouts():
    """frost-report & co. read runner.ini (it travels with the wheel); plain pytest in a checkout
    reads pyproject.toml: they must not drift apart."""
    ini = configparser.ConfigParser()
    ini.read(SUITES / "runner.ini", encoding="utf-8")
    settings = pyproject()["tool"]["pytest"]["ini_options"]
    assert ini["pytest"]["addopts"].split() == settings["addopts"].split()
    assert settings["testpaths"] == ["frost_harness/suites"]
    assert set(ini["pytest"]) == {"addopts"}, "a setting only the runners have"
    assert set(settings) == {"addopts", "testpaths"}, "a setting the runners lack (markers go in conftest.py)"


def _readme_command(comment: str) -> list[str]:
    """The steps of the README's one-line command that follows ``# <comment>``."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    line = lines[lines.index(f"# {comment}") + 1]
    return [step.strip() for step in line.split("&&")]


@pytest.mark.L0
@needs_checkout
def test_ci_runs_the_readme_test_command():
    steps = _readme_command("the tests")
    main_job = _readme_command("the main job: install, run level L0, write the report to frost-out/")
    # both run level L0 on an xdist worker per core (a 10-minute gate on 2 cores, install included)
    assert shlex.split(steps[-1])[:3] == ["pytest", "-m", "L0"] and shlex.split(main_job[-1])[:3] == [
        "frost-report", "--level", "L0"]
    assert all(" -n auto" in command[-1] for command in (steps, main_job)), (steps[-1], main_job[-1])
    install = [s for s in steps if s.startswith("pip install")]
    assert any("[harness]" in s for s in install), f"the tests need the harness extra: {install}"
    ci = [re.sub(r"\s+#.*$", "", line).strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    for step in install:
        assert step in ci, f".ci/run does not run the README's {step!r}"
    runs = [line.split("||")[0].strip() for line in ci if line.startswith("pytest")]
    assert runs == [steps[-1]], f".ci/run runs {runs}, the README {steps[-1]!r}"
    assert any("[harness]" in s for s in main_job)


@pytest.mark.L0
@needs_checkout
def test_readme_links_stay_inside_the_repository():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for document in documents:
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor
            path = (document.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{document.name} links {target}: not in the repository"
        # prose that points outside the checkout (a sibling shared/ folder) instead of linking
        assert "../shared/design" not in text, f"{document.name} refers to ../shared/design"


_CITATION = re.compile(r'docs/DECISIONS\.md,\s*(?:#\s*)?"([^"]+)"')


@pytest.mark.L0
@needs_checkout
def test_decision_citations_name_existing_headings():
    """A docstring or comment cites a decision as ``docs/DECISIONS.md, "<heading>"`` (the
    heading may wrap over comment or docstring lines); the heading must be one of the page's."""
    headings = set(re.findall(r"^### (.+)$", (ROOT / "docs" / "DECISIONS.md").read_text(encoding="utf-8"), re.M))
    sources = [*sorted(ROOT.glob("frost*/**/*.py")), *sorted(ROOT.glob("benchmarks/*.py")),
               *sorted(ROOT.glob("docs/*.md")), ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md"]
    cited = 0
    for path in sources:
        for found in _CITATION.finditer(path.read_text(encoding="utf-8")):
            heading = " ".join(re.sub(r"\n\s*#?", " ", found.group(1)).split())
            if heading == "<heading>":  # the form itself, as this docstring and the page state it
                continue
            assert heading in headings, f"{path.relative_to(ROOT)} cites {heading!r}: not a heading of docs/DECISIONS.md"
            cited += 1
    assert cited, "no citation found: the pattern no longer matches how the tree cites decisions"


@pytest.mark.L0
@needs_checkout
def test_the_version_is_written_once():
    assert "version" in pyproject()["project"]["dynamic"]
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "frost.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", frost.__version__)
    assert os.path.isfile(ROOT / "LICENSE") and "BSD" in (ROOT / "LICENSE").read_text(encoding="utf-8")
