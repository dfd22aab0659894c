"""memory="cuda" streams through the package: DeviceBatch, DeviceArray,
DLPack capsules and the CUDA Array Interface, against a larderd of their
own.  Without a GPU the driver is the test double of tests/cuda-fake/ (its
"device memory" is shared memory mapped at the device pointer, so the
tests read the bytes there); tests/cuda-real.sh sets LARDER_TEST_CUDA_REAL=1
on a GPU host, where the bytes are read back with torch.  Every wait has
a deadline."""
import ctypes
import gc
import os
import threading
import time

import numpy as np
import pytest

import larder
from larder import _device
from larder._lib import DLManagedTensor
import test_ctypes as lt
from conftest import BUILD, DAEMON_FLAGS

MAIN = lt.MAIN_FILE                  # 1,000 rows, 9 nullable strings
WIDE = os.path.join(lt.DATA, "delta_binary_packed.parquet")        # 200 rows, 66 int64
PLAIN = os.path.join(lt.DATA, "alltypes_plain.parquet")            # 8 rows, many types
DEADLINE = 60
REAL = os.environ.get("LARDER_TEST_CUDA_REAL") == "1"
_api = ctypes.PyDLL(None)  # the package's own pythonapi functions stay untouched


@pytest.fixture(scope="module", params=["legacy", "fd"])
def cuda_daemon(request, tmp_path_factory):
    """A larderd exporting each stream's device memory with a legacy IPC
    handle, or (cuda_fd_handles) as a VMM allocation's descriptor: every
    test runs on both."""
    saved = os.environ.get("LARDER_LIBCUDA")
    if REAL:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("LARDER_TEST_CUDA_REAL=1 but torch sees no GPU")
    else:
        fake = os.path.join(BUILD, "lib", "fake-cuda", "libcuda.so.1")
        if not os.path.exists(fake):
            pytest.skip("no CUDA driver double at %s (built with the CUDA toolkit)" % fake)
        # Both larderd and this process's liblarder dlopen this path.
        os.environ["LARDER_LIBCUDA"] = fake
    flags = list(DAEMON_FLAGS) + ["--cuda_fd_handles=%s" % ("true" if request.param == "fd" else "false")]
    d = lt.Daemon(BUILD, str(tmp_path_factory.mktemp("cuda")), flags)
    d.start()
    yield d
    # A device refusing VMM would make the regions legacy, with a warning.
    assert "cannot export device memory" not in d.tail(1 << 24)
    d.stop()
    if saved is None:
        os.environ.pop("LARDER_LIBCUDA", None)
    else:
        os.environ["LARDER_LIBCUDA"] = saved


@pytest.fixture
def cclient(cuda_daemon):
    c = larder.Client(cuda_daemon.socket)
    yield c
    c.close()


def host_bytes(a):
    """The bytes of DeviceArray a, copied to the host."""
    if a.nbytes == 0:
        return b""
    if REAL:
        import torch
        return torch.from_dlpack(a).cpu().numpy().tobytes()
    return ctypes.string_at(a.ptr, a.nbytes)


def same(dev, host):
    """Whether a DeviceArray / DeviceVarColumn / dict holds host's values."""
    if isinstance(dev, dict):
        return set(dev) == set(host) and all(same(dev[k], host[k]) for k in dev)
    if isinstance(dev, _device.DeviceVarColumn):
        return same(dev[0], host[0]) and same(dev[1], host[1])
    if dev.bitmap:
        bits = np.unpackbits(np.frombuffer(host_bytes(dev), np.uint8), bitorder="little")
        return np.array_equal(bits[:dev.length].astype(bool), np.asarray(host, bool))
    h = np.ascontiguousarray(host)
    if h.dtype.kind == "M":
        h = h.view(np.int64)
    return dev.shape == h.shape and host_bytes(dev) == h.tobytes()


def test_cuda_batches_equal_host(cclient):
    """A CUDA stream and a host stream of the same options deliver the same
    batches, value for value and validity for validity, in the same order."""
    for src, cols in ((WIDE, ["bitwidth%d" % i for i in range(10)]), (MAIN, None),
                      (PLAIN, None)):
        opts = dict(columns=cols, batch_size=64, seed=3, epochs=2, window=4)
        host = cclient.stream(src, **opts)
        dev = cclient.stream(src, memory="cuda", device=0, **opts)
        assert len(dev) == len(host)
        n = 0
        for hb in host:
            db = dev.next(timeout=DEADLINE)
            assert isinstance(db, _device.DeviceBatch) and db.device == 0
            assert db.position == hb.position and db.num_rows == hb.num_rows
            assert list(db) == list(hb)
            for k in hb:
                assert same(db[k], hb[k]), (src, k, hb.position)
                m = hb.mask(k)
                dm = db.mask(k)
                assert (m is None) == (dm is None), k
                if m is not None:
                    assert same(dm, m), (src, k)
            n += 1
            del hb, db
        assert dev.next(timeout=DEADLINE) is None
        assert n == 2 * len(host)
        host.close()
        dev.close()


def test_cuda_interfaces(cclient):
    """DLPack and the CUDA Array Interface describe the column in place:
    device, type, shape and pointer; numpy() is refused with a message."""
    dev = 1  # the driver double has two devices
    if REAL:
        import torch
        dev = torch.cuda.device_count() - 1
    s = cclient.stream(WIDE, columns=["bitwidth3"], batch_size=50, epochs=1, memory="cuda",
                       device="cuda:%d" % dev)
    b = next(s)
    assert b.device == dev
    a = b["bitwidth3"]
    assert a.__dlpack_device__() == (2, dev)
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (50,) and cai["typestr"] == "<i8" and cai["data"] == (a.ptr, True)
    assert cai["version"] == 3 and cai["stream"] is None
    cap = a.__dlpack__()
    p = _api.PyCapsule_GetPointer
    p.restype, p.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = DLManagedTensor.from_address(p(cap, b"dltensor")).dl_tensor
    assert (t.device.device_type, t.device.device_id) == (2, dev)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 64, 1)
    assert t.ndim == 1 and t.shape[0] == 50 and t.data == a.ptr and not t.strides
    del cap, t
    with pytest.raises(TypeError, match="GPU memory"):
        b.numpy()
    with pytest.raises(ValueError, match="memory is 'host' or 'cuda'"):
        cclient.stream(WIDE, memory="gpu")
    with pytest.raises(ValueError, match="CUDA ordinal"):
        cclient.stream(WIDE, memory="cuda", device="tpu:0")
    s.close()


def _consume(cap):
    """What a DLPack consumer does: takes the tensor out of the capsule
    (renaming it) and returns a function that drops it."""
    get, rename = _api.PyCapsule_GetPointer, _api.PyCapsule_SetName
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    rename.restype, rename.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(cap, b"dltensor")
    assert rename(cap, b"used_dltensor") == 0
    mt = DLManagedTensor.from_address(ptr)
    return lambda: mt.deleter(ptr)


def _past(s, b0):
    """Releases b0 (whatever holds it, holds it still), then takes the next
    batch and releases it, and returns the one after: in a window of 2, b0
    (if held) and that one fill it."""
    b0.release()
    del b0
    b1 = s.next(timeout=DEADLINE)
    b1.release()
    del b1
    gc.collect()
    return s.next(timeout=DEADLINE)  # b1's room came back


def test_cuda_release_waits_for_gpu(cclient, monkeypatch, tmp_path):
    """A batch whose last tensor is dropped while the GPU still runs work
    queued before (the driver double's busy GPU stands in for kernels still
    reading it) goes back to the daemon only once that work ends: with a
    window of 2, the next batch comes after the GPU is idle, never
    before."""
    if REAL:
        pytest.skip("needs the driver double's busy GPU")
    busy = tmp_path / "gpu-busy"
    busy.write_text("")
    monkeypatch.setenv("LARDER_FAKE_CUDA_GPU_BUSY", str(busy))
    s = cclient.stream(WIDE, columns=["bitwidth1"], batch_size=10, epochs=0, window=2,
                       memory="cuda", device=0)
    b0 = next(s)
    b1 = next(s)
    drop = _consume(b0["bitwidth1"].__dlpack__(stream=None))
    b0.release()
    del b0
    gc.collect()
    drop()                           # the last consumer: the release waits for the GPU
    idle_at = []

    def idle():
        idle_at.append(time.monotonic())
        busy.unlink()

    t = threading.Timer(0.3, idle)
    t.start()
    b2 = s.next(timeout=DEADLINE)
    got = time.monotonic()
    t.join()
    assert b2 is not None and idle_at and got >= idle_at[0]
    del b1, b2
    s.close()


@pytest.mark.parametrize("side", [False, True], ids=["default-stream", "side-stream"])
def test_cuda_release_waits_for_kernels(cclient, side):
    """On a GPU: a batch whose tensors are dropped while a kernel queued
    after them still runs (torch.cuda._sleep) goes back to the daemon only
    once the kernel is done: with a window of 2, when the next batch
    comes, the stream has nothing left to run.  The same with the kernels
    on a side stream of torch's, which does not wait for the legacy
    default stream (torch makes its streams non-blocking)."""
    if not REAL:
        pytest.skip("needs a GPU (tests/cuda-real.sh)")
    torch = pytest.importorskip("torch")
    s = cclient.stream(WIDE, columns=["bitwidth1"], batch_size=10, epochs=0, window=2,
                       memory="cuda", device=0)
    b0 = next(s)
    b1 = next(s)
    with torch.cuda.device(0):
        work = torch.cuda.Stream() if side else torch.cuda.current_stream()
        with torch.cuda.stream(work):
            x = b0.torch()["bitwidth1"]
            y = x * 2
            torch.cuda._sleep(int(1e9))  # some 0.5 s of GPU cycles, after the read
            del x, y
            b0.release()
            del b0
            gc.collect()
            b2 = s.next(timeout=DEADLINE)
            assert work.query()
    del b1, b2
    s.close()


@pytest.mark.parametrize("fast", [True, False], ids=["extension", "views"])
def test_cuda_torch_fences_current_stream(cclient, monkeypatch, fast):
    """With torch on a GPU, torch() gives the stream torch's current CUDA
    stream on the batch's device (larder_stream_set_cuda_stream) before it
    makes a tensor, on either path: the batch's release fences there.  The
    GPU is stood in for (torch.cuda.is_available, the raw stream's handle),
    and so is the import (_host_import); the driver double refuses the
    made-up handle, so the release waits for the context's work instead
    (lcuda_fence_push)."""
    if REAL:
        pytest.skip("test_cuda_release_waits_for_kernels checks it on the GPU")
    torch = pytest.importorskip("torch")
    _host_import(monkeypatch, fast)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 0x7000 + d,
                        raising=False)
    handles = []
    set_stream = larder.Stream._cuda_stream

    def spy(self, handle):
        handles.append(handle)
        set_stream(self, handle)

    monkeypatch.setattr(larder.Stream, "_cuda_stream", spy)
    s = cclient.stream(MAIN, batch_size=10, epochs=0, window=2, memory="cuda", device=0)
    b0 = next(s)
    ts = b0.torch()
    assert handles == [0x7000] and s._cstream == 0x7000
    del ts
    b0.release()
    del b0
    gc.collect()
    b1 = next(s)
    b2 = s.next(timeout=DEADLINE)  # b0 went back
    assert b1 is not None and b2 is not None
    del b1, b2
    s.close()


def test_cuda_tensor_holds_batch(cclient):
    """A consumed DLPack tensor keeps its batch's region from the daemon
    after the batch and its arrays are gone: with a window of 2, the stream
    stops until the consumer drops it.  A capsule never consumed gives its
    reference back when it is collected."""
    s = cclient.stream(WIDE, columns=["bitwidth1"], batch_size=10, epochs=0, window=2,
                       memory="cuda", device=0)
    b0 = next(s)
    drop = _consume(b0["bitwidth1"].__dlpack__())
    unconsumed = b0["bitwidth1"].__dlpack__()
    b2 = _past(s, b0)
    with pytest.raises(larder.LarderTimeoutError):
        s.next(timeout=0.5)          # b0 (two tensors) and b2 fill the window
    drop()
    with pytest.raises(larder.LarderTimeoutError):
        s.next(timeout=0.5)          # the unconsumed capsule still holds b0
    del unconsumed
    gc.collect()
    b3 = s.next(timeout=DEADLINE)
    assert b3 is not None
    del b2, b3
    s.close()


def test_cuda_torch_holds_batch(cclient, monkeypatch):
    """The tensors of torch() on the extension's path (one DLPack import
    per buffer) hold their batch's region until the last of them is
    dropped, whatever order they go in: with a window of 2 the stream
    stops until then."""
    if REAL:
        pytest.skip("the driver double's memory is read on the host here")
    _host_import(monkeypatch, True)
    s = cclient.stream(MAIN, batch_size=10, epochs=0, window=2, memory="cuda", device=0)
    b0 = next(s)
    ts = [t for t in b0.torch().values()]
    b2 = _past(s, b0)
    while ts:
        with pytest.raises(larder.LarderTimeoutError):
            s.next(timeout=0.2)      # b0's tensors and b2 fill the window
        ts.pop(0)
    gc.collect()
    b3 = s.next(timeout=DEADLINE)
    assert b3 is not None
    del b2, b3
    s.close()


def test_cuda_array_outlives_batch(cclient):
    """A DeviceArray (what the CUDA Array Interface hands its consumers)
    keeps the region: a hundred batches later through a window of 3, its
    values are unchanged."""
    s = cclient.stream(WIDE, columns=["bitwidth%d" % i for i in range(6)], batch_size=20,
                       epochs=0, window=3, seed=5, memory="cuda", device=0)
    held = next(s)
    arrays = dict(held)
    want = {k: host_bytes(v) for k, v in arrays.items()}
    held.release()
    del held
    for _ in range(100):
        b = s.next(timeout=DEADLINE)
        assert b is not None
        del b
    for k, v in arrays.items():
        assert host_bytes(v) == want[k], k
    del arrays
    s.close()


def test_cuda_dataset_checks(cuda_daemon):
    """LarderDataset with memory='cuda': numpy output and DataLoader worker
    processes are refused with a message that says why."""
    torch = pytest.importorskip("torch")
    from larder.torch import LarderDataset
    with pytest.raises(ValueError, match="output='torch'"):
        LarderDataset(WIDE, socket=cuda_daemon.socket, memory="cuda", output="numpy")
    ds = LarderDataset(WIDE, columns=["bitwidth1"], batch_size=50, socket=cuda_daemon.socket,
                       memory="cuda", device=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    with pytest.raises(Exception, match="num_workers=0"):
        next(iter(loader))


def test_cuda_torch_tensors(cclient):
    """On a GPU: batch.torch() gives CUDA tensors, on the stream's device,
    equal to the host stream's, masks included; they outlive the batch."""
    if not REAL:
        pytest.skip("torch cannot import CUDA tensors without a GPU")
    import torch
    opts = dict(batch_size=100, seed=4, epochs=1, window=4)
    host = cclient.stream(MAIN, **opts)
    dev = cclient.stream(MAIN, memory="cuda", device=0, **opts)
    kept = []
    for hb in host:
        db = dev.next(timeout=DEADLINE)
        ht, dt = hb.torch(masks=True), db.torch(masks=True)
        for k, (t, m) in ht.items():
            d, dm = dt[k]
            if isinstance(t, torch.Tensor):
                assert d.is_cuda and d.device.index == 0, k
                assert torch.equal(d.cpu(), t), k
            else:  # (offsets, values) of a string column
                assert torch.equal(d[0].cpu(), t[0]) and torch.equal(d[1].cpu(), t[1]), k
            assert (m is None) == (dm is None), k
            if m is not None:
                assert torch.equal(dm.cpu(), m), k
        kept = kept[-2:] + [dt]  # fewer than the window: the stream goes on
        del hb, db, ht
    torch.cuda.synchronize()
    host.close()
    dev.close()
    assert kept


def _host_import(monkeypatch, fast):
    """Stands in for torch.from_dlpack with the driver double, whose
    "device memory" the host reads: a DeviceArray becomes a CPU tensor over
    its bytes; the capsules of the extension's path (fast: that path, else
    the span of views without it) are made kDLCPU and imported by torch
    itself.  Returns the list of what was imported: the dtype of each
    DeviceArray, None for each capsule (holding neither would hold the
    batch)."""
    torch = pytest.importorskip("torch")
    if fast and getattr(larder._views, "tensors", None) is None:
        pytest.skip("the package's extension is not built here")
    if not fast:
        monkeypatch.setattr(larder, "_views", None)
    monkeypatch.setattr(_device, "_DLPACK_DEVICE", 1)  # kDLCPU
    real = torch.from_dlpack
    seen = []

    def from_dlpack(x):
        seen.append(x.dtype if isinstance(x, _device.DeviceArray) else None)
        if isinstance(x, _device.DeviceArray):
            buf = (ctypes.c_uint8 * x.nbytes).from_address(x.ptr)
            return torch.frombuffer(buf, dtype=torch.uint8)
        return real(x)

    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    return seen


@pytest.mark.parametrize("fast", [True, False], ids=["extension", "views"])
def test_cuda_torch_nested(cclient, monkeypatch, fast):
    """torch() on lists, maps, structs and decimals gives, leaf by leaf,
    the tensors of the mapping's own DeviceArrays (each imported alone),
    with the driver double standing in for the import (_host_import);
    masks equal mask()'s."""
    if REAL:
        pytest.skip("test_cuda_torch_tensors checks the real import")
    torch = pytest.importorskip("torch")
    _host_import(monkeypatch, fast)

    def alone(a):
        if isinstance(a, dict):
            return {k: alone(x) for k, x in a.items()}
        if isinstance(a, tuple):
            return (alone(a[0]), alone(a[1]))
        if a.nbytes == 0:
            return None
        t = torch.from_dlpack(a)
        if a.bitmap:
            return ((t.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()[
                :a.length].bool()
        t = t.view({"M": torch.int64, "m": torch.int64}.get(a.dtype.kind, None)
                   or getattr(torch, a.dtype.name))
        return t.view(a.shape)

    def same(want, got):
        if isinstance(want, dict):
            return sorted(want) == sorted(got) and all(same(want[k], got[k]) for k in want)
        if isinstance(want, tuple):
            return same(want[0], got[0]) and same(want[1], got[1])
        if want is None:
            return got.numel() == 0
        return want.dtype == got.dtype and want.shape == got.shape and torch.equal(want, got)

    for f in ("nested_maps.snappy.parquet", "list_columns.parquet", "null_list.parquet",
              "fixed_length_decimal.parquet", "nonnullable.impala.parquet"):
        dev = cclient.stream(os.path.join(lt.DATA, f), memory="cuda", device=0, batch_size=3,
                             seed=2, epochs=1, window=4)
        for db in dev:
            got, gotm = db.torch(), db.torch(masks=True)
            for k in db:
                assert same(alone(db[k]), got[k]), (f, k)
                assert same(got[k], gotm[k][0]), (f, k)
                m = db.mask(k)
                assert (m is None) == (gotm[k][1] is None), (f, k)
                if m is not None:
                    assert same(alone(m), gotm[k][1]), (f, k)
            del db, got, gotm
        dev.close()


def test_cuda_torch_stock_import(cclient, monkeypatch):
    """With torch's own from_dlpack (no stand-in), the extension's path
    hands the capsules to torch's converter directly; the tensors (CPU
    ones over the driver double's memory, kDLCPU) equal the host
    stream's."""
    if REAL:
        pytest.skip("test_cuda_torch_tensors checks the real import")
    torch = pytest.importorskip("torch")
    if getattr(larder._views, "tensors", None) is None:
        pytest.skip("the package's extension is not built here")
    monkeypatch.setattr(_device, "_DLPACK_DEVICE", 1)  # kDLCPU
    cols = ["bitwidth%d" % i for i in range(12)]
    opts = dict(columns=cols, batch_size=50, seed=3, epochs=1, window=4)
    host = cclient.stream(WIDE, **opts)
    dev = cclient.stream(WIDE, memory="cuda", device=0, **opts)
    n = 0
    for hb in host:
        db = dev.next(timeout=DEADLINE)
        got = db.torch()
        assert dev._tplan.stock is torch.from_dlpack and dev._tplan.convert is not None
        want = hb.torch()
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
        del hb, db, got, want
        n += 1
    assert n == 4
    host.close()
    dev.close()


def _same_tensors(a, b):
    """Whether a and b (tensors, pairs of them, dicts) are equal."""
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("fast", [True, False], ids=["extension", "views"])
def test_cuda_torch_views(cclient, monkeypatch, fast):
    """DeviceBatch.torch() imports each buffer on its own in one call of
    the package's extension, or, without it, makes one tensor of the
    batch's span and views of it: checked here with the driver double
    (_host_import).  Values and masks equal the host stream's, and torch()
    without masks gives the same tensors."""
    if REAL:
        pytest.skip("test_cuda_torch_tensors checks the real import")
    pytest.importorskip("torch")
    spans = _host_import(monkeypatch, fast)
    for src, cols in ((MAIN, None), (PLAIN, None), (WIDE, ["bitwidth%d" % i for i in range(12)])):
        opts = dict(columns=cols, batch_size=64, seed=6, epochs=1, window=4)
        host = cclient.stream(src, **opts)
        dev = cclient.stream(src, memory="cuda", device=0, **opts)
        for hb in host:
            db = dev.next(timeout=DEADLINE)
            n0 = len(spans)
            dt = db.torch(masks=True)
            if fast:  # a capsule per buffer, DeviceArrays (of bytes) only for bitmaps
                assert None in spans[n0:]
                assert all(x is None or x == np.uint8 for x in spans[n0:])
            else:
                assert len(spans) - n0 <= 1  # one import per batch
            dn = db.torch()
            assert list(dn) == list(dt) == list(hb)
            for k, (t, m) in hb.torch(masks=True).items():
                d, dm = dt[k]
                assert _same_tensors(dn[k], d), (src, k)
                flat_h, flat_d = [], []
                for x, out in ((t, flat_h), (d, flat_d)):
                    stack = [x]
                    while stack:
                        y = stack.pop()
                        if isinstance(y, dict):
                            stack.extend(y[j] for j in sorted(y))
                        elif isinstance(y, tuple):
                            stack.extend(reversed(y))
                        else:
                            out.append(y)
                assert len(flat_h) == len(flat_d), (src, k)
                for a, b in zip(flat_h, flat_d):
                    assert np.array_equal(a.numpy(), b.numpy()), (src, k)
                assert (m is None) == (dm is None), (src, k)
                if m is not None:
                    assert np.array_equal(m.numpy(), dm.numpy()), (src, k)
            del hb, db, dt
        host.close()
        dev.close()
