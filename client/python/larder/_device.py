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

from ._lib import (BATCH_INFO_WORDS, ARRAY_INFO_WORDS, DLDataType, DLManagedTensor, P)

__all__ = ["DeviceArray", "DeviceVarColumn", "DeviceBatch"]

_KDL_CUDA = 2
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
        if p:
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
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != (_KDL_CUDA, self.device):
            raise BufferError("larder: the batch is on cuda:%d; copy it to move it" % self.device)
        if copy:
            raise BufferError("larder: DLPack export of a batch does not copy")
        owner = self._owner
        ptr = owner.ptr
        if ptr is None:
            raise ValueError("larder: the batch was released")
        st = owner.stream
        dt = self.dtype
        if dt.kind in "Mm":
            dt = np.dtype("<i8")
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        out = P()
        rc = st._L.larder_batch_dlpack(ptr, self.ptr if self.nbytes else None, _dl_dtype(dt),
                                       len(self.shape), shape, ctypes.byref(out))
        if rc != 0:
            raise st.client._error(rc)
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
    ``numpy()`` is refused: the data is not in host memory."""

    __slots__ = ("_stream", "_owner", "_arrays", "_vec", "num_rows", "epoch", "index",
                 "device", "__weakref__")

    def __init__(self, stream, ptr):
        L = stream._L
        if stream._plan is None:
            stream._make_plan(ptr)
        fn, args, cbuf = stream._plan[0], stream._plan[1], stream._plan[2]
        fn(ptr, *args)
        v = list(cbuf)
        owner = _Owner(stream, ptr)
        stream._stash = 0  # the owner releases it from here on
        self._stream = stream
        self._owner = owner
        self._vec = v
        self.num_rows, self.epoch, self.index = v[0], v[1], v[2]
        self.device = L.larder_batch_device(ptr)
        self._arrays = {f.name: self._build(f, i) for i, f in enumerate(stream._fields)}

    def _build(self, f, idx):
        v, o, dev = self._vec, self._owner, self.device
        k = BATCH_INFO_WORDS + idx * ARRAY_INFO_WORDS
        t, width, ow, length = v[k], v[k + 1], v[k + 2], v[k + 6]
        from . import _T, _VAR, _LISTS
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
        return self._arrays[name]

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self):
        return len(self._arrays)

    def __repr__(self):
        return "DeviceBatch(epoch=%d, index=%d, rows=%d, device=cuda:%d, columns=%s)" % (
            self.epoch, self.index, self.num_rows, self.device, list(self._arrays))

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
        (offsets, values) tensor pairs.  One DLPack tensor spans the
        batch's buffers, and each column is a view of it: the cost is one
        import and a view per buffer, whatever the columns."""
        arrays = []
        for a in self._arrays.values():
            _flatten(a, arrays)
        if masks:
            ms = {k: self.mask(k) for k in self._arrays}
            arrays.extend(m for m in ms.values() if m is not None)
        base, lo = self._span(arrays)
        out = {k: _to_torch(a, base, lo) for k, a in self._arrays.items()}
        if masks:
            out = {k: (t, None if ms[k] is None else _to_torch(ms[k], base, lo))
                   for k, t in out.items()}
        return out

    def _span(self, arrays):
        """A uint8 CUDA tensor over every byte the arrays cover, and the
        device address it starts at (None, 0 when they cover none)."""
        live = [a for a in arrays if a.nbytes]
        if not live:
            return None, 0
        lo = min(a.ptr for a in live)
        hi = max(a.ptr + a.nbytes for a in live)
        span = DeviceArray(self._owner, lo, (hi - lo,), np.uint8, self.device)
        import torch
        return torch.from_dlpack(span), lo

    def release(self):
        """Drops the batch's own reference: the region goes back to the
        daemon now if nothing taken from it is alive, else when the last
        array or tensor is dropped."""
        self._arrays = {}
        self._owner = None


def _flatten(a, out):
    if isinstance(a, DeviceArray):
        out.append(a)
    elif isinstance(a, dict):
        for x in a.values():
            _flatten(x, out)
    else:  # DeviceVarColumn
        _flatten(a[0], out)
        _flatten(a[1], out)


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


def _to_torch(a, base, lo):
    """The tensor of a (a DeviceArray, DeviceVarColumn or dict) as a view of
    base, the span tensor that starts at device address lo."""
    if isinstance(a, DeviceArray):
        if a.nbytes == 0:
            import torch
            if a.bitmap:
                return torch.zeros(a.length, dtype=torch.bool, device=base.device
                                   if base is not None else "cuda:%d" % a.device)
            return torch.empty(a.shape, dtype=_torch_dtype(a.dtype),
                               device=base.device if base is not None else "cuda:%d" % a.device)
        off = a.ptr - lo
        t = base[off:off + a.nbytes]
        if a.bitmap:
            return _unpack_bits(t, a.length)
        t = t.view(_torch_dtype(a.dtype))
        return t.view(a.shape) if len(a.shape) > 1 else t
    if isinstance(a, DeviceVarColumn):
        return (_to_torch(a[0], base, lo), _to_torch(a[1], base, lo))
    if isinstance(a, dict):
        return {k: _to_torch(x, base, lo) for k, x in a.items()}
    raise TypeError("larder: cannot make a tensor of %r" % (a,))
