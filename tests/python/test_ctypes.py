#!/usr/bin/env python3
"""
test_ctypes.py: drives liblarder.so from Python through ctypes, the way a
PyTorch data loader would, against a real larderd on a temporary socket.

    python3 tests/python/test_ctypes.py BUILD_DIR

BUILD_DIR is a build flavour's directory, such as build/release: the test
loads BUILD_DIR/lib/liblarder.so and runs BUILD_DIR/bin/larderd and
BUILD_DIR/bin/larderctl.  It uses the standard library only, so that it
runs wherever Python 3 does; values are checked against what
`larderctl cat` prints for the same Parquet files, an independent reader
of the same data.

What it checks, in order:
  1. the ctypes mirrors of larder_stream_options_t, struct ArrowSchema and
     struct ArrowArray against a C program built with gcc from larder.h,
     and the error and type tables against larder.h's lists;
  2. two shuffled epochs of a 1,000-row file: every row once per epoch
     (plus the documented padding), values equal to `larderctl cat`, a new
     order each epoch, and the same sequence again for the same seed, with
     batches released on another thread as a pinning thread would;
  3. every column type the test files hold, read through the larder_array_*
     accessors and through an Arrow C Data Interface export, which must
     agree; the exported structs are released through their own function
     pointers, and a small window shows the releases reached the daemon;
  4. larder_stream_position and resuming from it;
  5. error paths: their codes, names and messages, and that nothing crashes;
  6. a forked child using its parent's client (a DataLoader worker), and a
     client killed with SIGKILL mid-epoch beside one that keeps reading;
  7. what loaders do besides: ranks (from options and from torchrun's
     variables), drop_last, a training and a validation stream on one
     client, an event loop on larder_stream_fd, held batches that must not
     change, the stall figures; and, last, the daemon dying under a trainer
     that then resumes on a restarted daemon;
  8. the bugs this test found when it was written, each fixed in
     liblarder or larderd (and tested in C too): a check of each.

Exit status 0 when everything passed, 1 otherwise.  It takes a few
seconds; a watchdog fails it after WATCHDOG_SECONDS.
"""
import base64
import ctypes
import faulthandler
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import queue
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HEADER = os.path.join(REPO, "client", "larder.h")
DATA = os.path.join(REPO, "tests", "data", "parquet-testing", "data")

# The whole run must end well under a minute; a hang in the library or the
# daemon must fail the test rather than stall CI, so a watchdog kills the
# daemon (which makes any blocked library call return) and then the process.
WATCHDOG_SECONDS = 50
# How long one larder_stream_next may wait before the test calls it a hang.
NEXT_TIMEOUT_MS = 10000


class TestFailure(Exception):
    """A check that did not hold."""


def check(cond, message):
    """Raises TestFailure with message unless cond holds."""
    if not cond:
        raise TestFailure(message)


# ---------------------------------------------------------------------------
# Bindings

class StreamOptions(ctypes.Structure):
    """The mirror of larder_stream_options_t; test_abi compares it with C."""
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


class ArrowSchema(ctypes.Structure):
    """The mirror of the C Data Interface's struct ArrowSchema."""


class ArrowArray(ctypes.Structure):
    """The mirror of the C Data Interface's struct ArrowArray."""


SCHEMA_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))
ARRAY_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))

# metadata is a binary encoding, not a C string, so it is read as a pointer.
ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_void_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", SCHEMA_RELEASE),
    ("private_data", ctypes.c_void_p),
]
ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ARRAY_RELEASE),
    ("private_data", ctypes.c_void_p),
]

ARROW_FLAG_NULLABLE = 2

# larder_type_t, in the order of larder.h's enum (test_abi checks the names).
TYPE_NAMES = ["null", "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
              "uint32", "uint64", "float16", "float32", "float64", "date32", "time32",
              "time64", "timestamp", "decimal128", "decimal256", "binary", "string",
              "large_binary", "large_string", "fixed_binary", "list", "large_list",
              "struct", "map"]
T = {name: i for i, name in enumerate(TYPE_NAMES)}

# Error codes the test names; test_abi checks them against larder.h.
EINVAL, ENOENT, ECORRUPT, ECHECKSUM, ETIMEDOUT = -1, -8, -4, -7, -10
EEOF, ECONNECT, EUNSUPPORTED, ECLOSED, ELIMIT = -17, -20, -5, -11, -6

P = ctypes.c_void_p


def load_library(build_dir):
    """Loads liblarder.so and declares every public function's prototype.

    Every prototype must be declared: ctypes otherwise passes and returns
    C ints, which truncates the 64-bit pointers and counts."""
    lib = ctypes.CDLL(os.path.join(build_dir, "lib", "liblarder.so"))
    u64p = ctypes.POINTER(ctypes.c_uint64)
    protos = {
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
        "larder_stream_position": (None, [P, u64p, u64p]),
        "larder_stream_batches_per_epoch": (ctypes.c_uint64, [P]),
        "larder_stream_num_samples": (ctypes.c_uint64, [P]),
        "larder_stream_num_columns": (ctypes.c_int, [P]),
        "larder_stream_column_name": (ctypes.c_char_p, [P, ctypes.c_int]),
        "larder_stream_column_type": (ctypes.c_int, [P, ctypes.c_int]),
        "larder_stream_stall": (None, [P, u64p, u64p]),
        "larder_stream_flush": (ctypes.c_int, [P]),
        "larder_stream_close": (None, [P]),
        "larder_batch_num_rows": (ctypes.c_int64, [P]),
        "larder_batch_epoch": (ctypes.c_uint64, [P]),
        "larder_batch_index": (ctypes.c_uint64, [P]),
        "larder_batch_num_columns": (ctypes.c_int, [P]),
        "larder_batch_column": (P, [P, ctypes.c_int]),
        "larder_batch_column_by_name": (P, [P, ctypes.c_char_p]),
        "larder_batch_bytes": (ctypes.c_uint64, [P]),
        "larder_batch_release": (None, [P]),
        "larder_array_name": (ctypes.c_char_p, [P]),
        "larder_array_type": (ctypes.c_int, [P]),
        "larder_array_nullable": (ctypes.c_int, [P]),
        "larder_array_byte_width": (ctypes.c_int32, [P]),
        "larder_array_precision": (ctypes.c_int32, [P]),
        "larder_array_scale": (ctypes.c_int32, [P]),
        "larder_array_unit": (ctypes.c_int, [P]),
        "larder_array_utc": (ctypes.c_int, [P]),
        "larder_array_length": (ctypes.c_int64, [P]),
        "larder_array_null_count": (ctypes.c_int64, [P]),
        "larder_array_validity": (P, [P]),
        "larder_array_offsets": (P, [P]),
        "larder_array_large_offsets": (P, [P]),
        "larder_array_values": (P, [P]),
        "larder_array_values_size": (ctypes.c_uint64, [P]),
        "larder_array_num_children": (ctypes.c_int, [P]),
        "larder_array_child": (P, [P, ctypes.c_int]),
        "larder_batch_export": (ctypes.c_int, [P, ctypes.POINTER(ArrowSchema),
                                               ctypes.POINTER(ArrowArray)]),
    }
    for name, (restype, argtypes) in protos.items():
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes
    return lib


class Larder:
    """A thin Pythonic layer over the library, as a data loader would write
    one: it keeps the ctypes arrays an open needs alive, and turns codes into
    values the tests compare."""

    def __init__(self, lib):
        self.lib = lib

    def err(self, code):
        return "%s (%s)" % (self.lib.larder_err_name(code).decode(),
                            self.lib.larder_strerror(code).decode())

    def connect(self, path):
        """Returns (code, client handle or None)."""
        c = P()
        rc = self.lib.larder_client_connect(path.encode() if path is not None else None,
                                            ctypes.byref(c))
        return rc, (c if c.value else None)

    def last_error(self, client):
        return self.lib.larder_client_last_error(client).decode()

    def options(self, sources, columns=None, **fields):
        """Fills a StreamOptions with the library's defaults, then fields.

        The returned structure holds pointers into ctypes arrays; they are
        attached to it so that they live exactly as long as it does."""
        o = StreamOptions()
        self.lib.larder_stream_options_init(ctypes.byref(o))
        src = (ctypes.c_char_p * len(sources))(*[s.encode() for s in sources])
        o.sources, o.num_sources = src, len(sources)
        o._keep = [src]
        if columns is not None:
            cols = (ctypes.c_char_p * len(columns))(*[c.encode() for c in columns])
            o.columns, o.num_columns = cols, len(columns)
            o._keep.append(cols)
        for k, v in fields.items():
            check(hasattr(o, k), "no option %s" % k)
            setattr(o, k, v)
        return o

    def open(self, client, opts):
        """Returns (code, stream handle or None)."""
        s = P()
        rc = self.lib.larder_stream_open(client, ctypes.byref(opts), ctypes.byref(s))
        return rc, (s if s.value else None)

    def open_ok(self, client, opts):
        rc, s = self.open(client, opts)
        check(rc == 0, "larder_stream_open: %s: %s" % (self.err(rc), self.last_error(client)))
        return s

    def next(self, stream, timeout_ms=NEXT_TIMEOUT_MS):
        """Returns (code, batch handle or None)."""
        b = P()
        rc = self.lib.larder_stream_next(stream, timeout_ms, ctypes.byref(b))
        return rc, (b if b.value else None)

    def position(self, stream):
        e, b = ctypes.c_uint64(), ctypes.c_uint64()
        self.lib.larder_stream_position(stream, ctypes.byref(e), ctypes.byref(b))
        return e.value, b.value

    def columns(self, batch):
        n = self.lib.larder_batch_num_columns(batch)
        return [self.lib.larder_batch_column(batch, i) for i in range(n)]


# ---------------------------------------------------------------------------
# The daemon

class Daemon:
    """A larderd on a socket and cache directory of its own, under tmp."""

    def __init__(self, build_dir, tmp, flags=()):
        self.bin = os.path.join(build_dir, "bin", "larderd")
        self.ctl = os.path.join(build_dir, "bin", "larderctl")
        self.dir = tmp
        self.socket = os.path.join(tmp, "sock")
        self.cache = os.path.join(tmp, "cache")
        self.log = os.path.join(tmp, "larderd.log")
        self.flags = list(flags)
        self.proc = None

    def start(self):
        os.makedirs(self.cache, exist_ok=True)
        # An empty configuration file keeps the host's /etc/larder out of it:
        # every setting comes from the flags, as in tests/daemon-harness.c.
        config = os.path.join(self.dir, "larderd.conf")
        with open(config, "w") as f:
            f.write("# empty: the test passes every setting as a flag\n")
        argv = [self.bin, "--config=" + config, "--socket=" + self.socket,
                "--cache_dir=" + self.cache] + self.flags
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, close_fds=True)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise TestFailure("larderd exited during startup (status %s):\n%s"
                                  % (self.proc.returncode, self.tail()))
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return
            except OSError:
                pass
            finally:
                s.close()
            if time.monotonic() > deadline:
                raise TestFailure("larderd did not accept in time:\n" + self.tail())
            time.sleep(0.01)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        """SIGTERM, then SIGKILL if it does not exit; returns its status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        status = self.proc.returncode
        self.proc = None
        return status

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def tail(self, n=4000):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def ctl_json(self, *args):
        out = subprocess.run([self.ctl, "--socket", self.socket, "--json"] + list(args),
                             capture_output=True, text=True, timeout=20)
        check(out.returncode == 0, "larderctl %s: %s" % (" ".join(args), out.stderr))
        return json.loads(out.stdout)


# ---------------------------------------------------------------------------
# Reading arrays into Python values
#
# Both readers below, one through the larder_array_* accessors and one
# through an Arrow export, build the same canonical Python values, so that
# they can be compared with each other and with `larderctl cat`:
# None for null, bool, int, float (the exact value of the stored float),
# "NaN"/"Infinity" for those floats (they have no JSON number), ISO 8601
# strings for dates, times and timestamps, exact decimal strings, str,
# bytes, lists, dicts for structs, and lists of {"key", "value"} for maps.

FIXED_FORMATS = {T["int8"]: "b", T["int16"]: "h", T["int32"]: "i", T["int64"]: "q",
                 T["uint8"]: "B", T["uint16"]: "H", T["uint32"]: "I", T["uint64"]: "Q",
                 T["float16"]: "e", T["float32"]: "f", T["float64"]: "d",
                 T["date32"]: "i", T["time32"]: "i", T["time64"]: "q", T["timestamp"]: "q"}
FLOATS = {T["float16"]: "e", T["float32"]: "f", T["float64"]: "d"}


def canon_float(x):
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return float(x)


def iso_date(days):
    """Days since 1970-01-01 as an ISO 8601 date, with the expanded form
    (a sign and at least four digits) for years outside 0..9999, which
    Python's datetime cannot hold (H. Hinnant's civil_from_days)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (m <= 2)
    if 0 <= y <= 9999:
        return "%04d-%02d-%02d" % (y, m, d)
    return "%+05d-%02d-%02d" % (y, m, d)


def iso_time(v, unit):
    secs, frac = divmod(v, 10 ** (3 * unit))
    s = "%02d:%02d:%02d" % (secs // 3600, secs // 60 % 60, secs % 60)
    return s + (".%0*d" % (3 * unit, frac) if unit else "")


def iso_timestamp(v, unit, utc):
    secs, frac = divmod(v, 10 ** (3 * unit))
    days, sod = divmod(secs, 86400)
    s = iso_date(days) + "T" + iso_time(sod * 10 ** (3 * unit) + frac, unit)
    return s + ("Z" if utc else "")


def decimal_string(v, scale):
    digits = str(abs(v)).rjust(scale + 1, "0")
    if scale > 0:
        digits = digits[:-scale] + "." + digits[-scale:]
    return ("-" if v < 0 else "") + digits


def bit(bitmap, i):
    return (bitmap[i >> 3] >> (i & 7)) & 1


def build_values(info, n, valid, values, offsets, children):
    """The canonical values of an array's n slots.

    info describes its type (see describe_array), valid is a list of n
    booleans, values the bytes of its values buffer (or None), offsets a
    list of n + 1 ints (or None), children the value lists of its
    children."""
    t = info["type"]
    if t == T["null"]:
        return [None] * n
    if t == T["bool"]:
        out = [bool(bit(values, i)) for i in range(n)]
    elif t in FIXED_FORMATS:
        code = FIXED_FORMATS[t]
        raw = struct.unpack_from("<%d%s" % (n, code), values, 0) if n else ()
        if t in FLOATS:
            out = [canon_float(x) for x in raw]
        elif t == T["date32"]:
            out = [iso_date(x) for x in raw]
        elif t in (T["time32"], T["time64"]):
            out = [iso_time(x, info["unit"]) for x in raw]
        elif t == T["timestamp"]:
            out = [iso_timestamp(x, info["unit"], info["utc"]) for x in raw]
        else:
            out = list(raw)
    elif t in (T["decimal128"], T["decimal256"]):
        w = 16 if t == T["decimal128"] else 32
        out = [decimal_string(int.from_bytes(values[i * w:(i + 1) * w], "little", signed=True),
                              info["scale"]) for i in range(n)]
    elif t == T["fixed_binary"]:
        w = info["byte_width"]
        out = [bytes(values[i * w:(i + 1) * w]) for i in range(n)]
    elif t in (T["string"], T["binary"], T["large_string"], T["large_binary"]):
        data = values or b""
        out = [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(n)]
        if t in (T["string"], T["large_string"]):
            out = [x.decode("utf-8") for x in out]
    elif t in (T["list"], T["large_list"], T["map"]):
        # A map is a list of its entries, structs of "key" and "value".
        out = [children[0][offsets[i]:offsets[i + 1]] for i in range(n)]
    elif t == T["struct"]:
        names = [c["name"] for c in info["children"]]
        out = [{names[k]: children[k][i] for k in range(len(names))} for i in range(n)]
    else:
        raise TestFailure("unexpected type %d" % t)
    return [out[i] if valid[i] else None for i in range(n)]


def describe_array(lib, a):
    """The type of array a, as the accessors report it, as a dict."""
    info = {
        "name": lib.larder_array_name(a).decode(),
        "type": lib.larder_array_type(a),
        "nullable": lib.larder_array_nullable(a),
        "byte_width": lib.larder_array_byte_width(a),
        "precision": lib.larder_array_precision(a),
        "scale": lib.larder_array_scale(a),
        "unit": lib.larder_array_unit(a),
        "utc": lib.larder_array_utc(a),
    }
    info["children"] = [describe_array(lib, lib.larder_array_child(a, i))
                        for i in range(lib.larder_array_num_children(a))]
    return info


def read_int_array(ptr, count, ctype):
    return list((ctype * count).from_address(ptr)) if count else []


def read_array(lib, a, where="column"):
    """Reads array a through the accessors into canonical values, checking
    the buffer rules larder.h states on the way."""
    info = describe_array(lib, a)
    t, name = info["type"], "%s %s" % (where, info["name"])
    n = lib.larder_array_length(a)
    nulls = lib.larder_array_null_count(a)
    check(0 <= nulls <= n, "%s: null count %d of %d slots" % (name, nulls, n))
    vptr = lib.larder_array_validity(a)
    if t == T["null"]:
        # Every slot of the NULL type is null, and Arrow readers check that
        # its null count says so.
        check(nulls == n, "%s: a NULL array of %d slots with null_count %d" % (name, n, nulls))
        valid = [False] * n
    elif nulls == 0:
        # larder.h: the validity bitmap is absent (NULL) when null_count is 0.
        check(vptr is None, "%s: validity present without nulls" % name)
        valid = [True] * n
    else:
        check(vptr is not None, "%s: %d nulls but no validity bitmap" % (name, nulls))
        bitmap = ctypes.string_at(vptr, (n + 7) // 8)
        valid = [bool(bit(bitmap, i)) for i in range(n)]
        check(valid.count(False) == nulls,
              "%s: the bitmap has %d nulls, null_count says %d" % (name, valid.count(False), nulls))
    off32 = lib.larder_array_offsets(a)
    off64 = lib.larder_array_large_offsets(a)
    offsets = None
    if t in (T["binary"], T["string"], T["list"], T["map"]):
        check(off32 is not None and off64 is None, "%s: no int32 offsets" % name)
        offsets = read_int_array(off32, n + 1, ctypes.c_int32)
    elif t in (T["large_binary"], T["large_string"], T["large_list"]):
        check(off64 is not None and off32 is None, "%s: no int64 offsets" % name)
        offsets = read_int_array(off64, n + 1, ctypes.c_int64)
    else:
        check(off32 is None and off64 is None, "%s: offsets on a %s" % (name, TYPE_NAMES[t]))
    if offsets is not None:
        check(all(offsets[i] <= offsets[i + 1] for i in range(n)) and (n == 0 or offsets[0] >= 0),
              "%s: offsets do not grow: %s" % (name, offsets[:20]))
    vsize = lib.larder_array_values_size(a)
    vptr_values = lib.larder_array_values(a)
    values = ctypes.string_at(vptr_values, vsize) if vptr_values and vsize else b""
    width = {T["decimal128"]: 16, T["decimal256"]: 32,
             T["fixed_binary"]: info["byte_width"]}.get(t)
    if t in FIXED_FORMATS:
        width = struct.calcsize(FIXED_FORMATS[t])
    if width is not None:
        check(vsize >= n * width, "%s: %d value bytes for %d slots of %d" % (name, vsize, n, width))
        # larder.h: in fixed-width types "a null slot holds zero bytes".
        for i in range(n):
            if not valid[i]:
                check(values[i * width:(i + 1) * width] == bytes(width),
                      "%s: null slot %d holds %r, not zero bytes"
                      % (name, i, values[i * width:(i + 1) * width]))
    if t == T["bool"]:
        check(vsize >= (n + 7) // 8, "%s: %d bytes of bits for %d slots" % (name, vsize, n))
        # The zero of a null slot, for bits.
        for i in range(n):
            if not valid[i]:
                check(not bit(values, i), "%s: null slot %d holds a set bit" % (name, i))
    if t in (T["binary"], T["string"]):
        check(n == 0 or offsets[n] <= vsize, "%s: last offset %d past %d value bytes"
              % (name, offsets[n], vsize))
        # larder.h: in BINARY/STRING "a null slot is empty".
        for i in range(n):
            if not valid[i]:
                check(offsets[i] == offsets[i + 1], "%s: null slot %d is not empty" % (name, i))
    children = []
    for k in range(lib.larder_array_num_children(a)):
        child = lib.larder_array_child(a, k)
        if t == T["struct"]:
            check(lib.larder_array_length(child) >= n, "%s: a short child" % name)
        children.append(read_array(lib, child, name)[1])
    check(lib.larder_array_child(a, len(children)) is None and lib.larder_array_child(a, -1) is None,
          "%s: larder_array_child out of range is not NULL" % name)
    if t in (T["list"], T["map"]) and n:
        check(offsets[n] <= len(children[0]), "%s: offsets past the child" % name)
    return info, build_values(info, n, valid, values, offsets, children)


def read_batch(lib, batch):
    """Reads every column of a batch; returns (infos, rows as dicts)."""
    n = lib.larder_batch_num_rows(batch)
    infos, cols = [], []
    for i in range(lib.larder_batch_num_columns(batch)):
        a = lib.larder_batch_column(batch, i)
        info, vals = read_array(lib, a)
        check(len(vals) == n, "column %s has %d slots in a batch of %d rows"
              % (info["name"], len(vals), n))
        infos.append(info)
        cols.append(vals)
    rows = [{infos[c]["name"]: cols[c][r] for c in range(len(cols))} for r in range(n)]
    return infos, rows


# The C Data Interface format string of each type (larder.h's comments).
def arrow_format(info):
    t = info["type"]
    simple = {"null": "n", "bool": "b", "int8": "c", "int16": "s", "int32": "i",
              "int64": "l", "uint8": "C", "uint16": "S", "uint32": "I", "uint64": "L",
              "float16": "e", "float32": "f", "float64": "g", "date32": "tdD",
              "binary": "z", "string": "u", "large_binary": "Z", "large_string": "U",
              "list": "+l", "large_list": "+L", "struct": "+s", "map": "+m"}
    name = TYPE_NAMES[t]
    if name in simple:
        return simple[name]
    unit = "smun"[info["unit"]]
    if name in ("time32", "time64"):
        return "tt" + unit
    if name == "timestamp":
        return "ts%s:%s" % (unit, "UTC" if info["utc"] else "")
    if name == "decimal128":
        return "d:%d,%d" % (info["precision"], info["scale"])
    if name == "decimal256":
        return "d:%d,%d,256" % (info["precision"], info["scale"])
    if name == "fixed_binary":
        return "w:%d" % info["byte_width"]
    raise TestFailure("no format for %s" % name)


def info_from_format(fmt, name, children):
    """The type description that an Arrow format string gives, for
    build_values; the inverse of arrow_format."""
    info = {"name": name, "unit": 0, "utc": 0, "scale": 0, "precision": 0,
            "byte_width": 0, "children": children}
    simple = {"n": "null", "b": "bool", "c": "int8", "s": "int16", "i": "int32",
              "l": "int64", "C": "uint8", "S": "uint16", "I": "uint32", "L": "uint64",
              "e": "float16", "f": "float32", "g": "float64", "tdD": "date32",
              "z": "binary", "u": "string", "Z": "large_binary", "U": "large_string",
              "+l": "list", "+L": "large_list", "+s": "struct", "+m": "map"}
    if fmt in simple:
        info["type"] = T[simple[fmt]]
    elif re.fullmatch(r"tt[smun]", fmt):
        info["unit"] = "smun".index(fmt[2])
        info["type"] = T["time32"] if fmt[2] in "sm" else T["time64"]
    elif re.fullmatch(r"ts[smun]:.*", fmt):
        info["type"], info["unit"] = T["timestamp"], "smun".index(fmt[2])
        info["utc"] = int(fmt[4:] != "")
    elif re.fullmatch(r"d:\d+,\d+(,256)?", fmt):
        parts = fmt[2:].split(",")
        info["precision"], info["scale"] = int(parts[0]), int(parts[1])
        info["type"] = T["decimal256"] if len(parts) == 3 else T["decimal128"]
    elif re.fullmatch(r"w:\d+", fmt):
        info["type"], info["byte_width"] = T["fixed_binary"], int(fmt[2:])
    else:
        raise TestFailure("unknown Arrow format %r" % fmt)
    return info


def arrow_buffer_count(t):
    if t == T["null"]:
        return 0
    if t == T["struct"]:
        return 1
    if t in (T["binary"], T["string"], T["large_binary"], T["large_string"]):
        return 3
    return 2


def read_arrow(schema, array, accessor, lib, where="column", map_part=False):
    """Reads an exported Arrow array (with its schema) into canonical
    values, using only the format strings and buffers, and checks each
    struct against the accessors' view of the same array (accessor).
    map_part: the array is a map's entries or its keys, which Arrow
    requires to be non-nullable whatever the Parquet file said."""
    fmt = schema.format.decode()
    name = schema.name.decode() if schema.name is not None else None
    label = "%s %s" % (where, name)
    acc = describe_array(lib, accessor)
    check(name == acc["name"], "%s: Arrow name, accessor name %r" % (label, acc["name"]))
    check(fmt == arrow_format(acc), "%s: format %r, expected %r for a %s"
          % (label, fmt, arrow_format(acc), TYPE_NAMES[acc["type"]]))
    check(bool(schema.flags & ARROW_FLAG_NULLABLE) == (bool(acc["nullable"]) and not map_part),
          "%s: flags %d, nullable %d" % (label, schema.flags, acc["nullable"]))
    check(not schema.dictionary and not array.dictionary, "%s: a dictionary" % label)
    n = array.length
    check(n == lib.larder_array_length(accessor), "%s: length %d" % (label, n))
    check(array.null_count == lib.larder_array_null_count(accessor),
          "%s: null_count %d" % (label, array.null_count))
    check(array.offset == 0, "%s: offset %d" % (label, array.offset))
    check(schema.n_children == array.n_children == lib.larder_array_num_children(accessor),
          "%s: %d / %d children" % (label, schema.n_children, array.n_children))
    t = acc["type"]
    check(array.n_buffers == arrow_buffer_count(t),
          "%s: %d buffers for a %s" % (label, array.n_buffers, TYPE_NAMES[t]))
    bufs = [array.buffers[i] for i in range(array.n_buffers)]
    # The buffers are the arena's, not copies: the same pointers.
    if bufs:
        check(bufs[0] == lib.larder_array_validity(accessor),
              "%s: validity buffer differs from the accessor's" % label)
    if t in (T["binary"], T["string"]):
        check(bufs[1] == lib.larder_array_offsets(accessor)
              and bufs[2] == lib.larder_array_values(accessor),
              "%s: offsets/values buffers differ" % label)
    elif t in (T["list"], T["map"]):
        check(bufs[1] == lib.larder_array_offsets(accessor), "%s: offsets buffer differs" % label)
    elif len(bufs) == 2:
        check(bufs[1] == lib.larder_array_values(accessor), "%s: values buffer differs" % label)
    children, child_infos = [], []
    for k in range(array.n_children):
        cs, ca = schema.children[k].contents, array.children[k].contents
        part = (t == T["map"]) or (map_part and t == T["struct"] and k == 0)
        cinfo, cvals = read_arrow(cs, ca, lib.larder_array_child(accessor, k), lib, label, part)
        child_infos.append(cinfo)
        children.append(cvals)
    info = info_from_format(fmt, name, child_infos)
    valid = [True] * n
    if t == T["null"]:
        valid = [False] * n
    elif array.null_count != 0:
        check(bufs[0] is not None, "%s: nulls but no validity buffer" % label)
        bitmap = ctypes.string_at(bufs[0], (n + 7) // 8)
        valid = [bool(bit(bitmap, i)) for i in range(n)]
    offsets, values = None, b""
    if t in (T["binary"], T["string"], T["list"], T["map"]):
        offsets = read_int_array(bufs[1], n + 1, ctypes.c_int32)
    if t in (T["binary"], T["string"]):
        size = offsets[n] if n else 0
        values = ctypes.string_at(bufs[2], size) if bufs[2] and size else b""
    elif len(bufs) == 2 and offsets is None:
        # Arrow gives no sizes: a fixed-width buffer holds n values.
        if t == T["bool"]:
            size = (n + 7) // 8
        elif t in FIXED_FORMATS:
            size = n * struct.calcsize(FIXED_FORMATS[t])
        elif t in (T["decimal128"], T["decimal256"]):
            size = n * (16 if t == T["decimal128"] else 32)
        else:
            size = n * info["byte_width"]
        values = ctypes.string_at(bufs[1], size) if bufs[1] and size else b""
    return info, build_values(info, n, valid, values, offsets, children)


class JsonInt(int):
    """An integer of `larderctl cat`'s JSON that keeps its text: a float
    column prints -0.0 as "-0", which Python would read as the integer 0."""

    def __new__(cls, text):
        v = int.__new__(cls, text)
        v.text = text
        return v


# `larderctl cat` prints JSON; canon_json turns its values into the
# canonical values above, given the array's type description.
def canon_json(info, v):
    t = info["type"]
    if v is None:
        return None
    if t in FLOATS:
        if isinstance(v, str):
            return v
        if isinstance(v, JsonInt):
            v = float(v.text)
        return canon_float(struct.unpack("<" + FLOATS[t], struct.pack("<" + FLOATS[t], v))[0])
    if t in (T["binary"], T["fixed_binary"], T["large_binary"]):
        return base64.b64decode(v)
    if t in (T["list"], T["large_list"], T["map"]):
        return [canon_json(info["children"][0], x) for x in v]
    if t == T["struct"]:
        return {c["name"]: canon_json(c, v[c["name"]]) for c in info["children"]}
    return v


def row_key(row):
    """A total order on rows, for comparing multisets of them."""
    return json.dumps(row, sort_keys=True,
                      default=lambda b: "bytes:" + base64.b64encode(b).decode())


_cat_cache = {}


def cat_rows(ctl, path):
    """The rows `larderctl cat` prints for a file, as parsed JSON."""
    if path not in _cat_cache:
        out = subprocess.run([ctl, "cat", path], capture_output=True, text=True, timeout=30)
        check(out.returncode == 0, "larderctl cat %s: %s" % (path, out.stderr))
        _cat_cache[path] = [json.loads(line, parse_int=JsonInt)
                            for line in out.stdout.splitlines() if line]
    return _cat_cache[path]


def canon_cat_rows(ctl, paths, infos):
    """The canonical rows of files as `larderctl cat` reads them, in the
    dataset's order (files sorted by path, as the daemon orders them)."""
    rows = []
    for p in sorted(paths):
        for r in cat_rows(ctl, p):
            check([i["name"] for i in infos] == list(r.keys()),
                  "%s: larderctl cat's columns %s, the stream's %s"
                  % (p, list(r.keys()), [i["name"] for i in infos]))
            rows.append({i["name"]: canon_json(i, r[i["name"]]) for i in infos})
    return rows


# ---------------------------------------------------------------------------
# Helpers for streams

def read_epochs(L, stream, expect_epochs, on_batch):
    """Reads a stream to its end, calling on_batch(batch) for each batch
    (which must release or export it); returns the count of batches.

    Checks each batch's (epoch, index) follows the last and that
    larder_stream_position always names the batch that comes next."""
    lib = L.lib
    bpe = lib.larder_stream_batches_per_epoch(stream)
    count = 0
    pos = L.position(stream)
    while True:
        rc, b = L.next(stream)
        if rc == EEOF:
            break
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        got = (lib.larder_batch_epoch(b), lib.larder_batch_index(b))
        check(got == pos, "batch (epoch %d, index %d) where the position said %s" % (got + (pos,)))
        pos = L.position(stream)
        expect_next = (got[0], got[1] + 1) if got[1] + 1 < bpe else (got[0] + 1, 0)
        check(pos == expect_next, "position %s after batch %s, expected %s" % (pos, got, expect_next))
        on_batch(b)
        count += 1
    # Once ended, the stream keeps saying so.
    rc, b = L.next(stream, 0)
    check(rc == EEOF and b is None, "larder_stream_next after the end: %s" % L.err(rc))
    if expect_epochs is not None:
        check(count == expect_epochs * bpe, "%d batches, expected %d epochs of %d"
              % (count, expect_epochs, bpe))
    return count


def check_epoch_rows(ids, num_samples, batch_size, label):
    """Checks one epoch's sequence of sample ids: the first num_samples are a
    permutation of all samples, and the padding that fills the last batch
    repeats the epoch's first samples (daemon/plan/README.md, "The order of batches")."""
    check(len(ids) % batch_size == 0, "%s: %d rows is not whole batches" % (label, len(ids)))
    check(len(ids) - num_samples < batch_size, "%s: %d rows for %d samples"
          % (label, len(ids), num_samples))
    head = ids[:num_samples]
    check(len(set(head)) == num_samples, "%s: %d distinct samples of %d, %d repeated"
          % (label, len(set(head)), num_samples, num_samples - len(set(head))))
    pad = ids[num_samples:]
    check(pad == ids[:len(pad)], "%s: the padding %s is not the epoch's first samples %s"
          % (label, pad[:8], ids[:8]))


# ---------------------------------------------------------------------------
# 1. ABI

def test_abi(L, build_dir, tmp):
    """The ctypes mirrors must match what a C compiler makes of larder.h, or
    every field after the first mismatch is silently wrong."""
    lib = L.lib
    cc = shutil.which("gcc") or shutil.which("cc")
    check(cc is not None, "no C compiler to check the structure layouts")
    prog = os.path.join(tmp, "layout.c")
    fields = {
        "larder_stream_options_t": [f[0] for f in StreamOptions._fields_],
        "struct ArrowSchema": [f[0] for f in ArrowSchema._fields_],
        "struct ArrowArray": [f[0] for f in ArrowArray._fields_],
    }
    with open(prog, "w") as f:
        f.write('#include <stdio.h>\n#include <stddef.h>\n#include "larder.h"\n'
                "int main(void) {\n")
        for tname, names in fields.items():
            f.write('  printf("%s size %%zu %%zu\\n", sizeof(%s), _Alignof(%s));\n'
                    % (tname, tname, tname))
            for n in names:
                f.write('  printf("%s %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n'
                        % (tname, n, tname, n, tname, n))
        f.write('  printf("enum size %zu %zu\\n", sizeof(larder_type_t), sizeof(larder_errno_t));\n')
        f.write("  return 0;\n}\n")
    exe = os.path.join(tmp, "layout")
    out = subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), prog, "-o", exe],
                         capture_output=True, text=True)
    check(out.returncode == 0, "cannot compile the layout program: " + out.stderr)
    lines = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()
    c_layout = {}
    for line in lines:
        key, a, b = line.rsplit(" ", 2)
        c_layout[key] = (int(a), int(b))
    for tname, cls in (("larder_stream_options_t", StreamOptions), ("struct ArrowSchema", ArrowSchema),
                       ("struct ArrowArray", ArrowArray)):
        check(c_layout[tname + " size"] == (ctypes.sizeof(cls), ctypes.alignment(cls)),
              "%s: C says size/align %s, ctypes %s" % (tname, c_layout[tname + " size"],
                                                       (ctypes.sizeof(cls), ctypes.alignment(cls))))
        for name, ctype in cls._fields_:
            py = (getattr(cls, name).offset, getattr(cls, name).size)
            check(c_layout["%s %s" % (tname, name)] == py,
                  "%s.%s: C says offset/size %s, ctypes %s" % (tname, name,
                                                               c_layout["%s %s" % (tname, name)], py))
    check(c_layout["enum size"] == (ctypes.sizeof(ctypes.c_int),) * 2,
          "the enums are not int-sized: %s" % (c_layout["enum size"],))

    # larder_stream_options_init through the mirror: the defaults the
    # header documents, and no byte written past the structure.
    size = ctypes.sizeof(StreamOptions)
    buf = (ctypes.c_ubyte * (size + 64))(*([0xAB] * (size + 64)))
    o = StreamOptions.from_buffer(buf)
    lib.larder_stream_options_init(ctypes.byref(o))
    check(bytes(buf[size:]) == b"\xab" * 64,
          "larder_stream_options_init wrote past the structure's %d bytes" % size)
    defaults = {"num_sources": 0, "num_columns": 0, "batch_size": 256, "seed": 0, "shuffle": 1,
                "shuffle_window": 0, "unit_rows": 0, "epochs": 1, "rank": -1, "world_size": -1,
                "drop_last": 0, "start_epoch": 0, "start_batch": 0, "window": 32,
                "arena_bytes": 0, "memory_kind": 0, "cuda_device": -1, "partitions": 0,
                "local_world_size": -1}
    for k, v in defaults.items():
        check(getattr(o, k) == v, "larder_stream_options_init: %s = %r, larder.h says %r"
              % (k, getattr(o, k), v))
    check(not o.sources and not o.columns, "larder_stream_options_init: pointers not NULL")

    # The error and type tables against larder.h's X-macro and enum.
    with open(HEADER) as f:
        header = f.read()
    errs = re.findall(r'XX\((\w+), (-\d+), "([^"]*)"\)', header)
    check(len(errs) >= 20, "cannot parse LARDER_ERRNO_MAP in larder.h")
    for name, code, msg in errs:
        check(lib.larder_err_name(int(code)).decode() == "LARDER_" + name,
              "larder_err_name(%s) = %r" % (code, lib.larder_err_name(int(code))))
        check(lib.larder_strerror(int(code)).decode() == msg, "larder_strerror(%s)" % code)
        check(globals().get(name, int(code)) == int(code), "the test's %s is wrong" % name)
    check(lib.larder_err_name(0) == b"OK" and lib.larder_strerror(0) == b"success", "code 0")
    for bad in (-21, -1000, 5, 2 ** 31 - 1, -2 ** 31):
        check(lib.larder_err_name(bad) == b"LARDER_EUNKNOWN"
              and lib.larder_strerror(bad) == b"unknown error", "unknown code %d" % bad)
    enum = re.search(r"typedef enum larder_type \{(.*?)\} larder_type_t;", header, re.S).group(1)
    names = re.findall(r"LARDER_TYPE_(\w+)", enum)
    check(names[0] == "NULL" and names[-1] == "COUNT_", "cannot parse larder_type_t")
    for i, n in enumerate(names[:-1]):
        want = {"FIXED_BINARY": "fixed_binary"}.get(n, n.lower())
        check(lib.larder_type_name(i).decode() == want == TYPE_NAMES[i],
              "larder_type_name(%d) = %r for LARDER_TYPE_%s" % (i, lib.larder_type_name(i), n))
    for bad in (-1, len(names) - 1, 1000):
        check(lib.larder_type_name(bad) == b"?", "larder_type_name(%d)" % bad)


# ---------------------------------------------------------------------------
# 2. Epochs, values and determinism

MAIN_FILE = os.path.join(DATA, "delta_byte_array.parquet")  # 1,000 rows, 9 nullable strings
MAIN_ID = "c_customer_id"                                   # unique per row
MAIN_OPTS = dict(batch_size=64, seed=20240611, epochs=2, unit_rows=100, shuffle_window=4,
                 window=8)


def collect_main(L, client, release_on_thread=False):
    """Reads MAIN_FILE for MAIN_OPTS's two epochs and returns
    (stream facts, [(epoch, index, [ids])...], rows by id).

    With release_on_thread, batches are handed to a second thread that reads
    and releases them, as a pinning thread does; the reader only calls
    larder_stream_next (larder.h allows that split)."""
    lib = L.lib
    s = L.open_ok(client, L.options([MAIN_FILE], **MAIN_OPTS))
    facts = (lib.larder_stream_batches_per_epoch(s), lib.larder_stream_num_samples(s),
             [lib.larder_stream_column_name(s, i).decode() for i in range(lib.larder_stream_num_columns(s))],
             [lib.larder_stream_column_type(s, i) for i in range(lib.larder_stream_num_columns(s))])
    seq, rows_by_id, errors = [], {}, []

    def consume(b):
        infos, rows = read_batch(lib, b)
        seq.append((lib.larder_batch_epoch(b), lib.larder_batch_index(b), [r[MAIN_ID] for r in rows]))
        for r in rows:
            rows_by_id.setdefault(r[MAIN_ID], r)
            check(rows_by_id[r[MAIN_ID]] == r, "row %s differs between batches" % r[MAIN_ID])
        by_name = lib.larder_batch_column_by_name(b, MAIN_ID.encode())
        check(by_name == lib.larder_batch_column(b, facts[2].index(MAIN_ID)),
              "larder_batch_column_by_name disagrees with larder_batch_column")
        check(lib.larder_batch_column_by_name(b, b"no such column") is None
              and lib.larder_batch_column(b, len(facts[2])) is None
              and lib.larder_batch_column(b, -1) is None, "a missing column is not NULL")
        check(lib.larder_batch_bytes(b) >= sum(lib.larder_array_values_size(a) for a in L.columns(b)),
              "larder_batch_bytes is below the batch's value bytes")
        lib.larder_batch_release(b)

    if not release_on_thread:
        read_epochs(L, s, 2, consume)
    else:
        q = queue.Queue(maxsize=4)

        def worker():
            while True:
                b = q.get()
                if b is None:
                    return
                try:
                    consume(b)
                except Exception as e:  # reported by the reader below
                    errors.append(e)
                    lib.larder_batch_release(b)

        th = threading.Thread(target=worker)
        th.start()
        try:
            read_epochs(L, s, 2, q.put)
        finally:
            q.put(None)
            th.join()
        if errors:
            raise errors[0]
    wait, compute = ctypes.c_uint64(), ctypes.c_uint64()
    lib.larder_stream_stall(s, ctypes.byref(wait), ctypes.byref(compute))
    check(wait.value + compute.value > 0, "larder_stream_stall reports no time at all")
    lib.larder_stream_close(s)
    return facts, seq, rows_by_id


def test_epochs(L, daemon, client):
    lib = L.lib
    facts, seq, rows_by_id = collect_main(L, client)
    bpe, num_samples, names, types = facts
    check(num_samples == 1000, "num_samples %d, the file has 1000 rows" % num_samples)
    check(bpe == (1000 + 63) // 64, "batches_per_epoch %d" % bpe)
    check(all(t == T["string"] for t in types), "column types %s" % types)
    # Columns come in the file's order.
    cat = cat_rows(daemon.ctl, MAIN_FILE)
    check(names == list(cat[0].keys()), "stream columns %s, file columns %s" % (names, list(cat[0])))
    # Every batch is full: the last one of each epoch is padded to 64 rows.
    check(all(len(ids) == 64 for _, _, ids in seq), "a batch without 64 rows")
    epochs = []
    for e in range(2):
        ids = [i for ep, _, batch in seq if ep == e for i in batch]
        check_epoch_rows(ids, num_samples, 64, "epoch %d" % e)
        epochs.append(ids[:num_samples])
    check(epochs[0] != epochs[1], "both epochs have the same order")
    check(epochs[0] != [r[MAIN_ID] for r in cat], "epoch 0 is in file order: not shuffled")
    # Values: every row read equals the row `larderctl cat` prints.
    infos = [{"name": n, "type": T["string"], "children": []} for n in names]
    want = {r[MAIN_ID]: r for r in canon_cat_rows(daemon.ctl, [MAIN_FILE], infos)}
    check(set(want) == set(rows_by_id), "the ids read differ from the file's")
    for k, r in want.items():
        check(rows_by_id[k] == r, "row %s: read %s, larderctl cat %s" % (k, rows_by_id[k], r))
    nulls = sum(v is None for r in rows_by_id.values() for v in r.values())
    check(nulls > 1000, "only %d nulls: the nullable columns were not exercised" % nulls)

    # The same seed on another connection, released on another thread: the
    # identical sequence.
    rc, other = L.connect(daemon.socket)
    check(rc == 0, "connect: %s" % L.err(rc))
    try:
        facts2, seq2, _ = collect_main(L, other, release_on_thread=True)
    finally:
        lib.larder_client_close(other)
    check(facts2 == facts, "the second run's stream differs: %s vs %s" % (facts2, facts))
    check(seq2 == seq, "the same seed gave another sequence (first difference at batch %s)"
          % next((i for i, (x, y) in enumerate(zip(seq, seq2)) if x != y), None))

    # Another seed: another order (a seed that were ignored would pass the
    # checks above).
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **dict(MAIN_OPTS, seed=1, epochs=1)))
    check(lib.larder_stream_num_columns(s) == 1, "a projection of one column has %d"
          % lib.larder_stream_num_columns(s))
    ids = []
    read_epochs(L, s, 1, lambda b: (ids.extend(r[MAIN_ID] for r in read_batch(lib, b)[1]),
                                    lib.larder_batch_release(b)))
    lib.larder_stream_close(s)
    check_epoch_rows(ids, 1000, 64, "seed 1")
    check(ids[:1000] != epochs[0], "seed 1 gave seed %d's order" % MAIN_OPTS["seed"])
    return seq


# ---------------------------------------------------------------------------
# 3. Types, accessors and the Arrow export

# Files whose columns cover the serving types: nullable strings and lists,
# structs of lists of structs, maps of maps, decimals, float16, fixed binary,
# INT96 timestamps, a list of the NULL type.  Each group is one dataset (its
# files share a schema).
TYPE_DATASETS = [
    ["alltypes_plain.parquet", "alltypes_dictionary.parquet", "alltypes_plain.snappy.parquet"],
    ["datapage_v2.snappy.parquet"],
    ["repeated_no_annotation.parquet"],
    ["nested_maps.snappy.parquet"],
    ["list_columns.parquet"],
    ["nonnullable.impala.parquet"],
    ["map_no_value.parquet"],
    ["incorrect_map_schema.parquet"],
    ["nulls.snappy.parquet"],
    ["null_list.parquet"],
    ["fixed_length_decimal.parquet"],
    ["byte_array_decimal.parquet"],
    ["int96_from_spark.parquet"],
    ["float16_nonzeros_and_nans.parquet"],
    ["fixed_length_byte_array.parquet"],
    ["rle_boolean_encoding.parquet"],
    ["concatenated_gzip_members.parquet"],
    ["byte_stream_split.zstd.parquet"],
    ["int32_decimal.parquet"],
    ["int64_decimal.parquet"],
    ["fixed_length_decimal_legacy.parquet"],
    ["sort_columns.parquet"],
    ["nested_structs.rust.parquet"],
    ["single_nan.parquet"],
    ["binary.parquet"],
    ["unknown-logical-type.parquet"],
]


def export_batch(lib, batch):
    schema, array = ArrowSchema(), ArrowArray()
    rc = lib.larder_batch_export(batch, ctypes.byref(schema), ctypes.byref(array))
    check(rc == 0, "larder_batch_export: %d" % rc)
    return schema, array


def release_exported(schema, array):
    """Releases an export through the callbacks in the structs, as a
    consumer (pyarrow, a DLPack bridge) does, and checks they mark the
    structs released, as the C Data Interface requires."""
    check(bool(array.release) and bool(schema.release), "an export without release callbacks")
    array.release(ctypes.byref(array))
    check(not array.release, "ArrowArray.release did not set release to NULL")
    schema.release(ctypes.byref(schema))
    check(not schema.release, "ArrowSchema.release did not set release to NULL")


def test_types(L, daemon, client):
    lib = L.lib
    seen = set()
    for group in TYPE_DATASETS:
        paths = [os.path.join(DATA, f) for f in group]
        label = "+".join(group)
        # In file order first (shuffle off, one batch of all rows and a
        # little padding): the rows must equal larderctl cat's, row for row.
        total = sum(len(cat_rows(daemon.ctl, p)) for p in paths)
        size = total + 2
        s = L.open_ok(client, L.options(paths, shuffle=0, batch_size=size, window=2))
        n = lib.larder_stream_num_samples(s)
        rc, b = L.next(s)
        check(rc == 0, "%s: larder_stream_next: %s: %s" % (label, L.err(rc), L.last_error(client)))
        infos, rows = read_batch(lib, b)
        check([i["name"] for i in infos] == [lib.larder_stream_column_name(s, k).decode()
                                             for k in range(lib.larder_stream_num_columns(s))]
              and [i["type"] for i in infos] == [lib.larder_stream_column_type(s, k)
                                                 for k in range(lib.larder_stream_num_columns(s))],
              "%s: the batch's columns differ from the stream's" % label)
        want = canon_cat_rows(daemon.ctl, paths, infos)
        check(n == len(want), "%s: num_samples %d, larderctl cat prints %d rows" % (label, n, len(want)))
        # row_key tells -0.0 from 0.0, where == does not.
        for i in range(n):
            check(row_key(rows[i]) == row_key(want[i]),
                  "%s: row %d read %s, larderctl cat %s" % (label, i, rows[i], want[i]))
        # The padding of the one batch wraps around to the first rows.
        check(len(rows) == size and rows[n:] == (rows * (size // n + 1))[n:size],
              "%s: the padding does not repeat the epoch's rows" % label)

        def walk(info):
            seen.add(info["type"])
            for c in info["children"]:
                walk(c)
        for i in infos:
            walk(i)

        # The same batch through the Arrow C Data Interface.
        schema, array = export_batch(lib, b)
        check(schema.format == b"+s" and schema.n_children == len(infos)
              and array.n_children == len(infos) and array.length == len(rows)
              and array.n_buffers == 1 and array.null_count == 0,
              "%s: the exported root is not a struct of the columns" % label)
        for k in range(array.n_children):
            info, vals = read_arrow(schema.children[k].contents, array.children[k].contents,
                                    lib.larder_batch_column(b, k), lib)
            check(row_key(vals) == row_key([r[infos[k]["name"]] for r in rows]),
                  "%s: column %s read through Arrow differs from the accessors"
                  % (label, infos[k]["name"]))
        # An exported batch belongs to its ArrowArray: a direct release is
        # ignored (larder.h), and the Arrow release frees it.
        lib.larder_batch_release(b)
        release_exported(schema, array)
        lib.larder_stream_close(s)

        # Shuffled, in small batches: each epoch holds the same rows (as a
        # multiset: some files repeat rows), in another order.
        s = L.open_ok(client, L.options(paths, batch_size=3, seed=11, epochs=2, window=4))
        got = []
        read_epochs(L, s, 2, lambda b: (got.extend(read_batch(lib, b)[1]), lib.larder_batch_release(b)))
        lib.larder_stream_close(s)
        per_epoch = len(got) // 2
        for e in range(2):
            epoch = got[e * per_epoch:(e + 1) * per_epoch]
            check(sorted(map(row_key, epoch[:n])) == sorted(map(row_key, want)),
                  "%s: shuffled epoch %d holds other rows than larderctl cat prints" % (label, e))
            check(epoch[n:] == epoch[:len(epoch) - n], "%s: shuffled epoch %d's padding" % (label, e))
    # The test files must have covered what this test claims to.
    for t in ("bool", "int32", "int64", "uint64", "float16", "float32", "float64", "timestamp",
              "decimal128", "decimal256", "binary", "string", "fixed_binary", "list",
              "struct", "map", "null"):
        check(T[t] in seen, "no test file had a %s column" % t)


def test_export_releases(L, daemon, client):
    """Exported batches released only through Arrow must reach the daemon:
    with a window of 2 the stream stops after two unreleased batches."""
    lib = L.lib
    paths = [os.path.join(DATA, "repeated_no_annotation.parquet")]
    s = L.open_ok(client, L.options(paths, batch_size=2, epochs=4, window=2))
    errors = []

    def release_elsewhere(b):
        # larder.h: release callbacks may run on any thread, and the schema
        # is independent of the array: here it goes first, on a thread that
        # is not the reader's, as a consumer's garbage collector would.
        schema, array = export_batch(lib, b)

        def run():
            try:
                schema.release(ctypes.byref(schema))
                check(not schema.release, "ArrowSchema.release did not set release to NULL")
                check(array.children[0].contents.length == array.length, "the array changed")
                array.release(ctypes.byref(array))
                check(not array.release, "ArrowArray.release did not set release to NULL")
            except TestFailure as e:
                errors.append(e)
        th = threading.Thread(target=run)
        th.start()
        th.join()

    count = read_epochs(L, s, 4, release_elsewhere)
    if errors:
        raise errors[0]
    check(count == 12, "%d batches" % count)
    lib.larder_stream_close(s)

    # A child moved out of the export (the C Data Interface allows it)
    # keeps the batch alive after the root's release: with a window of 1
    # nothing more comes until the child goes too.
    s = L.open_ok(client, L.options(paths, batch_size=3, epochs=1, window=1, shuffle=0))
    rc, b = L.next(s)
    check(rc == 0, "larder_stream_next: %s" % L.err(rc))
    _, before = read_batch(lib, b)
    schema, array = export_batch(lib, b)
    moved = ArrowArray()
    ctypes.memmove(ctypes.byref(moved), array.children[1], ctypes.sizeof(ArrowArray))
    array.children[1].contents.release = ARRAY_RELEASE()
    moved_schema = ArrowSchema()
    ctypes.memmove(ctypes.byref(moved_schema), schema.children[1], ctypes.sizeof(ArrowSchema))
    schema.children[1].contents.release = SCHEMA_RELEASE()
    release_exported(schema, array)
    rc, b2 = L.next(s, 300)
    check(rc == ETIMEDOUT, "a batch came while a moved child of the last one lived (window 1): %s"
          % L.err(rc))
    # The moved child still reads the batch's values, all the way down.
    _, vals = read_arrow(moved_schema, moved, lib.larder_batch_column(b, 1), lib)
    check(vals == [r["phoneNumbers"] for r in before],
          "the moved child's values changed after the root's release")
    moved.release(ctypes.byref(moved))
    check(not moved.release, "the moved child's release did not mark it released")
    moved_schema.release(ctypes.byref(moved_schema))
    rc, b2 = L.next(s)
    check(rc == 0, "no batch after the moved child's release: %s: %s" % (L.err(rc), L.last_error(client)))
    lib.larder_batch_release(b2)
    lib.larder_stream_close(s)


# ---------------------------------------------------------------------------
# 4. Position and resume

def test_resume(L, client, full_seq):
    lib = L.lib
    bpe = len(full_seq) // 2
    for start in ((0, 0), (0, 5), (0, bpe - 1), (1, 0), (1, 7), (0, bpe + 7), (0, 2 * bpe - 1)):
        s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID],
                                        **dict(MAIN_OPTS, start_epoch=start[0], start_batch=start[1])))
        # Before the first batch the position is the start, normalised.
        flat = start[0] * bpe + start[1]
        want = (flat // bpe, flat % bpe)
        check(L.position(s) == want, "start %s: position %s before the first batch, expected %s"
              % (start, L.position(s), want))
        tail = []
        read_epochs(L, s, None, lambda b: (tail.append((lib.larder_batch_epoch(b), lib.larder_batch_index(b),
                                                        [r[MAIN_ID] for r in read_batch(lib, b)[1]])),
                                           lib.larder_batch_release(b)))
        check(tail == full_seq[flat:], "resuming at %s gave %d batches, not the %d of the uninterrupted run"
              " (or other ones)" % (start, len(tail), len(full_seq) - flat))
        lib.larder_stream_close(s)
    # Resuming where a checkpoint was taken mid-run: read 11 batches, take
    # the position, close, reopen there on a new connection.
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **MAIN_OPTS))
    for _ in range(11):
        rc, b = L.next(s)
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        lib.larder_batch_release(b)
    pos = L.position(s)
    lib.larder_stream_close(s)
    check(pos == (0, 11), "position %s after 11 batches" % (pos,))
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID],
                                    **dict(MAIN_OPTS, start_epoch=pos[0], start_batch=pos[1])))
    rc, b = L.next(s)
    check(rc == 0 and [r[MAIN_ID] for r in read_batch(lib, b)[1]] == full_seq[11][2],
          "the resumed stream's first batch is not batch 11")
    lib.larder_batch_release(b)
    lib.larder_stream_close(s)
    # At the very end nothing is left: the stream ends at once.
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **dict(MAIN_OPTS, start_epoch=2)))
    rc, b = L.next(s)
    check(rc == EEOF, "a stream resumed past its last epoch gave %s" % L.err(rc))
    lib.larder_stream_close(s)


# ---------------------------------------------------------------------------
# 5. Errors

def expect_open_error(L, client, opts, code, *words):
    """Opens a stream that must fail with code, and a last error that
    contains each of words."""
    rc, s = L.open(client, opts)
    msg = L.last_error(client)
    check(rc == code and s is None, "expected %s, got %s (%s)" % (L.err(code), L.err(rc), msg))
    for w in words:
        check(w in msg, "the error of %s does not say %r: %r" % (L.err(code), w, msg))
    return msg


def test_errors(L, daemon, client, tmp):
    lib = L.lib
    missing = os.path.join(DATA, "no-such-file.parquet")
    expect_open_error(L, client, L.options([missing]), ENOENT, missing)
    expect_open_error(L, client, L.options([MAIN_FILE], columns=[MAIN_ID, "no_such_column"]),
                      ENOENT, "no_such_column")
    expect_open_error(L, client, L.options([os.path.join(REPO, "tests", "data", "parquet-testing",
                                                         "README.md")]), ECORRUPT, "Parquet")
    expect_open_error(L, client, L.options([MAIN_FILE], window=5000), EINVAL, "window")
    expect_open_error(L, client, L.options([MAIN_FILE], batch_size=0), EINVAL, "batch_size")
    expect_open_error(L, client, L.options([MAIN_FILE], rank=2, world_size=2), EINVAL, "rank")
    expect_open_error(L, client, L.options([MAIN_FILE], memory_kind=1), EUNSUPPORTED, "memory")
    expect_open_error(L, client, L.options([os.path.join(DATA, "column_chunk_key_value_metadata.parquet")]),
                      EINVAL, "no rows")
    # A torchrun variable that is no number must fail loudly, naming it.
    old = os.environ.get("RANK")
    os.environ["RANK"] = "three"
    try:
        expect_open_error(L, client, L.options([MAIN_FILE]), EINVAL, "RANK", "three")
    finally:
        if old is None:
            del os.environ["RANK"]
        else:
            os.environ["RANK"] = old
    # No sources at all.
    o = L.options([MAIN_FILE])
    o.num_sources = 0
    expect_open_error(L, client, o, EINVAL, "source")

    # After all those failures the client still works.
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], batch_size=500))
    rc, b = L.next(s)
    check(rc == 0, "a good stream after failed opens: %s" % L.err(rc))
    lib.larder_batch_release(b)
    lib.larder_stream_close(s)

    # An error that ends a stream after it opened: a page whose CRC is wrong.
    s = L.open_ok(client, L.options([os.path.join(DATA, "datapage_v1-corrupt-checksum.parquet")],
                                    batch_size=1024))
    codes = []
    for _ in range(8):
        rc, b = L.next(s)
        if rc == 0:
            lib.larder_batch_release(b)
            continue
        codes.append(rc)
        if len(codes) == 3:
            break
    check(codes and codes[0] == ECHECKSUM, "a corrupt page: %s" % [L.err(c) for c in codes])
    check(len(set(codes)) == 1, "an ended stream changed its error: %s" % codes)
    msg = L.last_error(client)
    check("CRC" in msg and "datapage_v1-corrupt-checksum.parquet" in msg,
          "the corrupt page's message: %r" % msg)
    check(lib.larder_stream_flush(s) == ECHECKSUM, "larder_stream_flush on the failed stream")
    lib.larder_stream_close(s)

    # Connecting: no daemon there, a path that is not a socket, one too long
    # for a socket address.  No client comes back, and nothing crashes.
    for path, code in ((os.path.join(tmp, "no-daemon.sock"), ECONNECT),
                       ("/nonexistent-dir/larderd.sock", ECONNECT),
                       (daemon.log, ECONNECT),
                       ("/tmp/" + "x" * 200, EINVAL)):
        rc, c = L.connect(path)
        check(rc == code and c is None, "connect(%s): %s, expected %s" % (path[:40], L.err(rc), L.err(code)))
    check(lib.larder_client_last_error(None) == b"", "larder_client_last_error(NULL)")
    # $LARDER_SOCKET is used when the path is NULL.
    old = os.environ.get("LARDER_SOCKET")
    os.environ["LARDER_SOCKET"] = daemon.socket
    try:
        rc, c = L.connect(None)
        check(rc == 0, "connect(NULL) with $LARDER_SOCKET: %s" % L.err(rc))
        lib.larder_client_close(c)
    finally:
        if old is None:
            del os.environ["LARDER_SOCKET"]
        else:
            os.environ["LARDER_SOCKET"] = old


# ---------------------------------------------------------------------------
# 6. Processes: fork and SIGKILL

def test_fork(L, client, sock):
    """A DataLoader worker started with fork inherits the parent's client:
    larder.h says calls there fail with LARDER_EINVAL and releases stay
    local, leaving the parent's stream untouched."""
    lib = L.lib
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **dict(MAIN_OPTS, window=2)))
    rc, b = L.next(s)
    check(rc == 0, "larder_stream_next: %s" % L.err(rc))
    first = [r[MAIN_ID] for r in read_batch(lib, b)[1]]
    sys.stdout.flush()
    sys.stderr.flush()
    # Python 3.12 warns that the watchdog's thread makes fork() unsafe; the
    # child touches nothing that thread holds, and leaves with os._exit.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        status = 1
        try:
            rc, _ = L.next(s, 100)
            msg = L.last_error(client)
            # The inherited batch is still readable, and its release frees
            # only this process's memory.
            same = [r[MAIN_ID] for r in read_batch(lib, b)[1]] == first
            lib.larder_batch_release(b)
            # Closing the parent's client here frees this process's copies
            # only; then the worker connects a client of its own.
            lib.larder_client_close(client)
            rc2, own = L.connect(sock)
            rc3 = -999
            if rc2 == 0:
                s2 = L.open_ok(own, L.options([MAIN_FILE], columns=[MAIN_ID], **MAIN_OPTS))
                rc3, b2 = L.next(s2)
                same2 = rc3 == 0 and [r[MAIN_ID] for r in read_batch(lib, b2)[1]] == first
                lib.larder_batch_release(b2)
                lib.larder_client_close(own)
            if rc == EINVAL and "forked child" in msg and same and rc2 == 0 and same2:
                status = 0
            else:
                print("fork child: next %d, message %r, batch same %s, own client %d/%d"
                      % (rc, msg, same, rc2, rc3), flush=True)
        except BaseException:
            traceback.print_exc()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          "the forked child's checks failed (status %#x)" % status)
    # The parent's batch is still its own: release it and read on.
    lib.larder_batch_release(b)
    n = 1 + read_epochs(L, s, None, lambda x: lib.larder_batch_release(x))
    check(n == 2 * lib.larder_stream_batches_per_epoch(s), "the parent read %d batches after the fork" % n)
    lib.larder_stream_close(s)


def child_reader(build_dir, sock):
    """The client that the SIGKILL test kills: it reads the main dataset
    forever, exporting some batches and holding them, and says "ready" once
    it is well into an epoch."""
    L = Larder(load_library(build_dir))
    rc, c = L.connect(sock)
    if rc:
        print("child: connect: %s" % L.err(rc), flush=True)
        return 1
    s = L.open_ok(c, L.options([MAIN_FILE], **dict(MAIN_OPTS, epochs=0)))
    held, n = [], 0
    while True:
        rc, b = L.next(s)
        if rc:
            print("child: next: %s" % L.err(rc), flush=True)
            return 1
        n += 1
        if len(held) < 3 and n % 2 == 0:
            held.append(export_batch(L.lib, b))  # never released: the kill must clean up
        else:
            L.lib.larder_batch_release(b)
        if n == 6:
            print("ready", flush=True)
        # Slowly after that, as a trainer's step: the kill, a few batches of
        # the other client later, comes in the middle of the first epoch.
        time.sleep(0.002 if n < 6 else 0.02)


def test_sigkill(L, daemon, build_dir, full_seq):
    """A trainer killed with SIGKILL mid-epoch, holding unreleased and
    exported batches, must not disturb another reading the same dataset
    from the same daemon at the same time."""
    lib = L.lib
    rc, client = L.connect(daemon.socket)
    check(rc == 0, "connect: %s" % L.err(rc))
    child = None
    try:
        # The same options as the child's but its epochs: the two streams
        # share the daemon's shuffle and decoded units.
        s = L.open_ok(client, L.options([MAIN_FILE], **MAIN_OPTS))
        seq = []

        def take(count):
            for _ in range(count):
                rc, b = L.next(s)
                check(rc == 0, "the surviving client's next: %s: %s" % (L.err(rc), L.last_error(client)))
                seq.append((lib.larder_batch_epoch(b), lib.larder_batch_index(b),
                            [r[MAIN_ID] for r in read_batch(lib, b)[1]]))
                lib.larder_batch_release(b)

        take(5)
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), build_dir,
                                  "--child-reader", daemon.socket],
                                 stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([child.stdout], [], [], 20)
        line = child.stdout.readline() if ready else ""
        check(line.strip() == "ready", "the child did not get going: %r" % line)
        take(4)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        check(child.returncode == -signal.SIGKILL, "the child ended with %s" % child.returncode)
        take(len(full_seq) - len(seq))
        rc, b = L.next(s)
        check(rc == EEOF, "after two epochs: %s" % L.err(rc))
        check(seq == full_seq, "the surviving client's sequence changed when the other was killed")
        lib.larder_stream_close(s)
        check(daemon.alive(), "larderd died")
        # The daemon notices the dead client: only this one stays.
        deadline = time.monotonic() + 10
        while True:
            pids = [c.get("pid") for c in daemon.ctl_json("clients").get("clients", [])]
            if child.pid not in pids:
                break
            check(time.monotonic() < deadline, "larderd still lists the killed client: %s" % pids)
            time.sleep(0.05)
        check(os.getpid() in pids, "larderctl clients does not list this process: %s" % pids)
    finally:
        if child is not None:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
        lib.larder_client_close(client)


# ---------------------------------------------------------------------------
# 7. How data loaders use it

def batch_ids(lib, b):
    return [r[MAIN_ID] for r in read_batch(lib, b)[1]]


def read_ids(L, client, **opts):
    """The batches of ids of a one-column stream of MAIN_FILE, to its end."""
    lib = L.lib
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **opts))
    out = []
    read_epochs(L, s, None, lambda b: (out.append(batch_ids(lib, b)), lib.larder_batch_release(b)))
    lib.larder_stream_close(s)
    return out


def test_loader_patterns(L, daemon, client):
    lib = L.lib
    base = dict(MAIN_OPTS, epochs=1)

    # DistributedDataParallel: two ranks of batch 32 together make the
    # global batches of one rank of batch 64 (daemon/plan/README.md: nothing but
    # world_size * batch_size decides a global batch), whether the ranks
    # come from the options or from torchrun's RANK and WORLD_SIZE.
    whole = read_ids(L, client, **dict(base, batch_size=64, rank=0, world_size=1))
    r0 = read_ids(L, client, **dict(base, batch_size=32, rank=0, world_size=2))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"
    try:
        r1 = read_ids(L, client, **dict(base, batch_size=32))
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]
    check(len(r0) == len(r1) == len(whole) == 16,
          "ranks: %d, %d and %d batches" % (len(r0), len(r1), len(whole)))
    for k in range(len(whole)):
        check(r0[k] + r1[k] == whole[k], "global batch %d differs between 1 and 2 ranks" % k)
    # drop_last drops the partial batch instead of padding it.
    dropped = read_ids(L, client, **dict(base, drop_last=1))
    flat = [i for b in dropped for i in b]
    check(len(dropped) == 1000 // 64 and len(set(flat)) == len(flat) == 1000 // 64 * 64,
          "drop_last: %d batches, %d ids, %d distinct" % (len(dropped), len(flat), len(set(flat))))

    # A training and a validation stream on one client, read in turns.
    train = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **dict(base, window=2)))
    val = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID],
                                      **dict(base, window=2, batch_size=100, shuffle=0)))
    got = {"train": [], "val": []}
    live = {"train": train, "val": val}
    while live:
        for name, s in list(live.items()):
            rc, b = L.next(s)
            if rc == EEOF:
                del live[name]
                continue
            check(rc == 0, "%s: %s" % (name, L.err(rc)))
            got[name].append(batch_ids(lib, b))
            lib.larder_batch_release(b)
    lib.larder_stream_close(train)
    lib.larder_stream_close(val)
    check(got["train"] == whole, "the training stream changed beside a validation stream")
    check([i for b in got["val"] for i in b] == [r[MAIN_ID] for r in cat_rows(daemon.ctl, MAIN_FILE)],
          "the unshuffled validation stream is not in file order")

    # An event loop (asyncio's add_reader, or select) waits on
    # larder_stream_fd and polls with a zero timeout, for two streams.
    streams = [L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **dict(base, window=2)))
               for _ in range(2)]
    by_fd = {lib.larder_stream_fd(s): i for i, s in enumerate(streams)}
    check(len(by_fd) == 2 and all(fd >= 0 for fd in by_fd), "larder_stream_fd: %s" % by_fd)
    seqs, ended = [[], []], set()
    deadline = time.monotonic() + 20
    while len(ended) < 2:
        check(time.monotonic() < deadline, "the event loop made no progress: %s batches"
              % [len(x) for x in seqs])
        ready, _, _ = select.select([fd for fd, i in by_fd.items() if i not in ended], [], [], 5)
        check(ready, "no stream descriptor became readable in 5 s (%s batches read)"
              % [len(x) for x in seqs])
        for fd in ready:
            i = by_fd[fd]
            while True:
                rc, b = L.next(streams[i], 0)
                if rc == ETIMEDOUT:
                    break
                if rc == EEOF:
                    ended.add(i)
                    break
                check(rc == 0, "event loop: %s" % L.err(rc))
                seqs[i].append(batch_ids(lib, b))
                lib.larder_batch_release(b)
    for s in streams:
        lib.larder_stream_close(s)
    check(seqs[0] == seqs[1] == whole, "the event loop's streams differ from the blocking read")

    # Zero copy: batches the trainer holds stay intact while the daemon
    # fills the rest of the window behind them, and no more than the window
    # comes.  Then they are released newest first.
    s = L.open_ok(client, L.options([MAIN_FILE], **dict(base, window=4)))
    held = []
    for _ in range(4):
        rc, b = L.next(s)
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        held.append((b, read_batch(lib, b)[1]))
    rc, extra = L.next(s, 300)
    check(rc == ETIMEDOUT, "a fifth batch came with a window of 4: %s" % L.err(rc))
    for b, rows in reversed(held):
        check(read_batch(lib, b)[1] == rows, "a held batch changed under the trainer")
        lib.larder_batch_release(b)
    # Sliding: keep the last two, as a loader with a prefetch of two does.
    keep, count = [], 4
    while True:
        rc, b = L.next(s)
        if rc == EEOF:
            break
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        keep.append((b, read_batch(lib, b)[1]))
        count += 1
        if len(keep) > 2:
            old, rows = keep.pop(0)
            check(read_batch(lib, old)[1] == rows, "a held batch changed under the trainer")
            lib.larder_batch_release(old)
    for b, _ in keep:
        lib.larder_batch_release(b)
    check(count == 16, "%d batches" % count)

    # The stall figures: time between calls is the trainer's own work.
    wait, compute = ctypes.c_uint64(), ctypes.c_uint64()
    lib.larder_stream_stall(s, ctypes.byref(wait), ctypes.byref(compute))
    check(lib.larder_stream_flush(s) == 0, "larder_stream_flush")
    lib.larder_stream_close(s)
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **base))
    for _ in range(4):
        rc, b = L.next(s)
        lib.larder_batch_release(b)
        time.sleep(0.03)
    rc, b = L.next(s)
    lib.larder_batch_release(b)
    lib.larder_stream_stall(s, ctypes.byref(wait), ctypes.byref(compute))
    check(compute.value >= 4 * 30e6 and wait.value < compute.value,
          "stall figures: wait %d ns, compute %d ns after 4 steps of 30 ms"
          % (wait.value, compute.value))
    lib.larder_stream_close(s)


def test_daemon_restart(L, daemon, full_seq):
    """The daemon dies under a trainer: the calls fail with LARDER_ECLOSED
    (no hang, no crash), a held batch stays readable, and after a restart
    (on the warm cache) the trainer resumes from its checkpoint to exactly
    the uninterrupted sequence."""
    lib = L.lib
    rc, client = L.connect(daemon.socket)
    check(rc == 0, "connect: %s" % L.err(rc))
    try:
        s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], **MAIN_OPTS))
        for _ in range(6):
            rc, b = L.next(s)
            check(rc == 0, "larder_stream_next: %s" % L.err(rc))
            lib.larder_batch_release(b)
        rc, held = L.next(s)
        ids = batch_ids(lib, held)
        checkpoint = L.position(s)
        daemon.kill()
        daemon.stop()
        codes = []
        for _ in range(40):
            rc, b = L.next(s, 200)
            if rc == 0:
                lib.larder_batch_release(b)  # batches already out may still come
                continue
            codes.append(rc)
            if len(codes) == 2:
                break
        check(codes == [ECLOSED, ECLOSED], "after the daemon died: %s" % [L.err(c) for c in codes])
        check("closed" in L.last_error(client), "the message: %r" % L.last_error(client))
        check(lib.larder_stream_flush(s) == ECLOSED, "larder_stream_flush after the daemon died")
        check(batch_ids(lib, held) == ids, "the held batch changed after the daemon died")
        lib.larder_batch_release(held)
        lib.larder_stream_close(s)
    finally:
        lib.larder_client_close(client)
    daemon.start()
    rc, client = L.connect(daemon.socket)
    check(rc == 0, "connect after the restart: %s" % L.err(rc))
    try:
        s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID],
                                        **dict(MAIN_OPTS, start_epoch=checkpoint[0],
                                               start_batch=checkpoint[1])))
        tail = []
        read_epochs(L, s, None, lambda b: (tail.append(batch_ids(lib, b)), lib.larder_batch_release(b)))
        lib.larder_stream_close(s)
        flat = checkpoint[0] * (len(full_seq) // 2) + checkpoint[1]
        check(tail == [ids for _, _, ids in full_seq[flat:]],
              "resuming on the restarted daemon did not continue the sequence")
    finally:
        lib.larder_client_close(client)


# ---------------------------------------------------------------------------
# 8. Bugs this test found
#
# Each checks what larder.h (or plain robustness) calls for and what the
# code did not do when this test was first written.  Each returns (ok,
# detail); the C tests named in the fixes' comments check the same.

def regress_null_column(build_dir, sock):
    """A NULL entry in opts.columns (a None in a ctypes array of names)
    should fail the open cleanly, as a NULL entry in opts.sources does; it
    crashed the process in protobuf-c's packing (strlen(NULL))."""
    # The crash must not leave a core file behind.
    out = subprocess.run([sys.executable, os.path.abspath(__file__), build_dir,
                          "--child-null-column", sock], capture_output=True, text=True, timeout=30,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
    how = ("signal %s" % signal.Signals(-out.returncode).name if out.returncode < 0
           else "status %d" % out.returncode)
    said = (out.stdout + out.stderr).strip()[-300:]
    return out.returncode == 0, "the process ended with %s %s" % (how, said)


def child_null_column(build_dir, sock):
    L = Larder(load_library(build_dir))
    rc, c = L.connect(sock)
    if rc:
        return 1
    o = L.options([MAIN_FILE], columns=[MAIN_ID, "placeholder"])
    o.columns[1] = None
    rc, s = L.open(c, o)
    print("open: %s: %s" % (L.err(rc), L.last_error(c)), flush=True)
    if s is not None:
        L.lib.larder_stream_close(s)
    L.lib.larder_client_close(c)
    return 0


def regress_export_twice(L, client):
    """A second larder_batch_export of a batch whose ownership already
    moved to an ArrowArray should be refused, as a direct release of it is
    ignored; it succeeded, and releasing both arrays released the batch
    twice, freeing memory that the next batches reuse."""
    lib = L.lib
    s = L.open_ok(client, L.options([MAIN_FILE], columns=[MAIN_ID], batch_size=64, window=4))
    try:
        rc, b = L.next(s)
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        first = export_batch(lib, b)
        schema, array = ArrowSchema(), ArrowArray()
        rc = lib.larder_batch_export(b, ctypes.byref(schema), ctypes.byref(array))
        # Only the first export is released: releasing the second as well
        # would corrupt the client.  A second one that succeeded leaks.
        release_exported(*first)
        return rc != 0, "the second export returned %d" % rc
    finally:
        lib.larder_stream_close(s)


def regress_local_rank_beside_rank(L, client):
    """larder.h: SLURM_PROCID, then LOCAL_RANK, is used when RANK is unset.
    With RANK set, a LOCAL_RANK that is no number (or any other variable
    not consulted) must not matter; the open failed with LARDER_EINVAL."""
    os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = "0", "1", "gpu0"
    try:
        rc, s = L.open(client, L.options([MAIN_FILE], columns=[MAIN_ID]))
        msg = L.last_error(client)
    finally:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del os.environ[k]
    if s is not None:
        L.lib.larder_stream_close(s)
    return rc == 0, "%s: %s" % (L.err(rc), msg)


def regress_arena_fragmentation(L, client):
    """A trainer holding one batch of a window of 3, in an arena of about
    three batches, must get its next batch or an error; the stream stalled
    for good once the held batch split the free space into two gaps each a
    little smaller than the next batch (first-fit allocation)."""
    lib = L.lib
    s = L.open_ok(client, L.options([MAIN_FILE], batch_size=100, window=3, epochs=2,
                                    arena_bytes=32768))
    held, count, rc = None, 0, 0
    try:
        while True:
            rc, b = L.next(s, 1500)
            if rc:
                break
            count += 1
            if held is not None:
                lib.larder_batch_release(held)
            held = b
    finally:
        if held is not None:
            lib.larder_batch_release(held)
        lib.larder_stream_close(s)
    return rc in (EEOF, ELIMIT), "%s after %d of 20 batches, holding one" % (L.err(rc), count)


def regress_map_keys_nullable(L, client):
    """The Arrow format (Schema.fbs, Map): "Neither the entries field nor the
    key field may be nullable."  A Parquet map whose key column is OPTIONAL
    (incorrect_map_schema.parquet, which other readers take as a map) was
    exported with ARROW_FLAG_NULLABLE on its key field."""
    lib = L.lib
    s = L.open_ok(client, L.options([os.path.join(DATA, "incorrect_map_schema.parquet")], batch_size=1))
    try:
        rc, b = L.next(s)
        check(rc == 0, "larder_stream_next: %s" % L.err(rc))
        schema, array = export_batch(lib, b)
        entries = schema.children[0].contents.children[0].contents
        key = entries.children[0].contents
        bad = [n for n, f in (("entries", entries.flags), ("key", key.flags)) if f & ARROW_FLAG_NULLABLE]
        release_exported(schema, array)
        return not bad, "flagged nullable: %s" % ", ".join(bad)
    finally:
        lib.larder_stream_close(s)


def regress_unbounded_empty_epochs(L, client):
    """larder.h refuses sources of no rows because "an epoch of them would
    have no batch, and an unbounded stream would never yield one".  drop_last
    with a batch larger than the dataset makes the same empty epochs; the
    open succeeded, and the unbounded stream (epochs 0) ended at once."""
    rc, s = L.open(client, L.options([MAIN_FILE], columns=[MAIN_ID], batch_size=2000,
                                     drop_last=1, epochs=0))
    if rc:
        return True, "refused: %s" % L.last_error(client)
    bpe = L.lib.larder_stream_batches_per_epoch(s)
    rc, b = L.next(s, 1000)
    if b is not None:
        L.lib.larder_batch_release(b)
    L.lib.larder_stream_close(s)
    return False, "opened with %d batches per epoch; the unbounded stream's first call: %s" % (bpe, L.err(rc))


def test_fixed_bugs(L, daemon, client, build_dir):
    for name, fn in (("null column", lambda: regress_null_column(build_dir, daemon.socket)),
                     ("map keys nullable", lambda: regress_map_keys_nullable(L, client)),
                     ("unbounded empty epochs", lambda: regress_unbounded_empty_epochs(L, client)),
                     ("export twice", lambda: regress_export_twice(L, client)),
                     ("LOCAL_RANK beside RANK", lambda: regress_local_rank_beside_rank(L, client)),
                     ("arena fragmentation", lambda: regress_arena_fragmentation(L, client))):
        ok, detail = fn()
        check(ok, "%s: %s" % (name, detail))


# ---------------------------------------------------------------------------

def main(argv):
    if len(argv) == 4 and argv[2] == "--child-reader":
        return child_reader(argv[1], argv[3])
    if len(argv) == 4 and argv[2] == "--child-null-column":
        return child_null_column(argv[1], argv[3])
    if len(argv) != 2:
        print("usage: %s BUILD_DIR" % argv[0], file=sys.stderr)
        return 2
    build_dir = os.path.abspath(argv[1])
    t0 = time.monotonic()
    # Run under torchrun or Slurm, these would change the streams' ranks
    # (larder_stream_open reads them); the tests set them where they mean to.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "LARDER_SOCKET"):
        os.environ.pop(var, None)
    L = Larder(load_library(build_dir))
    tmp = tempfile.mkdtemp(prefix="larder-ctypes-")
    daemon = Daemon(build_dir, tmp, ["--workers=2", "--memory_limit=256M", "--arena_bytes=16M",
                                     "--cache_capacity=64M"])

    # The watchdog: a hang anywhere becomes a failure with tracebacks.
    def on_timeout():
        print("FAIL: the test ran past %d s; killing larderd" % WATCHDOG_SECONDS, file=sys.stderr)
        faulthandler.dump_traceback(all_threads=True)
        daemon.kill()
        time.sleep(5)
        shutil.rmtree(tmp, ignore_errors=True)
        os._exit(1)
    watchdog = threading.Timer(WATCHDOG_SECONDS, on_timeout)
    watchdog.daemon = True
    watchdog.start()

    failures = 0
    full_seq = None
    try:
        test_abi(L, build_dir, tmp)
        print("ok abi", flush=True)
        daemon.start()
        rc, client = L.connect(daemon.socket)
        check(rc == 0, "connect: %s" % L.err(rc))
        try:
            steps = [
                ("epochs", lambda: test_epochs(L, daemon, client)),
                ("types", lambda: test_types(L, daemon, client)),
                ("export_releases", lambda: test_export_releases(L, daemon, client)),
                ("resume", lambda: test_resume(L, client, full_seq)),
                ("errors", lambda: test_errors(L, daemon, client, tmp)),
                ("fork", lambda: test_fork(L, client, daemon.socket)),
                ("sigkill", lambda: test_sigkill(L, daemon, build_dir, full_seq)),
                ("loader_patterns", lambda: test_loader_patterns(L, daemon, client)),
                ("fixed_bugs", lambda: test_fixed_bugs(L, daemon, client, build_dir)),
            ]
            for name, fn in steps:
                t = time.monotonic()
                try:
                    r = fn()
                    if name == "epochs":
                        full_seq = r
                    print("ok %s (%.1f s)" % (name, time.monotonic() - t), flush=True)
                except TestFailure as e:
                    failures += 1
                    print("FAIL %s: %s" % (name, e), flush=True)
                    if name == "epochs":
                        break  # the later steps compare with its sequence
                check(daemon.alive(), "larderd died during %s:\n%s" % (name, daemon.tail()))
        finally:
            L.lib.larder_client_close(client)
        # Last, as it kills the daemon: a trainer outlives a daemon crash.
        if full_seq is not None:
            t = time.monotonic()
            try:
                test_daemon_restart(L, daemon, full_seq)
                print("ok daemon_restart (%.1f s)" % (time.monotonic() - t), flush=True)
            except TestFailure as e:
                failures += 1
                print("FAIL daemon_restart: %s" % e, flush=True)
        status = daemon.stop()
        check(status == 0, "larderd exited with status %s after SIGTERM:\n%s" % (status, daemon.tail()))
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:", "ThreadSanitizer"):
            check(bad not in daemon.tail(10 ** 7), "larderd's log has a sanitizer report")
    except TestFailure as e:
        failures += 1
        print("FAIL: %s" % e, flush=True)
    except Exception:
        failures += 1
        traceback.print_exc()
    finally:
        # Clean up before printing anything more: a print can fail too (a
        # closed pipe), and must not leave a daemon or its directory behind.
        watchdog.cancel()
        log_tail = None
        try:
            daemon.stop()
            if failures:
                log_tail = daemon.tail()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if log_tail is not None:
            print("---- larderd log (tail) ----\n%s\n----" % log_tail, file=sys.stderr)
    print("%s in %.1f s" % ("FAILED (%d)" % failures if failures else "passed", time.monotonic() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
