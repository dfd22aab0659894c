"""Batches of CUDA streams (``memory="cuda"``): their buffers are in the
memory of the stream's GPU, so nothing here reads them on the host.

A column is a DeviceArray: a buffer in device memory with a shape and a
dtype, which any CUDA library takes without a copy, through DLPack
(``torch.from_dlpack(a)``, ``cupy.from_dlpack(a)``, ``jax.dlpack``) or the
CUDA Array Interface (``cupy.asarray(a)``, numba, ``torch.as_tensor(a,
device="cuda")``).  Every ``__dlpack__`` call hands out a tensor of its
own, which holds a reference to the batch (larder_batch_dlpack): the
batch's region goes back to the daemon when the Batch, every DeviceArray
taken from it and every tensor made from those are gone, never before.
The CUDA Array Interface keeps the DeviceArray itself alive, which does
the same.

The buffers are complete on the device when the batch is returned (the
daemon's copy finished before larder_stream_next returned), so there is
no stream to wait on: ``__cuda_array_interface__["stream"]`` is None and
``__dlpack__`` ignores the consumer's stream.  The memory is the daemon's,
mapped through CUDA IPC: treat it as read-only.
"""
import collections.abc
import ctypes

import numpy as np

from . import _LISTS, _T, _VAR
from ._lib import (BATCH_INFO_WORDS, ARRAY_INFO_WORDS, DLDataType, DLManagedTensor, P)

__all__ = ["DeviceArray", "DeviceVarColumn", "DeviceBatch"]

_KDL_CUDA = 2
# The DLPack device type to give the tensors handed out (capsules and
# __dlpack_device__) instead of kDLCUDA, or 0.  Only for the driver double
# (tests/cuda-fake), whose "device memory" the host reads: the tests and
# bench/py-overhead.py set kDLCPU (1) to import it into a CPU torch.
_DLPACK_DEVICE = 0
_DLTENSOR = b"dltensor"

# Function objects of our own: ctypes.pythonapi's are shared with every
# other user of ctypes, who may set other argtypes on them.
_api = ctypes.PyDLL(None)
_capsule_new = _api.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = _api.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = _api.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    # A capsule still named "dltensor" was never consumed: its tensor (and
    # the batch reference in it) is still ours to drop.  A consumer renames
    # it "used_dltensor" and calls the deleter itself.
    if _capsule_valid(capsule, _DLTENSOR):
        p = _capsule_pointer(capsule, _DLTENSOR)
        if p:
            t = DLManagedTensor.from_address(p)
            if t.deleter:
                t.deleter(p)


_DL_CODE = {"i": 0, "u": 1, "f": 2, "b": 6, "M": 0, "m": 0}


def _dl_dtype(dtype):
    code = _DL_CODE.get(dtype.kind)
    if code is None:
        raise TypeError("larder: DLPack has no type for %s" % dtype)
    return DLDataType(code, dtype.itemsize * 8, 1)


class _Owner:
    """The Batch's hold on its region: released when the last DeviceBatch
    or DeviceArray referring to it is gone.  Tensors handed out through
    DLPack hold references of their own, in liblarder."""

    __slots__ = ("stream", "ptr", "__weakref__")

    def __init__(self, stream, ptr):
        self.stream = stream
        self.ptr = ptr

    def __del__(self):
        p, self.ptr = self.ptr, None
        # Still the stream's stash: an interrupt fell between the owner's
        # two stores (DeviceBatch), and the next next() returns the batch.
        if p and p != self.stream._stash:
            try:
                self.stream._release(p)
            except Exception:
                pass


class DeviceArray:
    """One buffer of a CUDA batch: ``ptr`` (a device pointer), ``shape``,
    ``dtype`` (numpy's, for the element type) and ``device`` (the CUDA
    ordinal).  A bitmap (a BOOL column's values, a validity mask) has
    ``bitmap`` set: its bytes are uint8, holding ``length`` bits, eight to
    a byte, least significant first; ``torch()`` unpacks them."""

    __slots__ = ("_owner", "ptr", "shape", "dtype", "device", "length", "bitmap", "__weakref__")

    def __init__(self, owner, ptr, shape, dtype, device, bits=None):
        self._owner = owner
        self.ptr = ptr
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.bitmap = bits is not None
        self.length = bits if self.bitmap else self.shape[0]

    @property
    def nbytes(self):
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return "DeviceArray(shape=%s, dtype=%s, device=cuda:%d)" % (
            self.shape, self.dtype, self.device)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str,
                "data": (self.ptr if self.nbytes else 0, True), "version": 3,
                "strides": None, "stream": None}

    def __dlpack_device__(self):
        return (_DLPACK_DEVICE or _KDL_CUDA, self.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("larder: the batch is on cuda:%d; copy it to move it" % self.device)
        if copy:
            raise BufferError("larder: DLPack export of a batch does not copy")
        owner = self._owner
        ptr = owner.ptr
        if ptr is None:
            raise ValueError("larder: the batch was released")
        st = owner.stream
        # The consumer's stream (DLPack: None or 1 the legacy default
        # stream, 2 the per-thread one, -1 none): the batch's release waits
        # for the work it queues there.
        if stream is None or stream == 1:
            st._cuda_stream(0)
        elif isinstance(stream, int) and stream >= 2:
            st._cuda_stream(stream)
        dt = self.dtype
        if dt.kind in "Mm":
            dt = np.dtype("<i8")
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        out = P()
        rc = st._L.larder_batch_dlpack(ptr, self.ptr if self.nbytes else None, _dl_dtype(dt),
                                       len(self.shape), shape, ctypes.byref(out))
        if rc != 0:
            raise st.client._error(rc)
        if _DLPACK_DEVICE:
            DLManagedTensor.from_address(out.value).dl_tensor.device.device_type = _DLPACK_DEVICE
        return _capsule_new(out.value, _DLTENSOR, ctypes.cast(_capsule_destructor,
                                                               ctypes.c_void_p))

    def torch(self):
        """The buffer as a CUDA tensor (torch.from_dlpack; no copy).  A
        bitmap becomes a bool tensor of its ``length`` bits (unpacked on
        the GPU: that one is a new tensor)."""
        import torch
        t = torch.from_dlpack(self)
        return _unpack_bits(t, self.length) if self.bitmap else t


def _unpack_bits(bits, n):
    import torch
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    return ((bits.unsqueeze(1) >> shifts) & 1).flatten()[:n].bool()


class DeviceVarColumn(tuple):
    """A variable-width column on the device: (offsets, values) DeviceArrays
    (values a DeviceArray, DeviceVarColumn or dict for nested lists); the
    offsets are int32 (or int64 for the large types), ``len(offsets) =
    rows + 1``.  Reading the strings means copying them to the host
    (``torch.from_dlpack(values).cpu()``)."""

    def __new__(cls, offsets, values, kind):
        t = super().__new__(cls, (offsets, values))
        t.kind = kind
        return t


class DeviceBatch(collections.abc.Mapping):
    """A batch of a CUDA stream: a mapping of column name to DeviceArray
    (fixed-width values; BOOL columns as their packed bits, see
    DeviceArray.length; FIXED_BINARY and decimals as (rows, width) uint8),
    DeviceVarColumn (strings, binary, lists, maps) or dict (structs).
    ``torch()`` gives CUDA tensors, ``mask(name)`` the validity bitmap.
    ``numpy()`` is refused: the data is not in host memory.  The
    DeviceArrays are made on first use of the mapping: ``torch()`` goes
    from the batch's buffer table to tensors without them."""

    __slots__ = ("_stream", "_owner", "_arrays", "_vec", "num_rows", "epoch", "index",
                 "device", "__weakref__")

    def __init__(self, stream, ptr):
        L = stream._L
        if stream._plan is None:
            stream._make_plan(ptr)
        plan = stream._plan
        fast = plan[7]
        if fast is not None:  # the extension's describe: one call, no ctypes
            fast[0](fast[1], ptr, fast[2], fast[3], fast[4])
        else:
            plan[0](ptr, *plan[1])
        v = plan[2][:]  # a list of the words; list() of a ctypes array is 5x slower
        owner = _Owner(stream, None)
        # The owner releases the batch from here on: no call between these
        # two stores, so a signal cannot leave the batch both stashed and
        # owned (released twice) or neither.
        owner.ptr = ptr
        stream._stash = 0
        self._stream = stream
        self._owner = owner
        self._vec = v
        self.num_rows, self.epoch, self.index = v[0], v[1], v[2]
        dev = stream._device
        if dev is None:  # every batch of a stream is on its device
            dev = stream._device = L.larder_batch_device(ptr)
        self.device = dev
        self._arrays = None

    def _cols(self):
        a = self._arrays
        if a is None:
            a = self._arrays = {f.name: self._build(f, i)
                                for i, f in enumerate(self._stream._fields)}
        return a

    def _build(self, f, idx):
        v, o, dev = self._vec, self._owner, self.device
        k = BATCH_INFO_WORDS + idx * ARRAY_INFO_WORDS
        t, width, ow, length = v[k], v[k + 1], v[k + 2], v[k + 6]
        if f.dtype is not None:
            return DeviceArray(o, v[k + 10], (length,), f.dtype, dev)
        if t == _T["bool"]:
            return DeviceArray(o, v[k + 10], ((length + 7) // 8,), np.uint8, dev, length)
        if t == _T["null"]:
            return DeviceArray(o, 0, (0,), np.uint8, dev, length)
        if t == _T["fixed_binary"] or t in (_T["decimal128"], _T["decimal256"]):
            return DeviceArray(o, v[k + 10], (length, width), np.uint8, dev)
        odt = np.dtype("<i4") if ow == 4 else np.dtype("<i8")
        offs = DeviceArray(o, v[k + 9], (length + 1 if length else 0,), odt, dev)
        if t in _VAR:
            return DeviceVarColumn(offs, DeviceArray(o, v[k + 10], (v[k + 11],), np.uint8, dev),
                                   f.type_name)
        if t in _LISTS or t == _T["map"]:
            return DeviceVarColumn(offs, self._build(f.children[0], v[k + 4]), f.type_name)
        if t == _T["struct"]:
            first = v[k + 4]
            return {c.name: self._build(c, first + j) for j, c in enumerate(f.children)}
        raise TypeError("larder: column %r has type %s, which the package cannot view"
                        % (f.name, f.type_name))

    # -- mapping

    def __getitem__(self, name):
        return self._cols()[name]

    def __iter__(self):
        return iter(self._cols())

    def __len__(self):
        return len(self._stream._fields) if self._arrays is None else len(self._arrays)

    def __repr__(self):
        return "DeviceBatch(epoch=%d, index=%d, rows=%d, device=cuda:%d, columns=%s)" % (
            self.epoch, self.index, self.num_rows, self.device, list(self._cols()))

    @property
    def position(self):
        """(epoch, index) of this batch."""
        return (self.epoch, self.index)

    def mask(self, name):
        """The validity bitmap of column name as a DeviceArray (packed bits,
        ``length`` of them; True = present), or None when it has no nulls."""
        i = self._stream._names.index(name)
        k = BATCH_INFO_WORDS + i * ARRAY_INFO_WORDS
        if self._vec[k + 7] == 0:
            return None
        n = self._vec[k + 6]
        return DeviceArray(self._owner, self._vec[k + 8], ((n + 7) // 8,), np.uint8,
                           self.device, n)

    def numpy(self, masks=False):
        raise TypeError("larder: this batch is in GPU memory (memory='cuda'): use batch.torch(), "
                        "DLPack or the CUDA Array Interface, or open the stream with "
                        "memory='host'")

    def torch(self, masks=False):
        """{name: CUDA tensor}, zero-copy (BOOL columns and masks are
        unpacked to bool tensors on the GPU).  DeviceVarColumns become
        (offsets, values) tensor pairs; with masks, each entry is (tensor,
        mask or None).  With the package's extension, each buffer is a
        DLPack import of its own, all made in one call; without it, one
        DLPack tensor spans the batch's buffers and each buffer is a view
        of it.  Either way from a plan the stream makes at its first call,
        and the batch's region stays the trainer's until the last tensor
        is dropped."""
        if self._owner is None:
            raise ValueError("larder: the batch was released")
        plan = self._stream._tplan
        if plan is None:
            plan = self._stream._tplan = _TorchPlan(self._stream, self._vec)
        return plan.tensors(self, masks)

    def release(self):
        """Drops the batch's own reference: the region goes back to the
        daemon now if nothing taken from it is alive, else when the last
        array or tensor is dropped."""
        self._arrays = {}
        self._owner = None


_TORCH_TYPES = {}


def _torch_dtype(dt):
    t = _TORCH_TYPES.get(dt)
    if t is None:
        import torch
        name = {"M": "int64", "m": "int64", "b": "bool"}.get(dt.kind, dt.name)
        t = getattr(torch, name, None)
        if t is None:
            raise TypeError("larder: this torch has no %s tensors" % name)
        _TORCH_TYPES[dt] = t
    return t


class _TorchPlan:
    """How a stream's batches become tensors: a leaf per buffer, (ptr word,
    length word, bytes per element, kind, torch dtype, width), and each
    column's shape as a tree of leaf numbers (a pair for a variable-width
    column, a dict for a struct).  The words are indexes into the batch's
    buffer table (the same for every batch of the stream: its arrays follow
    the schema); the kinds: 0 values (length elements, or (length, width)
    bytes), 1 a bitmap of length bits, 2 offsets (length + 1 when length),
    3 bytes (their count at the length word), 4 nothing (a NULL column).

    With the package's extension (_views.tensors) each buffer is imported
    on its own, all of them in one call: a DLPack tensor per buffer, each
    holding the batch.  Without it, one tensor spans the batch's buffers
    and each buffer is a view of it."""

    def __init__(self, stream, v):
        import torch
        self.torch = torch
        # With torch on a GPU, the raw handle of torch's current CUDA
        # stream for a device, which the fast path's capsules do not carry
        # (DeviceArray's __dlpack__ is given it): a batch's release must
        # wait for the kernels queued there, and torch's side streams do
        # not wait for the legacy default stream, nor it for them.
        self.raw_stream = None
        if torch.cuda.is_available():
            self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda d: torch.cuda.current_stream(d).cuda_stream)
        self.leaves = []
        self.dl = []     # per leaf: DLPack (code, bits), or None
        self.masks = []  # per column: the k of its array (mask words k+6..k+8)
        self.shapes = []
        for i, f in enumerate(stream._fields):
            self.shapes.append((f.name, self._field(f, i, v)))
            self.masks.append(BATCH_INFO_WORDS + i * ARRAY_INFO_WORDS)
        self.names = [name for name, _ in self.shapes]
        self.flat = [shape for _, shape in self.shapes] == list(range(len(self.leaves)))
        from . import _views
        self.fast = getattr(_views, "tensors", None)
        # torch.from_dlpack given a capsule calls torch._C._from_dlpack, and
        # that call alone saves a Python frame per buffer; any other
        # from_dlpack (another torch's, a stand-in) is called as it is.
        dlpack = getattr(getattr(torch, "utils", None), "dlpack", None)
        self.convert = getattr(torch._C, "_from_dlpack", None)
        self.stock = getattr(dlpack, "from_dlpack", None) if self.convert else None
        self.dl_fn = ctypes.cast(stream._L.larder_batch_dlpack, ctypes.c_void_p).value
        # Leaves the fast path cannot import (bitmaps, NULL columns, types
        # DLPack lacks) get kind -1 there: it leaves them to the caller.
        self.cleaves = tuple(
            (p, n, kind if dl is not None else -1, dl[0] if dl else 0, dl[1] if dl else 0, width)
            for (p, n, _, kind, _, width), dl in zip(self.leaves, self.dl))

    def _leaf(self, p, n, size, kind, dt, width, dl=None):
        self.leaves.append((p, n, size, kind, dt, width))
        self.dl.append(dl)
        return len(self.leaves) - 1

    def _field(self, f, idx, v):
        k = BATCH_INFO_WORDS + idx * ARRAY_INFO_WORDS
        t, width, ow = v[k], v[k + 1], v[k + 2]
        u8 = self.torch.uint8
        if f.dtype is not None:
            code = _DL_CODE.get(f.dtype.kind)
            dl = (code, f.dtype.itemsize * 8) if code is not None and f.dtype.kind != "b" else None
            return self._leaf(k + 10, k + 6, f.dtype.itemsize, 0, _torch_dtype(f.dtype), 0, dl)
        if t == _T["bool"]:
            return self._leaf(k + 10, k + 6, 1, 1, u8, 0)
        if t == _T["null"]:
            return self._leaf(k + 10, k + 6, 1, 4, u8, 0)
        if t == _T["fixed_binary"] or t in (_T["decimal128"], _T["decimal256"]):
            return self._leaf(k + 10, k + 6, width, 0, u8, width, (1, 8))
        offs = self._leaf(k + 9, k + 6, ow, 2, self.torch.int32 if ow == 4 else self.torch.int64,
                          0, (0, ow * 8))
        if t in _VAR:
            return (offs, self._leaf(k + 10, k + 11, 1, 3, u8, 0, (1, 8)))
        if t in _LISTS or t == _T["map"]:
            return (offs, self._field(f.children[0], v[k + 4], v))
        if t == _T["struct"]:
            first = v[k + 4]
            return {c.name: self._field(c, first + j, v) for j, c in enumerate(f.children)}
        raise TypeError("larder: column %r has type %s, which the package cannot view"
                        % (f.name, f.type_name))

    @staticmethod
    def _bytes(v, leaf):
        p, n, size, kind, _, _ = leaf
        length = v[n]
        if kind == 0:
            nb = length * size
        elif kind == 1:
            nb = (length + 7) // 8
        elif kind == 2:
            nb = (length + 1) * size if length else 0
        elif kind == 3:
            nb = length
        else:
            nb = 0
        return v[p], nb

    def _empty(self, leaf, length, dev):
        torch = self.torch
        _, _, _, kind, dt, width = leaf
        if kind == 1 or kind == 4:
            return torch.zeros(length, dtype=torch.bool, device=dev)
        if width:
            return torch.empty((length, width), dtype=torch.uint8, device=dev)
        return torch.empty(0 if kind > 1 else length, dtype=dt, device=dev)

    @staticmethod
    def _shaped(x, leaf, length):
        """Buffer x (uint8) read as leaf says."""
        kind, dt, width = leaf[3], leaf[4], leaf[5]
        if kind == 1:
            return _unpack_bits(x, length)
        if width:
            return x.view(length, width)
        if dt is not x.dtype:
            return x.view(dt)
        return x

    def tensors(self, batch, masks):
        if self.raw_stream is not None:
            # Releases wait for the work queued on the current stream.
            batch._stream._cuda_stream(self.raw_stream(batch.device))
        if self.fast is not None:
            fd = self.torch.from_dlpack
            if fd is self.stock:  # for a capsule it only calls the converter
                fd = self.convert
            made = self.fast(self.dl_fn, batch._owner.ptr, batch._vec, self.cleaves, fd,
                             _DLPACK_DEVICE)
            if made is not None:
                return self._finish(batch, masks, made)
        return self._span(batch, masks)

    def _one(self, batch, ptr, nb):
        """One buffer of the batch, as a uint8 tensor of its own."""
        return self.torch.from_dlpack(DeviceArray(batch._owner, ptr, (nb,), np.uint8,
                                                  batch.device))

    def _finish(self, batch, masks, out):
        """The columns from the fast path's tensors (out, a list per leaf),
        the leaves it left (None) made here."""
        v = batch._vec
        dev = None  # where the tensors made here go, once one is: the imported ones'
        for i, x in enumerate(out):
            if x is None:
                leaf = self.leaves[i]
                ptr, nb = self._bytes(v, leaf)
                length = v[leaf[1]]
                if nb:
                    out[i] = self._shaped(self._one(batch, ptr, nb), leaf, length)
                else:
                    dev = dev or self._device(batch, out)
                    out[i] = self._empty(leaf, length, dev)
        if self.flat:  # a tensor per column, in order
            cols = dict(zip(self.names, out))
        else:
            cols = {name: _shape(shape, out) for name, shape in self.shapes}
        if not masks:
            return cols
        res = {}
        for (name, t), k in zip(cols.items(), self.masks):
            n = v[k + 6]
            if not v[k + 7]:
                res[name] = (t, None)
            elif v[k + 8] and n:
                res[name] = (t, _unpack_bits(self._one(batch, v[k + 8], (n + 7) // 8), n))
            else:
                dev = dev or self._device(batch, out)
                res[name] = (t, self.torch.zeros(n, dtype=self.torch.bool, device=dev))
        return res

    @staticmethod
    def _device(batch, out):
        """The device of the imported tensors in out, else the batch's."""
        return next((x.device for x in out if x is not None), None) or "cuda:%d" % batch.device

    def _span(self, batch, masks):
        """The columns as views of one tensor over the batch's buffers."""
        torch = self.torch
        v = batch._vec
        bufs = [self._bytes(v, leaf) for leaf in self.leaves]  # (ptr, bytes)
        if masks:
            for k in self.masks:
                bufs.append((v[k + 8], (v[k + 6] + 7) // 8) if v[k + 7] else (0, 0))
        lo = hi = None
        for ptr, nb in bufs:
            if nb:
                lo = ptr if lo is None or ptr < lo else lo
                hi = ptr + nb if hi is None or ptr + nb > hi else hi
        dev = "cuda:%d" % batch.device
        base = None
        if lo is not None:
            base = torch.from_dlpack(DeviceArray(batch._owner, lo, (hi - lo,), np.uint8,
                                                 batch.device))
            dev = base.device
        out = []
        for (ptr, nb), leaf in zip(bufs, self.leaves):
            length = v[leaf[1]]
            if nb == 0:
                out.append(self._empty(leaf, length, dev))
            else:
                out.append(self._shaped(base[ptr - lo:ptr - lo + nb], leaf, length))
        cols = {name: _shape(shape, out) for name, shape in self.shapes}
        if not masks:
            return cols
        res = {}
        for (name, t), k, (ptr, nb) in zip(cols.items(), self.masks, bufs[len(self.leaves):]):
            if not v[k + 7]:
                res[name] = (t, None)
            elif nb:
                res[name] = (t, _unpack_bits(base[ptr - lo:ptr - lo + nb], v[k + 6]))
            else:
                res[name] = (t, torch.zeros(v[k + 6], dtype=torch.bool, device=dev))
        return res


def _shape(shape, out):
    if isinstance(shape, int):
        return out[shape]
    if isinstance(shape, tuple):
        return (_shape(shape[0], out), _shape(shape[1], out))
    return {k: _shape(x, out) for k, x in shape.items()}
