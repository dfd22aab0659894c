"""pytest setup for tests/python: the package under client/python, the
liblarder, larderd and larderctl of LARDER_BUILD_DIR (default
build/release), and larderd fixtures on temporary sockets, started with
test_ctypes.py's Daemon helper.

    LARDER_BUILD_DIR=build/release /usr/bin/python3 -m pytest -q tests/python
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("LARDER_BUILD_DIR", os.path.join(REPO, "build", "release")))

# The package from the tree, over the build's library, whatever is installed.
sys.path.insert(0, os.path.join(REPO, "client", "python"))
sys.path.insert(0, HERE)
os.environ["LARDER_LIB"] = os.path.join(BUILD, "lib", "liblarder.so")
# Under torchrun or Slurm these would change the streams' ranks.
for _var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "LARDER_SOCKET"):
    os.environ.pop(_var, None)

import test_ctypes as lt  # noqa: E402  (the Daemon helper and larderctl cat readers)

# test_ctypes.py is a script with its own runner (test_ctypes_suite runs it):
# its functions named test_* take the script's arguments, not fixtures.
collect_ignore = ["test_ctypes.py"]

DAEMON_FLAGS = ["--workers=2", "--memory_limit=256M", "--arena_bytes=16M", "--cache_capacity=64M",
                "--log_level=warning"]


@pytest.fixture(scope="session")
def build_dir():
    for p in ("lib/liblarder.so", "bin/larderd", "bin/larderctl"):
        if not os.path.exists(os.path.join(BUILD, p)):
            pytest.exit("%s/%s is missing: build it first (make V=release)" % (BUILD, p), 2)
    return BUILD


def _start(build_dir, tmp_path_factory, name):
    d = lt.Daemon(build_dir, str(tmp_path_factory.mktemp(name)), DAEMON_FLAGS)
    d.start()
    return d


@pytest.fixture(scope="session")
def daemon(build_dir, tmp_path_factory):
    """One larderd shared by the tests that leave it running."""
    d = _start(build_dir, tmp_path_factory, "larderd")
    yield d
    status = d.stop()
    assert status == 0, "larderd exited with %s:\n%s" % (status, d.tail())


@pytest.fixture
def own_daemon(build_dir, tmp_path_factory):
    """A larderd of the test's own, which it may kill and restart."""
    d = _start(build_dir, tmp_path_factory, "own")
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    import larder
    c = larder.Client(daemon.socket)
    yield c
    c.close()
