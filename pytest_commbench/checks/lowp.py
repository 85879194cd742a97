"""Low-precision payloads (bfloat16, float8 e4m3) for the oracles: the device buffers hold
the raw bits (uint16, uint8), ml_dtypes does the rounding and the conversions.

Ops of low-precision tasks declare their buffers with the storage dtypes of `STORAGE` and
convert with `encode`/`decode`; rounding is round-to-nearest-even, as the CUDA intrinsics
`__float2bfloat16_rn` and `__nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3)` do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

#: the payload type -> (its ml_dtypes type, the unsigned type its bits are stored in)
STORAGE = {
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16)),
    "float8_e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.uint8)),
}
E4M3_MAX = 448.0  # the largest finite float8 e4m3 value


def storage(kind: str) -> str:
    """The dtype name of the buffer that holds `kind`'s bits."""
    return STORAGE[kind][1].name


def encode(values: np.ndarray, kind: str) -> np.ndarray:
    """float values -> the bits of their nearest `kind` values (e4m3 saturates at ±448)."""
    typ, bits = STORAGE[kind]
    v = np.asarray(values, dtype=np.float32)
    if kind == "float8_e4m3":
        v = np.clip(v, -E4M3_MAX, E4M3_MAX)
    return v.astype(typ).view(bits)


def decode(bits: np.ndarray, kind: str) -> np.ndarray:
    """The bits of `kind` values -> those values as float64 (NaN for NaN bits)."""
    typ, store = STORAGE[kind]
    return np.asarray(bits).astype(store, copy=False).view(typ).astype(np.float64)


def rounded(values: np.ndarray, kind: str) -> np.ndarray:
    """The values as `kind` rounds them, back in float64."""
    return decode(encode(values, kind), kind)


def ulp(values: np.ndarray, kind: str) -> np.ndarray:
    """The spacing of `kind` values at each value's magnitude (the error bound of one
    rounding is half of it)."""
    typ, _ = STORAGE[kind]
    info = ml_dtypes.finfo(typ)
    mag = np.maximum(np.abs(np.asarray(values, dtype=np.float64)), float(info.smallest_normal))
    return np.exp2(np.floor(np.log2(mag)) - info.nmant)
