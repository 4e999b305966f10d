"""frost's property-based search: Hypothesis strategies, properties, profiles and the nightly runner.

- ``fuzz.strategies``: problems (``suites.harness.Case``) drawn from the whole of
  SEMANTICS.md, in a ``cpu`` and a ``gpu`` size regime;
- ``fuzz.properties`` (agreement with the oracle, determinism, routing) and
  ``fuzz.identities`` (metamorphic rewrites), checked on the engines; ``fuzz.catalog``
  names them all; ``fuzz.compare`` is the rule the identities are judged by;
  ``fuzz.limits`` measures how much of what is drawn the acceptance rule judges (all of it);
- ``fuzz.failures`` and ``fuzz.replay``: every failure prints one command that
  replays it;
- ``fuzz.profiles`` (``ci`` / ``dev`` / ``nightly``), ``fuzz.budget`` (the wall-clock
  budget as seeded chunks), ``fuzz.devices`` (one GPU per xdist worker) and
  ``fuzz.plugin`` (the pytest side of all three);
- ``fuzz.nightly``: the ``frost-fuzz`` console script.

The Hypothesis tests themselves live in ``suites/fuzz``.
"""
