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
/* The samplers' own CPU time, so callers can take it out: what ended threads used, plus the
   running one's (a thread's CPU clock starts at 0). */
static atomic_llong probe_cpu_base_ns = 0;
static atomic_llong probe_cpu_now_ns = 0;
static long interval_ns = 100000;

/* A forked child has no sampler thread: it must not think one runs (nor join it). */
static void after_fork_in_child(void) { atomic_store(&running, 0); }

static void *probe_main(void *arg) {
    (void)arg;
    struct timespec pause = {0, interval_ns};
    struct timespec cpu;
    long long n = 0;
    while (atomic_load(&running)) {
        long long h = gil_locked();
        atomic_fetch_add(&held, h);
        atomic_fetch_add(&samples, 1);
        if ((++n & 63) == 0 && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
            atomic_store(&probe_cpu_now_ns, (long long)cpu.tv_sec * 1000000000LL + cpu.tv_nsec);
        nanosleep(&pause, NULL);
    }
    long long final_ns = atomic_load(&probe_cpu_now_ns);
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
        final_ns = (long long)cpu.tv_sec * 1000000000LL + cpu.tv_nsec;
    atomic_fetch_add(&probe_cpu_base_ns, final_ns);
    atomic_store(&probe_cpu_now_ns, 0);
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
    static int atfork_set = 0;
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        atfork_set = 1;
    }
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
        pthread_t thread = probe_thread; /* a start() while we wait must not change whom we join */
        Py_BEGIN_ALLOW_THREADS
        pthread_join(thread, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *probe_read(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    long long cpu = atomic_load(&probe_cpu_base_ns) + atomic_load(&probe_cpu_now_ns);
    return Py_BuildValue("(LLL)", (long long)atomic_load(&held), (long long)atomic_load(&samples),
                         cpu);
}

static PyMethodDef methods[] = {
    {"start", probe_start, METH_VARARGS,
     "start([interval_us]): sample the GIL every interval (default 100 us); False if running"},
    {"stop", probe_stop, METH_NOARGS, "stop sampling (the counts stay)"},
    {"read", probe_read, METH_NOARGS,
     "(samples with the GIL held, samples, the sampler thread's CPU ns) since import; the CPU "
     "figure is the running sampler's, refreshed every 64 samples (0 before the first)"},
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
