"""Kernel templates: one specialized module per params record, and the compile cache.

A *template* is a Python file (``frost/kernels/sm80/fwd.py`` and friends) whose
compile-time configuration is a module global ``PARAMS``: a frozen, hashable
TemplateParams record. The template reads every field of it through
``cutlass.const_expr`` so that a feature that is off generates no code.

``load_template`` executes the file as a fresh module per params record and
caches it for the process. Running one module per specialization (rather than
one class with attributes) keeps the traced functions of two specializations
distinct objects, so nothing one specialization sets can leak into another,
and a reader of the template sees plain functions instead of a parameter bag.

``CompileCache`` maps a compile key (template name, params, and any other
static facts of the call) to the object ``cute.compile`` returned, and counts
compiles and hits so tests can assert reuse. Token totals of packed input are
``cute.sym_int`` extents, so they never enter a key. A miss first asks the disk
cache (``frost/kernels/disk_cache.py``) when the caller says how the artifact is
persisted: ``compiles`` counts real JIT compiles only, ``loads`` the artifacts read
from disk.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Hashable

from frost.kernels import disk_cache

_TEMPLATE_DIR = Path(__file__).resolve().parent
_modules: dict[tuple[str, Hashable], ModuleType] = {}
_lock = threading.RLock()


def template_path(name: str) -> Path:
    """``"sm80/fwd"`` -> the template file under frost/kernels/."""
    path = _TEMPLATE_DIR / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel template {name!r} at {path}")
    return path


def load_template(name: str, params: Hashable) -> ModuleType:
    """The template ``name`` specialized for ``params``: one module per pair, cached."""
    if not dataclasses.is_dataclass(params):
        raise TypeError(f"template params must be a dataclass record, got {type(params).__name__}")
    key = (name, params)
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        path = template_path(name)
        digest = hashlib.sha1(repr(params).encode()).hexdigest()[:12]
        module_name = f"frost.kernels._specialized.{name.replace('/', '_')}_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        module.PARAMS = params  # read by the template at import time
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
        return module


@dataclasses.dataclass(frozen=True)
class CacheStats:
    compiles: int  # JIT compiles (cute.compile)
    hits: int      # served from this process's memory
    entries: int
    loads: int = 0  # read back from the disk cache instead of compiling


class CompileCache:
    """Compiled artifacts by compile key, with counters tests can read."""

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[Hashable, Any] = {}
        self._lock = threading.RLock()
        self.compiles = 0
        self.hits = 0
        self.loads = 0

    def get_or_compile(self, key: Hashable, build: Callable[[], Any],
                       persist: tuple[str, Hashable, str] | None = None) -> Any:
        """The artifact for ``key``: from memory, else from disk, else ``build()``.

        ``persist`` is ``(template, params, arch)``: where the artifact lives in the disk
        cache (None: memory only). A fresh build is written back there.
        """
        with self._lock:
            artifact = self._entries.get(key)
            if artifact is not None:
                self.hits += 1
                return artifact
            root = disk_cache.cache_dir() if persist is not None else None
            disk_key = path = None
            if root is not None:
                disk_key = disk_cache.entry_key(*persist)
                path = disk_cache.entry_path(root, disk_key)
                artifact = disk_cache.load(path, disk_key)
            if artifact is not None:
                self.loads += 1
            else:
                artifact = build()
                self.compiles += 1
                if path is not None:
                    disk_cache.store(path, disk_key, artifact)
            self._entries[key] = artifact
            return artifact

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.compiles, self.hits, len(self._entries), self.loads)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.compiles = 0
            self.hits = 0
            self.loads = 0


_caches: dict[str, CompileCache] = {}


def compile_cache(name: str) -> CompileCache:
    """The process-wide cache called ``name`` (one per kernel family)."""
    with _lock:
        cache = _caches.get(name)
        if cache is None:
            cache = _caches[name] = CompileCache(name)
        return cache


def all_cache_stats() -> dict[str, CacheStats]:
    with _lock:
        return {name: cache.stats() for name, cache in _caches.items()}
