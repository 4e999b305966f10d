"""Compiled kernels on disk, so a fresh process loads an artifact instead of JIT-compiling it.

An entry is the object file the CuTe DSL exports from a compiled TVM-FFI function
(``JitCompiledFunction.export_to_c``), behind a short header that names its key and the
payload's SHA-256. Loading it back (``cutlass.cute.runtime.load_module(...,
enable_tvm_ffi=True)``) links the object in memory and returns a ``tvm_ffi.Function``
that takes the same positional torch tensors and Python scalars as the in-memory one.

The key is everything that changes the bytes: the DSL version, the target architecture
the artifact was built for, the template name, the params record (its repr), a digest
of the sources the artifact is built from (the template, every frost/kernels module it
imports, transitively, and the builders: compile.py, config.py, template.py), so an edit
invalidates every entry built from the old text and no other, and the DSL's own
compile-affecting settings (CUTE_DSL_DEBUG, _LINEINFO, _ENABLE_ASSERTIONS, ...). The host CPU
architecture is in it too: the object's host side is native code for the machine that
built it.

Location: ``$FROST_CACHE_DIR`` when set (set but empty: disabled), else
``$XDG_CACHE_HOME/frost`` or ``~/.cache/frost``; ``FROST_DISK_CACHE=0`` disables it.
Writers put a temporary file beside the entry and ``os.replace`` it into place, so
concurrent writers (xdist workers, several processes) never leave a torn entry; a
missing, corrupt, mismatched or unloadable entry is a miss (the caller recompiles and
rewrites it), never an error.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Hashable

_log = logging.getLogger(__name__)
_MAGIC = b"frost-kernel-cache 1\n"
_KERNELS = Path(__file__).resolve().parent


def cache_dir() -> Path | None:
    """The cache directory, or None when the disk cache is disabled."""
    if os.environ.get("FROST_DISK_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    explicit = os.environ.get("FROST_CACHE_DIR")
    if explicit is not None:
        return Path(explicit).expanduser() if explicit.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "frost"


def dsl_version() -> str:
    import cutlass

    return str(cutlass.__version__)


# not keyed from the DSL's list: the target arch is keyed on its own (the DSL's is the
# process default, not what --gpu-arch asked for), and library paths differ between
# machines that share one cache while the libraries themselves follow the DSL version
_UNKEYED_SETTINGS = ("arch", "shared_libs")


def dsl_settings() -> str:
    """The DSL's settings that change generated code (its own JIT cache key), as one string."""
    try:
        from cutlass.cutlass_dsl import CuTeDSL

        envar = CuTeDSL._get_dsl().envar
        keyed = sorted(e.key_name for e in envar._ENV_VAR_SPEC if e.affects_compile)
        return ";".join(f"{k}={getattr(envar, k)!r}" for k in keyed if k not in _UNKEYED_SETTINGS)
    except Exception:  # a DSL without this introspection: its version still keys the entry
        return ""


# what builds every artifact, whatever the template: the fake arguments and options
# (compile.py), the records' derived facts (config.py), the template loader
_BUILDERS = ("sm80/compile.py", "sm80/config.py", "template.py")


def _kernel_imports(path: Path) -> set[Path]:
    """The modules of frost/kernels that ``path`` imports (``from frost.kernels.sm80 import x``,
    ``from frost.kernels.sm80.x import ...``, ``import frost.kernels.x``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("frost.kernels"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("frost.kernels"))
    found = (_KERNELS / (name.removeprefix("frost.kernels.").replace(".", "/") + ".py") for name in names)
    return {f for f in found if f.is_file()}


@functools.lru_cache(maxsize=None)
def sources_digest(template: str) -> str:
    """SHA-256 over the sources an artifact of ``template`` (e.g. ``"sm80/fwd"``) is built from:
    the template, every kernels module it imports (transitively), and the builders (relative
    path and bytes of each, in a fixed order). A change elsewhere (another template, the
    sanitizer grid, the params space) leaves its entries valid."""
    seen, todo = set(), [_KERNELS / f"{template}.py", *(_KERNELS / b for b in _BUILDERS)]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(_kernel_imports(path) - seen)
    digest = hashlib.sha256()
    for path in sorted(seen):
        digest.update(path.relative_to(_KERNELS).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def entry_key(template: str, params: Hashable, arch: str) -> dict[str, str]:
    return {
        "dsl": dsl_version(), "arch": arch, "host": platform.machine(), "template": template,
        "params": repr(params), "sources": sources_digest(template), "settings": dsl_settings(),
    }


def _key_hash(key: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def entry_path(root: Path, key: dict[str, str]) -> Path:
    """One file per key; version and arch are folders so a stale generation is easy to delete."""
    name = f"{key['template'].replace('/', '-')}-{_key_hash(key)[:32]}.bin"
    return root / f"cutedsl-{key['dsl']}" / key["arch"] / name


def _function_name(key: dict[str, str]) -> str:
    # unique per entry: every loaded object is linked into the same process, and a
    # distinct exported symbol keeps two entries from ever resolving to each other
    return "frost_" + _key_hash(key)[:24]


def dumps_requested() -> bool:
    """Whether the DSL was asked to keep what compiling produces (CUTE_DSL_KEEP=ptx, ...): only a
    real compile writes those, so the disk cache is not read then (it is still written)."""
    try:
        from cutlass.cutlass_dsl import CuTeDSL

        envar = CuTeDSL._get_dsl().envar
        return bool(envar.keep_tokens) or bool(envar.print_ir)
    except Exception:
        return False


def load(path: Path, key: dict[str, str]) -> Any | None:
    """The artifact stored at ``path`` for ``key``, or None (absent, corrupt, another key, unloadable,
    or compile dumps requested)."""
    if dumps_requested():
        return None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        _log.warning("frost disk cache: cannot read %s (%s); recompiling", path, error)
        return None
    payload, function = _unpack(data, key)
    if payload is None:
        _log.warning("frost disk cache: %s is corrupt or belongs to another key; recompiling", path)
        return None
    try:
        return _load_object(payload, function)
    except Exception as error:  # a foreign or damaged object: recompiling is always possible
        _log.warning("frost disk cache: cannot load %s (%s); recompiling", path, error)
        return None


def payload(path: Path, key: dict[str, str]) -> bytes | None:
    """The object file of an intact entry for ``key`` (None when missing or damaged)."""
    try:
        return _unpack(path.read_bytes(), key)[0]
    except OSError:
        return None


def present(path: Path, key: dict[str, str]) -> bool:
    """Whether ``path`` holds an intact entry for ``key`` (header and checksum; not linked)."""
    try:
        return _unpack(path.read_bytes(), key)[0] is not None
    except OSError:
        return False


def _unpack(data: bytes, key: dict[str, str]) -> tuple[bytes | None, str]:
    if not data.startswith(_MAGIC):
        return None, ""
    end = data.find(b"\n", len(_MAGIC))
    if end < 0:
        return None, ""
    try:
        header = json.loads(data[len(_MAGIC):end])
    except (ValueError, UnicodeDecodeError):
        return None, ""
    payload = data[end + 1:]
    intact = (
        isinstance(header, dict) and header.get("key") == key
        and header.get("size") == len(payload) and header.get("sha256") == hashlib.sha256(payload).hexdigest()
    )
    return (payload, str(header.get("function"))) if intact else (None, "")


def _load_object(payload: bytes, function: str) -> Any:
    from cutlass.cute.runtime import load_module

    # load_module reads an object file by path (it keeps the bytes, so the file can go at once)
    with tempfile.TemporaryDirectory(prefix="frost-load-") as scratch:
        obj = Path(scratch) / "kernel.o"
        obj.write_bytes(payload)
        return load_module(str(obj), enable_tvm_ffi=True)[function]


def store(path: Path, key: dict[str, str], artifact: Any) -> bool:
    """Export ``artifact`` to ``path`` atomically; False (and a warning) when it could not."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; an entry is no secret, and a cache may be shared
        function = _function_name(key)
        artifact.export_to_c(tmp, function_name=function)
        payload = Path(tmp).read_bytes()
        header = {"key": key, "function": function, "size": len(payload),
                  "sha256": hashlib.sha256(payload).hexdigest()}
        with open(tmp, "wb") as out:
            out.write(_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload)
        os.replace(tmp, path)  # atomic: a reader sees the old entry or the new one, never a part
        tmp = None
        return True
    except Exception as error:  # a full disk or a read-only cache must not fail the call
        _log.warning("frost disk cache: cannot write %s (%s)", path, error)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
