"""frost's test harness, one package apart from the kernels (``frost``).

- ``frost_harness.oracle``: the float64 reference, the same-precision baseline and the
  acceptance rule; it never imports frost;
- ``frost_harness.suites``: the pytest suites (every test marked L0, L1 or L2);
- ``frost_harness.fuzz``: the Hypothesis strategies, properties and the ``frost-fuzz`` runner;
- ``frost_harness.reports``: the records plugin and the ``frost-report`` command.
"""
