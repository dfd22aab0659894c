"""The build backend of pyproject.toml: setuptools', found offline.

pip builds in an isolated environment and would download the backend
named in build-system.requires; larder installs offline, so it requires
nothing and uses the setuptools of the interpreter itself.  The isolated
environment hides the interpreter's site directories, so they are put
back on sys.path (after the isolated ones): setuptools comes from there
when the isolated environment has none, and numpy, for the optional
extension that setup.py builds.
"""
import site
import sys

# The interpreter's own site directories, after the isolated ones: its
# setuptools where the isolated environment has none, and its numpy, which
# the optional extension (setup.py) is built against.
_paths = list(getattr(site, "getsitepackages", lambda: [])())
_paths += ["/usr/lib/python3/dist-packages",
           "/usr/lib/python%d.%d/dist-packages" % sys.version_info[:2],
           "/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2]]
for _p in _paths:
    if _p not in sys.path:
        sys.path.append(_p)

try:
    import setuptools.build_meta as _meta
except ImportError:
    raise ImportError("larder: building needs setuptools (Debian: apt-get install "
                      "python3-setuptools; else pip install setuptools)") from None

# PEP 517 and PEP 660 hooks, as setuptools defines them.
build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
get_requires_for_build_wheel = lambda config_settings=None: []  # noqa: E731
get_requires_for_build_sdist = lambda config_settings=None: []  # noqa: E731
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
build_editable = getattr(_meta, "build_editable", None)
get_requires_for_build_editable = lambda config_settings=None: []  # noqa: E731
prepare_metadata_for_build_editable = getattr(_meta, "prepare_metadata_for_build_editable", None)
if build_editable is None:
    del build_editable, get_requires_for_build_editable, prepare_metadata_for_build_editable
