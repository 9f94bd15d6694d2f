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
import os
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
    """``import gymnax``, with its plotting imports made lazy (and MNIST read from a folder of the user's own:
    :func:`keep_mnist_private`); returns the gymnax module."""
    if "gymnax" in sys.modules:
        keep_mnist_private()
        return sys.modules["gymnax"]
    with _lock:
        finder = _LazyFinder()
        sys.meta_path.insert(0, finder)
        try:
            gymnax = importlib.import_module("gymnax")
        finally:
            sys.meta_path.remove(finder)
    keep_mnist_private()
    return gymnax


# Where gymnax's MNISTBandit reads MNIST unless told otherwise: a folder of the machine's shared /tmp.
SHARED_MNIST_FOLDER = "/tmp/mnist"


def mnist_folder() -> str:
    """``$XDG_CACHE_HOME/jes/mnist`` (``~/.cache/jes/mnist``): where MNISTBandit reads MNIST in a process of jes's."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jes", "mnist")


def keep_mnist_private() -> None:
    """Point gymnax's ``load_mnist(directory="/tmp/mnist")`` at :func:`mnist_folder`.

    MNISTBandit (``"MNISTBandit-bsuite"``, which a checkpoint, a ``.policy`` file or a master's run description can
    name) calls it when it is made, and it downloads only the files missing from that folder and reads what is
    there: in a shared /tmp, files another user put there first were read as MNIST (a few MiB of gzip that inflate
    to more memory than the machine has, or data of their choosing). Only the default changes: a folder given is
    kept."""
    module = sys.modules.get("gymnax.utils.load_mnist")
    load = getattr(module, "load_mnist", None)
    if getattr(load, "__defaults__", None) == (SHARED_MNIST_FOLDER,):
        load.__defaults__ = (mnist_folder(),)
