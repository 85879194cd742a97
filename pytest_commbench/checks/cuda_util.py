"""Rank-local CUDA utilities: every rank works alone on inputs of its own (different on every
rank, so a rank that writes another rank's answer or a stale one is caught).

copy
    x (count,) -> out (count,): out == x bit for bit, any dtype. Integer inputs are drawn over
    the whole range of the type except the poison value (the integer minimum, the maximum for
    unsigned types), float inputs with every significand bit used (`full_random`, never NaN):
    an element that was never written still holds the poison and never equals its input.
    bytes = count * itemsize (one buffer, as nccl-tests counts it), bus factor 1.

offset_copy
    x uint8 (count,), out uint8 (count,); per rank and call three scalars, handed to the
    solution as context values (Trial.extra, in this order after the buffers): src_offset,
    dst_offset and length. out[dst_offset + i] == x[src_offset + i] for 0 <= i < length, and
    every other byte of out keeps the value it held before the call (the poison, 0xFF; the
    inputs never hold 0xFF, so a byte copied where it does not belong is caught, and so is one
    left out). Offsets are drawn in 0 .. min(63, count - 1) and the copy ends 0 .. 15 bytes
    before the end of the buffers it would otherwise reach; the first trial of a case whose
    count leaves room (126 bytes and more) has source and destination misaligned by different
    amounts modulo 16, a destination that starts and ends inside a 16-byte word, and input
    bytes before and after both ranges (one byte copied too many is a real byte, not 0xFF).
    bytes = count (the buffer), bus factor 1.

timed_wait
    ns int64 (count,) -> elapsed int64 (count,): entry b waits at least ns[b] nanoseconds of
    %globaltimer time and reports the time it measured. Accepted: ns[b] <= elapsed[b] <=
    ns[b] + WAIT_SLACK_NS (ranks share GPUs and may be preempted: only lateness beyond 20 ms
    counts as wrong). The numbers alone could be made up without waiting, so the call itself
    is timed too: from the rank's gate to the moment the observer saw it done (its device
    idle) at least CALL_FRACTION of its longest request must pass (the events of `verify`;
    an honest call takes longer than its longest wait). Requests are log-uniform from 1 us
    to 2 ms, and every call has at least one request of LONG_NS or more (longer than a single
    nanosleep instruction can sleep). `expected` gives the latest accepted value of every
    entry (verify accepts anything from ns up to it). bytes = 0 (the tasks report time).

device_attributes
    -> attrs int64 (len(ATTRIBUTES),): entry i is the value of ATTRIBUTES[i] for the rank's
    CUDA device. count is unused (sizes = [0]); there are no inputs. The expected values come
    from the controller, on the GPU host: a child process asks the CUDA driver (libcuda,
    cuDeviceGetAttribute / cuDeviceTotalMem; no context is created) about every GPU the
    controller can see. The job's GPUs are some of those (which ones the lease picks is not
    told to the oracle), so the list only holds quantities that are the same on all of them
    (the oracle raises, an infrastructure error, where they differ) and that an MPS client
    sees as a plain process does: the multiprocessor count is left out, since under MPS with
    an active-thread percentage a client is told its share of the SMs, which the oracle cannot
    know (on an H200, 2026-12-02: every listed value the same for a plain process and for MPS
    clients at 12% and 50%, whose SM counts were 14 and 66 of 132). Without a CUDA driver
    the oracle raises with the reason (never a pass).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np

from .base import FLOAT_KINDS, Op, Trial, full_random, poison_value

# -- copy ---------------------------------------------------------------------------------


def unpoisoned_random(rng: np.random.Generator, count: int, dtype: str) -> np.ndarray:
    """Random values of the dtype that never equal its poison: integers over the whole range
    of the type but the poison, floats with every significand bit used."""
    dt = np.dtype(dtype)
    if dt.kind in FLOAT_KINDS:
        return full_random(rng, (count,), dtype)
    info = np.iinfo(dt)
    poison = poison_value(dt)
    lo = info.min + 1 if poison == info.min else info.min
    hi = info.max - 1 if poison == info.max else info.max
    return rng.integers(lo, hi, size=count, dtype=dt, endpoint=True)


class Copy(Op):
    name = "copy"
    exact = True

    def args(self, params):
        return ["x", "out"]

    def make_trial(self, rng, count, dtype, world, params):
        inputs = [{"x": unpoisoned_random(rng, count, dtype)} for _ in range(world)]
        outputs = [{"out": ((count,), dtype)} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        return [{"out": named["x"].copy()} for named in trial.inputs]

    def bytes(self, count, dtype, world, params):
        return count * np.dtype(dtype).itemsize, 1.0


# -- offset_copy --------------------------------------------------------------------------

MAX_OFFSET = 63  # offsets are drawn in 0 .. MAX_OFFSET (several 16-byte words)
MAX_SHORT = 15  # the copy ends 0 .. MAX_SHORT bytes short of where the buffers would let it
POISON_U8 = 0xFF


def _window(rng: np.random.Generator, count: int, awkward: bool) -> tuple[int, int, int]:
    """(src_offset, dst_offset, length) for buffers of `count` bytes, length >= 1. `awkward`:
    where the count leaves room, source and destination misaligned differently modulo 16, the
    destination starting and ending inside a 16-byte word, bytes left before and after it
    (and after the source range: a byte copied one past the end is a real input byte)."""
    top = min(MAX_OFFSET, count - 1)
    for _ in range(1000):
        src = int(rng.integers(0, top, endpoint=True))
        dst = int(rng.integers(0, top, endpoint=True))
        room = count - max(src, dst)  # >= 1
        short = int(rng.integers(0, min(MAX_SHORT, room - 1), endpoint=True))
        length = room - short
        end = dst + length
        if not awkward or count < 2 * MAX_OFFSET:
            return src, dst, length
        if (src % 16 and dst % 16 and src % 16 != dst % 16 and end % 16 and end < count
                and src + length < count and length >= 32):
            return src, dst, length
    raise RuntimeError(f"offset_copy: no awkward window found for count {count}")


class OffsetCopy(Op):
    name = "offset_copy"
    exact = True

    def args(self, params):
        return ["x", "out", "src_offset", "dst_offset", "length"]

    def _trial(self, rng, count, world, awkward):
        if count < 1:
            raise ValueError("offset_copy needs buffers of at least one byte")
        inputs, extra = [], []
        for _ in range(world):
            inputs.append({"x": rng.integers(0, POISON_U8 - 1, size=count, dtype=np.uint8,
                                             endpoint=True)})
            src, dst, length = _window(rng, count, awkward)
            extra.append({"src_offset": src, "dst_offset": dst, "length": length})
        outputs = [{"out": ((count,), "uint8")} for _ in range(world)]
        return Trial(inputs, outputs, extra, [0.0] * world)

    def make_trial(self, rng, count, dtype, world, params):
        return self._trial(rng, count, world, awkward=False)

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        case = super().make_case(rng, case_id, count, dtype, world, params, trials, reps)
        case.trials[0] = self._trial(rng, count, world, awkward=True)
        return case

    def expected(self, trial, count, dtype, world, params):
        want = []
        for named, extra in zip(trial.inputs, trial.extra):
            out = np.full(count, POISON_U8, dtype=np.uint8)
            src, dst, length = extra["src_offset"], extra["dst_offset"], extra["length"]
            out[dst:dst + length] = named["x"][src:src + length]
            want.append({"out": out})
        return want

    def bytes(self, count, dtype, world, params):
        return count, 1.0


# -- timed_wait ---------------------------------------------------------------------------

MIN_NS = 1_000  # 1 us
MAX_NS = 2_000_000  # 2 ms
LONG_NS = 1_500_000  # every call has a request at least this long (> one nanosleep's 1 ms)
WAIT_SLACK_NS = 20_000_000  # lateness accepted: ranks share a GPU, kernels may be preempted
# the call (gate to done, host clock) lasts at least this share of its longest request: the
# GPU's timer and the host's clock may disagree by a little, never by 5%
CALL_FRACTION = 0.95


class TimedWait(Op):
    name = "timed_wait"
    batchable = True

    def args(self, params):
        return ["ns", "elapsed"]

    def make_trial(self, rng, count, dtype, world, params):
        if count < 1:
            raise ValueError("timed_wait needs at least one entry")
        inputs = []
        for _ in range(world):
            ns = np.exp(rng.uniform(np.log(MIN_NS), np.log(MAX_NS), size=count))
            ns = np.clip(np.rint(ns), MIN_NS, MAX_NS).astype(np.int64)
            ns[int(rng.integers(count))] = rng.integers(LONG_NS, MAX_NS, endpoint=True)
            inputs.append({"ns": ns})
        outputs = [{"elapsed": ((count,), "int64")} for _ in range(world)]
        return Trial(inputs, outputs)

    def expected(self, trial, count, dtype, world, params):
        """The latest accepted value of every entry (anything from ns up to it passes)."""
        return [{"elapsed": named["ns"] + WAIT_SLACK_NS} for named in trial.inputs]

    def verify(self, trial, got, events, case, rtol, atol, want=None, slack=None):
        errors = []
        for rank, (named, outs) in enumerate(zip(trial.inputs, got)):
            if "elapsed" not in outs:
                errors.append(f"rank {rank}: output 'elapsed' missing")
                continue
            ns, el = named["ns"], np.asarray(outs["elapsed"])
            if el.shape != ns.shape:
                errors.append(f"rank {rank}: output 'elapsed': shape {el.shape}, expected "
                              f"{ns.shape}")
                continue
            if rank < len(events or []) and ns.size:
                took = events[rank]["t_exit"] - events[rank]["t_enter"]
                if took < CALL_FRACTION * 1e-9 * float(ns.max()):
                    errors.append(f"rank {rank}: the call was done {1e6 * took:.0f} us after "
                                  f"it began, but its longest request is "
                                  f"{int(ns.max()) / 1e3:.0f} us: it cannot have waited")
            never = el == poison_value(np.int64)
            short = ~never & (el < ns)
            late = ~never & (el > ns + WAIT_SLACK_NS)
            for what, bad in (("never written (poison)", never),
                              ("shorter than requested", short),
                              (f"more than {WAIT_SLACK_NS // 1_000_000} ms longer than "
                               "requested", late)):
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    errors.append(f"rank {rank}: output 'elapsed': {int(bad.sum())} of "
                                  f"{el.size} entries {what}; first at index {i}: got "
                                  f"{int(el[i])} ns for a request of {int(ns[i])} ns")
        return errors

    def bytes(self, count, dtype, world, params):
        return 0, 1.0


# -- device_attributes --------------------------------------------------------------------

# (what the entry is, CUdevice_attribute / cudaDeviceAttr number, or None: total memory)
ATTRIBUTES: tuple[tuple[str, int | None], ...] = (
    ("compute capability major", 75),
    ("compute capability minor", 76),
    ("warp size (threads)", 10),
    ("max threads per block", 1),
    ("max block dimension x", 2),
    ("max grid dimension x", 5),
    ("max shared memory per block without opt-in (bytes)", 8),
    ("max shared memory per block with opt-in (bytes)", 97),
    ("max shared memory per multiprocessor (bytes)", 81),
    ("max 32-bit registers per block", 12),
    ("max resident threads per multiprocessor", 39),
    ("max resident blocks per multiprocessor", 106),
    ("L2 cache size (bytes)", 38),
    ("global memory bus width (bits)", 37),
    ("total global memory (bytes)", None),
    ("ECC enabled", 32),
    ("unified addressing", 41),
    ("concurrent managed access", 89),
    ("pageable memory access", 88),
    ("cooperative launch", 95),
    ("cluster launch", 120),
    ("host native atomics", 86),
)
QUERY_TIMEOUT_S = 60

# run in a child process (no CUDA state in the controller): every visible GPU's values as
# JSON, or {"error": why}
_QUERY = r"""
import ctypes, json, sys
codes = json.loads(sys.argv[1])
def fail(why):
    print(json.dumps({"error": why}))
    sys.exit(0)
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    fail(f"cannot load libcuda.so.1: {exc}")
rc = cu.cuInit(0)
if rc:
    fail(f"cuInit failed ({rc})")
n = ctypes.c_int()
rc = cu.cuDeviceGetCount(ctypes.byref(n))
if rc:
    fail(f"cuDeviceGetCount failed ({rc})")
gpus = []
for i in range(n.value):
    dev = ctypes.c_int()
    rc = cu.cuDeviceGet(ctypes.byref(dev), i)
    if rc:
        fail(f"cuDeviceGet({i}) failed ({rc})")
    row = []
    for code in codes:
        if code is None:
            mem = ctypes.c_size_t()
            rc = cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
            value = mem.value
        else:
            v = ctypes.c_int()
            rc = cu.cuDeviceGetAttribute(ctypes.byref(v), code, dev)
            value = v.value
        if rc:
            fail(f"device {i}: attribute {code} failed ({rc})")
        row.append(int(value))
    gpus.append(row)
print(json.dumps({"gpus": gpus}))
"""


class AttributeQueryError(RuntimeError):
    """The expected device attributes cannot be known on this machine."""


def query_gpus() -> list[list[int]]:
    """Every GPU the controller sees: its ATTRIBUTES values, asked of the CUDA driver in a
    child process (raises AttributeQueryError with the reason)."""
    codes = json.dumps([code for _, code in ATTRIBUTES])
    try:
        done = subprocess.run([sys.executable, "-c", _QUERY, codes], capture_output=True,
                              text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AttributeQueryError(f"device_attributes: the driver query failed: {exc}") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        why = (done.stderr or done.stdout).strip()[-500:]
        raise AttributeQueryError(f"device_attributes: the driver query gave no answer "
                              f"(exit {done.returncode}): {why}") from None
    if "error" in answer:
        raise AttributeQueryError(f"device_attributes: the expected values cannot be known on "
                              f"this machine: {answer['error']}")
    return answer["gpus"]


def common_row(gpus: list[list[int]]) -> np.ndarray:
    """The one row every GPU shares (raises where there are none, or where they differ: the
    oracle does not know which of them the job runs on)."""
    if not gpus:
        raise AttributeQueryError("device_attributes: the controller sees no GPU")
    first = gpus[0]
    for i, row in enumerate(gpus[1:], 1):
        diff = [ATTRIBUTES[k][0] for k, (a, b) in enumerate(zip(first, row)) if a != b]
        if diff:
            raise AttributeQueryError(
                f"device_attributes: GPU 0 and GPU {i} differ in {', '.join(diff)}; make only "
                f"the job's kind of GPU visible (CUDA_VISIBLE_DEVICES) so the oracle knows the "
                f"answer")
    return np.asarray(first, dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _expected_row(visible: str | None, order: str | None) -> tuple[int, ...]:
    return tuple(int(v) for v in common_row(query_gpus()))


def expected_attributes() -> np.ndarray:
    """The attribute row of the job's GPUs on this host (raises AttributeQueryError)."""
    row = _expected_row(os.environ.get("CUDA_VISIBLE_DEVICES"),
                        os.environ.get("CUDA_DEVICE_ORDER"))
    return np.asarray(row, dtype=np.int64)


class DeviceAttributes(Op):
    name = "device_attributes"
    exact = True

    def args(self, params):
        return ["attrs"]

    def make_trial(self, rng, count, dtype, world, params):
        expected_attributes()  # fail before the job runs when the answer cannot be known
        return Trial([{} for _ in range(world)],
                     [{"attrs": ((len(ATTRIBUTES),), "int64")} for _ in range(world)])

    def expected(self, trial, count, dtype, world, params):
        row = expected_attributes()
        return [{"attrs": row.copy()} for _ in range(world)]

    def bytes(self, count, dtype, world, params):
        return 0, 1.0


OPS = {
    "copy": Copy(),
    "offset_copy": OffsetCopy(),
    "timed_wait": TimedWait(),
    "device_attributes": DeviceAttributes(),
}
