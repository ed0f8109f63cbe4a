/* The engine's optional compiled accelerator: two per-record hot loops in C, nothing else.
 *
 * Both have a pure-Python twin that produces the same results (diffstore/engine/layout.py for the rows of
 * a bulk load, diffstore/engine/diff.py for the diff's scan); the engine uses this module when it was
 * built and falls back to the twin when it was not (tests/engine/test_accel.py compares the two).
 *
 *   sorted_short_rows(items, record_prefix, record_suffix, change_prefix)
 *       The rows of ``records`` and ``changes`` for a put of (key, value) pairs whose keys are short and
 *       strictly ascend (so none repeats): (records keys, their stored values, changes keys), built as
 *       layout.py's short_rows builds them. None when the items are not such a list (the general path
 *       takes them).
 *
 *   DiffScan(records_iter, from_seq, to_bound, stop, from_key, to_key, after_key, idle_limit, item_type, empty)
 *       An iterator of the diff items that diff.py's forward scan yields from the same records iterator;
 *       when it stops early, ``handed`` is the key form where the keyed way takes over (else None).
 *
 * See layout.py's docstring for the layout these loops read and write.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define LONG_KEY_PREFIX 200
#define MAX_RECORD_KEY 511 /* LMDB's default key limit */

/* ---- helpers ------------------------------------------------------------------------------------ */

static Py_ssize_t escaped_length(const char *s, Py_ssize_t n) {
    Py_ssize_t zeros = 0;
    const char *p = s, *end = s + n;
    while (p < end && (p = memchr(p, 0, (size_t)(end - p))) != NULL) {
        zeros++;
        p++;
    }
    return n + zeros;
}

/* esc(key): 00 -> 00 FF */
static char *escape_into(char *out, const char *s, Py_ssize_t n) {
    const char *end = s + n;
    while (s < end) {
        const char *zero = memchr(s, 0, (size_t)(end - s));
        if (zero == NULL) {
            memcpy(out, s, (size_t)(end - s));
            return out + (end - s);
        }
        memcpy(out, s, (size_t)(zero - s + 1));
        out += zero - s + 1;
        *out++ = (char)0xff;
        s = zero + 1;
    }
    return out;
}

static int compare_bytes(const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen) {
    int c = memcmp(a, b, (size_t)(alen < blen ? alen : blen));
    if (c) return c;
    return (alen > blen) - (alen < blen);
}

/* a <=> h | s, without building h | s */
static int compare_concat(const char *a, Py_ssize_t alen, const char *h, Py_ssize_t hlen, const char *s,
                          Py_ssize_t slen) {
    int c = memcmp(a, h, (size_t)(alen < hlen ? alen : hlen));
    if (c) return c;
    if (alen < hlen) return -1; /* a is a proper prefix of h */
    return compare_bytes(a + hlen, alen - hlen, s, slen);
}

/* ---- sorted_short_rows --------------------------------------------------------------------------- */

static PyObject *sorted_short_rows(PyObject *module, PyObject *args) {
    PyObject *items;
    const char *rp, *rs, *cp;
    Py_ssize_t rpl, rsl, cpl;
    if (!PyArg_ParseTuple(args, "Oy#y#y#:sorted_short_rows", &items, &rp, &rpl, &rs, &rsl, &cp, &cpl))
        return NULL;
    if (!PyList_CheckExact(items) || PyList_GET_SIZE(items) == 0) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(items);
    const char *previous = NULL;
    Py_ssize_t previous_length = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) Py_RETURN_NONE;
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > LONG_KEY_PREFIX) Py_RETURN_NONE;
        if (value != Py_None && !PyBytes_CheckExact(value)) Py_RETURN_NONE;
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key);
        if (previous != NULL && compare_bytes(previous, previous_length, k, kl) >= 0) Py_RETURN_NONE;
        previous = k;
        previous_length = kl;
    }
    /* No Python code ran since the checks: the list and its items are as checked. Three lists rather
     * than rows of tuples: ``zip`` hands putmulti the pairs without a tuple per row to allocate and for
     * the cyclic GC to track. */
    PyObject *record_keys = PyList_New(n), *values = PyList_New(n), *change_keys = PyList_New(n);
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (record_keys == NULL || values == NULL || change_keys == NULL || empty == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key), el = escaped_length(k, kl);
        PyObject *record_key = PyBytes_FromStringAndSize(NULL, rpl + el + 2 + rsl);
        PyObject *change_key = PyBytes_FromStringAndSize(NULL, cpl + el + 2);
        PyObject *stored;
        if (value == Py_None) {
            stored = empty;
            Py_INCREF(stored);
        } else {
            Py_ssize_t vl = PyBytes_GET_SIZE(value);
            stored = PyBytes_FromStringAndSize(NULL, vl + 1);
            if (stored != NULL) {
                PyBytes_AS_STRING(stored)[0] = 1;
                memcpy(PyBytes_AS_STRING(stored) + 1, PyBytes_AS_STRING(value), (size_t)vl);
            }
        }
        /* set before the check: the lists' deallocation frees what was made (and skips NULL slots) */
        PyList_SET_ITEM(record_keys, i, record_key);
        PyList_SET_ITEM(values, i, stored);
        PyList_SET_ITEM(change_keys, i, change_key);
        if (record_key == NULL || change_key == NULL || stored == NULL) goto fail;
        char *out = PyBytes_AS_STRING(record_key);
        memcpy(out, rp, (size_t)rpl);
        out = escape_into(out + rpl, k, kl);
        out[0] = out[1] = 0;
        memcpy(out + 2, rs, (size_t)rsl);
        out = PyBytes_AS_STRING(change_key);
        memcpy(out, cp, (size_t)cpl);
        out = escape_into(out + cpl, k, kl);
        out[0] = out[1] = 0;
    }
    Py_DECREF(empty);
    return Py_BuildValue("(NNN)", record_keys, values, change_keys);
fail:
    Py_XDECREF(record_keys);
    Py_XDECREF(values);
    Py_XDECREF(change_keys);
    Py_XDECREF(empty);
    return NULL;
}

/* ---- DiffScan ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *it;
    PyObject *from_seq, *to_bound, *stop; /* bytes */
    PyObject *from_key, *to_key, *after_key; /* bytes or None */
    PyObject *item_type, *empty_tuple, *empty_bytes;
    Py_ssize_t idle_limit;
    /* the head under the scan: a record key without its seq */
    char head[MAX_RECORD_KEY + 1];
    Py_ssize_t head_length;
    int have_head;
    PyObject *from_raw, *to_raw; /* owned; identical objects: the key was not written in the range */
    Py_ssize_t idle;
    int done;
    PyObject *handed; /* the form the keyed way resumes at, or NULL */
} DiffScan;

static void set_raw(PyObject **slot, PyObject *value) {
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
}

static int scan_init(DiffScan *self, PyObject *args, PyObject *kwargs) {
    PyObject *it, *from_seq, *to_bound, *stop, *from_key, *to_key, *after_key, *item_type, *empty;
    Py_ssize_t idle_limit;
    if (!PyArg_ParseTuple(args, "OSSSOOOnOO:DiffScan", &it, &from_seq, &to_bound, &stop, &from_key, &to_key,
                          &after_key, &idle_limit, &item_type, &empty))
        return -1;
    if (!PyIter_Check(it) || !PyType_Check(item_type) ||
        !PyType_IsSubtype((PyTypeObject *)item_type, &PyTuple_Type) || !PyTuple_CheckExact(empty)) {
        PyErr_SetString(PyExc_TypeError, "DiffScan: bad arguments");
        return -1;
    }
    PyObject *keys[3] = {from_key, to_key, after_key};
    for (int i = 0; i < 3; i++) {
        if (keys[i] != Py_None && !PyBytes_CheckExact(keys[i])) {
            PyErr_SetString(PyExc_TypeError, "DiffScan: a key bound is bytes or None");
            return -1;
        }
    }
#define KEEP(field, value) \
    Py_INCREF(value);      \
    Py_XSETREF(self->field, value)
    KEEP(it, it);
    KEEP(from_seq, from_seq);
    KEEP(to_bound, to_bound);
    KEEP(stop, stop);
    KEEP(from_key, from_key);
    KEEP(to_key, to_key);
    KEEP(after_key, after_key);
    KEEP(item_type, item_type);
    KEEP(empty_tuple, empty);
#undef KEEP
    PyObject *empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (empty_bytes == NULL) return -1;
    Py_XSETREF(self->empty_bytes, empty_bytes);
    set_raw(&self->from_raw, empty_bytes);
    set_raw(&self->to_raw, empty_bytes);
    self->idle_limit = idle_limit;
    self->head_length = 0;
    self->have_head = 0;
    self->idle = -1; /* the first head (none) is not a key */
    self->done = 0;
    Py_CLEAR(self->handed);
    return 0;
}

static void scan_dealloc(DiffScan *self) {
    Py_XDECREF(self->it);
    Py_XDECREF(self->from_seq);
    Py_XDECREF(self->to_bound);
    Py_XDECREF(self->stop);
    Py_XDECREF(self->from_key);
    Py_XDECREF(self->to_key);
    Py_XDECREF(self->after_key);
    Py_XDECREF(self->item_type);
    Py_XDECREF(self->empty_tuple);
    Py_XDECREF(self->empty_bytes);
    Py_XDECREF(self->from_raw);
    Py_XDECREF(self->to_raw);
    Py_XDECREF(self->handed);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int raw_equal(PyObject *a, PyObject *b) {
    return a == b || (PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b) &&
                      memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0);
}

static int is_long_value(PyObject *raw) {
    return PyBytes_GET_SIZE(raw) > 0 && (unsigned char)PyBytes_AS_STRING(raw)[0] >= 2;
}

static int outside(DiffScan *self, const char *k, Py_ssize_t kl) {
    PyObject *b = self->after_key;
    if (b != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) <= 0) return 1;
    b = self->from_key;
    if (b != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) < 0) return 1;
    b = self->to_key;
    if (b != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) >= 0) return 1;
    return 0;
}

static PyObject *value_of(PyObject *raw) {
    if (PyBytes_GET_SIZE(raw) == 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(PyBytes_AS_STRING(raw) + 1, PyBytes_GET_SIZE(raw) - 1);
}

/* The item of the finished head (short key, written, changed); NULL with no error: outside the bounds. */
static PyObject *head_item(DiffScan *self) {
    const char *s = self->head + 4;
    Py_ssize_t n = self->head_length - 6; /* head[4:-2] */
    if (n < 0) n = 0;
    PyObject *key = PyBytes_FromStringAndSize(NULL, n);
    if (key == NULL) return NULL;
    char *out = PyBytes_AS_STRING(key);
    Py_ssize_t length = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* .replace(b"\x00\xff", b"\x00") */
        out[length++] = s[i];
        if (s[i] == 0 && i + 1 < n && (unsigned char)s[i + 1] == 0xff) i++;
    }
    if (length != n && _PyBytes_Resize(&key, length) < 0) return NULL;
    if (outside(self, PyBytes_AS_STRING(key), length)) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *from_value = value_of(self->from_raw), *to_value = value_of(self->to_raw);
    PyObject *item = from_value && to_value ? ((PyTypeObject *)self->item_type)->tp_alloc(
                                                  (PyTypeObject *)self->item_type, 4)
                                            : NULL;
    if (item == NULL) {
        Py_DECREF(key);
        Py_XDECREF(from_value);
        Py_XDECREF(to_value);
        return NULL;
    }
    Py_INCREF(self->empty_tuple);
    PyTuple_SET_ITEM(item, 0, key);
    PyTuple_SET_ITEM(item, 1, from_value);
    PyTuple_SET_ITEM(item, 2, to_value);
    PyTuple_SET_ITEM(item, 3, self->empty_tuple);
    return item;
}

static int hand_over(DiffScan *self, const char *form, Py_ssize_t length) {
    self->done = 1;
    self->handed = PyBytes_FromStringAndSize(form, length < 0 ? 0 : length);
    return self->handed == NULL ? -1 : 0;
}

static PyObject *scan_next(DiffScan *self) {
    if (self->done || self->it == NULL) return NULL;
    const char *fs = PyBytes_AS_STRING(self->from_seq), *tb = PyBytes_AS_STRING(self->to_bound);
    Py_ssize_t fsl = PyBytes_GET_SIZE(self->from_seq), tbl = PyBytes_GET_SIZE(self->to_bound);
    for (;;) {
        PyObject *pair = PyIter_Next(self->it);
        if (pair == NULL) {
            self->done = 1;
            if (PyErr_Occurred()) return NULL;
            if (self->to_raw == self->from_raw || raw_equal(self->to_raw, self->from_raw)) return NULL;
            if (is_long_value(self->to_raw)) {
                hand_over(self, self->head + 4, self->head_length - 4);
                return NULL;
            }
            return head_item(self); /* NULL: outside the bounds, or an error */
        }
        PyObject *record_key, *raw;
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyBytes_CheckExact(record_key = PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_CheckExact(raw = PyTuple_GET_ITEM(pair, 1)) || PyBytes_GET_SIZE(record_key) < 12 ||
            PyBytes_GET_SIZE(record_key) > MAX_RECORD_KEY) {
            Py_DECREF(pair);
            self->done = 1;
            PyErr_SetString(PyExc_ValueError, "DiffScan: not a records row");
            return NULL;
        }
        const char *k = PyBytes_AS_STRING(record_key);
        Py_ssize_t kl = PyBytes_GET_SIZE(record_key), fl = kl - 8;
        if (self->have_head) {
            const char *h = self->head;
            Py_ssize_t hl = self->head_length;
            if (compare_concat(k, kl, h, hl, tb, tbl) < 0) { /* a version of the head at or below ``to`` */
                if (compare_concat(k, kl, h, hl, fs, fsl) <= 0) {
                    set_raw(&self->from_raw, raw);
                    set_raw(&self->to_raw, raw);
                } else {
                    set_raw(&self->to_raw, raw);
                }
                Py_DECREF(pair);
                continue;
            }
            if (fl == hl && memcmp(k, h, (size_t)hl) == 0) { /* a version above ``to`` */
                Py_DECREF(pair);
                continue;
            }
        }
        PyObject *out = NULL;
        if (self->to_raw != self->from_raw) {
            self->idle = 0;
            if (!raw_equal(self->to_raw, self->from_raw)) {
                if (is_long_value(self->to_raw)) { /* a long key: its group is sorted the keyed way */
                    Py_DECREF(pair);
                    hand_over(self, self->head + 4, self->head_length - 4);
                    return NULL;
                }
                out = head_item(self);
                if (out == NULL && PyErr_Occurred()) {
                    Py_DECREF(pair);
                    self->done = 1;
                    return NULL;
                }
            }
        } else if (++self->idle > self->idle_limit) { /* sparse here: seeking the changed keys costs less */
            int failed = hand_over(self, k + 4, kl - 12);
            Py_DECREF(pair);
            return failed ? NULL : out;
        }
        if (compare_bytes(k, kl, PyBytes_AS_STRING(self->stop), PyBytes_GET_SIZE(self->stop)) >= 0) {
            Py_DECREF(pair);
            self->done = 1;
            return out;
        }
        memcpy(self->head, k, (size_t)fl);
        self->head_length = fl;
        self->have_head = 1;
        if (compare_concat(k, kl, k, fl, tb, tbl) < 0) {
            if (compare_concat(k, kl, k, fl, fs, fsl) <= 0) {
                set_raw(&self->from_raw, raw);
                set_raw(&self->to_raw, raw);
            } else {
                set_raw(&self->from_raw, self->empty_bytes);
                set_raw(&self->to_raw, raw);
            }
        } else {
            set_raw(&self->from_raw, self->empty_bytes);
            set_raw(&self->to_raw, self->empty_bytes);
        }
        Py_DECREF(pair);
        if (out != NULL) return out;
    }
}

static PyObject *scan_handed(DiffScan *self, void *closure) {
    if (self->handed == NULL) Py_RETURN_NONE;
    Py_INCREF(self->handed);
    return self->handed;
}

static PyGetSetDef scan_getset[] = {
    {"handed", (getter)scan_handed, NULL, "the form where the keyed way takes over (None: none)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DiffScanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.DiffScan",
    .tp_basicsize = sizeof(DiffScan),
    .tp_dealloc = (destructor)scan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The diff's forward scan over a records iterator (see diff.py).",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)scan_next,
    .tp_getset = scan_getset,
    .tp_init = (initproc)scan_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"sorted_short_rows", sorted_short_rows, METH_VARARGS,
     "The records and changes rows of sorted short (key, value) pairs, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "The engine's optional compiled accelerator (see _accel.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__accel(void) {
    if (PyType_Ready(&DiffScanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&DiffScanType);
    if (PyModule_AddObject(m, "DiffScan", (PyObject *)&DiffScanType) < 0) {
        Py_DECREF(&DiffScanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
