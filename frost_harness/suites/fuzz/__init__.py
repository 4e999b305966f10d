"""The Hypothesis property suites (strategies and properties live in ``frost_harness/fuzz/``)."""
