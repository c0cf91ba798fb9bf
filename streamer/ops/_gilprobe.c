/* streamer.ops._gilprobe: how much of the time this process's GIL is held, sampled.
 *
 * A plain pthread (never holding the GIL, never touching a Python object) reads the
 * interpreter's "GIL locked" flag every interval and counts the samples where it was set.
 * That is what py-spy's --gil mode reads from outside (it needs ptrace, which containers and
 * CI rarely allow); from inside, the read is one relaxed atomic load.
 *
 * The flag is CPython's internal state (Include/internal/pycore_gil.h): 3.11 keeps it in
 * _PyRuntime.ceval.gil. Other versions moved it; there the module builds with AVAILABLE = 0
 * and start() raises, so the benchmark says the figure is not available instead of guessing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_GIL_DISABLED)
#define Py_BUILD_CORE 1
#include "internal/pycore_runtime.h"
#define PROBE_AVAILABLE 1
static int gil_locked(void) {
    return _Py_atomic_load_relaxed(&_PyRuntime.ceval.gil.locked) > 0;
}
#else
#define PROBE_AVAILABLE 0
static int gil_locked(void) { return 0; }
#endif

static pthread_t probe_thread;
static atomic_int running = 0;
static atomic_llong samples = 0;
static atomic_llong held = 0;
static long interval_ns = 100000;

static void *probe_main(void *arg) {
    (void)arg;
    struct timespec pause = {0, interval_ns};
    while (atomic_load(&running)) {
        long long h = gil_locked();
        atomic_fetch_add(&held, h);
        atomic_fetch_add(&samples, 1);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static PyObject *probe_start(PyObject *self, PyObject *args) {
    (void)self;
    long interval_us = 100;
    if (!PyArg_ParseTuple(args, "|l", &interval_us)) return NULL;
    if (!PROBE_AVAILABLE) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the GIL probe reads CPython 3.11's internal GIL state; this "
                        "interpreter keeps it elsewhere (use py-spy record --gil)");
        return NULL;
    }
    if (interval_us < 10 || interval_us > 1000000) {
        PyErr_SetString(PyExc_ValueError, "interval_us must be within 10..1000000");
        return NULL;
    }
    if (atomic_load(&running)) Py_RETURN_FALSE; /* already sampling: one probe per process */
    interval_ns = interval_us * 1000L;
    if (interval_ns >= 1000000000L) interval_ns = 999999999L;
    atomic_store(&running, 1);
    if (pthread_create(&probe_thread, NULL, probe_main, NULL) != 0) {
        atomic_store(&running, 0);
        PyErr_SetString(PyExc_OSError, "could not start the GIL probe thread");
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *probe_stop(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    if (atomic_exchange(&running, 0)) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(probe_thread, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *probe_read(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return Py_BuildValue("(LL)", (long long)atomic_load(&held), (long long)atomic_load(&samples));
}

static PyMethodDef methods[] = {
    {"start", probe_start, METH_VARARGS,
     "start([interval_us]): sample the GIL every interval (default 100 us); False if running"},
    {"stop", probe_stop, METH_NOARGS, "stop sampling (the counts stay)"},
    {"read", probe_read, METH_NOARGS, "(samples with the GIL held, samples) since import"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gilprobe", "Samples whether this process's GIL is held.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gilprobe(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "AVAILABLE", PROBE_AVAILABLE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
