"""The admitted SM80 params space, for the compile suites: it lives in the package
(``frost/kernels/sm80/space.py``) because ``frost-compile`` needs it and an installed package
must not import the test suites."""
from __future__ import annotations

from frost.kernels.sm80.space import (  # noqa: F401
    HEAD_DIMS, LAYOUTS, WINDOWS, admitted_bwd_params, admitted_fwd_params, all_records, covering_subset,
    l0_records,
)
