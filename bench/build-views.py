#!/usr/bin/env python3
"""
build-views.py DIR: compiles the larder package's extension
(client/python/larder/_views.c) for the interpreter that runs this script
and its numpy, into DIR/_views<EXT_SUFFIX>, where the package finds it
beside liblarder (DIR = the lib/larder folder next to liblarder.so).

For hosts that get a bundle (bench/bundle.sh) rather than `make` or `pip
install`: a GPU node whose python3 is not the build machine's.  Exits 1,
saying why, without a compiler, Python's headers or numpy.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "client", "python", "larder", "_views.c")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: build-views.py DIR")
    out_dir = sys.argv[1]
    try:
        import numpy
    except ImportError:
        sys.exit("build-views: this python3 has no numpy")
    inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(inc, "Python.h")):
        sys.exit("build-views: no Python.h in %s (python3-dev)" % inc)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit("build-views: no C compiler")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "_views" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    cmd = [cc, "-std=c11", "-O2", "-fPIC", "-shared", "-Wall",
           "-I" + inc, "-I" + numpy.get_include(), SRC, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("build-views: %s failed:\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    print("build-views: %s (numpy %s)" % (out, numpy.__version__))


if __name__ == "__main__":
    main()
