"""Finding and declaring liblarder for ctypes.

Every function the package calls is declared with its prototype: ctypes
otherwise passes and returns C ints, which truncates 64-bit pointers.
"""
import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import os
import sysconfig

P = ctypes.c_void_p
_u64p = ctypes.POINTER(ctypes.c_uint64)


class StreamOptions(ctypes.Structure):
    """The mirror of larder_stream_options_t (tests/python checks it against C)."""
    _fields_ = [
        ("sources", ctypes.POINTER(ctypes.c_char_p)),
        ("num_sources", ctypes.c_size_t),
        ("columns", ctypes.POINTER(ctypes.c_char_p)),
        ("num_columns", ctypes.c_size_t),
        ("batch_size", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("shuffle", ctypes.c_int),
        ("shuffle_window", ctypes.c_uint32),
        ("unit_rows", ctypes.c_uint32),
        ("epochs", ctypes.c_uint64),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("drop_last", ctypes.c_int),
        ("start_epoch", ctypes.c_uint64),
        ("start_batch", ctypes.c_uint64),
        ("window", ctypes.c_uint32),
        ("arena_bytes", ctypes.c_uint64),
        ("memory_kind", ctypes.c_int),
        ("cuda_device", ctypes.c_int),
        ("partitions", ctypes.c_uint32),
        ("local_world_size", ctypes.c_int32),
        ("job", ctypes.c_char_p),
    ]


# DLPack's structs as larder.h declares them (dlpack.h v0.8).
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
    ]


# larder_batch_info_t and larder_array_info_t: every field is 8 bytes, so
# that the package reads them as one int64 vector (larder.h).
BATCH_INFO_FIELDS = ("num_rows", "epoch", "index", "bytes", "num_columns", "num_arrays",
                     "arena", "arena_size")
ARRAY_INFO_FIELDS = ("type", "byte_width", "offset_width", "num_children", "first_child",
                     "parent", "length", "null_count", "validity", "offsets", "values",
                     "values_size")
BATCH_INFO_WORDS = len(BATCH_INFO_FIELDS)
ARRAY_INFO_WORDS = len(ARRAY_INFO_FIELDS)

_PROTOS = {
    "larder_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "larder_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "larder_type_name": (ctypes.c_char_p, [ctypes.c_int]),
    "larder_client_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(P)]),
    "larder_client_close": (None, [P]),
    "larder_client_last_error": (ctypes.c_char_p, [P]),
    "larder_stream_options_init": (None, [ctypes.POINTER(StreamOptions)]),
    "larder_stream_open": (ctypes.c_int, [P, ctypes.POINTER(StreamOptions), ctypes.POINTER(P)]),
    "larder_stream_next": (ctypes.c_int, [P, ctypes.c_int, ctypes.POINTER(P)]),
    "larder_stream_fd": (ctypes.c_int, [P]),
    "larder_stream_position": (None, [P, _u64p, _u64p]),
    "larder_stream_batches_per_epoch": (ctypes.c_uint64, [P]),
    "larder_stream_num_samples": (ctypes.c_uint64, [P]),
    "larder_stream_partitions": (None, [P, ctypes.POINTER(ctypes.c_uint32),
                                        ctypes.POINTER(ctypes.c_uint32),
                                        ctypes.POINTER(ctypes.c_uint32)]),
    "larder_stream_note": (ctypes.c_char_p, [P]),
    "larder_connect_error": (ctypes.c_char_p, []),
    "larder_stream_num_columns": (ctypes.c_int, [P]),
    "larder_stream_column_name": (ctypes.c_char_p, [P, ctypes.c_int]),
    "larder_stream_column_type": (ctypes.c_int, [P, ctypes.c_int]),
    "larder_stream_stall": (None, [P, _u64p, _u64p]),
    "larder_stream_flush": (ctypes.c_int, [P]),
    "larder_stream_set_cuda_stream": (None, [P, P]),
    "larder_stream_close": (None, [P]),
    "larder_batch_release": (None, [P]),
    "larder_batch_column": (P, [P, ctypes.c_int]),
    "larder_batch_describe": (ctypes.c_int, [P, P, P, ctypes.c_int]),
    "larder_batch_export": (ctypes.c_int, [P, P, P]),
    "larder_batch_device": (ctypes.c_int, [P]),
    "larder_batch_memory_kind": (ctypes.c_int, [P]),
    "larder_batch_dlpack": (ctypes.c_int, [P, P, DLDataType, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(P)]),
    "larder_array_name": (ctypes.c_char_p, [P]),
    "larder_array_nullable": (ctypes.c_int, [P]),
    "larder_array_byte_width": (ctypes.c_int32, [P]),
    "larder_array_precision": (ctypes.c_int32, [P]),
    "larder_array_scale": (ctypes.c_int32, [P]),
    "larder_array_unit": (ctypes.c_int, [P]),
    "larder_array_utc": (ctypes.c_int, [P]),
    "larder_array_num_children": (ctypes.c_int, [P]),
    "larder_array_child": (P, [P, ctypes.c_int]),
}


def _candidates():
    """Where liblarder may be, in the order tried."""
    env = os.environ.get("LARDER_LIB")
    if env:
        # An explicit choice: nothing else is tried, so that a wrong path
        # fails loudly rather than loading another build.
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "liblarder.so"), os.path.join(here, "liblarder.so.0")]
    try:
        from . import _config  # written by `make install`: its LIBDIR
        out += [os.path.join(_config.LIBDIR, "liblarder.so.0"),
                os.path.join(_config.LIBDIR, "liblarder.so")]
    except ImportError:
        pass
    # A source tree: client/python/larder -> build/release/lib.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    out.append(os.path.join(repo, "build", "release", "lib", "liblarder.so"))
    for prefix in ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
                   "/usr/lib/aarch64-linux-gnu"):
        out.append(os.path.join(prefix, "liblarder.so.0"))
    found = ctypes.util.find_library("larder")
    if found:
        out.append(found)
    out.append("liblarder.so.0")  # the dynamic loader's own search
    return out


def load():
    """Loads and declares liblarder; raises OSError naming what was tried."""
    tried = []
    lib = None
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    if lib is None:
        raise OSError("larder: cannot load liblarder; set LARDER_LIB to its path. Tried: "
                      + "; ".join(tried))
    for name, (restype, argtypes) in _PROTOS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise OSError("larder: %s lacks %s: an older liblarder than this package"
                          % (lib._name, name)) from None
        f.restype = restype
        f.argtypes = argtypes
    return lib


def load_views(lib):
    """The optional extension (_views.c) that builds a batch's numpy views
    in one call, as (module, None), or (None, why) when there is none that
    this interpreter and numpy can load: the package then builds them in
    Python.  It is looked for beside the package (make install, pip) and
    in larder/ beside the liblarder that lib was loaded from (a build
    tree).  LARDER_PURE_PYTHON=1 skips it."""
    if os.environ.get("LARDER_PURE_PYTHON", "") not in ("", "0"):
        return None, "LARDER_PURE_PYTHON is set"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    name = "_views" + suffix
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, name)]
    libpath = getattr(lib, "_name", "") or ""
    if os.sep in libpath:
        paths.append(os.path.join(os.path.dirname(os.path.realpath(libpath)), "larder", name))
    why = "no %s in %s" % (name, " or ".join(os.path.dirname(p) for p in paths))
    for path in paths:
        if not os.path.exists(path):
            continue
        try:
            loader = importlib.machinery.ExtensionFileLoader("larder._views", path)
            spec = importlib.util.spec_from_file_location("larder._views", path, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            return mod, None
        except Exception as e:  # another numpy's ABI, a broken file: fall back
            why = "%s: %s" % (path, e)
    return None, why
