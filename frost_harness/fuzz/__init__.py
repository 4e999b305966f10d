"""frost's property-based search: Hypothesis strategies, properties, profiles and the nightly runner.

- ``frost_harness.fuzz.strategies``: problems (``frost_harness.suites.harness.Case``) drawn from the whole of
  SEMANTICS.md, in a ``cpu`` and a ``gpu`` size regime; ``frost_harness.fuzz.pool``: the finite
  pool of record classes (what changes a compiled kernel) the ``gpu`` regime draws from
  first, and ``frost_harness.fuzz.prewarm``, which compiles its records before a run;
- ``frost_harness.fuzz.properties`` (agreement with the oracle, determinism, routing) and
  ``frost_harness.fuzz.identities`` (metamorphic rewrites), checked on the engines; ``frost_harness.fuzz.catalog``
  names them all; ``frost_harness.fuzz.compare`` is the rule the identities are judged by;
  ``frost_harness.fuzz.limits`` measures how much of what is drawn the acceptance rule judges (all of it);
- ``frost_harness.fuzz.failures`` and ``frost_harness.fuzz.replay``: every failure prints one command that
  replays it;
- ``frost_harness.fuzz.profiles`` (``ci`` / ``dev`` / ``nightly``), ``frost_harness.fuzz.budget`` (the wall-clock
  budget as seeded chunks), ``frost_harness.fuzz.devices`` (one GPU per xdist worker) and
  ``frost_harness.fuzz.plugin`` (the pytest side of all three);
- ``frost_harness.fuzz.nightly``: the ``frost-fuzz`` console script.

The Hypothesis tests themselves live in ``frost_harness/suites/fuzz``.
"""
