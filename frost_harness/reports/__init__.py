"""frost's reports: per-case records (``records``), the pytest plugin that collects them
(``plugin``), the pandas tables (``tables``) and the ``frost-report`` command (``cli``)."""
