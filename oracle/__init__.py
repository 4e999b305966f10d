"""frost's float64 oracle: the truth of SEMANTICS.md and the rule that judges engines.

- ``oracle.reference``: float64 forward (o, lse) and analytic backward (Grads).
- ``oracle.baseline``: the same-precision implementation X_lp of the acceptance rule.
- ``oracle.tolerance``: the acceptance rule itself (``check``, ``Verdict``).

The helpers they share: ``oracle.call`` (options, checked once),
``oracle.segments`` (layouts and per-sequence rows), ``oracle.masking``
(visibility), ``oracle.rope`` (rotary embedding and its transpose).
This package never imports frost.
"""
from oracle.reference import Grads, backward, forward, valid_rows_mask

__all__ = ["Grads", "backward", "forward", "valid_rows_mask"]
