"""The wire between the controller and a node agent (docs/cluster-design.md, "The wire
protocol"): one TCP connection per agent, authenticated frames, heartbeats. Standard library
and numpy only; both wings import it (the agent from the job's own copy of the rank code).

A frame:

    u32 length | u8 type | u32 header length | JSON header | payload | 16-byte MAC

`length` counts the bytes after it up to the MAC. The MAC is a keyed BLAKE2b (the job's key,
`COMMBENCH_AGENT_KEY`) of the direction, the connection's nonce (the controller's, fresh per
connection), the frame's sequence number in its direction (counted by both ends, never sent)
and the frame itself: a frame altered, replayed, reordered, reflected back or carried over
from another connection fails its check.

The handshake, within AUTH_S: the controller sends CHALLENGE with its nonce; the agent
answers HELLO with HMAC-SHA256(key, nonce || job || node) and a nonce of its own; the
controller answers WELCOME with HMAC-SHA256(key, agent's nonce || job || node). Until then a
frame may not exceed HANDSHAKE_BYTES (an unauthenticated peer makes no one allocate much).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import time

HEARTBEAT_S = 1.0  # a side that has sent nothing for this long sends a HEARTBEAT
SILENCE_BEATS = 3  # a peer silent for this many heartbeats is gone
AUTH_S = 2.0  # the handshake's time
MAC_BYTES = 16
NONCE_BYTES = 32
KEY_BYTES = 32
HANDSHAKE_BYTES = 4096  # the largest frame before the handshake is done
MAX_FRAME = 1 << 31  # the largest frame afterwards (a case's inputs of one rank)
MAX_HEADER = 1 << 20
KEY_ENV = "COMMBENCH_AGENT_KEY"  # the job's key (hex), in the agent step's environment only

TYPES = ("CHALLENGE", "HELLO", "WELCOME", "SYNC", "SYNC_REPLY", "HEARTBEAT", "RANK_UP",
         "STRAY", "WORD", "GONE", "LAYOUT", "INPUTS", "CALL", "SET", "SEEN", "FORGED",
         "COLLECT", "OUTPUTS", "STOP", "ERROR")
CODE = {name: i + 1 for i, name in enumerate(TYPES)}
NAME = {i + 1: name for i, name in enumerate(TYPES)}
TO_AGENT, TO_CONTROLLER = b"C", b"A"
_HEAD = struct.Struct("!IBI")


def _bytes_view(buf) -> memoryview:
    """A buffer as a flat view of its bytes (sent, and counted, byte by byte)."""
    view = memoryview(buf)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


class WireError(Exception):
    """The connection cannot go on: it closed, went silent, or a frame failed its check."""


def make_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def answer(key: bytes, nonce: bytes, job: str, node: int) -> str:
    """The proof of the key for a nonce: HMAC-SHA256(key, nonce || job || node), hex."""
    msg = nonce + job.encode() + str(int(node)).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


class Channel:
    """One end of an agent's connection: frames out (each with its MAC) and in (each checked,
    in order). `role`: "controller" or "agent". Sends may come from two threads (the
    controller's heartbeat); receives from one."""

    def __init__(self, sock: socket.socket, key: bytes, role: str, peer: str = "the peer",
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        if len(key) < 16:
            raise ValueError("the job's key is too short")
        self.sock, self.key, self.role, self.peer = sock, key, role, peer
        self.out_dir = TO_AGENT if role == "controller" else TO_CONTROLLER
        self.in_dir = TO_CONTROLLER if role == "controller" else TO_AGENT
        self.nonce: bytes | None = None  # the controller's, once sent or received
        self.sent = self.got = 0  # frames so far per direction (the sequence numbers)
        self.buf = bytearray()
        self.backlog: list = []  # frames read by `recv` beyond the one it returned
        self.authenticated = False
        self.heartbeat_s = heartbeat_s
        self.last_heard = self.last_sent = time.monotonic()
        self.lock = threading.Lock()
        self.closed = False

    # -- frames out ------------------------------------------------------------------------
    def _mac(self, direction: bytes, seq: int, frame: bytes | bytearray | memoryview) -> bytes:
        h = hashlib.blake2b(digest_size=MAC_BYTES, key=self.key)
        h.update(direction + (self.nonce or b"") + seq.to_bytes(8, "big"))
        h.update(frame)
        return h.digest()

    def frame(self, kind: str, header: dict | None = None, payload=b"") -> list:
        """The next frame of this direction as the buffers to send in order (its sequence
        number taken): send them next. `payload`: a buffer, or a list of buffers sent one
        after another (never joined: a case's inputs are not copied to be framed)."""
        head = json.dumps(header or {}, separators=(",", ":")).encode()
        parts = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        parts = [_bytes_view(p) for p in parts]
        size = sum(p.nbytes for p in parts)
        lead = _HEAD.pack(1 + 4 + len(head) + size, CODE[kind], len(head)) + head
        h = hashlib.blake2b(digest_size=MAC_BYTES, key=self.key)
        h.update(self.out_dir + (self.nonce or b"") + self.sent.to_bytes(8, "big"))
        h.update(lead)
        for p in parts:
            h.update(p)
        self.sent += 1
        return [lead, *(p for p in parts if p.nbytes), h.digest()]

    def pack(self, kind: str, header: dict | None = None, payload=b"") -> bytes:
        """The next frame of this direction, whole (its sequence number taken)."""
        return b"".join(self.frame(kind, header, payload))

    def send(self, kind: str, header: dict | None = None, payload=b"") -> None:
        """A frame, sent whole (blocking; WireError where the connection is gone)."""
        with self.lock:
            if self.closed:
                raise WireError(f"the connection to {self.peer} is closed")
            parts = self.frame(kind, header, payload)
            try:
                for part in parts:
                    self.sock.sendall(part)
            except OSError as exc:
                raise WireError(f"the connection to {self.peer} failed ({exc})") from None
            self.last_sent = time.monotonic()

    def beat(self) -> None:
        """A HEARTBEAT where nothing was sent for a heartbeat's time."""
        if time.monotonic() - self.last_sent >= self.heartbeat_s:
            self.send("HEARTBEAT", {"t": time.monotonic()})

    # -- frames in -------------------------------------------------------------------------
    def take(self, data: bytes) -> list[tuple[str, dict, bytes]]:
        """The frames whole in what came so far (`data` added): (type, header, payload)
        each, checked; WireError at the first that fails."""
        if data:
            self.buf += data
            self.last_heard = time.monotonic()
        frames = []
        while len(self.buf) >= 4:
            (length,) = struct.unpack_from("!I", self.buf)
            most = MAX_FRAME if self.authenticated else HANDSHAKE_BYTES
            if length > most or length < 5:
                raise WireError(f"{self.peer} sent a frame of {length} bytes (at most {most} "
                                f"{'' if self.authenticated else 'before the handshake '}"
                                "allowed): refused")
            end = 4 + length + MAC_BYTES
            if len(self.buf) < end:
                break
            view = memoryview(self.buf)
            frame = view[:4 + length]
            try:
                mac = bytes(view[4 + length:end])
                _len, code, hlen = _HEAD.unpack_from(frame)
                if hlen > min(length - 5, MAX_HEADER):
                    raise WireError(f"{self.peer} sent a frame whose header overruns it: "
                                    "refused")
                try:
                    header = json.loads(bytes(frame[9:9 + hlen]))
                except ValueError:
                    header = None
                if self.nonce is None and self.role == "agent" and code == CODE["CHALLENGE"] \
                        and isinstance(header, dict):
                    try:  # the first frame names the connection's nonce its MAC covers
                        self.nonce = bytes.fromhex(str(header.get("nonce", "")))
                    except ValueError:
                        self.nonce = b""
                want = self._mac(self.in_dir, self.got, frame)
                if not hmac.compare_digest(want, mac):
                    raise WireError(f"frame {self.got} from {self.peer} failed its check (a "
                                    "wrong key, or a frame altered, replayed or reordered): "
                                    "refused")
                payload = bytes(frame[9 + hlen:])  # the one copy a frame's payload costs
            finally:
                frame.release()
                view.release()
            del self.buf[:end]
            self.got += 1
            if code not in NAME or not isinstance(header, dict):
                raise WireError(f"{self.peer} sent a frame of no known kind ({code})")
            frames.append((NAME[code], header, payload))
        return frames

    def receive(self, most: int = 1 << 20) -> list[tuple[str, dict, bytes]]:
        """The frames whole after one read of what is there (non-blocking socket, or one
        that select said is readable); WireError where the connection closed."""
        ahead, self.backlog = self.backlog, []
        if ahead:  # (what was read ahead is given first; the socket may hold nothing more)
            return ahead
        try:
            data = self.sock.recv(most)
        except (BlockingIOError, InterruptedError):
            return ahead + self.take(b"")
        except OSError as exc:
            raise WireError(f"the connection to {self.peer} failed ({exc})") from None
        if not data:
            raise WireError(f"{self.peer} closed the connection")
        return ahead + self.take(data)

    def recv(self, timeout: float) -> tuple[str, dict, bytes]:
        """The next frame, waiting `timeout` seconds at most (WireError after), heartbeats
        passed over."""
        import select

        deadline = time.monotonic() + timeout
        self.backlog += self.take(b"")
        while True:
            while self.backlog:
                frame = self.backlog.pop(0)
                if frame[0] != "HEARTBEAT":
                    return frame
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"{self.peer} said nothing within {timeout:g} s")
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                self.backlog += self.receive()

    def silent(self) -> bool:
        """Whether the peer said nothing for SILENCE_BEATS heartbeats (read what is there
        first: a peer is silent only where nothing waits in the socket either)."""
        return time.monotonic() - self.last_heard > self.heartbeat_s * SILENCE_BEATS

    def close(self) -> None:
        with self.lock:
            self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


# -- the handshake -------------------------------------------------------------------------
def controller_handshake(ch: Channel, job: str, nodes: int, timeout: float = AUTH_S) -> dict:
    """The controller's side: CHALLENGE, the agent's HELLO checked (its node one of
    `range(nodes)`), WELCOME answered. Returns the HELLO's header; WireError where anything
    is wrong or late (the caller closes the connection, unread further)."""
    deadline = time.monotonic() + timeout
    ch.nonce = secrets.token_bytes(NONCE_BYTES)
    ch.send("CHALLENGE", {"nonce": ch.nonce.hex()})
    kind, hello, _ = ch.recv(max(deadline - time.monotonic(), 0.0))
    if kind != "HELLO":
        raise WireError(f"{ch.peer} sent {kind} where its HELLO was due")
    node = hello.get("node")
    if not isinstance(node, int) or not 0 <= node < nodes:
        raise WireError(f"{ch.peer} claimed node {node!r}, which the job does not have")
    if not hmac.compare_digest(str(hello.get("answer", "")), answer(ch.key, ch.nonce, job, node)):
        raise WireError(f"{ch.peer} did not prove the job's key (node {node}): refused")
    try:
        theirs = bytes.fromhex(str(hello.get("nonce", "")))
    except ValueError:
        theirs = b""
    if len(theirs) != NONCE_BYTES:
        raise WireError(f"{ch.peer} sent no nonce of its own: refused")
    ch.authenticated = True
    hello["welcome"] = answer(ch.key, theirs, job, node)
    return hello


def welcome(ch: Channel, hello: dict, **fields) -> None:
    """The controller's WELCOME to an agent whose HELLO passed (`controller_handshake`)."""
    ch.send("WELCOME", {**fields, "answer": hello["welcome"]})


def agent_handshake(ch: Channel, job: str, node: int, about: dict,
                    timeout: float = AUTH_S) -> dict:
    """The agent's side: the controller's CHALLENGE, HELLO (with `about`: host, pid, ...),
    the controller's WELCOME checked. Returns the WELCOME's header."""
    deadline = time.monotonic() + timeout
    kind, challenge, _ = ch.recv(timeout)
    if kind != "CHALLENGE" or not ch.nonce or len(ch.nonce) != NONCE_BYTES:
        raise WireError("the controller sent no challenge")
    mine = secrets.token_bytes(NONCE_BYTES)
    ch.send("HELLO", {**about, "node": node, "nonce": mine.hex(),
                      "answer": answer(ch.key, ch.nonce, job, node)})
    kind, welcome, _ = ch.recv(max(deadline - time.monotonic(), 0.0) + timeout)
    if kind != "WELCOME":
        raise WireError(f"the controller sent {kind} where its WELCOME was due")
    if not hmac.compare_digest(str(welcome.get("answer", "")), answer(ch.key, mine, job, node)):
        raise WireError("the controller did not prove the job's key")
    ch.authenticated = True
    return welcome


# -- clocks --------------------------------------------------------------------------------
def best_offset(samples: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, uncertainty) of a peer's clock from SYNC exchanges (t0: ours when sent, ta:
    the peer's when it answered, t1: ours when the answer came): the exchange with the
    smallest round trip, offset = ta - (t0 + t1) / 2, uncertainty half its round trip."""
    t0, ta, t1 = min(samples, key=lambda s: s[2] - s[0])
    return ta - (t0 + t1) / 2, (t1 - t0) / 2


# -- arrays --------------------------------------------------------------------------------
def pack_arrays(arrays, recipes: bool = False) -> tuple[list, list]:
    """(name, array) pairs as a header's list [name, dtype, shape] and the payload's parts
    (buffers, sent in order: `Channel.send` takes them as they are). `recipes`: an array
    drawn with a recipe (`draws.recipe_of`) goes as [name, dtype, shape, recipe] with no
    bytes; the agent draws it (`unpack_arrays`)."""
    import numpy as np

    from .draws import recipe_of

    meta, parts = [], []
    for name, a in arrays:
        recipe = recipe_of(a) if recipes else None
        if recipe is not None:
            meta.append([name, a.dtype.str, [int(x) for x in a.shape], recipe])
            continue
        a = np.ascontiguousarray(a)
        meta.append([name, a.dtype.str, [int(x) for x in a.shape]])
        if a.nbytes:
            parts.append(memoryview(a).cast("B"))
    return meta, parts


def unpack_arrays(meta, payload: bytes) -> list:
    """The (name, array) pairs `pack_arrays` made (numeric dtypes only; WireError where the
    sizes do not add up, or a recipe does not make what its entry says): a recipe's array is
    drawn here."""
    import numpy as np

    from .draws import RecipeError, make

    out, at = [], 0
    try:
        for entry in meta:
            name, dtype, shape = entry[:3]
            dt = np.dtype(dtype)
            if dt.kind not in "biufc" or dt.hasobject:
                raise WireError(f"an array of dtype {dtype!r} is refused")
            if len(entry) == 4:
                try:
                    a = make(entry[3])
                except RecipeError as exc:
                    raise WireError(str(exc)) from None
                if a.dtype != dt or list(a.shape) != [int(x) for x in shape]:
                    raise WireError(f"a recipe made {a.dtype}{list(a.shape)} where its entry "
                                    f"said {dt}{list(shape)}")
                out.append((str(name), a))
                continue
            n = 1
            for x in shape:
                n *= int(x)
            size = n * dt.itemsize
            if at + size > len(payload):
                raise WireError("a frame's arrays overrun its payload")
            out.append((str(name), np.frombuffer(payload, dt, n, at).reshape(shape)))
            at += size
    except (TypeError, ValueError) as exc:
        raise WireError(f"a frame's arrays could not be read ({exc})") from None
    return out
