"""The larder package against a real larderd: values, lifetimes, ranks,
signals, fork, a daemon restart.  Every wait has a deadline; nothing
depends on how fast a loaded machine runs."""
import ctypes
import gc
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import larder
import test_ctypes as lt
from conftest import REPO, BUILD

MAIN = lt.MAIN_FILE                  # 1,000 rows, 9 nullable strings
MAIN_ID = lt.MAIN_ID                 # unique per row
FLOATS = os.path.join(lt.DATA, "byte_stream_split.zstd.parquet")   # f32, f64: 300 rows
PLAIN = os.path.join(lt.DATA, "alltypes_plain.parquet")            # 8 rows, many types
LISTS = os.path.join(lt.DATA, "list_columns.parquet")
WIDE = os.path.join(lt.DATA, "delta_binary_packed.parquet")        # 200 rows, 66 int64

DEADLINE = 60  # seconds any single wait in these tests may take at most
# Whether this build has the package's extension (_views.c; python3-dev and
# numpy from deps.sh): then installs have it too, built for this interpreter.
HAVE_VIEWS = larder.library() is not None and larder._views is not None


def ids_of(batch):
    return batch.to_pylist(MAIN_ID)


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "client", "python"),
                                         os.path.dirname(__file__)])
    return env


def run_child(code, *args, timeout=DEADLINE):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(args),
                          env=child_env(), capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# The C struct the package reads as words

def test_describe_abi(tmp_path):
    """larder_batch_info_t and larder_array_info_t are as many 8-byte words
    as the package reads, in its order (checked against gcc's layout)."""
    from larder import _lib
    src = tmp_path / "abi.c"
    fields_b = _lib.BATCH_INFO_FIELDS
    fields_a = _lib.ARRAY_INFO_FIELDS
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "larder.h"', "int main(void) {",
             'printf("%zu %zu\\n", sizeof(larder_batch_info_t), sizeof(larder_array_info_t));']
    lines += ['printf("%%zu\\n", offsetof(larder_batch_info_t, %s));' % f for f in fields_b]
    lines += ['printf("%%zu\\n", offsetof(larder_array_info_t, %s));' % f for f in fields_a]
    lines += ["return 0; }"]
    src.write_text("\n".join(lines))
    exe = tmp_path / "abi"
    subprocess.run(["gcc", "-I", os.path.join(REPO, "client"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    nums = [int(x) for x in out]
    assert nums[0] == 8 * len(fields_b) and nums[1] == 8 * len(fields_a)
    assert nums[2:2 + len(fields_b)] == [8 * i for i in range(len(fields_b))]
    assert nums[2 + len(fields_b):] == [8 * i for i in range(len(fields_a))]
    # And the options struct's mirror is the one test_ctypes.py checks.
    assert [f[0] for f in _lib.StreamOptions._fields_] == [f[0] for f in lt.StreamOptions._fields_]


def test_ctypes_suite(build_dir):
    """tests/python/test_ctypes.py, liblarder's own ctypes test, passes."""
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "test_ctypes.py"),
                          build_dir], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


# ---------------------------------------------------------------------------
# Values

def cat(daemon, path):
    out = subprocess.run([daemon.ctl, "cat", path], capture_output=True, text=True, timeout=30,
                         check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line]


def test_values_equal_cat(daemon, client):
    """Every row read (strings with their nulls, float32 and float64, ints,
    timestamps, lists) equals the row `larderctl cat` prints, in file order
    with shuffle off."""
    s = client.stream(MAIN, batch_size=100, shuffle=False)
    assert len(s) == 10 and s.num_samples == 1000
    rows = []
    for b in s:
        cols = {name: b.to_pylist(name) for name in b}
        assert all(isinstance(b[name], larder.VarColumn) for name in b)
        rows += [dict(zip(cols, vals)) for vals in zip(*cols.values())]
    assert rows == cat(daemon, MAIN)
    assert sum(v is None for r in rows for v in r.values()) > 1000  # nulls exercised

    s = client.stream(FLOATS, batch_size=300, shuffle=False)
    b = next(s)
    want = cat(daemon, FLOATS)
    assert b["f32"].dtype == np.float32 and b["f64"].dtype == np.float64
    assert b["f32"].tolist() == [float(np.float32(r["f32"])) for r in want]
    assert b["f64"].tolist() == [r["f64"] for r in want]
    assert not b["f64"].flags.writeable  # the arena is read-only
    assert b.mask("f64") is None

    s = client.stream(PLAIN, batch_size=8, shuffle=False)
    b = next(s)
    want = cat(daemon, PLAIN)
    assert b["id"].tolist() == [r["id"] for r in want]
    assert b["bigint_col"].tolist() == [r["bigint_col"] for r in want]
    assert b["bool_col"].tolist() == [r["bool_col"] for r in want]
    assert b["double_col"].tolist() == [r["double_col"] for r in want]
    ts = b["timestamp_col"]
    assert ts.dtype.kind == "M"
    assert [str(t)[:19] for t in ts] == [r["timestamp_col"][:19] for r in want]

    s = client.stream(LISTS, batch_size=3, shuffle=False)
    b = next(s)
    want = cat(daemon, LISTS)
    # Nulls inside a list read as zeros / empty strings (the top level masks).
    assert b.to_pylist("int64_list") == [[x or 0 for x in r["int64_list"]] for r in want]
    assert b.to_pylist("utf8_list") == [None if r["utf8_list"] is None else
                                        [x or "" for x in r["utf8_list"]] for r in want]


def test_fixed_size_lists_are_2d(client):
    """A LIST whose rows all have one length is a 2-D view; the FLOATS
    columns' batches of one length stay 1-D."""
    s = client.stream(PLAIN, batch_size=4, shuffle=False)
    b = next(s)
    assert b["id"].ndim == 1
    # (No test file has a fixed-length list column; a VarColumn otherwise.)
    s = client.stream(LISTS, batch_size=3, shuffle=False)
    assert isinstance(next(s)["int64_list"], larder.VarColumn)


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return a == b  # None, a VarColumn's kind
    return (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            and a.flags.writeable == b.flags.writeable)


@pytest.mark.parametrize("name", ["alltypes_plain.parquet", "alltypes_dictionary.parquet",
                                  "byte_stream_split.zstd.parquet", "delta_binary_packed.parquet",
                                  "datapage_v2.snappy.parquet", "int32_decimal.parquet",
                                  "int96_from_spark.parquet", "float16_nonzeros_and_nans.parquet",
                                  "nan_in_stats.parquet", "list_columns.parquet",
                                  "nested_structs.rust.parquet", "int32_with_null_pages.parquet"])
def test_views_extension_equals_python(client, monkeypatch, name):
    """The extension's views (_views.c) and numpy's, built in Python, are
    the same arrays: dtypes, shapes, bytes, masks, read-only; batches of
    every size the file gives (a short last one included)."""
    path = os.path.join(lt.DATA, name)
    if not os.path.exists(path):
        pytest.skip("%s is not in this parquet-testing" % name)

    fast = client.stream(path, batch_size=7, shuffle=False)
    pure = client.stream(path, batch_size=7, shuffle=False)
    first_fast = next(fast)
    monkeypatch.setattr(larder, "_views", None)  # the plan is made at the first batch
    first_pure = next(pure)
    monkeypatch.undo()
    # Streams with fixed-width columns take the extension's path.
    assert (fast._plan[7] is not None) == (HAVE_VIEWS and bool(fast._plan[5]))
    assert pure._plan[7] is None
    # In step, one batch of each alive at a time (a window holds 32).
    n = 0
    for bf, bp in itertools.chain([(first_fast, first_pure)], zip(fast, pure)):
        assert bf.position == bp.position
        cf, cp = bf.numpy(masks=True), bp.numpy(masks=True)
        assert cf.keys() == cp.keys()
        for k in cf:
            assert _same(cf[k], cp[k]), (name, bf.position, k)
        n += 1
        del bf, bp, cf, cp
    assert n == len(fast) > 0
    assert next(pure, None) is None


@pytest.mark.skipif(not HAVE_VIEWS, reason="the extension is not built")
def test_views_extension_arguments(client):
    """The extension takes only what its conventions allow: views that
    would leave the region (or have no rows) go to the general path
    (None); malformed specs and word indexes raise; its arrays cannot be
    made writable, and keep their owner alive."""
    views = larder._views.views
    buf = (ctypes.c_int64 * 4)(3, 0, 0, 0)
    region = (ctypes.c_char * 64)()
    base = ctypes.addressof(region)
    owner = memoryview(region).toreadonly()
    vec = ctypes.addressof(buf)
    i8 = np.dtype("<i8")
    buf[1] = base + 16
    got = views(owner, base, 64, vec, 4, (("x", 0, 1, i8),))
    assert list(got) == ["x"] and got["x"].shape == (3,) and got["x"].base is owner
    assert not got["x"].flags.writeable and got["x"].flags.aligned
    with pytest.raises(ValueError):
        got["x"].flags.writeable = True
    buf[1] = base + 48  # 3 * 8 bytes from 48 pass the end of 64
    assert views(owner, base, 64, vec, 4, (("x", 0, 1, i8),)) is None
    buf[1] = base - 8
    assert views(owner, base, 64, vec, 4, (("x", 0, 1, i8),)) is None
    buf[1], buf[0] = base, 0  # no rows
    assert views(owner, base, 64, vec, 4, (("x", 0, 1, i8),)) is None
    buf[0] = -1
    assert views(owner, base, 64, vec, 4, (("x", 0, 1, i8),)) is None
    buf[0] = 1
    with pytest.raises(ValueError):
        views(owner, base, 64, vec, 4, (("x", 0, 4, i8),))
    with pytest.raises(TypeError):
        views(owner, base, 64, vec, 4, (("x", 0, 1, "<i8"),))
    with pytest.raises(TypeError):
        views(owner, base, 64, vec, 4, (("x", 0, 1),))
    with pytest.raises(TypeError):
        views(owner, base, 64, vec, 4, [("x", 0, 1, i8)])
    # describe calls larder_batch_describe, which refuses a NULL batch.
    daddr = ctypes.cast(larder.library().larder_batch_describe, ctypes.c_void_p).value
    info = (ctypes.c_int64 * 8)()
    with pytest.raises(ValueError):
        larder._views.describe(daddr, 0, ctypes.addressof(info), 0, 0)
    with pytest.raises(ValueError):
        larder._views.describe(0, 1, ctypes.addressof(info), 0, 0)


# ---------------------------------------------------------------------------
# Lifetimes

def test_tensors_outlive_stream(daemon):
    """Arrays and tensors taken from a batch stay valid after the batch,
    the stream and the client are gone; dropping them releases the batch."""
    import torch
    c = larder.Client(daemon.socket)
    s = c.stream(FLOATS, batch_size=50, seed=4)
    b = next(s)
    t = b.torch()["f64"]
    a = b["f32"]
    want_t, want_a = t.clone(), a.copy()
    b.release()
    del b
    s.close()
    c.close()
    del s, c
    gc.collect()
    assert torch.equal(t, want_t) and np.array_equal(a, want_a)
    del t, a
    gc.collect()


def test_release_follows_last_view(client):
    """With a window of 2, two held arrays of two batches stop the stream
    (the daemon may not send a third); dropping the batch objects does not
    release them while the arrays live; dropping one array does."""
    s = client.stream(WIDE, columns=["bitwidth1", "bitwidth2"], batch_size=10, epochs=0,
                      window=2)
    b0, b1 = next(s), next(s)
    h0, h1 = b0["bitwidth1"], b1["bitwidth2"]
    b0.release()
    del b0, b1
    gc.collect()
    with pytest.raises(larder.LarderTimeoutError) as e:
        s.next(timeout=0.5)
    assert isinstance(e.value, TimeoutError) and e.value.code == -10
    del h0
    gc.collect()
    assert s.next(timeout=DEADLINE) is not None  # its region came back
    del h1


def test_held_array_not_reused(client):
    """An array held while 100 more batches go through a window of 3 keeps
    its values: the daemon never reuses the region under it."""
    s = client.stream(WIDE, columns=["bitwidth%d" % i for i in range(8)], batch_size=20,
                      epochs=0, window=3, seed=9)
    held = next(s)
    arrays = dict(held)
    want = {k: v.copy() for k, v in arrays.items()}
    del held
    for _ in range(100):
        b = s.next(timeout=DEADLINE)
        assert b is not None
        del b
    for k in want:
        assert np.array_equal(arrays[k], want[k]), k


def test_with_batch_releases(client):
    s = client.stream(FLOATS, batch_size=100, epochs=0, window=1)
    for _ in range(5):
        with s.next(timeout=DEADLINE) as b:
            assert len(b["f32"]) == 100
        # The with block's release let the next batch come (window of 1).


# ---------------------------------------------------------------------------
# Streams: ranks, resume, errors

RANK_CHILD = """
import sys, json, larder
c = larder.Client(sys.argv[1])
s = c.stream(sys.argv[2], columns=[sys.argv[3]], batch_size=50, seed=11,
             rank=int(sys.argv[4]), world_size=2)
ids = [i for b in s for i in b.to_pylist(sys.argv[3])]
print(json.dumps({"ids": ids, "len": len(s)}))
"""


def test_exactly_once_two_ranks(daemon):
    """Two processes, ranks 0 and 1 of 2, read every row once between them."""
    procs = [subprocess.Popen([sys.executable, "-c", RANK_CHILD, daemon.socket, MAIN, MAIN_ID,
                               str(r)], env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    got = []
    for p in procs:
        out, err = p.communicate(timeout=DEADLINE)
        assert p.returncode == 0, err
        got.append(json.loads(out))
    assert got[0]["len"] == got[1]["len"] == 10
    a, b = got[0]["ids"], got[1]["ids"]
    assert len(a) == len(b) == 500 and not set(a) & set(b)
    assert sorted(a + b) == sorted(r[MAIN_ID] for r in lt.cat_rows(daemon.ctl, MAIN))


def test_position_and_resume(client):
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=5, epochs=2)
    full = [ids_of(b) for b in s]
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=5, epochs=2)
    head = [ids_of(next(s)) for _ in range(20)]
    pos = s.position
    assert pos == (1, 4)  # 16 batches an epoch
    s.close()
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=5, epochs=2, start=pos)
    assert head + [ids_of(b) for b in s] == full
    wait, compute = s.stall
    assert wait + compute > 0


def test_errors(daemon, client, tmp_path):
    with pytest.raises(larder.NotFoundError) as e:
        client.stream(str(tmp_path / "missing.parquet"))
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, larder.LarderError)
    assert e.value.code == -8 and e.value.name == "LARDER_ENOENT"
    assert "missing.parquet" in str(e.value)
    with pytest.raises(larder.LarderError) as e:
        client.stream(MAIN, columns=["no_such_column"])
    assert "no_such_column" in str(e.value)
    with pytest.raises(larder.ConnectError) as e:
        larder.Client(str(tmp_path / "nosock"))
    assert isinstance(e.value, ConnectionError) and e.value.name == "LARDER_ECONNECT"
    with pytest.raises(larder.InvalidArgumentError):
        client.stream(MAIN, window=larder.MAX_WINDOW + 1)


# ---------------------------------------------------------------------------
# Signals, fork, the daemon restarting

SIGINT_CHILD = """
import sys, time, larder
c = larder.Client(sys.argv[1])
s = c.stream(sys.argv[2], batch_size=10, epochs=0, window=1)
held = next(s)                 # the whole window: next() now waits for ever
print("waiting", flush=True)
try:
    s.next()
    print("no wait", flush=True)
    sys.exit(3)
except KeyboardInterrupt:
    print("interrupted %.6f" % time.monotonic(), flush=True)
del held                       # the stream is still usable
b = s.next(timeout=60)
print("next ok" if b is not None else "no batch", flush=True)
"""


def test_ctrl_c_during_wait(daemon):
    """SIGINT to a process blocked in next() raises KeyboardInterrupt there
    promptly (the wait is sliced), and the stream goes on afterwards."""
    p = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD, daemon.socket, FLOATS],
                         env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # let it enter the wait (sooner passes too, vacuously)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().split()
        assert line and line[0] == "interrupted", line
        # Slices of 100 ms: a deadline well above that, for a loaded machine;
        # an unsliced wait would never return at all.
        assert float(line[1]) - sent < 5
        assert p.stdout.readline().strip() == "next ok"
        assert p.wait(timeout=DEADLINE) == 0, p.stderr.read()
    finally:
        p.kill()
        p.wait()


def test_fork(daemon, client):
    """A forked child (a DataLoader worker) drops the batch it inherited and
    reads through a client of its own; the parent's batch and stream are
    untouched."""
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=2, window=2)
    b = next(s)
    ids = ids_of(b)
    arr = b[MAIN_ID].offsets.copy()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            same = ids_of(b) == ids
            del b                 # releases in this process only
            gc.collect()
            c2 = larder.Client(daemon.socket)
            s2 = c2.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=2)
            status = 0 if same and ids_of(next(s2)) == ids else 2
        except BaseException:
            import traceback
            traceback.print_exc()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert ids_of(b) == ids and np.array_equal(b[MAIN_ID].offsets, arr)
    del b
    assert sum(1 for _ in s) == len(s) - 1


def test_daemon_restart(own_daemon):
    """The daemon dies under a trainer: next() raises ClosedError (a
    ConnectionError), held arrays stay readable; a new client on the
    restarted daemon resumes from the position to the same sequence."""
    d = own_daemon
    c = larder.Client(d.socket)
    s = c.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=3, epochs=1)
    full = [ids_of(b) for b in s]
    # A window of 2: most of the epoch is still to come when the daemon dies.
    s = c.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=3, epochs=1, window=2)
    got = [ids_of(next(s)) for _ in range(5)]
    held = next(s)
    got.append(ids_of(held))
    pos = s.position
    d.kill()
    d.stop()
    with pytest.raises(ConnectionError) as e:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:  # batches already sent may still come
            b = s.next(timeout=1)
            assert b is not None, "the stream ended normally with its daemon dead"
            del b
    assert isinstance(e.value, larder.ClosedError)
    assert ids_of(held) == got[-1]
    del held
    c.close()
    d.start()
    c = larder.Client(d.socket)
    s = c.stream(MAIN, columns=[MAIN_ID], batch_size=64, seed=3, epochs=1, start=pos)
    got += [ids_of(b) for b in s]
    assert got == full
    c.close()


# ---------------------------------------------------------------------------
# Installing

IMPORT_CHECK = ("import larder, larder.torch; print(larder.__file__); print(larder.library()._name); "
                "print(larder._views.__file__ if larder._views else 'none:' + larder.views_note)")


def test_make_install_finds_library(tmp_path):
    """`make install PREFIX=...` puts the package where Debian's python3
    finds it (with PYTHONPATH for a private prefix), and the package finds
    the installed liblarder without LD_LIBRARY_PATH or LARDER_LIB."""
    prefix = tmp_path / "prefix"
    out = subprocess.run(["make", "--no-print-directory", "install", "PREFIX=%s" % prefix],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    site = prefix / "lib" / ("python%d.%d" % sys.version_info[:2]) / "dist-packages"
    env = {k: v for k, v in os.environ.items() if k not in ("LARDER_LIB", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(site)
    res = subprocess.run([sys.executable, "-c", IMPORT_CHECK], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=DEADLINE)
    assert res.returncode == 0, res.stderr
    where, lib, views = res.stdout.splitlines()
    assert where.startswith(str(site)) and lib == str(prefix / "lib" / "liblarder.so.0")
    assert views.startswith(str(site)) if HAVE_VIEWS else views.startswith("none:")


def test_pip_install_offline(tmp_path):
    """`pip install ./client/python` builds and installs with no index."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=DEADLINE)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    out = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index",
                          os.path.join(REPO, "client", "python")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_CHECK], env=env,
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=DEADLINE)
    assert res.returncode == 0, res.stderr
    where, _, views = res.stdout.splitlines()
    assert where.startswith(str(venv))
    # pip builds the extension against this interpreter's numpy.
    assert views.startswith(str(venv)) if HAVE_VIEWS else views.startswith("none:")


# ---------------------------------------------------------------------------
# Arrow PyCapsule interface

_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def test_arrow_capsules(client):
    """__arrow_c_schema__ / __arrow_c_array__ give a struct schema of the
    columns and an array whose buffers are the arena's (the numpy views'
    own memory); a consumer that moves the array out keeps the batch's
    region until it releases it, and an unconsumed capsule releases on
    destruction."""
    from larder import _arrow
    s = client.stream(PLAIN, batch_size=8, shuffle=False, epochs=0, window=1)
    b = next(s)
    sc = b.__arrow_c_schema__()
    schema = ctypes.cast(_get_pointer(sc, b"arrow_schema"), ctypes.POINTER(_arrow.ArrowSchema)).contents
    assert schema.format == b"+s" and schema.n_children == len(b)
    names = [schema.children[i].contents.name.decode() for i in range(schema.n_children)]
    assert names == list(b)
    fmts = dict(zip(names, [schema.children[i].contents.format for i in range(schema.n_children)]))
    assert fmts["id"] == b"i" and fmts["double_col"] == b"g" and fmts["string_col"] == b"z"
    del sc, schema

    sc, ac = b.__arrow_c_array__()
    arr = ctypes.cast(_get_pointer(ac, b"arrow_array"), ctypes.POINTER(_arrow.ArrowArray)).contents
    assert arr.length == 8 and arr.n_children == len(b)
    col = arr.children[names.index("id")].contents
    assert col.length == 8 and col.buffers[1] == b["id"].ctypes.data
    # A consumer moves the array out of the capsule, as the interface says.
    moved = _arrow.ArrowArray()
    ctypes.memmove(ctypes.addressof(moved), ctypes.addressof(arr), ctypes.sizeof(moved))
    arr.release = _arrow.ARRAY_RELEASE()
    del sc, ac, arr, col
    b.release()
    del b
    gc.collect()
    with pytest.raises(larder.LarderTimeoutError):
        s.next(timeout=0.5)   # the moved array still holds the only window slot
    moved.release(ctypes.pointer(moved))
    assert not moved.release
    b = s.next(timeout=DEADLINE)
    assert b is not None
    # Unconsumed capsules release on destruction.
    b.__arrow_c_array__()
    b.release()
    del b
    gc.collect()
    assert s.next(timeout=DEADLINE) is not None
    assert not _arrow._live


def test_interrupt_after_batch_taken(client):
    """An exception raised just after larder_stream_next took a batch (a
    KeyboardInterrupt between the call and the Batch) loses nothing: the
    next call returns that batch, and the sequence and window are intact."""
    ref = client.stream(MAIN, columns=[MAIN_ID], batch_size=100, seed=8)
    want = [ids_of(b) for b in ref]
    # A window of 2: a for loop's variable holds the previous batch while
    # next() waits for the following one.
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=100, seed=8, window=2)
    real = s._next

    def interrupted(h, ms, out):
        real(h, -1, out)  # waits until it takes a batch
        s._next = real
        raise KeyboardInterrupt
    got = [ids_of(next(s))]
    s._next = interrupted
    with pytest.raises(KeyboardInterrupt):
        next(s)
    got += [ids_of(b) for b in s]
    assert got == want


def test_interrupt_then_close(client):
    """A batch taken when an exception interrupted next(), which no Batch
    owns, goes back when the stream closes: held, it would keep the
    stream's region (a CUDA stream's device memory) until the process
    exits."""
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=100, seed=8, window=2)
    real = s._next

    def interrupted(h, ms, out):
        real(h, -1, out)
        raise KeyboardInterrupt
    s._next = interrupted
    with pytest.raises(KeyboardInterrupt):
        next(s)
    stashed = s._stash
    assert stashed
    lib, released = s._L, []

    class Spy:
        def __getattr__(self, name):
            return getattr(lib, name)

        def larder_batch_release(self, p):
            released.append(p)
            lib.larder_batch_release(p)
    s._L = Spy()
    s.close()
    assert released == [stashed] and not s._stash


def test_arrow_pyarrow(client, daemon):
    """pyarrow (where installed) imports a batch through the PyCapsule
    interface, zero-copy, with the values `larderctl cat` prints, and the
    imported record batch keeps the region after the Batch is gone."""
    pa = pytest.importorskip("pyarrow")
    s = client.stream(PLAIN, batch_size=8, shuffle=False, epochs=0, window=1)
    b = next(s)
    rb = pa.record_batch(b)
    assert rb.num_rows == 8 and rb.schema.names == list(b)
    want = cat(daemon, PLAIN)
    assert rb.column(rb.schema.get_field_index("id")).to_pylist() == [r["id"] for r in want]
    assert rb.column(rb.schema.get_field_index("double_col")).to_pylist() == \
        [r["double_col"] for r in want]
    assert rb.column(rb.schema.get_field_index("id")).buffers()[1].address == b["id"].ctypes.data
    b.release()
    del b
    gc.collect()
    with pytest.raises(larder.LarderTimeoutError):
        s.next(timeout=0.5)   # the record batch holds the only window slot
    del rb
    gc.collect()
    assert s.next(timeout=DEADLINE) is not None


def test_partitions_and_job(client):
    """Node partitions and the job reach the daemon: P = 1 is no partition,
    and a file of one row group cannot be cut into two (its error says so);
    a job name the daemon refuses fails the open."""
    s = client.stream(MAIN, columns=[MAIN_ID], batch_size=64, partitions=1, job="py-test")
    assert s.partitions == (1, 0, 1)
    assert "partition" not in s.note
    s.close()
    with pytest.raises(larder.LarderError) as e:
        client.stream(MAIN, columns=[MAIN_ID], batch_size=64, partitions=2, world_size=2, rank=0,
                      local_world_size=1)
    assert e.value.name == "LARDER_EINVAL"
    assert "row groups" in str(e.value)
    with pytest.raises(larder.LarderError):
        client.stream(MAIN, columns=[MAIN_ID], batch_size=64, job="x" * 65)
