"""The value outputs are filled with before every call: NaN for floats, the integer minimum
(maximum for unsigned) otherwise. Shared by the ranks (which poison) and the oracles (which
recognise an element that was never written)."""

from __future__ import annotations

import numpy as np


def poison_value(dtype: np.dtype | str):
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "i":
        return np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return 0
