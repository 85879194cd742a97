"""Random inputs that a node agent can draw itself (docs/cluster-design.md, "Seeds, inputs and
checks"). Numpy only: the controller's oracles (`checks/base.py`) and the node agents (from the
job's own copy of the rank code) both import it.

An array drawn by `drawn` comes from a generator of its own, seeded by a fresh 128-bit seed
taken from the caller's (the job's secret) generator, and is kept with its recipe: the draw's
name, the seed, the shape and the dtype. Sending a rank's inputs to its node's agent, the
controller sends the recipe of each array that has one in place of its bytes, and the agent
draws the same bytes (`make`) the moment before it writes them into the rank's memory: no input
crosses the network and the seed goes no further than the agent (outside the ranks' sandbox).
A drawn array is read-only, so what its recipe says is what it holds; an array made from one
(a slice, a sum, a copy) has no recipe and travels as bytes.
"""

from __future__ import annotations

import functools
import hashlib
import weakref

import numpy as np

FLOAT_KINDS = "fc"

#: per float dtype: (unsigned type of its width, the bits kept from a random word: sign,
#: the lowest exponent bit and the whole significand; the exponent bits set: magnitude 0.5)
FULL_BITS = {
    np.dtype(np.float16): (np.uint16, 0x87FF, 0x3800),
    np.dtype(np.float32): (np.uint32, 0x80FFFFFF, 0x3F000000),
    np.dtype(np.float64): (np.uint64, 0x801FFFFFFFFFFFFF, 0x3FE0000000000000),
}
MAX_ELEMENTS = 1 << 34  # the most elements a recipe may ask an agent to draw


def full_random(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Values that use every bit of the dtype's significand (floats: random sign and
    significand, magnitudes in [0.5, 2), built from random words; integers over a sixteenth
    of the type's range): nothing narrower can carry them, so a solution that moves them in
    a smaller type (float16 for float32, int16 for int32) is wrong, not merely faster."""
    dt = np.dtype(dtype)
    if dt in FULL_BITS:
        word, keep, exponent = FULL_BITS[dt]
        bits = rng.integers(0, np.iinfo(word).max, size=shape, dtype=word, endpoint=True)
        bits &= word(keep)
        bits |= word(exponent)
        return bits.view(dt)
    if dt.kind in FLOAT_KINDS:
        out = rng.random(size=shape, dtype=np.float64)
        out *= 4.0
        out -= 2.0
        return out.astype(dt, copy=False)
    info = np.iinfo(dt)
    return rng.integers(info.min // 16, info.max // 16, size=shape, dtype=dt, endpoint=True)


def random_data(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Values exactly representable in the dtype, different on every element."""
    dt = np.dtype(dtype)
    # drawn as small integer types: several times faster than int64 draws at 10^8 elements
    if dt.kind in FLOAT_KINDS:
        # small integers over 2^k: exact in float16 and up, and sums of a few of them stay exact
        out = rng.integers(-512, 512, size=shape, dtype=np.int16).astype(dt)
        out *= dt.type(1 / 64)  # a power of two: exact
        return out
    if dt.kind == "i":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int16).astype(dt)
    return rng.integers(0, 200, size=shape, dtype=np.uint8).astype(dt)


DRAWS = {"full": full_random, "data": random_data}

# id(array) -> (a weak reference to it, its recipe); an entry leaves with its array
_RECIPES: dict[int, tuple[weakref.ref, dict]] = {}


def _forget(ref: weakref.ref, key: int) -> None:
    entry = _RECIPES.get(key)
    if entry is not None and entry[0] is ref:
        del _RECIPES[key]


def drawn(rng: np.random.Generator, draw: str, shape, dtype: str) -> np.ndarray:
    """`DRAWS[draw]` of this shape and dtype from a generator seeded by `rng`, read-only and
    kept with its recipe (`recipe_of`)."""
    seed = [int(x) for x in rng.integers(0, 1 << 63, size=2, dtype=np.int64)]
    dims = [int(s) for s in ((shape,) if np.isscalar(shape) else shape)]
    recipe = {"draw": draw, "seed": seed, "shape": dims, "dtype": np.dtype(dtype).str}
    a = make(recipe)
    a.flags.writeable = False
    key = id(a)
    _RECIPES[key] = (weakref.ref(a, lambda ref, key=key: _forget(ref, key)), recipe)
    return a


def recipe_of(a) -> dict | None:
    """The recipe `a` was drawn from (None: it was not drawn by `drawn`, or is another array
    made from one)."""
    entry = _RECIPES.get(id(a))
    if entry is None or entry[0]() is not a or a.flags.writeable:
        return None
    return entry[1]


class RecipeError(ValueError):
    """A recipe that names no draw, or asks for something no draw makes."""


def make(recipe: dict) -> np.ndarray:
    """The array a recipe describes (the same bytes wherever it is drawn with this numpy)."""
    try:
        fn = DRAWS[str(recipe["draw"])]
        seed = [int(x) for x in recipe["seed"]]
        shape = tuple(int(s) for s in recipe["shape"])
        dt = np.dtype(str(recipe["dtype"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RecipeError(f"a recipe that cannot be read ({exc!r})") from None
    if (len(seed) != 2 or any(not 0 <= s < 1 << 63 for s in seed)
            or any(s < 0 for s in shape) or dt.kind not in "biufc" or dt.hasobject):
        raise RecipeError(f"a recipe no draw makes: {recipe!r}")
    count = 1
    for s in shape:
        count *= s
    if count > MAX_ELEMENTS:
        raise RecipeError(f"a recipe of {count} elements (at most {MAX_ELEMENTS})")
    out = fn(np.random.default_rng(seed), shape, dt.str)
    return out if out.dtype == dt else out.astype(dt)


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A digest of what every draw makes of a fixed recipe in each dtype the oracles draw:
    an agent whose installation says another one than the controller's would draw other
    bytes from a recipe (another numpy), so the controller sends it bytes instead."""
    h = hashlib.sha256()
    for draw in sorted(DRAWS):
        for dtype in ("<f2", "<f4", "<f8", "<i4", "<i8", "|u1", "<u2"):
            h.update(make({"draw": draw, "seed": [1, 2], "shape": [257],
                           "dtype": dtype}).tobytes())
    return h.hexdigest()[:32]
