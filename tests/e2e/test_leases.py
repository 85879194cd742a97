from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from pytest_commbench.leases import lease


def _hold(folder, count, total, exclusive, started, release):
    with lease(count, total, exclusive, folder) as devices:
        started.put(devices)
        release.wait(30)


@pytest.fixture
def ctx():
    return mp.get_context("fork")


def test_two_leases_get_different_devices(tmp_path, ctx):
    started, release = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, 1, 2, False, started, release))
    p.start()
    first = started.get(timeout=10)
    with lease(1, 2, False, tmp_path) as second:
        assert first != second and set(first) | set(second) == {0, 1}
    release.set()
    p.join(10)


def test_exclusive_lease_waits_for_the_whole_node(tmp_path, ctx):
    started, release = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, 1, 2, False, started, release))
    p.start()
    started.get(timeout=10)
    waiter = ctx.Process(target=_hold, args=(tmp_path, 1, 2, True, started, ctx.Event()))
    waiter.start()
    time.sleep(0.6)
    assert started.empty()  # the exclusive lease is still waiting
    release.set()
    p.join(10)
    assert started.get(timeout=10) == [0]
    waiter.kill()
    waiter.join(10)


def test_a_killed_holder_releases_its_devices(tmp_path, ctx):
    started, release = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, 2, 2, False, started, release))
    p.start()
    assert started.get(timeout=10) == [0, 1]
    p.kill()
    p.join(10)
    with lease(2, 2, False, tmp_path) as devices:
        assert devices == [0, 1]


def _hold_slots(folder, slots, whole, started, release):
    with lease(1, 1, False, folder, slots=slots, whole=whole) as devices:
        started.put(devices)
        release.wait(30)


def test_untimed_jobs_share_a_device_up_to_its_slots_and_a_whole_lease_waits_for_all(tmp_path,
                                                                                     ctx):
    """--commbench-jobs-per-gpu: two untimed jobs hold the one device's two slots side by
    side; a third waits, and so does a timed (whole) lease until both are given back."""
    started, release = ctx.Queue(), ctx.Event()
    holders = [ctx.Process(target=_hold_slots, args=(tmp_path, 2, False, started, release))
               for _ in range(2)]
    for p in holders:
        p.start()
    assert [started.get(timeout=10), started.get(timeout=10)] == [[0], [0]]
    third, third_go = ctx.Queue(), ctx.Event()
    waiters = [ctx.Process(target=_hold_slots, args=(tmp_path, 2, whole, third, third_go))
               for whole in (False, True)]
    for p in waiters:
        p.start()
    time.sleep(0.6)
    assert third.empty()  # no slot free: both wait
    release.set()
    for p in holders:
        p.join(10)
    got = [third.get(timeout=10)]
    third_go.set()  # the first of them gives back, then the other gets in
    got.append(third.get(timeout=10))
    assert got == [[0], [0]]
    for p in waiters:
        p.join(10)
    # a whole lease holds every slot: an untimed one cannot get in beside it
    whole, whole_go = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=_hold_slots, args=(tmp_path, 3, True, whole, whole_go))
    holder.start()
    assert whole.get(timeout=10) == [0]
    p = ctx.Process(target=_hold_slots, args=(tmp_path, 3, False, started, ctx.Event()))
    p.start()
    time.sleep(0.6)
    assert started.empty()
    whole_go.set()
    holder.join(10)
    assert started.get(timeout=10) == [0]
    p.kill()
    p.join(10)


def _hold_timed(folder, slots, whole, name, started, release):
    with lease(1, 1, False, folder, slots=slots, whole=whole):
        started.put((name, time.monotonic()))
        release.wait(30)


def test_leases_are_granted_in_the_order_asked_so_a_whole_lease_is_not_starved(tmp_path, ctx):
    """An untimed job holds one of the GPU's two slots; a timed (whole) lease asks next, then
    another untimed one: the free slot is not taken from under the whole lease (it goes first,
    once the holder is done), and a queued asker killed while waiting holds nobody up."""
    started, release = ctx.Queue(), ctx.Event()
    holder = ctx.Process(target=_hold_timed, args=(tmp_path, 2, False, "holder", started, release))
    holder.start()
    assert started.get(timeout=10)[0] == "holder"
    dead = ctx.Process(target=_hold_timed, args=(tmp_path, 2, True, "dead", started, ctx.Event()))
    dead.start()
    time.sleep(0.6)  # queued behind nobody but the holder's devices
    go = ctx.Event()
    timed = ctx.Process(target=_hold_timed, args=(tmp_path, 2, True, "timed", started, go))
    timed.start()
    time.sleep(0.6)
    untimed = ctx.Process(target=_hold_timed, args=(tmp_path, 2, False, "untimed", started, go))
    untimed.start()
    time.sleep(0.6)
    dead.kill()
    dead.join(10)
    time.sleep(0.6)
    # slot 1 is free, yet the untimed asker waits its turn behind the timed one
    assert started.empty()
    release.set()
    holder.join(10)
    first = started.get(timeout=10)
    assert first[0] == "timed"
    time.sleep(0.6)
    assert started.empty()  # the timed lease holds both slots
    go.set()
    assert started.get(timeout=10)[0] == "untimed"
    for p in (timed, untimed):
        p.join(10)
    assert not list((tmp_path / "queue").glob("*.ticket"))  # every ticket given back

def test_ranks_are_pinned_to_distinct_cpus_near_their_gpu():
    from pytest_commbench.platforms.gpu import parse_cpulist, rank_cpus

    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    local = {"0": parse_cpulist("0-15"), "1": parse_cpulist("0-15"), "2": parse_cpulist("16-31")}
    allowed = set(range(32))
    # two GPUs on one NUMA node share its CPUs without overlap; the third gets its own node's
    # (CPU 0, the kernel's housekeeping CPU, only when there is nothing else)
    assert rank_cpus(["0", "1", "2"], local, allowed) == [[1, 2, 3, 4], [5, 6, 7, 8],
                                                        [16, 17, 18, 19]]
    assert rank_cpus(["0", "1"], {"0": [0, 1], "1": [0, 1]}, allowed) == [[1], [0]]
    # only CPUs this process may use; a GPU whose CPUs are unknown is not pinned
    assert rank_cpus(["1", "7"], local, {2, 3, 20}) == [[2, 3], []]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_the_timing_thread_gets_a_cpu_of_its_own():
    """Before timing, a GPU rank keeps its first CPU for the thread that times and moves its
    other threads (libraries' helpers, started before or after pinning) to the rest."""
    cpus = sorted(os.sched_getaffinity(0))[:3]
    script = """
import os, threading
from pytest_commbench.rank import gpu
stop = threading.Event()
early = threading.Thread(target=stop.wait); early.start()
gpu.pin_cpus(1)
late = threading.Thread(target=stop.wait); late.start()
gpu.keep_timing_thread_apart()
print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(early.native_id)),
      sorted(os.sched_getaffinity(late.native_id)))
stop.set()
"""
    env = {**os.environ, "COMMBENCH_RANK_CPUS": "999;" + ",".join(map(str, cpus))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == f"{[cpus[0]]} {cpus[1:]} {cpus[1:]}"



def test_untimed_jobs_spread_over_idle_devices_before_sharing_one(tmp_path):
    with lease(1, 2, False, tmp_path, slots=2) as first, \
            lease(1, 2, False, tmp_path, slots=2) as second, \
            lease(1, 2, False, tmp_path, slots=2) as third:
        assert (first, second) == ([0], [1]) and third in ([0], [1])
