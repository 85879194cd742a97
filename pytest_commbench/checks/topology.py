"""Host topology: from the (virtual) host each rank is on, every rank derives its place.

host_topology: the harness gives each rank a host name (ctx.hostname, Trial.extra) so that
the ranks are spread over 1..world virtual hosts in a random interleaving. Every rank writes
`topo`, int64 of shape (4,):
  [local_rank  index of this rank among the ranks on its host, in global-rank order,
   local_size  number of ranks on its host,
   node_index  its host's number, hosts numbered 0.. in the order of their lowest global rank,
   leader      the lowest global rank on its host]

count is unused (the sizes list is [0]): the case is the layout, and every trial draws a new
one. The layouts of one case always include a single host, one host per rank, and (from three
ranks on) interleaved layouts that no block-layout formula gets right; host names never sort
in the order of the hosts' lowest ranks.
"""

from __future__ import annotations

import string

import numpy as np

from .base import Case, Op, Trial

FIELDS = ("local_rank", "local_size", "node_index", "leader")


def _names(rng: np.random.Generator, hosts: int) -> list[str]:
    """`hosts` distinct host names, in an order that is not their sorted order (hosts >= 2)."""
    letters = np.array(list(string.ascii_lowercase + string.digits))
    names: list[str] = []
    while len(names) < hosts:
        name = "node-" + "".join(rng.choice(letters, size=int(rng.integers(2, 7))))
        if name not in names:
            names.append(name)
    if hosts >= 2 and names == sorted(names):
        names[0], names[1] = names[1], names[0]
    return names


def topology(hosts_of: list[str]) -> list[list[int]]:
    """The expected topo row of every rank, from the host name of every rank."""
    first: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts_of):
        first.setdefault(host, len(first))
        members.setdefault(host, []).append(rank)
    return [[members[h].index(r), len(members[h]), first[h], members[h][0]]
            for r, h in enumerate(hosts_of)]


def _interleaved(layout: list[int]) -> bool:
    """True when block-layout shortcuts fail: some host's ranks are not contiguous, and some
    rank's local index differs both from rank % local_size and from rank - leader."""
    topo = topology([str(h) for h in layout])
    contiguous = all(
        layout[r] == layout[r - 1] or layout[r] not in layout[:r] for r in range(1, len(layout))
    )
    modulo = any(t[0] != r % t[1] for r, t in enumerate(topo))
    offset = any(t[0] != r - t[3] for r, t in enumerate(topo))
    return not contiguous and modulo and offset


def _layout(rng: np.random.Generator, world: int, hosts: int, interleaved: bool) -> list[int]:
    """Host of every rank, numbered by first appearance, every host used at least once."""
    for _ in range(1000):
        raw = np.concatenate([np.arange(hosts), rng.integers(0, hosts, size=world - hosts)])
        rng.shuffle(raw)
        order: dict[int, int] = {}
        layout = [order.setdefault(int(h), len(order)) for h in raw]
        if not interleaved or _interleaved(layout):
            return layout
    raise RuntimeError(f"no interleaved layout of {world} ranks on {hosts} hosts")


class HostTopology(Op):
    name = "host_topology"
    exact = True

    def args(self, params):
        return ["topo"]

    def make_trial(self, rng, count, dtype, world, params):
        raise NotImplementedError  # layouts are chosen together in make_case

    def make_case(self, rng, case_id, count, dtype, world, params, trials, reps):
        middle = list(range(2, world))  # host counts that allow an interleaved layout
        # trial 0 (also the layout of the timed repetitions) is interleaved when it can be;
        # then one host, one host per rank, and more interleaved (or random) layouts
        plan = [int(rng.choice(middle)) if middle else world, 1, world]
        while len(plan) < max(trials, 3):
            plan.append(int(rng.choice(middle)) if middle else int(rng.integers(1, world + 1)))
        plan = plan[:1] + [plan[i] for i in rng.permutation(np.arange(1, len(plan)))]
        made = []
        for hosts in plan:
            layout = _layout(rng, world, hosts, interleaved=2 <= hosts < world)
            names = _names(rng, hosts)
            extra = [{"hostname": names[h]} for h in layout]
            made.append(Trial([{} for _ in range(world)],
                              [{"topo": ((len(FIELDS),), "int64")} for _ in range(world)],
                              extra, [0.0] * world))
        return Case(case_id, count, dtype, world, dict(params), self.args(params), made, op=self)

    def expected(self, trial, count, dtype, world, params):
        rows = topology([e["hostname"] for e in trial.extra])
        return [{"topo": np.asarray(row, dtype=np.int64)} for row in rows]

    def bytes(self, count, dtype, world, params):
        return 0, 1.0


OPS = {"host_topology": HostTopology()}
