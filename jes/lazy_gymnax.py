"""Import gymnax without paying for its plotting imports until something plots.

``import gymnax`` imports every gymnax env module, and a few of them import
``matplotlib.pyplot`` and ``seaborn`` (which pulls in scipy.stats and pandas) at
module level for their ``render`` methods: 4-5 s of a 2-vCPU machine's start-up,
most of a short run's wall time. :func:`import_gymnax` imports gymnax while a
finder hands out *lazy* modules for those plotting packages: a lazy module is a
real module object in ``sys.modules`` whose code runs on the first attribute
access (``plt.subplots``), so rendering, gymnax's visualizer and the user's own
``import matplotlib.pyplot`` keep working. The finder is installed only for the
duration of jes's own ``import gymnax``; anything imported before or afterwards
is untouched, and a plotting package already imported is never made lazy.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any

# The modules gymnax's env files import at module level only to render (gymnax 0.0.x-1.x).
LAZY_MODULES = frozenset({"matplotlib", "matplotlib.pyplot", "matplotlib.colors", "seaborn"})

_lock = threading.RLock()


class _LazyModule(types.ModuleType):
    """A module whose code has not run yet; the first missing attribute runs it."""

    def __getattr__(self, attr: str) -> Any:
        name = self.__spec__.name
        submodule = f"{name}.{attr}"
        if submodule in LAZY_MODULES and not attr.startswith("__"):
            # `from matplotlib import colors` must not run matplotlib just to find a lazy submodule.
            return importlib.import_module(submodule)
        _load(self)
        return getattr(self, attr)


class _LazyLoader(importlib.abc.Loader):
    """Creates the module as the real loader would, and defers running its code."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__class__ = _LazyModule


def _load(module: types.ModuleType) -> None:
    """Run a lazy module's code (once), turning it into an ordinary module."""
    with _lock:
        parent = sys.modules.get(module.__spec__.name.rpartition(".")[0])
        if type(parent) is _LazyModule:
            # An ordinary import runs the package before its submodule; so must we (matplotlib.colors
            # needs a finished matplotlib, and running matplotlib may itself finish this module).
            _load(parent)
        if type(module) is not _LazyModule:
            return
        spec = module.__spec__
        loader = spec.loader.loader
        # Back to a plain module first: names the module's own code looks up mid-import must
        # behave as in an ordinary import (AttributeError, then the import system's fallback).
        module.__class__ = types.ModuleType
        spec.loader = loader
        module.__loader__ = loader
        try:
            loader.exec_module(module)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`LAZY_MODULES` with the other finders and wraps their loaders in :class:`_LazyLoader`."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in LAZY_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None
                spec.loader = _LazyLoader(spec.loader)
                return spec
        return None


def import_gymnax() -> types.ModuleType:
    """``import gymnax``, with its plotting imports made lazy; returns the gymnax module."""
    if "gymnax" in sys.modules:
        return sys.modules["gymnax"]
    with _lock:
        finder = _LazyFinder()
        sys.meta_path.insert(0, finder)
        try:
            return importlib.import_module("gymnax")
        finally:
            sys.meta_path.remove(finder)
