"""The wire between the controller and a node agent (`rank/wire.py`) over a socketpair: a good
exchange, and each way a frame or a peer is refused (an altered frame, a replayed or
reordered one, a wrong key, silence past the heartbeat bound, an oversize frame)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import numpy as np
import pytest

from pytest_commbench.rank import wire
from pytest_commbench.rank.wire import Channel, WireError

KEY = bytes(range(32))
JOB = "job-1"


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _shake(a, b, agent_key=KEY, node=1, nodes=2):
    """The handshake on both ends (the agent's in a thread); returns the two channels and
    what each end raised (None: nothing)."""
    ctl = Channel(a, KEY, "controller", "the agent")
    agent = Channel(b, agent_key, "agent", "the controller")
    got: dict = {}

    def agent_side():
        try:
            got["welcome"] = wire.agent_handshake(agent, JOB, node, {"host": "h2"})
        except WireError as exc:
            got["agent"] = exc

    t = threading.Thread(target=agent_side)
    t.start()
    try:
        hello = wire.controller_handshake(ctl, JOB, nodes)
        wire.welcome(ctl, hello, node_seed=7)
        got["hello"] = hello
    except WireError as exc:
        got["controller"] = exc
        a.close()  # closed unread: the agent's wait ends
    t.join(5)
    return ctl, agent, got


def test_a_good_exchange_authenticates_both_ends_and_carries_frames(pair):
    a, b = pair
    ctl, agent, got = _shake(a, b)
    assert got["hello"]["node"] == 1 and got["hello"]["host"] == "h2"
    assert got["welcome"]["node_seed"] == 7
    assert ctl.authenticated and agent.authenticated
    arrays = [("x", np.arange(5, dtype=np.float32)), ("y", np.ones((2, 3), np.int64))]
    meta, payload = wire.pack_arrays(arrays)
    ctl.send("INPUTS", {"rank": 3, "arrays": meta}, payload)
    ctl.send("HEARTBEAT", {"t": 0})
    agent.send("SEEN", {"rank": 3, "word": "done", "value": 1, "t": 2.5})
    kind, header, body = agent.recv(2)
    assert kind == "INPUTS" and header["rank"] == 3
    back = wire.unpack_arrays(header["arrays"], body)
    assert [n for n, _ in back] == ["x", "y"]
    assert np.array_equal(back[0][1], arrays[0][1]) and back[1][1].shape == (2, 3)
    assert ctl.recv(2)[1]["word"] == "done"


def test_a_wrong_key_is_refused(pair, monkeypatch):
    a, b = pair
    monkeypatch.setattr(wire, "AUTH_S", 0.5)
    # an agent with another key cannot check the controller's challenge and answers nothing:
    # the controller gives up within the handshake's time
    _ctl, _agent, got = _shake(a, b, agent_key=bytes(32))
    assert "failed its check" in str(got["agent"])
    assert "said nothing" in str(got["controller"]) and "hello" not in got


def test_a_hello_made_with_a_wrong_key_is_refused(pair):
    """A peer that reads the challenge's nonce (it is in the clear) but has not the key: its
    HELLO fails its check."""
    a, b = pair
    ctl = Channel(a, KEY, "controller", "the agent")
    forger = Channel(b, bytes(32), "agent", "the controller")
    got: dict = {}

    def controller_side():
        try:
            wire.controller_handshake(ctl, JOB, 2)
        except WireError as exc:
            got["controller"] = exc

    t = threading.Thread(target=controller_side)
    t.start()
    raw = b.recv(4096)
    nonce = raw[9:raw.index(b"}") + 1]
    forger.nonce = bytes.fromhex(json.loads(nonce)["nonce"])
    forger.got = 1
    forger.send("HELLO", {"node": 0, "nonce": "00" * 32,
                          "answer": wire.answer(bytes(32), forger.nonce, JOB, 0)})
    t.join(5)
    assert "failed its check" in str(got["controller"])


def test_a_claim_for_a_node_the_job_lacks_is_refused(pair):
    a, b = pair
    _ctl, _agent, got = _shake(a, b, node=5, nodes=2)
    assert "claimed node 5" in str(got["controller"])


def _authenticated(a, b):
    ctl, agent, got = _shake(a, b)
    assert "hello" in got and "welcome" in got, got
    return ctl, agent


def test_an_altered_frame_is_refused(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    data = bytearray(ctl.pack("SET", {"rank": 0, "word": "gate", "value": 1}))
    data[12] ^= 1
    a.sendall(bytes(data))
    with pytest.raises(WireError, match="failed its check"):
        agent.recv(2)


def test_a_replayed_frame_is_refused(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    frame = ctl.pack("SET", {"rank": 0, "word": "gate", "value": 1})
    a.sendall(frame)
    assert agent.recv(2)[0] == "SET"
    a.sendall(frame)  # the same bytes again
    with pytest.raises(WireError, match="replayed or reordered"):
        agent.recv(2)


def test_reordered_frames_are_refused(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    first = ctl.pack("SET", {"rank": 0, "word": "prep", "value": 1})
    second = ctl.pack("SET", {"rank": 0, "word": "gate", "value": 1})
    a.sendall(second + first)
    with pytest.raises(WireError, match="failed its check"):
        agent.recv(2)


def test_a_frame_from_another_connection_is_refused():
    """Each connection has its own nonce in every MAC: a frame recorded on one is refused on
    another of the same job."""
    a1, b1 = socket.socketpair()
    a2, b2 = socket.socketpair()
    try:
        ctl1, _agent1 = _authenticated(a1, b1)
        _ctl2, agent2 = _authenticated(a2, b2)
        # the same sequence number on both: only the connection differs
        ctl1.sent = _ctl2.sent
        a2.sendall(ctl1.pack("STOP"))
        with pytest.raises(WireError, match="failed its check"):
            agent2.recv(2)
    finally:
        for s in (a1, b1, a2, b2):
            s.close()


def test_silence_past_the_heartbeat_bound_is_noticed(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    ctl.heartbeat_s = 0.02
    agent.send("HEARTBEAT", {"t": 0})
    assert ctl.receive()[0][0] == "HEARTBEAT"  # heard now
    assert not ctl.silent()
    time.sleep(0.02 * wire.SILENCE_BEATS + 0.05)
    assert ctl.silent()
    agent.send("HEARTBEAT", {"t": 1})
    time.sleep(0.01)
    ctl.receive()
    assert not ctl.silent()


def test_a_closed_connection_says_so(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    b.close()
    with pytest.raises(WireError, match="closed the connection"):
        ctl.recv(2)


def test_an_oversize_frame_is_refused(pair):
    a, b = pair
    ctl = Channel(a, KEY, "controller", "the agent")
    # before the handshake: more than HANDSHAKE_BYTES is refused at once, unread
    b.sendall(struct.pack("!IBI", 1 << 20, wire.CODE["HELLO"], 2) + b"{}")
    with pytest.raises(WireError, match="before the handshake"):
        ctl.recv(2)


def test_an_oversize_frame_after_the_handshake_is_refused(pair):
    a, b = pair
    ctl, agent = _authenticated(a, b)
    a.sendall(struct.pack("!IBI", wire.MAX_FRAME + 1, wire.CODE["INPUTS"], 2) + b"{}")
    with pytest.raises(WireError, match=r"frame of \d+ bytes .*refused"):
        agent.recv(2)


def test_an_array_of_objects_is_refused():
    with pytest.raises(WireError, match="refused"):
        wire.unpack_arrays([["x", "|O", [1]]], b"\0" * 8)
    with pytest.raises(WireError, match="overrun"):
        wire.unpack_arrays([["x", "<f8", [4]]], b"\0" * 8)


def test_the_clock_offset_is_that_of_the_shortest_round_trip():
    samples = [(0.0, 105.0, 10.0), (20.0, 120.6, 21.0), (30.0, 140.0, 50.0)]
    offset, uncertainty = wire.best_offset(samples)
    assert offset == pytest.approx(120.6 - 20.5) and uncertainty == pytest.approx(0.5)


def test_the_job_s_key_never_reaches_the_ranks_environment(monkeypatch):
    """The agent step's environment carries the key; the ranks' (`launch.mpi_env`, which
    every rank step starts from) drops every COMMBENCH_ variable."""
    from pytest_commbench.launch import mpi_env

    monkeypatch.setenv(wire.KEY_ENV, KEY.hex())
    assert wire.KEY_ENV not in mpi_env()


def test_a_drawn_input_crosses_as_its_recipe_and_the_agent_draws_the_same_bytes(pair):
    from pytest_commbench.checks.base import full_random, random_data

    a, b = pair
    ctl, agent, _got = _shake(a, b)
    rng = np.random.default_rng(5)
    big = full_random(rng, (1 << 16,), "float32")
    small = random_data(rng, (3, 4), "int32")
    made = np.arange(6, dtype=np.float64)  # made by the oracle, not drawn: its bytes go
    part = big[:8]  # a slice of a drawn array has no recipe of its own
    meta, parts = wire.pack_arrays([("big", big), ("small", small), ("made", made),
                                    ("part", part)], recipes=True)
    assert [len(e) for e in meta] == [4, 4, 3, 3]
    assert sum(memoryview(p).nbytes for p in parts) == made.nbytes + part.nbytes
    ctl.send("INPUTS", {"rank": 0, "arrays": meta}, parts)
    kind, header, body = agent.recv(2)
    assert len(body) == made.nbytes + part.nbytes
    back = dict(wire.unpack_arrays(header["arrays"], body))
    for name, want in [("big", big), ("small", small), ("made", made), ("part", part)]:
        assert back[name].dtype == want.dtype and back[name].tobytes() == want.tobytes(), name
    # without recipes (the one-node path, or a controller that sends bytes) the same arrays
    meta, parts = wire.pack_arrays([("big", big)])
    assert len(meta[0]) == 3 and memoryview(parts[0]).nbytes == big.nbytes


def test_a_drawn_array_is_read_only_and_one_made_from_it_has_no_recipe():
    from pytest_commbench.checks.base import full_random
    from pytest_commbench.rank.draws import recipe_of

    x = full_random(np.random.default_rng(1), 16, "float16")
    assert recipe_of(x) is not None and not x.flags.writeable
    with pytest.raises(ValueError):
        x[0] = 1
    for other in (x.copy(), x + 0, x[1:], np.array(x), x.view(np.uint16)):
        assert recipe_of(other) is None
    # two draws from one generator differ; the same recipe draws the same bytes again
    rng = np.random.default_rng(2)
    y, z = full_random(rng, 16, "float32"), full_random(rng, 16, "float32")
    assert recipe_of(y)["seed"] != recipe_of(z)["seed"]
    from pytest_commbench.rank.draws import make

    assert make(recipe_of(y)).tobytes() == y.tobytes()


@pytest.mark.parametrize("recipe", [
    {"draw": "eval", "seed": [1, 2], "shape": [4], "dtype": "<f4"},
    {"draw": "full", "seed": [1], "shape": [4], "dtype": "<f4"},
    {"draw": "full", "seed": [1, 2], "shape": [-4], "dtype": "<f4"},
    {"draw": "full", "seed": [1, 2], "shape": [1 << 20, 1 << 20], "dtype": "<f4"},
    {"draw": "full", "seed": [1, 2], "shape": [4], "dtype": "|O"},
    {"draw": "full", "seed": [1, 2], "shape": [4], "dtype": "<f8"},  # not the entry's dtype
    {"draw": "full", "seed": [1, 2], "shape": [5], "dtype": "<f4"},  # not the entry's shape
    {"seed": [1, 2]},
    "full",
])
def test_a_recipe_that_makes_something_else_or_nothing_is_refused(recipe):
    with pytest.raises(WireError):
        wire.unpack_arrays([["x", "<f4", [4], recipe]], b"")
