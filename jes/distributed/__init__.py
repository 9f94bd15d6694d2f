"""Distributed jes: one training run spread over many processes and hosts, two ways.

- **ZeroMQ, for elastic fleets.** The master (:class:`jes.distributed.master.Master`, started by
  ``jes.train(..., master=":5555")``) farms each generation's population chunks out to
  ``jes-worker`` processes (:mod:`jes.distributed.worker`) that may come and go; the wire format
  and its authentication live in :mod:`jes.distributed.protocol`, the CURVE transport under it (only
  holders of the shared secret get through the handshake) in :mod:`jes.distributed.transport`.
- **JAX's multi-process runtime, for homogeneous accelerator clusters.** Every process runs the
  same script; :func:`initialize` (or ``jes.train(..., distributed=True)``) joins them into one
  ``jax.distributed`` runtime and the compiled generation step shards the population over every
  device of every process (:mod:`jes.distributed.jax_runtime`; ``jes launch`` starts the processes
  on one machine or on hosts without a scheduler).

Importing this package, :mod:`jes.distributed.protocol` or :mod:`jes.distributed.worker` does
not import JAX (``jes`` imports its public names lazily; a worker imports JAX when it builds its
first run), so ``jes-worker --help`` answers at once; the master and the JAX runtime import it.
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it (imported on first use: this package stays JAX-free)
_EXPORTS = {
    "initialize": "jes.distributed.jax_runtime", "info": "jes.distributed.jax_runtime",
    "is_initialized": "jes.distributed.jax_runtime", "ProcessInfo": "jes.distributed.jax_runtime",
    "DistributedSetupError": "jes.distributed.jax_runtime",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jes.distributed' has no attribute {name!r}")
