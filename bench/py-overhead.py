#!/usr/bin/env python3
"""
py-overhead.py: what the larder Python package adds per batch, for batches
of 15 columns, against the bare library calls in the same run.

    /usr/bin/python3 bench/py-overhead.py [BUILD_DIR] [--batches 20000] [--rounds 5] [--cuda]

It starts BUILD_DIR/bin/larderd (default build/release) on a temporary
socket and reads 15 int64 columns of a test file (batches of 64 rows,
window 64, epochs without end) two ways, alternating, `rounds` times:

  - package: ``for b in stream: cols = b.numpy()``: larder_stream_next,
    larder_batch_describe, the numpy views of all columns in one call of
    the package's extension (_views.c), and the release when the views go;
  - package without its extension (as where it is not built, or
    LARDER_PURE_PYTHON=1): numpy builds the views one by one;
  - peer: the bare larder_stream_next + larder_batch_release through
    ctypes, which every client pays (the library's own work, and two
    foreign calls).

For each it prints the process's CPU time per batch (time.process_time:
the daemon's work on the same cores does not count, nor the time this
process waits) and liblarder's compute figure per batch (the wall time
between next calls, which a loaded machine inflates).  The package's
overhead is its CPU per batch less the peer's, the median over rounds.

With --cuda it measures a trainer's feed from a CUDA stream instead (the
same columns, memory="cuda"): ``b.torch()`` and the release, with the
extension (a DLPack import per buffer, all in one call) and without it (one
import spanning the batch, and a view per buffer), against the same peer.
On a host where torch sees no GPU, the driver is the test double of
tests/cuda-fake (built with the CUDA toolkit), whose "device memory" the
host reads: the tensors are then made as CPU tensors over it (kDLCPU in
the capsules), so the figures are torch's CPU work without CUDA's.
"""
import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

SOURCE = os.path.join(REPO, "tests", "data", "parquet-testing", "data", "delta_binary_packed.parquet")
COLUMNS = ["bitwidth%d" % i for i in range(15)]


def run_package(stream, n, cuda=False):
    """The package's CPU per batch: numpy() of host batches, or torch() of
    CUDA ones (cuda)."""
    w0, c0 = stream.stall
    p0 = time.process_time()
    for _ in range(n):
        b = next(stream)
        cols = b.torch() if cuda else b.numpy()
        del b, cols
    p1 = time.process_time()
    w1, c1 = stream.stall
    return (p1 - p0) / n * 1e6, (c1 - c0) / n / 1e3


def cuda_setup(build):
    """Where torch has no GPU: the driver double, and tensors on the CPU
    over its memory.  Returns a note for the output."""
    import torch
    if torch.cuda.is_available():
        return "torch on %s" % torch.cuda.get_device_name(0)
    fake = os.path.join(build, "lib", "fake-cuda", "libcuda.so.1")
    if not os.path.exists(fake):
        sys.exit("py-overhead: --cuda needs a GPU or the driver double at %s" % fake)
    os.environ["LARDER_LIBCUDA"] = fake
    from larder import _device
    _device._DLPACK_DEVICE = 1  # kDLCPU: the double's memory is the host's
    return "no GPU: the driver double, CPU tensors over its memory"


def run_peer(L, stream, n):
    bp = ctypes.c_void_p()
    ref = ctypes.byref(bp)
    h = stream._h
    nxt, rel = L.larder_stream_next, L.larder_batch_release
    w0, c0 = stream.stall
    p0 = time.process_time()
    for _ in range(n):
        if nxt(h, -1, ref) != 0:
            raise RuntimeError("larder_stream_next failed")
        rel(bp.value)
    p1 = time.process_time()
    w1, c1 = stream.stall
    return (p1 - p0) / n * 1e6, (c1 - c0) / n / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(REPO, "build", "release"))
    ap.add_argument("--batches", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cuda", action="store_true",
                    help="a CUDA stream's batches through torch() (see above)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ.setdefault("LARDER_LIB", os.path.join(build, "lib", "liblarder.so"))
    import larder
    import test_ctypes as lt
    note = cuda_setup(build) if args.cuda else None
    def run(stream, n):
        return run_package(stream, n, args.cuda)
    kind = dict(memory="cuda", device=0) if args.cuda else {}

    with tempfile.TemporaryDirectory(prefix="larder-pyov-") as tmp:
        d = lt.Daemon(build, tmp, ["--workers=2", "--log_level=warning", "--arena_bytes=16M"])
        d.start()
        try:
            c = larder.Client(d.socket)
            s = c.stream(SOURCE, columns=COLUMNS, batch_size=64, epochs=0, window=64, seed=1,
                         **kind)
            run(s, 500)  # warm: the cache, the plan, the arena's pages
            # The same stream read without the extension: its plan, made at
            # its first batch, leaves the views to numpy.
            views, larder._views = larder._views, None
            p = c.stream(SOURCE, columns=COLUMNS, batch_size=64, epochs=0, window=64, seed=1,
                         **kind)
            run(p, 500)
            larder._views = views
            if views is None:
                print("the package's extension is not in use: %s" % larder.views_note)
            if note:
                print("CUDA batches, torch(): %s" % note)
            rows = []
            for r in range(args.rounds):
                pk = run(s, args.batches)
                pp = run(p, args.batches)
                pe = run_peer(larder.library(), s, args.batches)
                rows.append((pk, pp, pe))
                print("round %d: package %.2f us CPU/batch (%.2f us between calls), "
                      "without extension %.2f us, peer next+release %.2f us CPU/batch "
                      "(%.2f us between calls)" % (r, pk[0], pk[1], pp[0], pe[0], pe[1]), flush=True)
            over = statistics.median(pk[0] - pe[0] for pk, _, pe in rows)
            pover = statistics.median(pp[0] - pe[0] for _, pp, pe in rows)
            print("python overhead per batch of %d columns%s: %.2f us%s (median of %d rounds; "
                  "package %.2f us, peer %.2f us CPU per batch); without the extension "
                  "%.2f us" % (len(COLUMNS), ", torch() of a CUDA batch" if args.cuda else "",
                               over, "" if views else " (no extension)",
                               args.rounds, statistics.median(pk[0] for pk, _, _ in rows),
                               statistics.median(pe[0] for _, _, pe in rows), pover))
            s.close()
            p.close()
            c.close()
        finally:
            d.stop()


if __name__ == "__main__":
    main()
