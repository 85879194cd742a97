from __future__ import annotations

import multiprocessing as mp
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
