"""larder: Python client of larderd, over liblarder through ctypes.

    import larder
    client = larder.Client()                  # $LARDER_SOCKET or the default
    for batch in client.stream(["/data/train/*.parquet"], batch_size=512, epochs=1):
        x = batch["features"]                 # numpy, zero-copy into the arena
        t = batch.torch()                     # {name: tensor}, zero-copy too

Batches are views of larderd's shared-memory arena, never copies.  A batch's
region goes back to the daemon when the last object made from it is gone:
the Batch itself and every array (or tensor made with torch.from_numpy, or
view of either) hold a reference to it, so a region is never reused while
anything still points into it.  ``batch.release()`` (or leaving ``with
batch:``) drops only the Batch's own reference: the arrays taken from it
stay valid, and the region goes back once they are dropped too.  Holding
arrays of more batches than the stream's ``window`` blocks the stream: the
daemon sends no batch while the client holds a full window.  Note that in
``for b in stream:`` the loop variable still holds the previous batch while
the next one is awaited: with a window of 1, release it in the loop body
(``b.release()``, or ``with b:``).

The arrays are read-only (the arena is mapped read-only in the trainer):
writing one in place through a torch tensor faults; copy first
(``tensor.clone()``, ``.to(device)``, ``pin_memory()``).

Each batch costs a constant number of foreign calls (larder_stream_next,
larder_batch_describe, and the release), whatever its columns.  Where the
package's extension (_views.c, built by make and installed by make
install) loads, one more call builds all the fixed-width columns' arrays;
elsewhere (another interpreter or numpy, LARDER_PURE_PYTHON=1) numpy builds
them one by one, with the same results.  ``larder.views_note`` says why
the extension is not in use.
"""
import collections.abc
import ctypes
import os
import struct
import threading
import weakref

import numpy as np

from . import _lib
from ._lib import P, StreamOptions, BATCH_INFO_WORDS, ARRAY_INFO_WORDS

__all__ = ["Client", "Stream", "Batch", "VarColumn", "LarderError", "connect", "library",
           "DEFAULT_WINDOW", "MAX_WINDOW", "MEMORY_HOST", "MEMORY_CUDA"]

DEFAULT_WINDOW = 32
MAX_WINDOW = 1024

_L = None
_L_lock = threading.Lock()
# The optional extension that builds a batch's numpy views in one call
# (_views.c), loaded with liblarder; None where it is not available, and
# views_note then says why (the package works the same, a little slower).
_views = None
views_note = "liblarder is not loaded yet"


def library():
    """The loaded liblarder (ctypes.CDLL), loaded on first use."""
    global _L, _views, views_note
    if _L is None:
        with _L_lock:
            if _L is None:
                lib = _lib.load()
                _views, views_note = _lib.load_views(lib)
                _L = lib
    return _L


# ---------------------------------------------------------------------------
# Errors

# larder.h's LARDER_ERRNO_MAP: code -> name.
ERRORS = {
    -1: "EINVAL", -2: "ENOMEM", -3: "EIO", -4: "ECORRUPT", -5: "EUNSUPPORTED", -6: "ELIMIT",
    -7: "ECHECKSUM", -8: "ENOENT", -9: "EPROTO", -10: "ETIMEDOUT", -11: "ECLOSED",
    -12: "EACCES", -13: "EREMOTE", -14: "ESHUTDOWN", -15: "EAGAIN", -16: "EVERSION",
    -17: "EEOF", -18: "ENOSPC", -19: "EBUSY", -20: "ECONNECT",
}
for _code, _name in ERRORS.items():
    globals()[_name] = _code
EINVAL, ETIMEDOUT, EEOF = -1, -10, -17  # for linters: set above as well


class LarderError(Exception):
    """An error of liblarder or larderd.

    ``code`` is the negative larder_errno_t, ``name`` its symbol (such as
    "LARDER_ENOENT"), and the message is the daemon's (or the library's)
    explanation where there is one."""

    def __init__(self, code, message=None):
        self.code = code
        self.name = "LARDER_" + ERRORS.get(code, "E?")
        try:
            self.description = library().larder_strerror(code).decode()
        except OSError:
            self.description = self.name
        self.message = message or self.description
        super().__init__("%s: %s" % (self.name, self.message))

    def __reduce__(self):
        return (error_for, (self.code, self.message))


class InvalidArgumentError(LarderError, ValueError):
    """LARDER_EINVAL."""


class NotFoundError(LarderError, FileNotFoundError):
    """LARDER_ENOENT: a source that does not exist."""


class AccessError(LarderError, PermissionError):
    """LARDER_EACCES."""


class LarderTimeoutError(LarderError, TimeoutError):
    """LARDER_ETIMEDOUT."""


class ConnectError(LarderError, ConnectionRefusedError):
    """LARDER_ECONNECT: no daemon at the socket."""


class ClosedError(LarderError, ConnectionError):
    """LARDER_ECLOSED or LARDER_ESHUTDOWN: the connection is gone."""


class LimitError(LarderError, OSError):
    """LARDER_ELIMIT, LARDER_ENOSPC, LARDER_ENOMEM."""


_CLASSES = {-1: InvalidArgumentError, -8: NotFoundError, -12: AccessError,
            -10: LarderTimeoutError, -20: ConnectError, -11: ClosedError, -14: ClosedError,
            -6: LimitError, -18: LimitError, -2: LimitError}


def error_for(code, message=None):
    """The exception for a larder_errno_t code, of its subclass."""
    return _CLASSES.get(code, LarderError)(code, message)


# ---------------------------------------------------------------------------
# Types

TYPE_NAMES = ["null", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "float16", "float32", "float64", "date32", "time32",
              "time64", "timestamp", "decimal128", "decimal256", "binary", "string",
              "large_binary", "large_string", "fixed_binary", "list", "large_list",
              "struct", "map"]
_T = {n: i for i, n in enumerate(TYPE_NAMES)}
_UNITS = ["s", "ms", "us", "ns"]
_FIXED = {_T["int8"]: "i1", _T["int16"]: "<i2", _T["int32"]: "<i4", _T["int64"]: "<i8",
          _T["uint8"]: "u1", _T["uint16"]: "<u2", _T["uint32"]: "<u4", _T["uint64"]: "<u8",
          _T["float16"]: "<f2", _T["float32"]: "<f4", _T["float64"]: "<f8",
          _T["date32"]: "<i4", _T["time32"]: "<i4", _T["time64"]: "<i8"}
_VAR = (_T["binary"], _T["string"], _T["large_binary"], _T["large_string"])
_LISTS = (_T["list"], _T["large_list"])


class Field:
    """A column (or child) of a stream: name, type name, nullability, and
    the numpy dtype of its values where they are fixed-width."""

    __slots__ = ("name", "type", "type_name", "nullable", "byte_width", "unit", "utc",
                 "precision", "scale", "children", "dtype")

    def __repr__(self):
        return "Field(%r, %s%s)" % (self.name, self.type_name, ", nullable" if self.nullable else "")


def _field_of(L, a):
    f = Field()
    f.name = L.larder_array_name(a).decode()
    t = None
    # The type comes from describe; the accessors give the static facts.
    f.nullable = bool(L.larder_array_nullable(a))
    f.byte_width = L.larder_array_byte_width(a)
    f.unit = L.larder_array_unit(a)
    f.utc = bool(L.larder_array_utc(a))
    f.precision = L.larder_array_precision(a)
    f.scale = L.larder_array_scale(a)
    f.children = [_field_of(L, L.larder_array_child(a, i))
                  for i in range(L.larder_array_num_children(a))]
    f.type = t
    return f


def _finish_field(f, t):
    f.type = t
    f.type_name = TYPE_NAMES[t] if 0 <= t < len(TYPE_NAMES) else "?"
    if t in _FIXED:
        f.dtype = np.dtype(_FIXED[t])
    elif t == _T["timestamp"]:
        f.dtype = np.dtype("datetime64[%s]" % _UNITS[f.unit])
    else:
        f.dtype = None


class VarColumn(tuple):
    """A variable-width column (strings, binary, lists whose lengths vary,
    maps): ``offsets`` (int32 or int64, length + 1 entries) into
    ``values`` (bytes as uint8 for strings and binary; the child's array
    for lists), zero-copy."""

    __slots__ = ()

    def __new__(cls, offsets, values, kind):
        return tuple.__new__(cls, (offsets, values, kind))

    offsets = property(lambda self: self[0])
    values = property(lambda self: self[1])
    kind = property(lambda self: self[2])

    def __len__(self):
        return len(self[0]) - 1 if len(self[0]) else 0

    def to_pylist(self):
        """Python values: str for strings, bytes for binary, lists (of
        numpy scalars' Python values) for lists.  Copies."""
        off = self[0].tolist()
        vals = self[1]
        if self[2] in ("string", "large_string", "binary", "large_binary"):
            raw = vals.tobytes()
            base = 0
            out = [raw[off[i] - base:off[i + 1] - base] for i in range(len(off) - 1)]
            if self[2] in ("string", "large_string"):
                out = [b.decode("utf-8") for b in out]
            return out
        # Lists and maps: the child's values as Python values first.  (Nulls
        # inside a child read as zeros: Batch.to_pylist masks the top
        # level only.)
        if isinstance(vals, VarColumn):
            items = vals.to_pylist()
        elif isinstance(vals, np.ndarray):
            items = vals.tolist()
        elif isinstance(vals, dict):
            cols = {k: (x.to_pylist() if isinstance(x, VarColumn) else x.tolist())
                    for k, x in vals.items()}
            n = len(next(iter(cols.values()))) if cols else 0
            items = [{k: c[i] for k, c in cols.items()} for i in range(n)]
        else:
            items = list(vals)
        return [items[off[i]:off[i + 1]] for i in range(len(off) - 1)]

    def __repr__(self):
        return "VarColumn(%s, %d rows)" % (self[2], len(self))


def _unpack_bits(u8, n):
    return np.unpackbits(u8, count=n, bitorder="little").view(np.bool_)


# ---------------------------------------------------------------------------
# Client

class _Conn:
    """The connection handle.  larder_client_close runs when the last
    reference goes: the Client's, each Stream's, and through them each
    live batch's, so that the connection outlives every batch of it (the
    C library requires their release before the close)."""

    __slots__ = ("h", "L", "pid", "__weakref__")

    def __init__(self, L, h):
        self.L, self.h, self.pid = L, h, os.getpid()

    def __del__(self):
        h, self.h = self.h, None
        if h:
            try:
                self.L.larder_client_close(h)
            except Exception:
                pass


class Client:
    """A connection to larderd (one per trainer process, or per loading
    thread; see larder.h's threading rules).  ``close()`` closes its
    streams; the connection itself goes once the last batch is released."""

    def __init__(self, socket=None):
        L = library()
        self._L = L
        h = P()
        rc = L.larder_client_connect(os.fsencode(socket) if socket is not None else None,
                                     ctypes.byref(h))
        if rc != 0:
            why = L.larder_connect_error().decode(errors="replace")
            if not why:
                where = socket or os.environ.get("LARDER_SOCKET") or "/run/larder/larderd.sock"
                why = "%s (socket %s)" % (L.larder_strerror(rc).decode(), where)
            raise error_for(rc, why)
        self._conn = _Conn(L, h.value)
        self._streams = weakref.WeakSet()
        self.socket = socket

    @property
    def _h(self):
        c = self._conn
        if c is None or not c.h:
            raise ValueError("larder: the client is closed")
        return c.h

    def last_error(self):
        c = self._conn
        return self._L.larder_client_last_error(c.h).decode(errors="replace") if c and c.h else ""

    def _error(self, rc):
        return error_for(rc, self.last_error() or None)

    def stream(self, sources, columns=None, batch_size=256, seed=0, shuffle=True, epochs=1,
               rank=None, world_size=None, drop_last=False, start=(0, 0), window=None,
               shuffle_window=0, unit_rows=0, arena_bytes=0, partitions=0,
               local_world_size=None, job=None, memory="host", device=None):
        """Opens a stream; see larder_stream_options_t.  ``sources`` is a path
        (str) or a list of paths, globs, directories or URLs; ``epochs=0``
        is unbounded; rank/world_size None read RANK/WORLD_SIZE as in C.
        ``partitions`` > 1 splits the data into node partitions, each node
        (``local_world_size`` ranks, None: LOCAL_WORLD_SIZE) reading its own;
        ``job`` names the job in the daemon's metrics.  ``memory="cuda"``
        delivers the batches in the memory of GPU ``device`` (an ordinal,
        "cuda:N" or a torch.device; None: LOCAL_RANK, as in C), as
        DeviceBatch objects (larder._device)."""
        st = Stream(self, sources, columns, batch_size, seed, shuffle, epochs, rank,
                    world_size, drop_last, start, window, shuffle_window, unit_rows,
                    arena_bytes, partitions, local_world_size, job, memory, device)
        self._streams.add(st)
        return st

    def close(self):
        """Closes the client's streams; batches still alive stay valid, and
        the connection closes when the last of them is dropped."""
        for st in list(self._streams):
            st.close()
        self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(socket=None):
    """larder.Client(socket)."""
    return Client(socket)


MEMORY_HOST, MEMORY_CUDA = 0, 1


def _device_ordinal(device):
    """The CUDA ordinal of device (None, an int, "cuda:N", "cuda" or a
    torch.device); -1 (LOCAL_RANK, as in C) for None and a bare "cuda"."""
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    kind = getattr(device, "type", None)
    if kind is not None:  # torch.device
        if kind != "cuda":
            raise ValueError("larder: device %s is not a CUDA device" % (device,))
        return -1 if index is None else index
    s = str(device)
    if s == "cuda":
        return -1
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    raise ValueError("larder: device is a CUDA ordinal, 'cuda:N' or a torch.device, not %r"
                     % (device,))


# The longest a single larder_stream_next waits: Python runs signal
# handlers only between foreign calls, so Ctrl-C (KeyboardInterrupt)
# arrives within this, and the stream is untouched by it.
_SLICE_MS = 100


class Stream:
    """An open stream: iterate it for Batch objects.  ``len(stream)`` is the
    batches per epoch on this rank; ``position`` the (epoch, batch) of the
    next batch, for checkpoints (pass it as ``start`` to resume)."""

    def __init__(self, client, sources, columns, batch_size, seed, shuffle, epochs, rank,
                 world_size, drop_last, start, window, shuffle_window, unit_rows, arena_bytes,
                 partitions=0, local_world_size=None, job=None, memory="host", device=None):
        L = client._L
        self._L = L
        self.client = client
        self._h = None
        if isinstance(sources, (str, bytes, os.PathLike)):
            sources = [sources]
        sources = [os.fsencode(s) for s in sources]
        o = StreamOptions()
        L.larder_stream_options_init(ctypes.byref(o))
        src = (ctypes.c_char_p * len(sources))(*sources)
        o.sources, o.num_sources = src, len(sources)
        keep = [src]
        if columns is not None:
            if isinstance(columns, str):
                columns = [columns]
            cols = (ctypes.c_char_p * len(columns))(*[c.encode() for c in columns])
            o.columns, o.num_columns = cols, len(columns)
            keep.append(cols)
        o.batch_size = batch_size
        o.seed = seed
        o.shuffle = 1 if shuffle else 0
        o.epochs = epochs
        o.rank = -1 if rank is None else rank
        o.world_size = -1 if world_size is None else world_size
        o.drop_last = 1 if drop_last else 0
        o.start_epoch, o.start_batch = start
        o.window = DEFAULT_WINDOW if window is None else window
        o.shuffle_window = shuffle_window
        o.unit_rows = unit_rows
        o.arena_bytes = arena_bytes
        o.partitions = partitions or 0
        o.local_world_size = -1 if local_world_size is None else local_world_size
        if job is not None:
            jb = job.encode()
            keep.append(jb)
            o.job = jb
        if memory not in ("host", "cuda"):
            raise ValueError("larder: memory is 'host' or 'cuda', not %r" % (memory,))
        self.memory = memory
        if memory == "cuda":
            o.memory_kind = MEMORY_CUDA
            o.cuda_device = _device_ordinal(device)
        elif device is not None:
            raise ValueError("larder: device is for memory='cuda' streams")
        h = P()
        rc = L.larder_stream_open(client._h, ctypes.byref(o), ctypes.byref(h))
        if rc != 0:
            raise client._error(rc)
        self._h = h.value
        self._batch = Batch
        if memory == "cuda":
            from ._device import DeviceBatch
            self._batch = DeviceBatch
        self.window = o.window
        self.batch_size = batch_size
        self._conn = client._conn  # the connection outlives the stream
        self._stash = 0             # a batch taken that no Batch owns yet
        self._bp = P()
        self._bpref = ctypes.byref(self._bp)
        self._next = L.larder_stream_next
        self._plan = None
        self._tplan = None          # DeviceBatch.torch()'s plan (_device.py)
        self._device = None         # a CUDA stream's device, from its first batch
        self._cstream = 0           # the CUDA stream its releases fence on (0: legacy)
        self.columns = [L.larder_stream_column_name(self._h, i).decode()
                        for i in range(L.larder_stream_num_columns(self._h))]
        self._n_batches = L.larder_stream_batches_per_epoch(self._h)
        self.num_samples = L.larder_stream_num_samples(self._h)

    def _cuda_stream(self, handle):
        """The CUDA stream (a raw handle; 0: the legacy default stream) on
        which the trainer reads this stream's batches: a batch's release
        waits for the work queued there before it (larder.h,
        larder_stream_set_cuda_stream).  Set by the DLPack and torch paths
        from the consumer's current stream."""
        if handle != self._cstream and self._h:
            self._L.larder_stream_set_cuda_stream(self._h, handle or None)
            self._cstream = handle

    # -- facts

    def __len__(self):
        return self._n_batches

    @property
    def batches_per_epoch(self):
        return self._n_batches

    @property
    def partitions(self):
        """(P, first, last): the node partitions and this rank's node's
        [first, last) of them; (1, 0, 1) without partitions."""
        p, a, b = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint32()
        self._L.larder_stream_partitions(self._h, ctypes.byref(p), ctypes.byref(a),
                                         ctypes.byref(b))
        return (p.value, a.value, b.value)

    @property
    def note(self):
        """What the daemon said the trainer should know at open ("" if nothing)."""
        return self._L.larder_stream_note(self._h).decode(errors="replace")

    @property
    def position(self):
        e, b = ctypes.c_uint64(), ctypes.c_uint64()
        self._L.larder_stream_position(self._h, ctypes.byref(e), ctypes.byref(b))
        return (e.value, b.value)

    @property
    def stall(self):
        """(wait_ns, compute_ns) since the stream opened (larder_stream_stall)."""
        w, c = ctypes.c_uint64(), ctypes.c_uint64()
        self._L.larder_stream_stall(self._h, ctypes.byref(w), ctypes.byref(c))
        return (w.value, c.value)

    @property
    def fields(self):
        """The columns' Field descriptions (known once a batch has come)."""
        return getattr(self, "_fields", None)

    def fileno(self):
        """larder_stream_fd: readable while next() may have a batch."""
        return self._L.larder_stream_fd(self._h)

    def flush(self):
        rc = self._L.larder_stream_flush(self._h)
        if rc != 0:
            raise self.client._error(rc)

    # -- batches

    def __iter__(self):
        return self

    def __next__(self):
        b = self.next()
        if b is None:
            raise StopIteration
        return b

    def next(self, timeout=None):
        """The next Batch, None after the last; ``timeout`` in seconds
        (None: wait as long as it takes) raises LarderTimeoutError."""
        if self._h is None:
            raise ValueError("larder: the stream is closed")
        if self._stash:
            return self._batch(self, self._stash)
        # An exception (KeyboardInterrupt) can be raised right after a call
        # that took a batch, before any Batch owns it: the batch is kept in
        # _stash then, and the next call returns it, so that none is lost
        # (nor its window slot) and the sequence goes on unchanged.  Batch
        # clears _stash in the same step (no call between) as it takes the
        # release over.
        bp = self._bp
        bp.value = None
        try:
            rc = self._next(self._h, 0, self._bpref)
            if rc == ETIMEDOUT:
                rc = self._wait(timeout)
            if rc == 0:
                self._stash = bp.value
        except BaseException:
            if bp.value and not self._stash:
                self._stash = bp.value
            raise
        if rc != 0:
            if rc == EEOF:
                return None
            raise self.client._error(rc)
        return self._batch(self, self._stash)

    def _wait(self, timeout):
        # Sliced, so that a KeyboardInterrupt raised between the calls
        # leaves the stream as it was: no batch is taken half-way.
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ms = _SLICE_MS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ETIMEDOUT if timeout is None else self._timed_out(timeout)
                ms = max(1, min(ms, int(left * 1000)))
            rc = self._next(self._h, ms, self._bpref)
            if rc != ETIMEDOUT:
                return rc

    def _timed_out(self, timeout):
        raise error_for(ETIMEDOUT, "no batch within %g s" % timeout)

    def _make_plan(self, ptr):
        L = self._L
        n = L.larder_batch_describe(ptr, None, None, 0)
        head = BATCH_INFO_WORDS
        cbuf = (ctypes.c_int64 * (head + n * ARRAY_INFO_WORDS))()
        addr = ctypes.addressof(cbuf)
        fn = L.larder_batch_describe
        args = (ctypes.c_void_p(addr), ctypes.c_void_p(addr + head * 8), n)
        fn(ptr, *args)
        v = list(cbuf)
        ncols = v[4]
        fields = [_field_of(L, L.larder_batch_column(ptr, i)) for i in range(ncols)]

        # Types come from the describe vector, in slot order.
        def walk(f, idx):
            _finish_field(f, v[head + idx * ARRAY_INFO_WORDS])
            first = v[head + idx * ARRAY_INFO_WORDS + 4]
            for j, c in enumerate(f.children):
                walk(c, first + j)
        for i, f in enumerate(fields):
            walk(f, i)
        # The fast path unpacks the header and, per column, its length,
        # null count and values pointer (words 6, 7 and 10); fixed-width
        # columns are (name, index of length, index of values, dtype) into
        # that tuple, and the rest are built by _build from the full vector.
        fmt = "<%dq" % head + ("48x2q16xq8x" * ncols) + "%dx" % ((n - ncols) * ARRAY_INFO_WORDS * 8)
        unpack = struct.Struct(fmt).unpack_from
        fixed = tuple((f.name, head + 3 * i, head + 3 * i + 2, f.dtype)
                      for i, f in enumerate(fields) if f.dtype is not None)
        other = tuple((f.name, i, f) for i, f in enumerate(fields) if f.dtype is None)
        arena_size = v[7]
        owner = type("BatchMemory", (ctypes.c_char * arena_size,), {"__del__": _owner_del})
        # With the extension: describe's arguments (its address, the
        # vector's, the arrays', their number), and views' (the vector's
        # length, the arena's, and per fixed-width column its name, the
        # words of its length and values in the vector, its dtype).
        fast = None
        if _views is not None and fixed:
            vspecs = tuple((f.name, head + i * ARRAY_INFO_WORDS + 6,
                            head + i * ARRAY_INFO_WORDS + 10, f.dtype)
                           for i, f in enumerate(fields) if f.dtype is not None)
            fast = (_views.describe, ctypes.cast(fn, ctypes.c_void_p).value, addr,
                    addr + head * 8, n, _views.views, len(cbuf), arena_size, vspecs)
        self._release = L.larder_batch_release
        self._fields = fields
        self._names = [f.name for f in fields]
        self._plan = (fn, args, cbuf, unpack, owner, fixed, other, fast)

    def close(self):
        """Closes the stream; batches still alive stay valid until dropped."""
        h, self._h = self._h, None
        if h:
            # A batch taken when a signal interrupted next() that no Batch
            # owns: held, it would keep a CUDA stream's region mapped and
            # its connection open until the process exits.
            p, self._stash = self._stash, 0
            if p:
                self._L.larder_batch_release(p)
            self._L.larder_stream_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _owner_del(self):
    """A batch's region goes back to the daemon when its last view is gone.
    Its stream (and so the connection) stays alive until after this."""
    try:
        self._b[0](self._b[1])
    except Exception:
        pass


_frombuffer = np.frombuffer
_u8 = np.dtype(np.uint8)
_HEAD = BATCH_INFO_WORDS
_W = ARRAY_INFO_WORDS


class Batch(collections.abc.Mapping):
    """One batch: a mapping of column name to a zero-copy array.

    Fixed-width columns are numpy arrays (timestamps as datetime64; bools
    unpacked from their bitmap, a copy), LISTs of fixed-width values of one
    length a 2-D array, FIXED_BINARY and decimals a 2-D uint8 array,
    strings, binary and other lists VarColumn (offsets, values), structs a
    dict of their fields.  A null slot holds zeros; ``mask(name)`` gives
    the validity (True = present), None when the column has no nulls."""

    __slots__ = ("_stream", "_ptr", "_ro", "_full", "_arrays", "num_rows", "epoch", "index",
                 "__weakref__")

    def __init__(self, stream, ptr):
        plan = stream._plan
        if plan is None:
            stream._make_plan(ptr)
            plan = stream._plan
        describe, args, cbuf, unpack, owner, fixed, other, fast = plan
        if fast is not None:
            # larder_batch_describe, and the header's rows, epoch, index
            # and arena, in one call.
            h = fast[0](fast[1], ptr, fast[2], fast[3], fast[4])
            base = h[3]
        else:
            describe(ptr, *args)
            # Only the words the Python path reads (struct skips the
            # others): the header, then each column's length, null count
            # and values.
            h = unpack(cbuf)
            base = h[6]
        mem = owner.from_address(base)
        mem._b = (stream._release, ptr, stream)
        stream._stash = 0  # no call between: a signal cannot fall in between
        # Read-only, as the arena is mapped: a write would fault.
        ro = memoryview(mem).toreadonly()
        self._stream = stream
        self._ptr = ptr
        self._ro = ro
        self._full = None
        self.num_rows = h[0]
        self.epoch = h[1]
        self.index = h[2]
        # The extension's views, else (no extension, or a column it leaves
        # to the general path) numpy's, one call per column.
        arrays = fast[5](ro, base, fast[7], fast[2], fast[6], fast[8]) if fast else None
        if arrays is None:
            v = unpack(cbuf)
            try:
                arrays = {name: _frombuffer(ro, dt, v[kl], v[kv] - base)
                          for name, kl, kv, dt in fixed}
            except ValueError:  # a column of no rows: no buffer to view
                arrays = {f.name: _build(self, f, i) for i, f in enumerate(stream._fields)}
                other = ()
        for name, i, f in other:
            arrays[name] = _build(self, f, i)
        if other and fixed:  # keep the stream's column order
            arrays = {k: arrays[k] for k in stream._names}
        self._arrays = arrays

    def _vector(self):
        """The whole describe vector of this batch (the slow paths)."""
        if self._full is None:
            if self._ro is None:
                raise ValueError("larder: the batch was released")
            st = self._stream
            n = (len(st._plan[2]) - BATCH_INFO_WORDS) // ARRAY_INFO_WORDS
            buf = (ctypes.c_int64 * (BATCH_INFO_WORDS + n * ARRAY_INFO_WORDS))()
            addr = ctypes.addressof(buf)
            st._L.larder_batch_describe(self._ptr, addr, addr + BATCH_INFO_WORDS * 8, n)
            self._full = buf[:]  # a list; list(buf) is several times slower
        return self._full

    # -- mapping

    def __getitem__(self, name):
        return self._arrays[name]

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self):
        return len(self._arrays)

    def keys(self):
        return self._arrays.keys()

    def items(self):
        return self._arrays.items()

    def values(self):
        return self._arrays.values()

    def __repr__(self):
        return "Batch(epoch=%d, index=%d, rows=%d, columns=%s)" % (
            self.epoch, self.index, self.num_rows, list(self._arrays))

    # -- conversions

    def numpy(self, masks=False):
        """{name: array}; with masks, {name: (array, mask or None)}."""
        if not masks:
            return dict(self._arrays)
        return {k: (a, self.mask(k)) for k, a in self._arrays.items()}

    def torch(self, masks=False):
        """{name: tensor} by torch.from_numpy (zero-copy; the tensor keeps
        the batch alive).  VarColumns become (offsets, values) tensor
        pairs; unsigned 16/32-bit columns are widened (a copy), as torch
        lacks those types; uint64 raises TypeError."""
        out = {}
        for k, a in self._arrays.items():
            t = _to_torch(k, a)
            out[k] = (t, None if (m := self.mask(k)) is None else _to_torch(k, m)) if masks else t
        return out

    def mask(self, name):
        """The validity of column name as a bool array (True = present), or
        None when it has no nulls."""
        i = self._stream._names.index(name)
        return self._mask_of(i)

    def _mask_of(self, idx):
        v = self._vector()
        k = _HEAD + idx * _W
        if v[k + 7] == 0:
            return None
        n = v[k + 6]
        bits = _frombuffer(self._ro, _u8, (n + 7) // 8, v[k + 8] - v[6])
        return _unpack_bits(bits, n)

    def to_pylist(self, name):
        """Column name as Python values (None for nulls).  Copies."""
        a = self._arrays[name]
        vals = a.to_pylist() if isinstance(a, VarColumn) else (
            a.tolist() if isinstance(a, np.ndarray) else a)
        m = self.mask(name)
        if m is not None:
            vals = [x if ok else None for x, ok in zip(vals, m.tolist())]
        return vals

    @property
    def position(self):
        """(epoch, index) of this batch."""
        return (self.epoch, self.index)

    def release(self):
        """Drops the batch's own reference to its region: the region goes
        back to the daemon now if no array taken from the batch is alive,
        else when the last one is dropped.  The batch is unusable after."""
        self._arrays = {}
        self._ro = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    # -- Arrow PyCapsule interface

    def __arrow_c_schema__(self):
        from . import _arrow
        return _arrow.schema_capsule(self)

    def __arrow_c_array__(self, requested_schema=None):
        from . import _arrow
        return _arrow.array_capsules(self)


def _build(batch, f, idx):
    """The array (or VarColumn, dict) of node idx of field f, zero-copy."""
    v, u8 = batch._vector(), batch._ro
    base = v[6]
    k = _HEAD + idx * _W
    t, width, ow, length = v[k], v[k + 1], v[k + 2], v[k + 6]

    def view(dtype, count, ptr):
        if count == 0 or ptr == 0:
            return np.zeros(0, dtype)
        return _frombuffer(u8, dtype, count, ptr - base)

    if f.dtype is not None:
        return view(f.dtype, length, v[k + 10])
    if t == _T["bool"]:
        return _unpack_bits(view(_u8, (length + 7) // 8, v[k + 10]), length)
    if t == _T["null"]:
        return np.zeros(length, np.bool_)
    if t == _T["fixed_binary"] or t in (_T["decimal128"], _T["decimal256"]):
        return view(_u8, length * width, v[k + 10]).reshape(length, width)
    odt = np.dtype("<i4") if ow == 4 else np.dtype("<i8")
    if t in _VAR:
        offs = view(odt, length + 1, v[k + 9]) if length else np.zeros(1, odt)
        return VarColumn(offs, view(_u8, v[k + 11], v[k + 10]), f.type_name)
    if t in _LISTS or t == _T["map"]:
        offs = view(odt, length + 1, v[k + 9]) if length else np.zeros(1, odt)
        child = _build(batch, f.children[0], v[k + 4])
        if t in _LISTS and isinstance(child, np.ndarray) and child.ndim == 1 and length:
            first, last = int(offs[0]), int(offs[-1])
            span = last - first
            if span % length == 0:
                per = span // length
                if np.array_equal(offs, first + per * np.arange(length + 1)):
                    return child[first:last].reshape(length, per)
        return VarColumn(offs, child, f.type_name)
    if t == _T["struct"]:
        first = v[k + 4]
        return {c.name: _build(batch, c, first + j) for j, c in enumerate(f.children)}
    raise TypeError("larder: column %r has type %s, which the package cannot view"
                    % (f.name, f.type_name))


_TORCH_WIDEN = {np.dtype("<u2"): np.int32, np.dtype("<u4"): np.int64}
_torch_warned = [False]


def _to_torch(name, a):
    import torch
    if not _torch_warned[0]:
        # Arena views are read-only; torch warns once for each such array
        # it wraps.  The package's documentation says so instead.
        import warnings
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        _torch_warned[0] = True
    if isinstance(a, VarColumn):
        vals = a[1]
        return (torch.from_numpy(a[0]),
                _to_torch(name, vals) if not isinstance(vals, dict) else
                {k: _to_torch(name, x) for k, x in vals.items()})
    if isinstance(a, dict):
        return {k: _to_torch(name + "." + k, x) for k, x in a.items()}
    if a.dtype.kind == "M":
        a = a.view(np.int64)
    w = _TORCH_WIDEN.get(a.dtype)
    if w is not None:
        a = a.astype(w)
    elif a.dtype == np.uint64:
        raise TypeError("larder: column %r is uint64, which torch lacks" % name)
    return torch.from_numpy(a)
