"""frost's float64 oracle: the truth of SEMANTICS.md and the rule that judges engines.

- ``frost_harness.oracle.reference``: float64 forward (o, lse) and analytic backward (Grads).
- ``frost_harness.oracle.baseline``: the same-precision implementation X_lp of the acceptance rule.
- ``frost_harness.oracle.tolerance``: the acceptance rule itself (``check``, ``Verdict``).

The helpers they share: ``frost_harness.oracle.call`` (options, checked once),
``frost_harness.oracle.segments`` (layouts and per-sequence rows), ``frost_harness.oracle.masking``
(visibility), ``frost_harness.oracle.rope`` (rotary embedding and its transpose).
This package never imports frost.
"""
from frost_harness.oracle.reference import Grads, backward, forward, valid_rows_mask

__all__ = ["Grads", "backward", "forward", "valid_rows_mask"]
