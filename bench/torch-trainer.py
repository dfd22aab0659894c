#!/usr/bin/env python3
"""
torch-trainer.py: how long a GPU sits idle when larder feeds a PyTorch
training loop, against the same loop fed from host memory, in one run.

    python3 bench/torch-trainer.py BUILD_DIR 'SOURCE_GLOB' [--step-us 1000 200]

BUILD_DIR is a build directory or a bundle from bench/bundle.sh: the script
starts BUILD_DIR/bin/larderd on a temporary socket and cache (the Daemon
helper of tests/python/test_ctypes.py) and reads it through the Python
package of client/python (larder), over BUILD_DIR/lib/liblarder.so.

Each step of the loop is a kernel that keeps the GPU busy for a fixed time
(torch.cuda._sleep, calibrated first) and a reduction that reads the
batch's bytes on the GPU.  The host queues up to RING steps ahead of the
GPU, as a DataLoader with pin_memory does, so the GPU idles only when the
host cannot fetch and stage batches as fast as the GPU steps.  Three arms
feed that loop, for each step time:

  - larder host (memory="host"): the pinned-memory prefetch of a trainer.
    For each batch the loop copies the batch's arrays (numpy views of the
    daemon's arena) into one of RING pinned host buffers, releases the
    batch, queues an asynchronous copy of the buffer to the GPU, and makes
    the columns' tensors in the copy (a view per array).
  - larder cuda (memory="cuda", on a GPU only): the batches arrive in GPU
    memory, so there is no pinned staging and no host-to-device copy.  The
    loop takes the columns' CUDA tensors (batch.torch(), through DLPack),
    in place.  The loop holds each batch's tensors until the GPU has read
    them (an event per ring slot), so RING batches are held.
  - peer: the host arm's loop with each batch copied from one host buffer
    instead of a larder batch, in the pieces of a larder batch's arrays,
    and the same tensors made of them: everything but larder.
In every arm the step then reads the column tensors: one torch.cat gathers
them into one input, as a model's first layer gathers its feature columns,
and the reduction reads that.

Per arm and epoch it prints:
  - the GPU's busy fraction: steps x step time over the epoch's wall time,
    beside the peer's;
  - the idle time larder adds, 1 - peer wall / larder wall (negative when
    the arm keeps the GPU busier than the peer does);
  - liblarder's stall figure for the stream (time waiting in next() over
    the time between calls);
  - the bytes per second the loop takes in, and the host's time per batch
    in next() and the staging (the copy, or the DLPack exports).
The daemon starts with an empty cache, so the run's first epoch (the host
arm's at the first step time, marked cold) includes decoding; every later
stream reads the same data, from what the cache holds by then (its first
epoch is marked first).

Without PyTorch or a GPU (--device cpu, or when torch is missing or sees no
GPU) the step is a busy wait on the host and the host arm copies into a
host buffer, which checks the package's path on a machine without a GPU;
its figures say nothing about GPUs, and the CUDA arm is skipped.
"""
import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
import test_ctypes as lt  # noqa: E402  (the daemon wrapper)

RING = 4
COLUMNS = ["label", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "weight",
           "image", "embedding"]
TIMEOUT_S = 60  # the longest one next() may wait


def host_arrays(x, out):
    """Appends the numpy arrays of a host batch's column x (a VarColumn's
    offsets and values, a struct's fields) to out."""
    if isinstance(x, np.ndarray):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            host_arrays(v, out)
    else:  # VarColumn: (offsets, values, kind)
        host_arrays(x[0], out)
        host_arrays(x[1], out)


def device_tensors(x, out):
    """Appends the CUDA tensors of one entry of DeviceBatch.torch() (a
    tensor, an (offsets, values) pair, a struct's dict) to out."""
    if isinstance(x, dict):
        for v in x.values():
            device_tensors(v, out)
    elif isinstance(x, tuple):
        for v in x:
            device_tensors(v, out)
    else:
        out.append(x)


class Gpu:
    """The device side: pinned staging ring, copies and the timed step."""

    def __init__(self, torch, cap):
        self.torch = torch
        self.index = torch.cuda.current_device()
        self.dev = torch.device("cuda", self.index)
        self.pinned = [torch.empty(cap, dtype=torch.uint8).pin_memory() for _ in range(RING)]
        self.host = [p.numpy() for p in self.pinned]  # the same memory, for numpy copies
        self.on_gpu = [torch.empty(cap, dtype=torch.uint8, device=self.dev) for _ in range(RING)]
        self.done = [None] * RING   # per slot: the event after its last read of the input
        self.held = [None] * RING   # per slot: the CUDA arm's tensors the GPU may still read
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
        """Slot k's pinned buffer (a numpy view) once the GPU has read its
        last input; the CUDA arm's tensors held there are dropped then."""
        if self.done[k] is not None:
            self.done[k].synchronize()
        self.held[k] = None
        return self.host[k]

    def step(self, k, size, step_us, layout):
        """Copies size bytes of slot k's pinned buffer to the GPU, makes the
        columns' tensors there (layout: (offset, bytes, numpy dtype) per
        array), then the step on them."""
        t = self.torch
        buf = self.on_gpu[k]
        buf[:size].copy_(self.pinned[k][:size], non_blocking=True)
        tensors = [buf[o:o + n].view(torch_dtype(t, dt)) for o, n, dt in layout]
        self.step_tensors(k, tensors, step_us)

    def step_tensors(self, k, tensors, step_us):
        """The step on a batch's column tensors in GPU memory (where larder
        put them, or the copy in slot k): one torch.cat gathers them, as a
        model's first layer gathers its feature columns, then the step.
        Slot k holds them until the gather has read them."""
        t = self.torch
        x = t.cat([v.reshape(-1).view(t.uint8) for v in tensors])
        ev = t.cuda.Event()
        ev.record()
        self.done[k] = ev
        self.held[k] = tensors
        t.cuda._sleep(int(step_us * self.cycles_per_us))
        self.acc += x.sum(dtype=t.int64)

    def sync(self):
        self.torch.cuda.synchronize()

    def drop(self):
        """Waits for the GPU and drops every tensor held."""
        self.sync()
        self.held = [None] * RING


class Cpu:
    """The host stand-in: a copy to a host buffer and a busy-wait step."""

    index = None

    def __init__(self, cap):
        self.bufs = [np.empty(cap, np.uint8) for _ in range(RING)]

    def slot(self, k):
        return self.bufs[k]

    def step(self, k, size, step_us, layout):
        end = time.perf_counter() + step_us / 1e6
        while time.perf_counter() < end:
            pass

    def sync(self):
        pass

    drop = sync


def batch_tensors(batch):
    """The CUDA tensors of a CUDA batch's columns, flat; releases the batch
    (the tensors hold its region until they are dropped)."""
    tensors = []
    for x in batch.torch().values():
        device_tensors(x, tensors)
    batch.release()
    return tensors


_TORCH_DTYPES = {}


def torch_dtype(torch, dt):
    """torch's dtype for numpy's dt."""
    t = _TORCH_DTYPES.get(dt)
    if t is None:
        t = _TORCH_DTYPES[dt] = torch.from_numpy(np.empty(0, dt)).dtype
    return t


def stage_host(dev, k, batch):
    """Copies a host batch's arrays into slot k and releases the batch;
    returns (bytes, layout: (offset, bytes, dtype) per array, seconds
    spent copying)."""
    arrays = []
    for x in batch.values():
        host_arrays(x, arrays)
    x = None
    dst = dev.slot(k)
    t0 = time.perf_counter()
    pos = 0
    layout = []
    for a in arrays:
        n = a.nbytes
        dst[pos:pos + n] = a.reshape(-1).view(np.uint8)
        layout.append((pos, n, a.dtype if a.dtype.kind not in "Mm" else np.dtype("<i8")))
        pos += n
    arrays = a = None
    batch.release()  # no view is left: the region goes back to the daemon now
    return pos, layout, time.perf_counter() - t0


def run_larder(client, dev, memory, source, epochs, step_us, batch_size, seed):
    """Runs the loop on a larder stream of the given memory kind; returns
    one dict per epoch."""
    kw = {"memory": "cuda", "device": dev.index} if memory == "cuda" else {}
    stream = client.stream([source], columns=COLUMNS, batch_size=batch_size, seed=seed,
                           epochs=epochs, rank=0, world_size=1, **kw)
    per_epoch = len(stream)
    arm = "larder " + memory
    rows = []
    k = 0
    nbufs = 0
    for epoch in range(epochs):
        w0, c0 = stream.stall
        dev.sync()
        t0 = time.perf_counter()
        moved = 0
        feed = 0.0
        for _ in range(per_epoch):
            f0 = time.perf_counter()
            b = stream.next(timeout=TIMEOUT_S)
            if b is None:
                sys.exit("torch-trainer: %s: the stream ended in epoch %d" % (arm, epoch))
            if memory == "cuda":
                tensors = batch_tensors(b)
                del b
                nbufs = len(tensors)
                size = sum(v.numel() * v.element_size() for v in tensors)
                feed += time.perf_counter() - f0
                dev.slot(k)
                dev.step_tensors(k, tensors, step_us)
                del tensors
            else:
                feed += time.perf_counter() - f0
                size, layout, copy_s = stage_host(dev, k, b)
                nbufs = len(layout)
                dev.last_layout = layout  # the peer's shape
                del b
                feed += copy_s
                dev.step(k, size, step_us, layout)
            moved += size
            k = (k + 1) % RING
        dev.sync()
        wall = time.perf_counter() - t0
        w1, c1 = stream.stall
        wait, comp = w1 - w0, c1 - c0
        rows.append({"arm": arm, "epoch": epoch, "batches": per_epoch, "wall_s": wall,
                     "bytes": moved, "buffers": nbufs,
                     "busy": per_epoch * step_us / 1e6 / wall,
                     "larder_stall": wait / max(1, wait + comp),
                     "feed_us": feed / per_epoch * 1e6})
    dev.drop()
    stream.close()
    return rows


def run_peer(dev, batches, layout, step_us):
    """The host arm's loop with each batch copied from one host buffer, in
    the pieces of layout (a host batch's arrays: (offset, bytes, dtype)),
    whose tensors the step makes as the host arm's; returns its wall
    time."""
    size = sum(n for _, n, _ in layout)
    src = np.ones(size, np.uint8)
    k = 0
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(batches):
        dst = dev.slot(k)
        for o, n, _ in layout:
            dst[o:o + n] = src[o:o + n]
        dev.step(k, size, step_us, layout)
        k = (k + 1) % RING
    dev.sync()
    return time.perf_counter() - t0


def cuda_driver():
    """The path of the CUDA driver library this process has loaded (torch's),
    or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libcuda.so"):
                    return parts[5].strip()
    except OSError:
        pass
    return None


def report(r, step_us, peer, peer_busy, gpu, cold):
    """Prints an epoch's figures against the peer's: a JSON line, then words."""
    r.update({"step_us": step_us, "peer_wall_s": peer, "peer_busy": peer_busy,
              "added_idle": 1 - peer / r["wall_s"]})
    print(json.dumps(r), flush=True)
    cold = "        " if r["epoch"] else " (cold) " if cold else " (first)"
    print(f"  {r['arm']:<11} step {step_us:6.0f} us, epoch {r['epoch']}{cold}: "
          f"{'GPU' if gpu else 'stand-in'} busy {100 * r['busy']:6.2f}% "
          f"(peer from host memory {100 * peer_busy:6.2f}%), "
          f"idle added by larder {100 * r['added_idle']:6.2f}%, liblarder stall "
          f"{100 * r['larder_stall']:5.2f}%, {r['bytes'] / r['wall_s'] / 1e9:5.2f} GB/s "
          f"{'to the GPU' if r['arm'] == 'larder host' and gpu else 'read on the GPU' if gpu else 'to the host buffer'}, "
          f"host feed {r['feed_us']:5.0f} us/batch", flush=True)


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
    build = os.path.abspath(args.build)
    libdir = os.path.join(build, "lib")
    pb = os.path.join(libdir, "libprotobuf-c.so.1")
    if os.path.exists(pb):
        ctypes.CDLL(pb, mode=ctypes.RTLD_GLOBAL)
    # The package loads exactly this library (no other candidate is tried).
    os.environ["LARDER_LIB"] = os.path.join(libdir, "liblarder.so")
    import larder
    larder.library()

    if torch is not None and not os.environ.get("LARDER_LIBCUDA"):
        # larderd (and liblarder here) dlopen the driver as libcuda.so.1,
        # which a bundle's loader, limited to the bundle's lib/, may not
        # find: both get the path of the driver torch has loaded instead.
        drv = cuda_driver()
        if drv:
            os.environ["LARDER_LIBCUDA"] = drv

    cap = 8 << 20
    dev = Gpu(torch, cap) if torch is not None else Cpu(cap)
    where = torch.cuda.get_device_name(dev.index) if torch is not None else "host (no GPU)"
    print(f"torch-trainer: {where}, {os.cpu_count()} cores, batches of {args.batch_size} rows, "
          f"pinned ring of {RING}; arms: larder host, "
          f"{'larder cuda, ' if torch is not None else ''}peer", flush=True)
    if torch is None:
        why = ("--device cpu" if args.device == "cpu" else
               "no PyTorch" if "torch" not in sys.modules else "PyTorch sees no GPU")
        print(f"torch-trainer: larder cuda skipped ({why}): the host arm and the peer run "
              f"with the CPU stand-in", flush=True)

    with tempfile.TemporaryDirectory(prefix="larder-torch-") as tmp:
        d = lt.Daemon(build, tmp, ["--log_level=warning"])
        d.start()
        try:
            client = larder.Client(d.socket)
            cuda_ok = torch is not None
            for i, step_us in enumerate(args.step_us):
                rows = run_larder(client, dev, "host", args.source, args.epochs, step_us,
                                  args.batch_size, seed=7 + i)
                # The peer takes the shape of the host arm's last (warm) epoch.
                warm = rows[-1]
                per = sum(n for _, n, _ in dev.last_layout)
                peer = run_peer(dev, warm["batches"], dev.last_layout, step_us)
                peer_busy = warm["batches"] * step_us / 1e6 / peer
                print(f"  {'peer':<11} step {step_us:6.0f} us: "
                      f"{'GPU' if torch is not None else 'stand-in'} busy {100 * peer_busy:6.2f}%, "
                      f"{warm['batches']} batches of {per} bytes in {warm['buffers']} pieces "
                      f"from host memory", flush=True)
                for r in rows:
                    report(r, step_us, peer, peer_busy, torch is not None, cold=i == 0)
                if not cuda_ok:
                    continue
                try:
                    rows = run_larder(client, dev, "cuda", args.source, args.epochs, step_us,
                                      args.batch_size, seed=7 + i)
                except larder.LarderError as e:
                    # larderd or liblarder could not use the GPU (its driver,
                    # CUDA IPC): the host arm's figures stand alone.
                    print(f"torch-trainer: larder cuda skipped: {e}\nlarderd's log ends:\n"
                          f"{d.tail(1500)}", flush=True)
                    dev.drop()
                    cuda_ok = False
                    continue
                for r in rows:
                    report(r, step_us, peer, peer_busy, True, cold=False)
            client.close()
        finally:
            d.stop()


if __name__ == "__main__":
    main()
