"""The extension of the larder package (larder/_views.c), for pip.

Everything else is in pyproject.toml.  The extension is optional: it is
built against the numpy of the interpreter that builds it, when numpy, the
interpreter's headers and a C compiler are there, and the package runs
without it (pure Python over ctypes, a little slower per batch) when they
are not.
"""
from setuptools import Extension, setup

try:
    import numpy
    ext_modules = [Extension("larder._views", ["larder/_views.c"],
                             include_dirs=[numpy.get_include()],
                             extra_compile_args=["-std=c11"], optional=True)]
except ImportError:
    ext_modules = []

setup(ext_modules=ext_modules)
