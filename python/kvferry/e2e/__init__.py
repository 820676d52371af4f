"""End-to-end serving harness: time to first token with no cache, a local
cache and a remote kvferry store, on one trace, with outputs checked.

- :mod:`.trace` makes the load (Poisson arrivals, shared prefixes).
- :mod:`.model` builds the model (Llama-shaped, random weights, or a
  checkpoint).
- :mod:`.caches` are the configurations (none, local, remote, gpu).
- :mod:`.overlap` loads prefix KV layer by layer behind the compute.
- :mod:`.engine` serves the trace first-come-first-served, batch 1.
- :mod:`.policy` decides load or recompute (the ``kvferry calc`` model).
- :mod:`.stats` and :mod:`.record` summarise and write records.
- :mod:`.correctness` checks cache-hit outputs against recompute.
- :mod:`.cli` is ``kvferry bench e2e``.

torch and transformers are imported only by the modules that need them,
so the trace, statistics, policy and records work without them.
"""
