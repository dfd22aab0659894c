/*
 * _views.c: the larder package's fast path, a CPython extension that
 * builds a batch's numpy views in one call.
 *
 * Conventions
 * - describe() calls larder_batch_describe through the address the
 *   package's ctypes found, and returns the batch header's words.
 * - tensors() makes the tensors of a CUDA batch's buffers, one DLPack
 *   import each, through larder_batch_dlpack (its address, as for
 *   describe) and the consumer's from_dlpack (torch.from_dlpack).
 * - views() reads the int64 vector that
 *   larder_batch_describe filled (larder.h: larder_batch_info_t, then one
 *   larder_array_info_t per array, every field 8 bytes) and returns
 *   {name: 1-D read-only ndarray} for the columns it is given, or None
 *   when one of them cannot be viewed this way (no rows, no buffer, a
 *   buffer outside the region): the package then takes its general path,
 *   which gives the same arrays and the errors for what is wrong.
 * - Ownership: every array's base is `owner` (a new reference each), so
 *   the batch's region stays mapped and unreleased while any array, or
 *   anything made from one (views, torch.from_numpy tensors), is alive.
 *   The dict and the arrays belong to the caller.
 * - The arrays are not writable and cannot be made so: the owner the
 *   package passes is a read-only memoryview (the arena is mapped
 *   read-only; a write would fault).
 * - Threads: called with the GIL held, as any CPython function; it keeps
 *   no state between calls.
 * - Errors: a Python exception (TypeError, ValueError, MemoryError) for
 *   arguments that break these conventions; nothing is leaked.
 *
 * The module is optional: the package works without it (pure Python over
 * ctypes, np.frombuffer per column), at about 0.5 us more per column.  It
 * is built against the numpy it will run with; loading it into another
 * numpy's interpreter fails at import, and the package falls back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdint.h>
#include <string.h>

/* numpy 2 hides the descriptor's fields behind PyDataType_ELSIZE (an
 * inline function); numpy 1 has the field and not the function. */
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif

/* views(owner, base, size, vector, words, specs) -> dict or None
 *
 * owner: the object every array keeps alive (its base).
 * base, size: the region the buffers must lie in (addresses, bytes).
 * vector, words: the describe vector's address and its length in int64s.
 * specs: a tuple of (name, length_word, values_word, dtype): the column's
 *   row count is vector[length_word], its values' address
 *   vector[values_word], its element type dtype (a numpy.dtype). */
static PyObject *views(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *owner, *specs;
  unsigned long long base, size, vec;
  Py_ssize_t words;
  if (!PyArg_ParseTuple(args, "OKKKnO!", &owner, &base, &size, &vec, &words, &PyTuple_Type, &specs))
    return NULL;
  if (vec == 0 || words < 0) {
    PyErr_SetString(PyExc_ValueError, "views: no describe vector");
    return NULL;
  }
  /* Addresses the package took from larder_batch_describe. */
  const int64_t *w = (const int64_t *)(uintptr_t)vec; /* NOLINT(performance-no-int-to-ptr) */
  Py_ssize_t n = PyTuple_GET_SIZE(specs);
  PyObject *out = PyDict_New();
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *spec = PyTuple_GET_ITEM(specs, i);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4 ||
        !PyArray_DescrCheck(PyTuple_GET_ITEM(spec, 3))) {
      PyErr_SetString(PyExc_TypeError, "views: a spec is (name, length_word, values_word, dtype)");
      goto fail;
    }
    PyObject *name = PyTuple_GET_ITEM(spec, 0);
    Py_ssize_t kl = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 1));
    Py_ssize_t kv = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 2));
    if (PyErr_Occurred()) goto fail;
    if (kl < 0 || kl >= words || kv < 0 || kv >= words) {
      PyErr_SetString(PyExc_ValueError, "views: a word index lies outside the vector");
      goto fail;
    }
    PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(spec, 3);
    int64_t len = w[kl];
    uint64_t p = (uint64_t)w[kv];
    uint64_t item = PyDataType_ELSIZE(descr) > 0 ? (uint64_t)PyDataType_ELSIZE(descr) : 0;
    /* The general path handles what is not a plain run of values inside
     * the region. */
    if (len <= 0 || p == 0 || item == 0 || p < base || p - base > size ||
        (uint64_t)len > (size - (p - base)) / item) {
      Py_DECREF(out);
      Py_RETURN_NONE;
    }
    npy_intp dim = (npy_intp)len;
    void *data = (void *)(uintptr_t)p; /* NOLINT(performance-no-int-to-ptr) */
    Py_INCREF(descr);                  /* PyArray_NewFromDescr steals it */
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, descr, 1, &dim, NULL, data,
                                       0 /* not writable; numpy sets the alignment flags */, NULL);
    if (a == NULL) goto fail;
    Py_INCREF(owner); /* PyArray_SetBaseObject steals it, on failure too */
    if (PyArray_SetBaseObject((PyArrayObject *)a, owner) < 0) {
      Py_DECREF(a);
      goto fail;
    }
    int rc = PyDict_SetItem(out, name, a);
    Py_DECREF(a);
    if (rc < 0) goto fail;
  }
  return out;
fail:
  Py_DECREF(out);
  return NULL;
}

/* larder_batch_describe, as larder.h declares it. */
typedef int (*describe_fn)(const void *batch, void *info, void *arrays, int max_arrays);

/* describe(fn, batch, info, arrays, max_arrays) -> (rows, epoch, index, arena)
 *
 * Calls fn, the address of liblarder's larder_batch_describe, as that
 * function with the other arguments (addresses and a count), and returns
 * the header words the package reads for every batch: the same as a
 * ctypes call and a struct unpack, in one call.  Raises ValueError when
 * describe refuses (a NULL batch). */
static PyObject *describe(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long fn, batch, info, arrays;
  int max;
  if (!PyArg_ParseTuple(args, "KKKKi", &fn, &batch, &info, &arrays, &max)) return NULL;
  if (fn == 0 || info == 0) {
    PyErr_SetString(PyExc_ValueError, "describe: no function or no vector");
    return NULL;
  }
  describe_fn f;
  _Static_assert(sizeof(f) == sizeof(fn), "a function's address fits an unsigned long long");
  memcpy(&f, &fn, sizeof(f));
  /* Addresses from ctypes. */
  const void *b = (const void *)(uintptr_t)batch; /* NOLINT(performance-no-int-to-ptr) */
  void *in = (void *)(uintptr_t)info;             /* NOLINT(performance-no-int-to-ptr) */
  void *ar = (void *)(uintptr_t)arrays;           /* NOLINT(performance-no-int-to-ptr) */
  int rc = f(b, in, ar, max);
  if (rc < 0) {
    PyErr_Format(PyExc_ValueError, "larder_batch_describe returned %d", rc);
    return NULL;
  }
  const int64_t *w = in;
  return Py_BuildValue("(LLLL)", (long long)w[0], (long long)w[1], (long long)w[2],
                       (long long)w[6]);
}

/* DLPack's structures, as dlpack.h (v0.8 and later) and larder.h define
 * them: the extension builds without liblarder's headers. */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} dl_device;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dl_dtype;
typedef struct dl_managed {
  struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
  } dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct dl_managed *self);
} dl_managed;

/* larder_batch_dlpack, as larder.h declares it. */
typedef int (*dlpack_fn)(void *batch, const void *data, dl_dtype dtype, int ndim,
                         const int64_t *shape, dl_managed **out);

/* A capsule no consumer took still holds its tensor (and the batch
 * reference in it): drop them.  A consumer renames it "used_dltensor" and
 * calls the deleter itself. */
static void capsule_free(PyObject *cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;
  dl_managed *t = PyCapsule_GetPointer(cap, "dltensor");
  if (t != NULL && t->deleter != NULL) t->deleter(t);
}

/* Leaf kinds, as _device._TorchPlan names them. */
enum { LEAF_VALUES = 0, LEAF_BITMAP = 1, LEAF_OFFSETS = 2, LEAF_BYTES = 3, LEAF_NULL = 4 };

/* tensors(fn, batch, vector, leaves, from_dlpack, device_type) -> list or None
 *
 * fn: the address of liblarder's larder_batch_dlpack; batch: the batch
 *   (larder_batch_t *), which the caller owns.
 * vector: the batch's describe vector (a list of ints).
 * leaves: a tuple of (ptr_word, length_word, kind, code, bits, width), one
 *   per buffer: kind LEAF_VALUES (length elements of DLPack type code and
 *   bits, or (length, width) bytes when width), LEAF_OFFSETS (length + 1
 *   elements when length), LEAF_BYTES (length bytes); other kinds are left
 *   to the caller.
 * from_dlpack: called with each buffer's DLPack capsule; what it returns
 *   (a tensor) goes in the list.
 * device_type: 0, or the DLPack device type to put in the tensors instead
 *   of the batch's (the tests' driver double keeps "device memory" where
 *   the host reads it, and pass kDLCPU).
 *
 * Returns a list with, per leaf, its tensor, or None for a leaf the caller
 * makes itself (a bitmap, a NULL column, an empty buffer).  Returns None
 * when larder_batch_dlpack refuses a buffer (the caller's general path
 * then raises the error it means).  Every tensor holds a reference to the
 * batch (released when it is dropped), on failure too.  Raises what
 * from_dlpack raises, TypeError or ValueError for arguments that break
 * these conventions; nothing is leaked. */
static PyObject *tensors(PyObject *self, PyObject *args) {
  (void)self;
  unsigned long long fn, batch;
  PyObject *vec, *leaves, *from_dlpack;
  int devtype;
  if (!PyArg_ParseTuple(args, "KKO!O!Oi", &fn, &batch, &PyList_Type, &vec, &PyTuple_Type, &leaves,
                        &from_dlpack, &devtype))
    return NULL;
  if (fn == 0 || batch == 0) {
    PyErr_SetString(PyExc_ValueError, "tensors: no function or no batch");
    return NULL;
  }
  dlpack_fn f;
  _Static_assert(sizeof(f) == sizeof(fn), "a function's address fits an unsigned long long");
  memcpy(&f, &fn, sizeof(f));
  void *b = (void *)(uintptr_t)batch; /* NOLINT(performance-no-int-to-ptr) */
  Py_ssize_t n = PyTuple_GET_SIZE(leaves);
  PyObject *out = PyList_New(n);
  if (out == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *leaf = PyTuple_GET_ITEM(leaves, i);
    long long w[6];
    if (!PyTuple_Check(leaf) || PyTuple_GET_SIZE(leaf) != 6) {
      PyErr_SetString(PyExc_TypeError,
                      "tensors: a leaf is (ptr_word, length_word, kind, code, "
                      "bits, width)");
      goto fail;
    }
    for (int j = 0; j < 6; j++) w[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(leaf, j));
    if (PyErr_Occurred()) goto fail;
    /* Bounds-checked: from_dlpack runs Python, which may change the list. */
    PyObject *pw = PyList_GetItem(vec, (Py_ssize_t)w[0]),
             *lw = PyList_GetItem(vec, (Py_ssize_t)w[1]);
    if (pw == NULL || lw == NULL) goto fail;
    long long ptr = PyLong_AsLongLong(pw), len = PyLong_AsLongLong(lw);
    if (PyErr_Occurred()) goto fail;
    int64_t shape[2] = {len, w[5]};
    int ndim = 1;
    dl_dtype dt = {(uint8_t)w[3], (uint8_t)w[4], 1};
    switch (w[2]) {
      case LEAF_VALUES:
        if (w[5] > 0) {
          ndim = 2;
          dt = (dl_dtype){1, 8, 1}; /* kDLUInt */
        }
        break;
      case LEAF_OFFSETS: shape[0] = len ? len + 1 : 0; break;
      case LEAF_BYTES: dt = (dl_dtype){1, 8, 1}; break;
      default: shape[0] = 0; break; /* the caller's */
    }
    if (shape[0] <= 0 || ptr == 0 || (ndim == 2 && shape[1] <= 0)) {
      Py_INCREF(Py_None);
      PyList_SET_ITEM(out, i, Py_None);
      continue;
    }
    dl_managed *t = NULL;
    const void *data = (const void *)(uintptr_t)ptr; /* NOLINT(performance-no-int-to-ptr) */
    if (f(b, data, dt, ndim, shape, &t) != 0 || t == NULL) {
      Py_DECREF(out);
      Py_RETURN_NONE;
    }
    if (devtype) t->dl_tensor.device.device_type = devtype;
    PyObject *cap = PyCapsule_New(t, "dltensor", capsule_free);
    if (cap == NULL) {
      t->deleter(t);
      goto fail;
    }
    PyObject *tensor = PyObject_CallFunctionObjArgs(from_dlpack, cap, NULL);
    Py_DECREF(cap);
    if (tensor == NULL) goto fail;
    PyList_SET_ITEM(out, i, tensor);
  }
  return out;
fail:
  Py_DECREF(out); /* drops the tensors made so far, and with them their references */
  return NULL;
}

static PyMethodDef methods[] = {
    {"views", views, METH_VARARGS,
     "views(owner, base, size, vector, words, specs) -> {name: ndarray} or None"},
    {"describe", describe, METH_VARARGS,
     "describe(fn, batch, info, arrays, max_arrays) -> (rows, epoch, index, arena)"},
    {"tensors", tensors, METH_VARARGS,
     "tensors(fn, batch, vector, leaves, from_dlpack, device_type) -> [tensor or None] or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_views",
    "The larder package's fast path for numpy views.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__views(void) {
  import_array(); /* returns NULL with ImportError set on a numpy of another ABI */
  return PyModule_Create(&module);
}
