"""The Arrow PyCapsule interface of a Batch, over larder_batch_export.

A batch is exported once, through liblarder, into structs this module
keeps (the "inner" export); its release then releases the batch, so the
batch's memory object calls it instead of larder_batch_release when its
last view goes.  Each capsule handed out holds a deep copy of the inner
structs' tree whose release callbacks (below) drop the copy's reference
to that memory object: the batch's region goes back to the daemon only
once every view, the Batch, and every Arrow array imported from a capsule
are gone.  Consumers may release the copies on any thread.
"""
import ctypes
import threading

from . import library

P = ctypes.c_void_p


class ArrowSchema(ctypes.Structure):
    pass


class ArrowArray(ctypes.Structure):
    pass


SCHEMA_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))
ARRAY_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))
ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_void_p),
    ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)), ("release", SCHEMA_RELEASE),
    ("private_data", ctypes.c_void_p)]
ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)), ("release", ARRAY_RELEASE),
    ("private_data", ctypes.c_void_p)]

_SCHEMA_NAME = b"arrow_schema"
_ARRAY_NAME = b"arrow_array"

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [P, ctypes.c_char_p, P]
_api.PyCapsule_GetPointer.restype = P
_api.PyCapsule_GetPointer.argtypes = [P, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [P]

# Exports alive in consumers: id -> _Copy.  A copy leaves when its last
# node is released.
_live = {}
_lock = threading.Lock()


class _Copy:
    """One capsule's struct tree: its nodes, their buffers, and what keeps
    the batch alive (`keep`)."""

    def __init__(self, keep):
        self.keep = keep
        self.nodes = []     # ctypes structs, root first
        self.extra = []     # arrays of pointers and strings they point to
        self.open = 0       # nodes not released yet


def _copy_schema(src, dst, cp):
    dst.format = src.format
    dst.name = src.name
    dst.metadata = None
    dst.flags = src.flags
    dst.n_children = src.n_children
    dst.dictionary = None
    dst.private_data = id(cp)
    dst.release = _schema_release
    cp.open += 1
    if src.n_children:
        kids = [ArrowSchema() for _ in range(src.n_children)]
        ptrs = (ctypes.POINTER(ArrowSchema) * src.n_children)(*[ctypes.pointer(k) for k in kids])
        cp.nodes += kids
        cp.extra.append(ptrs)
        dst.children = ptrs
        for i, k in enumerate(kids):
            _copy_schema(src.children[i].contents, k, cp)
    else:
        dst.children = None


def _copy_array(src, dst, cp):
    dst.length, dst.null_count, dst.offset = src.length, src.null_count, src.offset
    dst.n_buffers, dst.n_children = src.n_buffers, src.n_children
    bufs = (ctypes.c_void_p * max(1, src.n_buffers))(*[src.buffers[i] for i in range(src.n_buffers)])
    cp.extra.append(bufs)
    dst.buffers = bufs
    dst.dictionary = None
    dst.private_data = id(cp)
    dst.release = _array_release
    cp.open += 1
    if src.n_children:
        kids = [ArrowArray() for _ in range(src.n_children)]
        ptrs = (ctypes.POINTER(ArrowArray) * src.n_children)(*[ctypes.pointer(k) for k in kids])
        cp.nodes += kids
        cp.extra.append(ptrs)
        dst.children = ptrs
        for i, k in enumerate(kids):
            _copy_array(src.children[i].contents, k, cp)
    else:
        dst.children = None


def _node_released(key):
    with _lock:
        cp = _live.get(key)
        if cp is None:
            return
        cp.open -= 1
        if cp.open == 0:
            del _live[key]


def _release_schema(p):
    s = p.contents
    if not s.release:
        return
    # A parent releases the children not moved out of it (the C Data
    # Interface's rule); a moved child has its own release called.
    for i in range(s.n_children):
        c = s.children[i].contents
        if c.release:
            c.release(s.children[i])
    key = s.private_data
    s.release = SCHEMA_RELEASE()
    _node_released(key)


def _release_array(p):
    a = p.contents
    if not a.release:
        return
    for i in range(a.n_children):
        c = a.children[i].contents
        if c.release:
            c.release(a.children[i])
    key = a.private_data
    a.release = ARRAY_RELEASE()
    _node_released(key)


_schema_release = SCHEMA_RELEASE(_release_schema)
_array_release = ARRAY_RELEASE(_release_array)


@ctypes.CFUNCTYPE(None, P)
def _capsule_destructor(capsule):
    # A capsule no consumer imported: release what it holds.  (The capsule
    # is dying: it is passed as a plain pointer, never as an object.)
    name = _api.PyCapsule_GetName(capsule)
    T = ArrowArray if name == _ARRAY_NAME else ArrowSchema
    ptr = _api.PyCapsule_GetPointer(capsule, name)
    if ptr:
        s = ctypes.cast(ptr, ctypes.POINTER(T))
        if s.contents.release:
            s.contents.release(s)


def _inner(batch):
    """The batch's own export (schema, array), made on first use."""
    if batch._ro is None:
        raise ValueError("larder: the batch was released")
    mem = batch._ro.obj
    ex = getattr(mem, "_arrow", None)
    if ex is None:
        L = library()
        schema, array = ArrowSchema(), ArrowArray()
        rc = L.larder_batch_export(batch._ptr, ctypes.addressof(schema), ctypes.addressof(array))
        if rc != 0:
            from . import error_for
            raise error_for(rc, "larder_batch_export")
        ex = (schema, array)
        mem._arrow = ex
        # From now on the ArrowArray owns the batch: the memory object's
        # last reference releases it through the array instead.
        mem._b = (_release_inner, ex, mem._b[2])  # [2] keeps the stream alive
    return mem, ex


def _release_inner(ex):
    schema, array = ex
    if array.release:
        array.release(ctypes.pointer(array))
    if schema.release:
        schema.release(ctypes.pointer(schema))


def _capsule(root, name, cp):
    key = id(cp)
    with _lock:
        _live[key] = cp
    return _api.PyCapsule_New(ctypes.addressof(root), name,
                              ctypes.cast(_capsule_destructor, P))


def schema_capsule(batch):
    mem, (schema, _) = _inner(batch)
    cp = _Copy(None)  # a schema points at no batch memory
    root = ArrowSchema()
    cp.nodes.append(root)
    _copy_schema(schema, root, cp)
    return _capsule(root, _SCHEMA_NAME, cp)


def array_capsules(batch):
    mem, (_, array) = _inner(batch)
    cp = _Copy(mem)
    root = ArrowArray()
    cp.nodes.append(root)
    _copy_array(array, root, cp)
    return schema_capsule(batch), _capsule(root, _ARRAY_NAME, cp)
