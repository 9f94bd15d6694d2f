"""Distributed jes: one training run spread over many hosts with ZeroMQ.

The master (:class:`jes.distributed.master.Master`, started by
``jes.train(..., master=":5555")``) farms each generation's population chunks
out to ``jes-worker`` processes (:mod:`jes.distributed.worker`); the wire
format and its authentication live in :mod:`jes.distributed.protocol`.
Importing this package, :mod:`jes.distributed.protocol` or :mod:`jes.distributed.worker` does
not import JAX (``jes`` imports its public names lazily; a worker imports JAX when it builds its
first run), so ``jes-worker --help`` answers at once; the master imports it.
"""
