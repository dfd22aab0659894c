#!/usr/bin/env python3
"""
torch-trainer.py: how long a GPU sits idle when larder feeds a PyTorch
training loop, against the same loop fed from host memory, in one run.

    python3 bench/torch-trainer.py BUILD_DIR 'SOURCE_GLOB' [--step-us 1000 200]

BUILD_DIR is a build directory or a bundle from bench/bundle.sh: the script
starts BUILD_DIR/bin/larderd on a temporary socket and cache and loads
BUILD_DIR/lib/liblarder.so through ctypes (the bindings of
tests/python/test_ctypes.py).

The loop is what a trainer with pinned-memory prefetch does.  For each batch
it takes the next larder batch, copies its buffers into one of RING pinned
host buffers, releases the batch, starts an asynchronous copy to the GPU,
and queues the step: a kernel that keeps the GPU busy for a fixed time
(torch.cuda._sleep, calibrated first) and a reduction that reads the copied
bytes.  The host runs up to RING batches ahead of the GPU, as a DataLoader
with pin_memory does, so the GPU idles only when the host cannot fetch and
stage batches as fast as the GPU steps.

For each step time it prints, per epoch:
  - the GPU's busy fraction: steps x step time over the epoch's wall time;
  - the same loop's busy fraction with its batches memmoved from one host
    buffer instead (the peer: everything but larder);
  - the idle time larder adds, 1 - peer wall / larder wall;
  - liblarder's own stall figure for the stream.
Epoch 0 starts with an empty cache, so it includes decoding.

Without PyTorch or a GPU (--device cpu, or when torch is missing) the step
is a busy wait on the host and the copy goes to a host buffer, which checks
the bindings on a machine without a GPU; its figures say nothing about GPUs.
"""
import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import test_ctypes as lt  # noqa: E402  (the bindings and the daemon wrapper)

RING = 4
COLUMNS = ["label", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "weight",
           "image", "embedding"]


class Buffers:
    """Finds every buffer of a batch with one larder_batch_describe call
    (the larder_array_* accessors took about 80 calls a batch)."""

    HEAD, WORDS = 8, 12  # larder_batch_info_t and larder_array_info_t, in int64 words

    def __init__(self, lib):
        self.fn = lib.larder_batch_describe
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self.n = None

    def __call__(self, b):
        """[(pointer, bytes)] of batch b's buffers, columns and children."""
        if self.n is None:
            self.n = self.fn(b, None, None, 0)
            self.buf = (ctypes.c_int64 * (self.HEAD + self.n * self.WORDS))()
            addr = ctypes.addressof(self.buf)
            self.args = (addr, addr + self.HEAD * 8, self.n)
        self.fn(b, *self.args)
        v = self.buf[:]
        out = []
        for k in range(self.HEAD, len(v), self.WORDS):
            n, ow = v[k + 6], v[k + 2]
            validity, offsets, values = v[k + 8], v[k + 9], v[k + 10]
            if validity:
                out.append((validity, (n + 7) // 8))
            if offsets:
                out.append((offsets, (n + 1) * ow))
            if values:
                out.append((values, v[k + 11]))
        return out


class Gpu:
    """The device side: pinned staging ring, copies and the timed step."""

    def __init__(self, torch, cap):
        self.torch = torch
        self.dev = torch.device("cuda")
        self.pinned = [torch.empty(cap, dtype=torch.uint8).pin_memory() for _ in range(RING)]
        self.on_gpu = [torch.empty(cap, dtype=torch.uint8, device=self.dev) for _ in range(RING)]
        self.done = [None] * RING
        self.acc = torch.zeros((), dtype=torch.int64, device=self.dev)
        self.cycles_per_us = self.calibrate()

    def calibrate(self):
        t = self.torch
        t.cuda._sleep(1000000)
        t.cuda.synchronize()
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        n = 20000000
        a.record()
        t.cuda._sleep(n)
        b.record()
        b.synchronize()
        return n / (a.elapsed_time(b) * 1000)

    def slot(self, k):
        """Returns slot k's pinned buffer address once its last copy ended."""
        if self.done[k] is not None:
            self.done[k].synchronize()
        return self.pinned[k].data_ptr()

    def step(self, k, size, step_us):
        t = self.torch
        self.on_gpu[k][:size].copy_(self.pinned[k][:size], non_blocking=True)
        ev = t.cuda.Event()
        ev.record()
        self.done[k] = ev
        t.cuda._sleep(int(step_us * self.cycles_per_us))
        self.acc += self.on_gpu[k][:size].sum(dtype=t.int64)

    def sync(self):
        self.torch.cuda.synchronize()


class Cpu:
    """The host stand-in: a copy to a host buffer and a busy-wait step."""

    def __init__(self, cap):
        self.bufs = [ctypes.create_string_buffer(cap) for _ in range(RING)]

    def slot(self, k):
        return ctypes.addressof(self.bufs[k])

    def step(self, k, size, step_us):
        end = time.perf_counter() + step_us / 1e6
        while time.perf_counter() < end:
            pass

    def sync(self):
        pass


def run_larder(L, lib, dev, sock, source, epochs, step_us, batch_size, seed):
    """Returns one dict per epoch for a stream read with the given step."""
    rc, client = L.connect(sock)
    lt.check(rc == 0, "connect: " + L.err(rc))
    opts = L.options([source], COLUMNS, batch_size=batch_size, seed=seed, epochs=epochs,
                     rank=0, world_size=1)
    stream = L.open_ok(client, opts)
    per_epoch = lib.larder_stream_batches_per_epoch(stream)
    find = Buffers(lib)
    rows = []
    k = 0
    for epoch in range(epochs):
        w0, c0 = ctypes.c_uint64(), ctypes.c_uint64()
        lib.larder_stream_stall(stream, ctypes.byref(w0), ctypes.byref(c0))
        dev.sync()
        t0 = time.perf_counter()
        moved = 0
        for _ in range(per_epoch):
            rc, b = L.next(stream, 60000)
            lt.check(rc == 0, "next: " + L.err(rc))
            bufs = find(b)
            dst = dev.slot(k)
            pos = 0
            for ptr, size in bufs:
                ctypes.memmove(dst + pos, ptr, size)
                pos += size
            lib.larder_batch_release(b)
            dev.step(k, pos, step_us)
            moved += pos
            k = (k + 1) % RING
        dev.sync()
        wall = time.perf_counter() - t0
        w1, c1 = ctypes.c_uint64(), ctypes.c_uint64()
        lib.larder_stream_stall(stream, ctypes.byref(w1), ctypes.byref(c1))
        wait, comp = w1.value - w0.value, c1.value - c0.value
        rows.append({"epoch": epoch, "batches": per_epoch, "wall_s": wall, "bytes": moved,
                     "busy": per_epoch * step_us / 1e6 / wall,
                     "larder_stall": wait / max(1, wait + comp)})
    lib.larder_stream_close(stream)
    lib.larder_client_close(client)
    return rows


def run_peer(dev, batches, batch_bytes, nbufs, step_us):
    """The same loop with each batch memmoved from one host buffer, in as
    many pieces as a larder batch has buffers; returns its wall time."""
    src = ctypes.create_string_buffer(batch_bytes)
    piece = batch_bytes // nbufs
    k = 0
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(batches):
        dst = dev.slot(k)
        for i in range(nbufs):
            ctypes.memmove(dst + i * piece, ctypes.addressof(src) + i * piece, piece)
        dev.step(k, piece * nbufs, step_us)
        k = (k + 1) % RING
    dev.sync()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("source")
    ap.add_argument("--step-us", type=float, nargs="+", default=[1000, 200])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    args = ap.parse_args()

    torch = None
    if args.device != "cpu":
        try:
            import torch  # noqa: F401
            if not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
        if torch is None and args.device == "cuda":
            sys.exit("torch-trainer: no CUDA device through PyTorch")

    # liblarder.so needs libprotobuf-c.so.1; a bundle carries it beside
    # liblarder.so, and the host's loader does not look there by itself.
    libdir = os.path.join(args.build, "lib")
    pb = os.path.join(libdir, "libprotobuf-c.so.1")
    if os.path.exists(pb):
        ctypes.CDLL(pb, mode=ctypes.RTLD_GLOBAL)
    lib = lt.load_library(args.build)
    L = lt.Larder(lib)

    cap = 8 << 20
    dev = Gpu(torch, cap) if torch is not None else Cpu(cap)
    where = torch.cuda.get_device_name(0) if torch is not None else "host (no GPU)"
    print(f"torch-trainer: {where}, {os.cpu_count()} cores, batches of {args.batch_size} rows, "
          f"pinned ring of {RING}", flush=True)

    with tempfile.TemporaryDirectory(prefix="larder-torch-") as tmp:
        d = lt.Daemon(args.build, tmp, ["--log_level=warning"])
        d.start()
        try:
            for i, step_us in enumerate(args.step_us):
                rows = run_larder(L, lib, dev, d.socket, args.source, args.epochs, step_us,
                                  args.batch_size, seed=7 + i)
                # One probe batch for the peer's shape: bytes and buffer count.
                warm = rows[-1]
                batch_bytes = warm["bytes"] // warm["batches"]
                rc, client = L.connect(d.socket)
                stream = L.open_ok(client, L.options([args.source], COLUMNS,
                                                     batch_size=args.batch_size, epochs=1))
                rc, b = L.next(stream, 60000)
                lt.check(rc == 0, "next: " + L.err(rc))
                bufs = Buffers(lib)(b)
                lib.larder_batch_release(b)
                lib.larder_stream_close(stream)
                lib.larder_client_close(client)
                peer = run_peer(dev, warm["batches"], batch_bytes, len(bufs), step_us)
                peer_busy = warm["batches"] * step_us / 1e6 / peer
                for r in rows:
                    r.update({"step_us": step_us, "peer_wall_s": peer, "peer_busy": peer_busy,
                              "added_idle": 1 - peer / r["wall_s"]})
                    print(json.dumps(r), flush=True)
                for r in rows:
                    print(f"  step {step_us:6.0f} us, epoch {r['epoch']}{' (cold)' if r['epoch'] == 0 else '       '}: "
                          f"{'GPU' if torch is not None else 'stand-in'} busy {100 * r['busy']:6.2f}% (peer from host memory {100 * peer_busy:6.2f}%), "
                          f"idle added by larder {100 * r['added_idle']:6.2f}%, liblarder stall "
                          f"{100 * r['larder_stall']:5.2f}%, {r['bytes'] / r['wall_s'] / 1e9:5.2f} GB/s "
                          f"to the {'GPU' if torch is not None else 'host buffer'}", flush=True)
        finally:
            d.stop()


if __name__ == "__main__":
    main()
