"""The Hypothesis property suites (strategies and properties live in ``fuzz/``)."""
