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
``cute.sym_int`` extents, so they never enter a key.
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
    compiles: int
    hits: int
    entries: int


class CompileCache:
    """Compiled artifacts by compile key, with counters tests can read."""

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[Hashable, Any] = {}
        self._lock = threading.RLock()
        self.compiles = 0
        self.hits = 0

    def get_or_compile(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            artifact = self._entries.get(key)
            if artifact is not None:
                self.hits += 1
                return artifact
            artifact = build()
            self._entries[key] = artifact
            self.compiles += 1
            return artifact

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.compiles, self.hits, len(self._entries))

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.compiles = 0
            self.hits = 0


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
