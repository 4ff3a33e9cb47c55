#!/usr/bin/env python3
"""PyTorch's torch.distributed (backend "nccl") on oxccl's libnccl.so.2.

Run with the library preloaded (torch's RPATH wins over LD_LIBRARY_PATH):

    LD_PRELOAD=/abs/path/libnccl.so.2 python3 check_torch.py --procs 4

It starts N rank processes on the one visible GPU (NCCL itself refuses
two ranks on one GPU: "Duplicate GPU detected"), and each checks every
collective against values it computes itself, then runs 20 DDP steps and
compares the weights with the same training done in one process. A check
can fail: the DDP comparison is also made against a reference that drops
one rank's gradient, which must differ. Exit status 0 only if every rank
passed. `--bench` adds all_reduce timings (256 MiB, and 8 B latency);
`--graph-premul` adds PREMUL_SUM with a tensor factor captured in a CUDA
graph and replayed with the factor changed between replays.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    port = free_port()
    procs = []
    for r in range(args.procs):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.procs), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, __file__, "--rank", str(r), "--procs", str(args.procs)]
        if args.bench:
            cmd.append("--bench")
        if args.graph_premul:
            cmd.append("--graph-premul")
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.time() + args.timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"torch-check procs={args.procs}: TIMEOUT after {args.timeout}s", flush=True)
            return 1
    ok = all(c == 0 for c in codes)
    print(f"torch-check procs={args.procs}: {'PASS' if ok else 'FAIL'} exit codes {codes}", flush=True)
    return 0 if ok else 1


class Checks:
    def __init__(self, rank):
        self.rank, self.failed, self.passed = rank, [], 0

    def eq(self, name, got, want, tol=0.0):
        import torch
        got, want = got.float().cpu(), want.float().cpu()
        bad = got.shape != want.shape or not torch.allclose(got, want, atol=tol, rtol=0)
        if bad:
            self.failed.append(name)
            print(f"rank {self.rank}: FAIL {name}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}",
                  flush=True)
        else:
            self.passed += 1


def collectives(dist, torch, c, n, r, dev):
    k = 1000
    full = lambda v, dt=torch.float32: torch.full((k,), float(v), device=dev, dtype=dt)
    s = n * (n + 1) / 2
    x = full(r + 1); dist.all_reduce(x, op=dist.ReduceOp.SUM); c.eq("all_reduce sum", x, full(s))
    x = full(r + 1); dist.all_reduce(x, op=dist.ReduceOp.MAX); c.eq("all_reduce max", x, full(n))
    x = full(r + 1); dist.all_reduce(x, op=dist.ReduceOp.MIN); c.eq("all_reduce min", x, full(1))
    x = full(r + 1); dist.all_reduce(x, op=dist.ReduceOp.AVG); c.eq("all_reduce avg", x, full(s / n), 1e-6)
    x = full(r + 1); dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    c.eq("all_reduce premul_sum", x, full(2 * s))
    # A tensor factor is ncclScalarDevice: read from device memory per call.
    f = torch.tensor([0.5 * (r + 1)], device=dev)
    x = full(2.0); dist.all_reduce(x, op=dist._make_nccl_premul_sum(f))
    c.eq("all_reduce premul_sum (tensor factor)", x, full(s))
    for dt in (torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.float64):
        x = full(r + 1, dt); dist.all_reduce(x); c.eq(f"all_reduce {dt}", x, full(s, dt))
    root = 1 % n
    x = full(r * 10); dist.broadcast(x, src=root); c.eq("broadcast", x, full(root * 10))
    x = full(r + 1); dist.reduce(x, dst=0)
    if r == 0:
        c.eq("reduce", x, full(s))
    out = torch.empty(n * k, device=dev)
    dist.all_gather_into_tensor(out, full(r))
    c.eq("all_gather_into_tensor", out, torch.arange(n, device=dev).float().repeat_interleave(k))
    inp = torch.arange(n * k, device=dev).float() + r
    out = torch.empty(k, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    want = n * (torch.arange(r * k, (r + 1) * k, device=dev).float()) + s - n
    c.eq("reduce_scatter_tensor", out, want)
    inp = torch.cat([full(r * 100 + j) for j in range(n)])
    out = torch.empty(n * k, device=dev)
    dist.all_to_all_single(out, inp)
    c.eq("all_to_all_single", out, torch.cat([full(i * 100 + r) for i in range(n)]))
    # send/recv between pairs (a 2-rank communicator per pair), then a
    # ring in one batch (grouped Send/Recv).
    if n % 2 == 0:
        peer = r ^ 1
        x = full(r + 7)
        if r % 2 == 0:
            dist.send(x, dst=peer); y = full(-1); dist.recv(y, src=peer)
        else:
            y = full(-1); dist.recv(y, src=peer); dist.send(x, dst=peer)
        c.eq("send/recv", y, full(peer + 7))
    nxt, prv = (r + 1) % n, (r - 1) % n
    y = full(-1)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, full(r), nxt), dist.P2POp(dist.irecv, y, prv)])
    for q in reqs:
        q.wait()
    c.eq("batch_isend_irecv ring", y, full(prv))
    dist.barrier()
    half = list(range(max(1, n // 2)))
    g = dist.new_group(ranks=half)
    if r in half:
        x = full(r + 1); dist.all_reduce(x, group=g)
        c.eq("new_group all_reduce", x, full(len(half) * (len(half) + 1) / 2))
    dist.barrier()


def mem_pool(dist, torch, c, n, r, dev):
    """A tensor from torch's NCCL memory pool (ncclMemAlloc behind
    torch.cuda.MemPool), registered with the communicator (ncclCommRegister
    through register_mem_pool), then an all_reduce on it."""
    try:
        backend = dist.group.WORLD._get_backend(dev)
        alloc = backend.mem_allocator
        pool = torch.cuda.MemPool(alloc)
    except (AttributeError, RuntimeError, TypeError) as e:
        print(f"rank {r}: mem pool check skipped: this torch has no NCCL mem pool ({e})", flush=True)
        return
    k = 1 << 20
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((k,), float(r + 1), device=dev)
    backend.register_mem_pool(pool)
    dist.all_reduce(x)
    c.eq("all_reduce on ncclMemAlloc memory, registered", x,
         torch.full((k,), n * (n + 1) / 2, device=dev))
    backend.deregister_mem_pool(pool)
    torch.cuda.synchronize()
    del x


def graph_premul(dist, torch, c, n, r, dev):
    """PREMUL_SUM with a tensor factor (ncclScalarDevice) captured in a CUDA
    graph: the factor is read when each replay runs, so changing it between
    replays changes the result (a value read at capture would not)."""
    k = 1000
    f = torch.tensor([1.0], device=dev)
    x = torch.zeros(k, device=dev)
    op = dist._make_nccl_premul_sum(f)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.fill_(1.0); dist.all_reduce(x, op=op)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(x, op=op)
    for scale in (0.5, 3.0):
        f.fill_(scale * (r + 1))
        x.fill_(2.0)
        g.replay()
        torch.cuda.synchronize()
        want = 2.0 * scale * n * (n + 1) / 2
        c.eq(f"graph-captured premul_sum (tensor factor {scale} x rank)", x, torch.full((k,), want, device=dev))
    del g


def ddp_subgroups(dist, torch, c, n, r, dev):
    """DDP in two subgroups at once (even ranks, odd ranks), each over its
    own communicator split from the world, as data-parallel groups inside
    a tensor-parallel job are: each group's weights must match its own
    members' training and not the other group's."""
    if n < 4:
        return
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    groups = [dist.new_group(ranks=evens), dist.new_group(ranks=odds)]
    mine = evens if r % 2 == 0 else odds
    ddp(dist, torch, c, n, r, dev, group=groups[r % 2], members=mine, label=f"ddp subgroup {mine}")
    dist.barrier()


def ddp(dist, torch, c, n, r, dev, group=None, members=None, label="ddp"):
    from torch.nn.parallel import DistributedDataParallel as DDP
    steps, per = 20, 16
    members = list(range(n)) if members is None else members
    me = members.index(r)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)

    gen = torch.Generator(device="cpu").manual_seed(1)
    data = [(torch.randn(n * per, 32, generator=gen), torch.randn(n * per, 8, generator=gen)) for _ in range(steps)]
    m = DDP(model(), device_ids=[dev.index], process_group=group)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for xb, yb in data:
        opt.zero_grad()
        sl = slice(members[me] * per, (members[me] + 1) * per)
        torch.nn.functional.mse_loss(m(xb[sl].to(dev)), yb[sl].to(dev)).backward()
        opt.step()

    def reference(ranks):
        ref = model()
        o = torch.optim.SGD(ref.parameters(), lr=0.1)
        for xb, yb in data:
            o.zero_grad()
            idx = torch.cat([torch.arange(q * per, (q + 1) * per) for q in ranks])
            torch.nn.functional.mse_loss(ref(xb[idx].to(dev)), yb[idx].to(dev)).backward()
            o.step()
        return torch.cat([p.detach().flatten() for p in ref.parameters()])

    got = torch.cat([p.detach().flatten() for p in m.module.parameters()])
    tol = 1e-5
    c.eq(f"{label} 20 steps vs one process", got, reference(members), tol)
    if len(members) > 1:
        # The comparison can fail: a reference without the last member's
        # data must be told apart at the same tolerance.
        dropped = reference(members[:-1])
        if torch.allclose(got.cpu(), dropped.cpu(), atol=tol, rtol=0):
            c.failed.append(f"{label} self-test: a dropped rank went unnoticed")
        else:
            c.passed += 1
    return float((got - reference(members)).abs().max())


def bench(dist, torch, n, r, dev):
    res = {}
    for name, elems, iters in (("256MiB", 64 << 20, 10), ("8B", 2, 200)):
        x = torch.ones(elems, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / iters
        nbytes = elems * 4
        res[name] = {"us": dt * 1e6, "algbw_GBs": nbytes / dt / 1e9, "busbw_GBs": nbytes / dt / 1e9 * 2 * (n - 1) / n}
    return res


def rank_main(args):
    import torch
    import torch.distributed as dist
    n, r = args.procs, args.rank
    maps = open("/proc/self/maps").read()
    pre = os.environ.get("LD_PRELOAD", "")
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    c = Checks(r)
    if not pre or os.path.realpath(pre) not in maps:
        c.failed.append(f"libnccl.so.2 from LD_PRELOAD={pre!r} is not mapped")
    dist.init_process_group("nccl", rank=r, world_size=n, device_id=dev)
    ver = torch.cuda.nccl.version()
    t0 = time.time()
    collectives(dist, torch, c, n, r, dev)
    mem_pool(dist, torch, c, n, r, dev)
    if args.graph_premul:
        graph_premul(dist, torch, c, n, r, dev)
    ddp_diff = ddp(dist, torch, c, n, r, dev)
    ddp_subgroups(dist, torch, c, n, r, dev)
    out = {"rank": r, "procs": n, "nccl_version": list(ver) if isinstance(ver, tuple) else ver,
           "passed": c.passed, "failed": c.failed, "ddp_max_abs_diff": ddp_diff,
           "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "seconds": round(time.time() - t0, 2)}
    if args.bench:
        out["bench"] = bench(dist, torch, n, r, dev)
    dist.destroy_process_group()
    if r == 0 or c.failed:
        print("torch-check " + json.dumps(out), flush=True)
    return 1 if c.failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--bench", action="store_true")
    # Off by default: CUDA processes staged through the host (no MPS) read
    # a device scalar on the host, which is refused under capture.
    ap.add_argument("--graph-premul", action="store_true")
    ap.add_argument("--timeout", type=int, default=240)
    a = ap.parse_args()
    sys.exit(rank_main(a) if a.rank is not None else launch(a))
