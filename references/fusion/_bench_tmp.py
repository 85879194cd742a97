import sys, time, threading
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD.Dup()
n, rank = comm.Get_size(), comm.Get_rank()

def v_allgather(a, b, c):
    m = a.shape[0]
    A = np.empty((n * m, a.shape[1]))
    comm.Allgather(a, A)
    np.matmul(A, b, out=c)

def v_ring(a, b, c):
    m, k = a.shape
    A = np.empty((n * m, k))
    A[rank*m:(rank+1)*m] = a
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        si = (rank - s) % n
        ri = (rank - s - 1) % n
        reqs = [comm.Irecv(A[ri*m:(ri+1)*m], source=left, tag=s),
                comm.Isend(A[si*m:(si+1)*m], dest=right, tag=s)]
        np.matmul(A[si*m:(si+1)*m], b, out=c[si*m:(si+1)*m])
        MPI.Request.Waitall(reqs)
    li = (rank + 1) % n
    np.matmul(A[li*m:(li+1)*m], b, out=c[li*m:(li+1)*m])

def v_iallgather(a, b, c):
    m, k = a.shape
    A = np.empty((n * m, k))
    req = comm.Iallgather(a, A)
    np.matmul(a, b, out=c[rank*m:(rank+1)*m])
    req.Wait()
    if rank > 0:
        np.matmul(A[:rank*m], b, out=c[:rank*m])
    if rank < n - 1:
        np.matmul(A[(rank+1)*m:], b, out=c[(rank+1)*m:])

def v_thread(a, b, c):
    m, k = a.shape
    A = np.empty((n * m, k))
    A[rank*m:(rank+1)*m] = a
    right, left = (rank + 1) % n, (rank - 1) % n
    ready = [threading.Event() for _ in range(n)]
    def mover():
        for s in range(n - 1):
            si = (rank - s) % n
            ri = (rank - s - 1) % n
            comm.Sendrecv(A[si*m:(si+1)*m], dest=right, sendtag=s, recvbuf=A[ri*m:(ri+1)*m], source=left, recvtag=s)
            ready[ri].set()
    th = threading.Thread(target=mover); th.start()
    np.matmul(a, b, out=c[rank*m:(rank+1)*m])
    for s in range(n - 1):
        ri = (rank - s - 1) % n
        ready[ri].wait()
        np.matmul(A[ri*m:(ri+1)*m], b, out=c[ri*m:(ri+1)*m])
    th.join()


import queue
class Worker:
    def __init__(self):
        self.q = queue.SimpleQueue()
        self.t = threading.Thread(target=self.loop, daemon=True); self.t.start()
    def loop(self):
        while True:
            fn = self.q.get()
            fn()
W = Worker()

def v_pthread_ag(a, b, c):
    m, k = a.shape
    if m * k * 8 * n < (1 << 16):
        return v_allgather(a, b, c)
    A = np.empty((n * m, k))
    done = threading.Event()
    def job():
        comm.Allgather(a, A); done.set()
    W.q.put(job)
    np.matmul(a, b, out=c[rank*m:(rank+1)*m])
    done.wait()
    if rank > 0:
        np.matmul(A[:rank*m], b, out=c[:rank*m])
    if rank < n - 1:
        np.matmul(A[(rank+1)*m:], b, out=c[(rank+1)*m:])

def v_pthread_ring(a, b, c):
    m, k = a.shape
    if m * k * 8 * n < (1 << 16):
        return v_allgather(a, b, c)
    A = np.empty((n * m, k))
    A[rank*m:(rank+1)*m] = a
    right, left = (rank + 1) % n, (rank - 1) % n
    ready = [threading.Event() for _ in range(n)]
    def job():
        for s in range(n - 1):
            si = (rank - s) % n
            ri = (rank - s - 1) % n
            comm.Sendrecv(A[si*m:(si+1)*m], dest=right, sendtag=s, recvbuf=A[ri*m:(ri+1)*m], source=left, recvtag=s)
            ready[ri].set()
    W.q.put(job)
    np.matmul(a, b, out=c[rank*m:(rank+1)*m])
    for s in range(n - 1):
        ri = (rank - s - 1) % n
        ready[ri].wait()
        np.matmul(A[ri*m:(ri+1)*m], b, out=c[ri*m:(ri+1)*m])

V = dict(pthread_ag=v_pthread_ag, pthread_ring=v_pthread_ring, allgather=v_allgather, ring=v_ring, iallgather=v_iallgather, )
k = nn = 128
for m in [int(x) for x in sys.argv[1].split(",")]:
    rng = np.random.default_rng(rank)
    a = rng.integers(-512,512,(m,k))/64.; b = rng.integers(-512,512,(k,nn))/64.
    As = comm.allgather(a); want = np.concatenate(As) @ b
    res = {}
    for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
      for name, f in V.items():
        c = np.full((n*m, nn), np.nan)
        f(a, b, c); assert np.array_equal(c, want), name
        ts = []
        for _ in range(30):
            comm.Barrier(); t = time.perf_counter(); f(a, b, c); ts.append(time.perf_counter() - t)
        ts = np.array(ts); comm.Allreduce(MPI.IN_PLACE, ts, op=MPI.MAX)
        res.setdefault(name, []).append(np.median(ts) * 1e6)
    if rank == 0:
        print(m, {k_: round(min(v), 1) for k_, v in res.items()}, "thread", MPI.Query_thread(), flush=True)
