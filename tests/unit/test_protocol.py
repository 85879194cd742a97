"""The call protocol between the observer and a rank, driven word by word (no MPI, no job)."""

from __future__ import annotations

import mmap
import os
import threading
import time
from types import SimpleNamespace

from pytest_commbench.rank.backends import make_backend
from pytest_commbench.rank.harness import Calls
from pytest_commbench.rank.protocol import Control, layout, memfd


def _rank_side():
    ctl_fd, data_fd = memfd("ctl", 1 << 16), memfd("data", 1 << 16)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK)
    link = SimpleNamespace(ctl=Control(ctl_fd), data=mmap.mmap(data_fd, 1 << 16),
                           wake=wake_r, ring=lambda: None)
    observer = Control(ctl_fd)
    return link, observer, wake_w


def test_a_rank_never_runs_the_next_cases_first_call_in_the_old_cases_loop():
    """The observer opens the next case's first call and only then says the old case ended
    (the order a slow rank can see them in): the rank must leave the old case without making
    that call, and make it in the next case's loop, with that case's arguments."""
    link, observer, wake_w = _rank_side()
    made: list[tuple[str, int]] = []

    def solution(ctx, buf, tag):
        made.append((tag, int(observer.get("gate"))))

    calls = Calls(link, make_backend("cpu"), solution)
    placed, _ = layout([("buf", "out", (4,), "float32")])

    def open_call(k: int, case_no: int) -> None:
        observer.write_info({"layout": placed, "extra": {}})
        observer.set("layout_version", case_no)
        observer.set("case", case_no)
        observer.set("gate", k)
        os.write(wake_w, b"!")

    def driver() -> None:
        open_call(1, 1)
        while observer.get("done") < 1:
            time.sleep(0.001)
        open_call(2, 2)  # the next case's first call first ...
        time.sleep(0.05)
        observer.set("end", 1)  # ... then the end of the old case
        while observer.get("done") < 2:
            time.sleep(0.001)
        observer.set("end", 2)
        os.write(wake_w, b"!")

    t = threading.Thread(target=driver)
    t.start()
    ctx = SimpleNamespace()
    calls.case(1, {"id": "c0", "args": ["buf", "tag"], "params": {"tag": "c0"}}, ctx)
    calls.case(2, {"id": "c1", "args": ["buf", "tag"], "params": {"tag": "c1"}}, ctx)
    t.join(5)
    assert made == [("c0", 1), ("c1", 2)]


def test_the_feed_fills_each_calls_inputs_in_order_and_says_when_they_were_taken():
    """A batch's inputs through the feed: arrays filled in order (empty ones too: a rank that
    gets no rows), and inputs missing from the feed (read ahead by someone else) are an error
    of the rank, not a short read."""
    import numpy as np
    import pytest

    from pytest_commbench.rank.protocol import feed_pipe, read_feed

    r, w, capacity = feed_pipe()
    try:
        assert capacity >= 1 << 16
        sent = [np.arange(5, dtype=np.float64), np.empty((0, 4), np.float32),
                np.arange(3, dtype=np.int64)]
        os.write(w, b"".join(a.tobytes() for a in sent))
        got = [np.empty_like(a) for a in sent]
        read_feed(r, got)
        for a, b in zip(sent, got):
            assert a.shape == b.shape and np.array_equal(a, b)
        os.write(w, np.arange(2, dtype=np.float64).tobytes())
        os.read(r, 8)  # one element taken ahead of its call
        with pytest.raises(RuntimeError, match="missing from the harness's feed"):
            read_feed(r, [np.empty(2, np.float64)])
    finally:
        os.close(r)
        os.close(w)


def test_every_copy_of_the_job_contract_says_what_the_protocol_says():
    """Exit codes, environment and file names are spelled once in rank/protocol.py; the C
    guards, the sandbox's first process and the MPS wrapper keep copies (they run before, or
    without, the package) and must agree with it."""
    import re
    from pathlib import Path

    from pytest_commbench import cupti_guard, interposer, sandbox, sandbox_init
    from pytest_commbench.rank import guard, mps, protocol

    rank_dir = Path(protocol.__file__).parent
    for c_file in ("interpose.c", "cupti_guard.c"):
        text = (rank_dir / c_file).read_text()
        assert int(re.search(r"#define GUARD_EXIT (\d+)", text).group(1)) == protocol.GUARD_EXIT
    interpose = (rank_dir / "interpose.c").read_text()
    assert int(re.search(r"#define RESOLVE_EXIT (\d+)", interpose).group(1)) == \
        protocol.RESOLVE_EXIT
    assert sandbox_init.SETUP_FAILED == sandbox.SETUP_FAILED == protocol.SANDBOX_FAILED
    assert sandbox_init.LIMIT_EXIT == sandbox.LIMIT_EXIT == protocol.LIMIT_EXIT
    assert mps.MPS_FAILED == protocol.MPS_FAILED
    assert guard.GUARD_EXIT == interposer.GUARD_EXIT == cupti_guard.GUARD_EXIT == \
        protocol.GUARD_EXIT
    assert interposer.REPORT_ENV == cupti_guard.REPORT_ENV == protocol.ENV_GUARD_REPORT
    assert len({protocol.GUARD_EXIT, protocol.RESOLVE_EXIT, protocol.LIMIT_EXIT,
                protocol.MPS_FAILED, protocol.SANDBOX_FAILED}) == 5
    evidence = re.compile(protocol.EVIDENCE)
    for name in (protocol.status_file(3), protocol.stack_file(12), protocol.guard_file(0),
                 protocol.MPS_STATE):
        assert evidence.fullmatch(name), name
    assert not evidence.fullmatch("solution.cu")
