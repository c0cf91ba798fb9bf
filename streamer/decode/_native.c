/*
 * streamer.decode._native: the fast path of decode_block, in C, with the GIL released.
 *
 * One call decodes a block of msgpack records into one buffer per feature for a schema whose
 * features are all fixed-shape numbers (bool, int8..int64, uint8..uint64, float32, float64).
 * A record is taken here only when it is certainly good and its values are certainly those
 * the reference decoder (streamer/decode/records.py) would give; every other record (any
 * doubt: a reject, a default, NaN, a nested list, an ext type, a container among the extra
 * keys) is marked for the reference, which decides it. So the two never disagree on a
 * reject, by construction, and the differential tests check the columns of the rest.
 *
 * decode(features, limits, values) -> (status, columns)
 *   features: tuple of (name: bytes, kind: "b" | "i" | "u" | "f", itemsize, count, ndim)
 *   limits:   (max_record_bytes, max_depth, max_array_len, max_map_len)
 *   values:   a sequence of bytes (anything else is left to the reference)
 *   status:   bytearray, one byte per record: 1 decoded here, 0 for the reference
 *   columns:  one bytearray per feature, count * itemsize bytes per record, little-endian
 *             (only the rows of records taken here are meaningful)
 *
 * The records are parsed without the GIL: the values are held by a tuple of our own, and
 * the outputs are fresh bytearrays no one else sees until we return.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_FEATURES 64 /* a record holds every feature: at most MAX_KEYS */
#define MAX_KEYS 64

typedef struct {
    const char *name;
    Py_ssize_t name_len;
    char kind; /* 'b' bool, 'i' signed, 'u' unsigned, 'f' float */
    int itemsize;
    Py_ssize_t count; /* elements per record */
    int ndim;         /* 0: a scalar; 1: a vector (a flat list is accepted); 2+: bin only */
    char *out;        /* this feature's column */
} feature_t;

typedef struct {
    Py_ssize_t max_record_bytes;
    long max_depth;
    Py_ssize_t max_array_len;
    Py_ssize_t max_map_len;
} limits_t;

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} reader_t;

/* A msgpack number: exactly one of the three is meant, by `type`. */
enum { NUM_NONE = 0, NUM_UINT, NUM_SINT, NUM_FLOAT, NUM_BOOL };
typedef struct {
    int type;
    uint64_t u; /* NUM_UINT: any non-negative integer */
    int64_t s;  /* NUM_SINT: a negative integer */
    double f;   /* NUM_FLOAT */
    int b;      /* NUM_BOOL */
} number_t;

static inline int need(reader_t *r, size_t n) { return (size_t)(r->end - r->p) >= n; }

static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* A str or bin header at r->p: its payload and length; 1 ok, 0 not one (r unchanged). */
static int read_strbin(reader_t *r, int want_str, const uint8_t **data, size_t *len) {
    if (!need(r, 1)) return 0;
    uint8_t t = *r->p;
    int hdr;
    size_t n;
    if (want_str && (t & 0xe0) == 0xa0) {
        hdr = 1;
        n = t & 0x1f;
    } else if (t == (want_str ? 0xd9 : 0xc4)) {
        if (!need(r, 2)) return 0;
        hdr = 2;
        n = r->p[1];
    } else if (t == (want_str ? 0xda : 0xc5)) {
        if (!need(r, 3)) return 0;
        hdr = 3;
        n = (size_t)be(r->p + 1, 2);
    } else if (t == (want_str ? 0xdb : 0xc6)) {
        if (!need(r, 5)) return 0;
        hdr = 5;
        n = (size_t)be(r->p + 1, 4);
    } else {
        return 0;
    }
    if ((size_t)(r->end - r->p) - hdr < n) return 0;
    *data = r->p + hdr;
    *len = n;
    r->p += hdr + n;
    return 1;
}

/* Strict UTF-8, as Python's decoder: no overlongs, no surrogates, nothing past U+10FFFF. */
static int valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* A number (or bool) at r->p; 1 ok, 0 not one. */
static int read_number(reader_t *r, number_t *num) {
    if (!need(r, 1)) return 0;
    uint8_t t = *r->p;
    if (t <= 0x7f) {
        num->type = NUM_UINT;
        num->u = t;
        r->p += 1;
        return 1;
    }
    if (t >= 0xe0) {
        num->type = NUM_SINT;
        num->s = (int8_t)t;
        r->p += 1;
        return 1;
    }
    if (t == 0xc2 || t == 0xc3) {
        num->type = NUM_BOOL;
        num->b = t == 0xc3;
        r->p += 1;
        return 1;
    }
    int n;
    switch (t) {
    case 0xcc: n = 1; break;
    case 0xcd: n = 2; break;
    case 0xce: n = 4; break;
    case 0xcf: n = 8; break;
    case 0xd0: n = 1; break;
    case 0xd1: n = 2; break;
    case 0xd2: n = 4; break;
    case 0xd3: n = 8; break;
    case 0xca: n = 4; break;
    case 0xcb: n = 8; break;
    default: return 0;
    }
    if (!need(r, 1 + (size_t)n)) return 0;
    uint64_t v = be(r->p + 1, n);
    r->p += 1 + n;
    if (t >= 0xcc && t <= 0xcf) {
        num->type = NUM_UINT;
        num->u = v;
    } else if (t >= 0xd0 && t <= 0xd3) {
        int64_t s;
        if (n == 1) s = (int8_t)v;
        else if (n == 2) s = (int16_t)v;
        else if (n == 4) s = (int32_t)v;
        else s = (int64_t)v;
        if (s >= 0) {
            num->type = NUM_UINT;
            num->u = (uint64_t)s;
        } else {
            num->type = NUM_SINT;
            num->s = s;
        }
    } else if (t == 0xca) {
        uint32_t bits = (uint32_t)v;
        float f;
        memcpy(&f, &bits, 4);
        num->type = NUM_FLOAT;
        num->f = (double)f;
    } else {
        double d;
        memcpy(&d, &v, 8);
        num->type = NUM_FLOAT;
        num->f = d;
    }
    return 1;
}

/* A container header at r->p: fix types `fix` (0x90 array, 0x80 map, 16 of them), then the
 * 16- and 32-bit forms `t16`, `t32`; its length. 1 ok, 0 not one. */
static int read_header(reader_t *r, uint8_t fix, uint8_t t16, uint8_t t32, size_t *len) {
    if (!need(r, 1)) return 0;
    uint8_t t = *r->p;
    if ((t & 0xf0) == fix) {
        *len = t & 0x0f;
        r->p += 1;
        return 1;
    }
    if (t == t16 && need(r, 3)) {
        *len = (size_t)be(r->p + 1, 2);
        r->p += 3;
        return 1;
    }
    if (t == t32 && need(r, 5)) {
        *len = (size_t)be(r->p + 1, 4);
        r->p += 5;
        return 1;
    }
    return 0;
}

static int read_array_header(reader_t *r, size_t *len) { return read_header(r, 0x90, 0xdc, 0xdd, len); }
static int read_map_header(reader_t *r, size_t *len) { return read_header(r, 0x80, 0xde, 0xdf, len); }

/* The value of a key that is not a feature: skipped when it is a scalar the reference takes
 * as it is (nil, bool, a number, valid UTF-8 str, bin); 0 for anything else. */
static int skip_plain(reader_t *r) {
    if (!need(r, 1)) return 0;
    uint8_t t = *r->p;
    if (t == 0xc0) {
        r->p += 1;
        return 1;
    }
    number_t num;
    if (read_number(r, &num)) return 1;
    const uint8_t *data;
    size_t len;
    if (read_strbin(r, 1, &data, &len)) return valid_utf8(data, len);
    if (read_strbin(r, 0, &data, &len)) return 1;
    return 0;
}

/* One element of a numeric feature into `out`; 1 stored, 0 for the reference. */
static int store(const feature_t *f, const number_t *num, char *out) {
    if (f->kind == 'b') {
        if (num->type != NUM_BOOL) return 0;
        *(uint8_t *)out = (uint8_t)num->b;
        return 1;
    }
    if (num->type == NUM_BOOL) return 0;
    if (f->kind == 'f') {
        double d;
        if (num->type == NUM_FLOAT) {
            d = num->f;
            if (!isfinite(d)) return 0; /* NaN and inf: the reference's rules decide */
        } else {
            /* An integer in a float feature: exact in the target type, or the reference. */
            uint64_t mag = num->type == NUM_UINT ? num->u : (uint64_t)(-(num->s + 1)) + 1;
            uint64_t exact = f->itemsize == 4 ? (1ull << 24) : (1ull << 53);
            if (mag > exact) return 0;
            d = num->type == NUM_UINT ? (double)num->u : (double)num->s;
        }
        if (f->itemsize == 4) {
            if (d > 3.4028234663852886e38 || d < -3.4028234663852886e38) return 0;
            float v = (float)d;
            memcpy(out, &v, 4);
        } else {
            memcpy(out, &d, 8);
        }
        return 1;
    }
    if (num->type == NUM_FLOAT) return 0; /* a float in an integer feature */
    int bits = f->itemsize * 8;
    if (f->kind == 'u') {
        if (num->type != NUM_UINT) return 0;
        if (bits < 64 && num->u >> bits) return 0;
        uint64_t v = num->u;
        memcpy(out, &v, (size_t)f->itemsize); /* little-endian: the low bytes */
        return 1;
    }
    int64_t v;
    if (num->type == NUM_UINT) {
        if (num->u > (uint64_t)INT64_MAX) return 0;
        v = (int64_t)num->u;
    } else {
        v = num->s;
    }
    if (bits < 64) {
        int64_t hi = (int64_t)((1ull << (bits - 1)) - 1);
        if (v > hi || v < -hi - 1) return 0;
    }
    memcpy(out, &v, (size_t)f->itemsize);
    return 1;
}

/* One feature's value at r->p into its row; 1 stored, 0 for the reference. */
static int read_feature(reader_t *r, const feature_t *f, char *row, long max_depth,
                        Py_ssize_t max_array_len) {
    size_t nbytes = (size_t)f->count * (size_t)f->itemsize;
    const uint8_t *data;
    size_t len;
    if (read_strbin(r, 0, &data, &len)) {
        /* Raw little-endian bytes: exactly the feature's size; a bool's bytes are 0 or 1; a
         * float's elements finite (NaN and inf: the reference's rules decide). */
        if (len != nbytes) return 0;
        if (f->kind == 'b') {
            for (size_t i = 0; i < len; i++)
                if (data[i] > 1) return 0;
        } else if (f->kind == 'f') {
            for (Py_ssize_t i = 0; i < f->count; i++) {
                double d;
                if (f->itemsize == 4) {
                    float v;
                    memcpy(&v, data + 4 * i, 4);
                    d = v;
                } else {
                    memcpy(&d, data + 8 * i, 8);
                }
                if (!isfinite(d)) return 0;
            }
        }
        memcpy(row, data, nbytes);
        return 1;
    }
    number_t num;
    if (f->ndim == 0) {
        return read_number(r, &num) && store(f, &num, row);
    }
    size_t n;
    if (f->ndim != 1 || max_depth < 2 || !read_array_header(r, &n)) return 0;
    if (n != (size_t)f->count || n > (size_t)max_array_len) return 0;
    for (size_t i = 0; i < n; i++) {
        if (!read_number(r, &num) || !store(f, &num, row + i * f->itemsize)) return 0;
    }
    return 1;
}

/* One record; 1 decoded into row `index` of every column, 0 for the reference. */
static int decode_record(const uint8_t *data, size_t size, feature_t *features, int nf,
                         const limits_t *lim, Py_ssize_t index) {
    if (size == 0 || size > (size_t)lim->max_record_bytes || lim->max_depth < 1) return 0;
    reader_t r = {data, data + size};
    size_t nkeys;
    if (!read_map_header(&r, &nkeys)) return 0;
    if (nkeys > (size_t)lim->max_map_len || nkeys > MAX_KEYS) return 0;
    const uint8_t *keys[MAX_KEYS];
    size_t key_lens[MAX_KEYS];
    uint8_t seen[MAX_FEATURES];
    memset(seen, 0, (size_t)nf);
    int found = 0;
    for (size_t k = 0; k < nkeys; k++) {
        const uint8_t *key;
        size_t key_len;
        if (!read_strbin(&r, 1, &key, &key_len) || !valid_utf8(key, key_len)) return 0;
        for (size_t j = 0; j < k; j++) /* a key twice: the reference says format */
            if (key_lens[j] == key_len && memcmp(keys[j], key, key_len) == 0) return 0;
        keys[k] = key;
        key_lens[k] = key_len;
        int which = -1;
        for (int i = 0; i < nf; i++) {
            if ((size_t)features[i].name_len == key_len &&
                memcmp(features[i].name, key, key_len) == 0) {
                which = i;
                break;
            }
        }
        if (which < 0) {
            if (!skip_plain(&r)) return 0;
            continue;
        }
        feature_t *f = &features[which];
        char *row = f->out + (size_t)index * (size_t)f->count * (size_t)f->itemsize;
        if (!read_feature(&r, f, row, lim->max_depth, lim->max_array_len)) return 0;
        seen[which] = 1;
        found++;
    }
    /* Every feature present (a default is the reference's), nothing after the map. */
    return found == nf && r.p == r.end;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *spec, *limits_obj, *values_obj;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &spec, &PyTuple_Type, &limits_obj,
                          &values_obj))
        return NULL;
    limits_t lim;
    if (!PyArg_ParseTuple(limits_obj, "nlnn", &lim.max_record_bytes, &lim.max_depth,
                          &lim.max_array_len, &lim.max_map_len))
        return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(spec);
    if (nf < 1 || nf > MAX_FEATURES) {
        PyErr_SetString(PyExc_ValueError, "decode: 1 to 64 features");
        return NULL;
    }
    PyObject *values = PySequence_Tuple(values_obj); /* ours: no one mutates it meanwhile */
    if (values == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    feature_t features[MAX_FEATURES];
    PyObject *columns = PyList_New(nf);
    PyObject *status = PyByteArray_FromStringAndSize(NULL, n);
    const uint8_t **ptrs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*ptrs));
    Py_ssize_t *lens = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*lens));
    if (columns == NULL || status == NULL || ptrs == NULL || lens == NULL) goto fail;
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *item = PyTuple_GET_ITEM(spec, i);
        const char *kind;
        Py_ssize_t kind_len;
        feature_t *f = &features[i];
        if (!PyArg_ParseTuple(item, "y#s#ini", &f->name, &f->name_len, &kind, &kind_len,
                              &f->itemsize, &f->count, &f->ndim))
            goto fail;
        f->kind = kind[0];
        if (kind_len != 1 || !strchr("biuf", f->kind) || f->count < 1 ||
            !(f->itemsize == 1 || f->itemsize == 2 || f->itemsize == 4 || f->itemsize == 8) ||
            (f->kind == 'f' && f->itemsize < 4) || (f->kind == 'b' && f->itemsize != 1)) {
            PyErr_Format(PyExc_ValueError, "decode: unsupported feature %zd", i);
            goto fail;
        }
        Py_ssize_t row = f->count * f->itemsize;
        if (f->count > PY_SSIZE_T_MAX / f->itemsize || (n && row > PY_SSIZE_T_MAX / n)) {
            PyErr_Format(PyExc_OverflowError, "decode: feature %zd's column is too large", i);
            goto fail;
        }
        PyObject *column = PyByteArray_FromStringAndSize(NULL, n * row);
        if (column == NULL) goto fail;
        PyList_SET_ITEM(columns, i, column);
        f->out = PyByteArray_AS_STRING(column);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i);
        if (PyBytes_CheckExact(v)) {
            ptrs[i] = (const uint8_t *)PyBytes_AS_STRING(v);
            lens[i] = PyBytes_GET_SIZE(v);
        } else {
            ptrs[i] = NULL; /* None, bytearray, anything else: the reference's */
        }
    }
    char *st = PyByteArray_AS_STRING(status);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        st[i] = ptrs[i] != NULL &&
                decode_record(ptrs[i], (size_t)lens[i], features, (int)nf, &lim, i);
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(values);
    return Py_BuildValue("(NN)", status, columns);

fail:
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_XDECREF(columns);
    Py_XDECREF(status);
    Py_DECREF(values);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(features, limits, values) -> (status, columns): the fast path of decode_block, "
     "with the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The fast path of streamer.decode.records.decode_block.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
