"""CPU: the compile cache on disk (frost/kernels/disk_cache.py) and ``frost-compile``.

A record compiled in one process is loaded, not compiled, by a fresh one, and quickly; the
loaded artifact checks its arguments exactly like the in-memory one; any change of the key
(template sources, DSL version) misses; a corrupt entry is recompiled and rewritten; two
processes writing one key leave one valid entry; ``frost-compile`` fills a cache a fresh
process then uses without compiling. The small ``sm80/bwd_pre`` / ``sm80/bwd_convert``
kernels (well under a second to compile) stand in wherever the kind does not matter.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import cutlass  # noqa: E402,F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

from frost.kernels import disk_cache  # noqa: E402
from frost.kernels.sm80 import compile as sm80_compile  # noqa: E402
from frost.kernels.sm80.config import BwdConvertParams, BwdParams, BwdPreParams, FwdParams  # noqa: E402
from frost.kernels.sm80 import covering  # noqa: E402
from frost.kernels.template import CompileCache  # noqa: E402
from frost_harness.suites import source  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
L0 = covering.l0("fwd") + covering.l0("bwd")
FWD = next(p for p in L0 if isinstance(p, FwdParams))
PRE = next(p for p in L0 if isinstance(p, BwdPreParams))
CONVERT = next(p for p in L0 if isinstance(p, BwdConvertParams))


def _env(cache_dir: Path) -> dict[str, str]:
    # the checkout first, then whatever made the DSL importable here (the GPU kit puts it on PYTHONPATH)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, FROST_CACHE_DIR=str(cache_dir), CUTE_DSL_ARCH="sm_80", PYTHONPATH=path)
    env.pop("FROST_DISK_CACHE", None)
    return env


# Run in a fresh interpreter: get_or_compile each record (timed), call each artifact with its
# full arity of CPU tensors (it must refuse them, naming its signature, the same way whichever
# way it was obtained), print the counters.
_CHILD = textwrap.dedent("""
    import json, sys, time, torch
    from frost.kernels.sm80 import compile as c
    from frost.kernels.sm80.config import *
    out = {"seconds": [], "errors": []}
    q = torch.zeros(1, 64, 2, 64, dtype=torch.float16)
    arity = {FwdParams: 15, BwdPreParams: 11}
    for text in sys.argv[1:]:
        params = eval(text)
        start = time.perf_counter()
        artifact = c.compile_record(params)
        out["seconds"].append(time.perf_counter() - start)
        try:
            artifact(*[q] * arity[type(params)])
            out["errors"].append(None)
        except Exception as error:
            out["errors"].append(f"{type(error).__name__}: {error}")
    caches = (c.FWD_CACHE, c.BWD_CACHE)
    out["compiles"] = sum(x.compiles for x in caches)
    out["loads"] = sum(x.loads for x in caches)
    print("RESULT " + json.dumps(out))
""")


def _child(cache_dir: Path, *records, wait: bool = True):
    cmd = [sys.executable, "-c", _CHILD, *(repr(r) for r in records)]
    proc = subprocess.Popen(cmd, env=_env(cache_dir), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return _result(proc) if wait else proc


def _result(proc) -> dict:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.L0
def test_a_fresh_process_loads_what_another_compiled(tmp_path):
    first = _child(tmp_path, FWD, PRE)
    assert (first["compiles"], first["loads"]) == (2, 0)
    second = _child(tmp_path, FWD, PRE)
    assert (second["compiles"], second["loads"]) == (0, 2), second
    assert second["seconds"][0] < 1.0, f"loading the forward took {second['seconds'][0]:.2f} s"
    # the loaded functions check their arguments exactly as the compiled ones did (same
    # signature, arity, dtypes), and the two entries loaded into one process stay distinct
    assert second["errors"] == first["errors"]
    assert all(e and "expected device_type=cuda" in e for e in second["errors"]), second["errors"]
    assert "sdpa_fwd(" in second["errors"][0] and "sdpa_bwd_pre(" in second["errors"][1]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One real bwd_convert artifact (compiled without touching any cache) written to a fresh dir."""
    root = tmp_path_factory.mktemp("disk-cache")
    template, _, builder = sm80_compile._KINDS[BwdConvertParams]
    arch, options = sm80_compile._target(CONVERT, "sm_80")
    artifact = builder(CONVERT, options)
    key = disk_cache.entry_key(template, CONVERT, arch)
    path = disk_cache.entry_path(root, key)
    assert disk_cache.store(path, key, artifact)
    return root, key, path, artifact


def _get(cache: CompileCache, artifact=None):
    """get_or_compile CONVERT for sm_80 through ``cache``; the build hands back ``artifact``."""
    return cache.get_or_compile(("k", CONVERT), lambda: artifact or object(),
                                persist=("sm80/bwd_convert", CONVERT, "sm_80"))


@pytest.mark.L0
def test_the_key_names_sources_and_dsl_version(stored, monkeypatch):
    root, key, path, _ = stored
    assert "debug=False" in key["settings"] and "shared_libs" not in key["settings"], key
    monkeypatch.setenv("FROST_CACHE_DIR", str(root))
    cache = CompileCache("t")
    _get(cache)
    assert (cache.compiles, cache.loads) == (0, 1)
    for name, value in (("sources_digest", "0" * 64), ("dsl_version", "4.8.1.post9"),
                        ("dsl_settings", disk_cache.dsl_settings().replace("debug=False", "debug=True"))):
        with monkeypatch.context() as m:
            m.setattr(disk_cache, name, lambda *args, value=value: value)
            cache = CompileCache("t")
            _get(cache)
            assert (cache.compiles, cache.loads) == (1, 0), name
    # asking the DSL to keep PTX / cubin / IR needs a real compile
    monkeypatch.setattr(disk_cache, "dumps_requested", lambda: True)
    cache = CompileCache("t")
    _get(cache)
    assert (cache.compiles, cache.loads) == (1, 0)
    monkeypatch.undo()
    monkeypatch.setenv("FROST_CACHE_DIR", str(root))
    # an entry whose header names another key is refused even at the right path
    other = dict(key, sources="0" * 64)
    moved = disk_cache.entry_path(root, other)
    moved.parent.mkdir(parents=True, exist_ok=True)
    moved.write_bytes(path.read_bytes())
    assert disk_cache.load(moved, other) is None and disk_cache.load(path, key) is not None


@pytest.mark.L0
@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "garbage", "empty"])
def test_a_corrupt_entry_is_recompiled_and_rewritten(stored, tmp_path, monkeypatch, damage):
    _, key, path, artifact = stored
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    target = disk_cache.entry_path(tmp_path, key)
    target.parent.mkdir(parents=True)
    data = bytearray(path.read_bytes())
    if damage == "flip a payload byte":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(os.urandom(4096))
    else:
        data = bytearray()
    target.write_bytes(bytes(data))
    cache = CompileCache("t")
    assert _get(cache, artifact) is artifact
    assert (cache.compiles, cache.loads) == (1, 0)
    assert target.read_bytes() == path.read_bytes(), "the recompiled artifact was not written back"
    assert disk_cache.load(target, key) is not None


@pytest.mark.L0
def test_disabled_or_unwritable_cache_is_never_fatal(stored, tmp_path, monkeypatch):
    _, _, _, artifact = stored
    for env in ({"FROST_DISK_CACHE": "0", "FROST_CACHE_DIR": str(tmp_path)}, {"FROST_CACHE_DIR": ""}):
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            assert disk_cache.cache_dir() is None
            cache = CompileCache("t")
            _get(cache, artifact)
            assert (cache.compiles, cache.loads) == (1, 0)
    assert not any(tmp_path.iterdir()), "a disabled cache wrote files"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FROST_CACHE_DIR", str(blocker))
    cache = CompileCache("t")
    assert _get(cache, artifact) is artifact and cache.compiles == 1


@pytest.mark.L0
def test_cache_dir_defaults(monkeypatch, tmp_path):
    for name in ("FROST_CACHE_DIR", "FROST_DISK_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert disk_cache.cache_dir() == tmp_path / ".cache" / "frost"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.cache_dir() == tmp_path / "xdg" / "frost"
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path / "mine"))
    assert disk_cache.cache_dir() == tmp_path / "mine"


# Two writers of one key: each compiles in memory, waits for the other, then stores the same
# entry many times over while the other does too, reading it back between its writes: a
# reader must see the entry whole or not at all, never half written.
_WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from frost.kernels import disk_cache
    from frost.kernels.sm80 import compile as c
    from frost.kernels.sm80.config import *
    params = eval(sys.argv[1]); ready, other = Path(sys.argv[2]), Path(sys.argv[3])
    template, _, builder = c._KINDS[type(params)]
    arch, options = c._target(params, "sm_80")
    artifact = builder(params, options)
    key = disk_cache.entry_key(template, params, arch)
    path = disk_cache.entry_path(disk_cache.cache_dir(), key)
    ready.touch()
    deadline = time.time() + 120
    while not other.exists() and time.time() < deadline:
        time.sleep(0.01)
    torn = 0
    for _ in range(30):
        assert disk_cache.store(path, key, artifact)
        torn += path.exists() and not disk_cache.present(path, key)
    assert torn == 0, f"{torn} torn reads"
    print("STORED", path)
""")


@pytest.mark.L0
def test_two_processes_writing_one_key_leave_one_valid_entry(tmp_path):
    cache_dir = tmp_path / "cache"
    flags = [tmp_path / "a", tmp_path / "b"]
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, repr(CONVERT), str(mine), str(other)], env=_env(cache_dir),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for mine, other in (flags, flags[::-1])
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    files = [p for p in cache_dir.rglob("*") if p.is_file()]
    assert len(files) == 1, files  # no temporary file left behind
    key = disk_cache.entry_key("sm80/bwd_convert", CONVERT, "sm_80")
    assert files[0] == disk_cache.entry_path(cache_dir, key)
    assert disk_cache.load(files[0], key) is not None


@pytest.mark.L0
def test_frost_compile_fills_a_cache_a_fresh_process_uses(tmp_path):
    cache_dir = tmp_path / "prebuilt"
    arch = sm80_compile.target_arch()  # the fresh process's own target (the GPU's, on a GPU machine)
    # the forward's records: only its family is listed (the backward's space takes a minute)
    cmd = [sys.executable, "-m", "frost.kernels.prebuild", "--records", "L0", "--arch", arch, "-j", "2",
           "--cache-dir", str(cache_dir), "--template", "sm80/fwd", "--limit", "2"]
    env = _env(tmp_path / "elsewhere")  # --cache-dir wins over the environment
    run = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 compiled, 0 already present, 0 skipped" in run.stdout, run.stdout
    again = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "0 compiled, 2 already present" in again.stdout, again.stdout
    assert not (tmp_path / "elsewhere").exists()
    result = _child(cache_dir, covering.l0("fwd")[1])
    assert (result["compiles"], result["loads"]) == (0, 1), result


@pytest.mark.L0
def test_build_records_fills_the_cache_for_this_process(tmp_path, monkeypatch):
    """What a benchmark does before timing: records (repeats allowed) built by workers are then
    loads in this process, for its own target."""
    from frost.kernels.prebuild import build_records

    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FROST_DISK_CACHE", raising=False)
    pres = [p for p in L0 if isinstance(p, BwdPreParams)][2:4]
    assert build_records([*pres, pres[0]], jobs=2) == {"compiled": 2, "present": 0, "failed": 0}
    assert build_records(pres, jobs=2) == {"compiled": 0, "present": 2, "failed": 0}
    for params in pres:
        key = disk_cache.entry_key("sm80/bwd_pre", params, sm80_compile.target_arch(params))
        assert disk_cache.present(disk_cache.entry_path(tmp_path, key), key)


@pytest.mark.L0
def test_frost_compile_skips_records_newer_than_the_arch():
    from frost.kernels.prebuild import plan

    wide = next(p for p in L0 if isinstance(p, BwdParams) and p.target_arch == "sm_90")
    tasks, skipped = plan([FWD, wide], ["sm_80", "sm_90"])
    assert tasks == [(FWD, "sm_80"), (FWD, "sm_90"), (wide, "sm_90")] and skipped == 1
    with pytest.raises(ValueError, match="needs sm_90"):
        sm80_compile.compile_record(wide, "sm_80")


@pytest.mark.L0
def test_frost_compile_is_a_console_script():
    module, _, function = source.console_scripts()["frost-compile"].partition(":")
    assert module == "frost.kernels.prebuild" and callable(getattr(__import__(module, fromlist=["x"]), function))


@pytest.mark.L0
def test_the_in_memory_key_names_the_arch(monkeypatch):
    """A process that builds one record for two arches (frost-compile's workers) gets two artifacts."""
    if torch.cuda.is_available():
        pytest.skip("the GPU's own arch is the target there")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80")
    assert sm80_compile.target_arch(CONVERT) == "sm_80"
    a = sm80_compile.compile_record(CONVERT, "sm_80")
    b = sm80_compile.compile_record(CONVERT, "sm_90")
    assert a is not b
    assert ("sm80/bwd_convert", CONVERT, "sm_90") in sm80_compile.BWD_CACHE.keys()


@pytest.mark.L0
def test_a_source_change_invalidates_exactly_the_templates_built_from_it(tmp_path, monkeypatch):
    """An entry's sources digest covers its template, the kernels modules it imports and the
    builders: editing one template leaves the others' entries valid, editing a shared module or
    a builder invalidates every template that uses it."""
    kernels = tmp_path / "kernels"
    shutil.copytree(disk_cache._KERNELS, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(disk_cache, "_KERNELS", kernels)
    templates = ("sm80/fwd", "sm80/bwd", "sm80/bwd_combine", "sm80/rope")

    def digests():
        disk_cache.sources_digest.cache_clear()
        return {t: disk_cache.sources_digest(t) for t in templates}

    def edit(relative):
        path = kernels / relative
        path.write_text(path.read_text() + "\n# edited\n")

    before = digests()
    edit("sm80/bwd_combine.py")
    after = digests()
    assert [t for t in templates if after[t] != before[t]] == ["sm80/bwd_combine"]
    edit("sm80/mask.py")  # the forward and the backward use it, the others do not
    again = digests()
    assert [t for t in templates if again[t] != after[t]] == ["sm80/fwd", "sm80/bwd"]
    edit("sm80/compile.py")  # a builder: every template
    assert all(value != again[t] for t, value in digests().items())
    disk_cache.sources_digest.cache_clear()
