/* The engine's optional compiled accelerator: per-record and per-key hot loops in C, nothing else.
 *
 * Each has a pure-Python twin that produces the same results (diffstore/engine/layout.py for the rows of
 * a bulk load, diffstore/engine/diff.py for the diff's scan and keyed way, reads.py for a query page and
 * get_many); the engine uses this module when it was built and falls back to the twin when it was not
 * (tests/engine/test_accel.py compares the two).
 *
 *   sorted_short_rows(items, record_prefix, record_suffix, change_prefix, seal=True)
 *       The rows of ``records`` and ``changes`` for a put of (key, value) pairs whose keys are short and
 *       strictly ascend (so none repeats), as layout.py's short_rows builds them (records values sealed:
 *       a CRC-32 of key and value, computed here, unless ``seal`` is false): a SortedRows whose
 *       records() and changes() iterate them (keys and values as bytes). None when the items are
 *       not such a list (the general path takes them). Its chunks(limit) are the same keys' packed rows
 *       of ``change_chunks`` (layout.chunk_rows). One pass over the items checks them and escapes each
 *       key once into a buffer packed as chunks are (the rows are cut from it): a batch is larger than
 *       the CPU's caches, and every further pass over its scattered objects cost a bulk load more CPU
 *       than LMDB's own work above raw putmulti's (benchmarks/RESULTS.md, session 14).
 *       Its digest() is the digests' sum of its records rows (digest_rows below), read from that buffer.
 *
 *   unpack_forms(raw)
 *       The key forms of a ``change_chunks`` value, as layout.unpack_forms reads them.
 *
 *   DiffScan(records_iter, from_seq, to_bound, stop, from_key, to_key, after_key, idle_limit, item_type, empty)
 *       An iterator of the diff items that diff.py's forward scan yields from the same records iterator;
 *       when it stops early, ``handed`` is the key form where the keyed way takes over (else None).
 *
 *   KeyedScan(cursor, prefix, forms_iter, from_seq, to_bound, from_key, to_key, after_key, stretch, item_type,
 *             empty)
 *       An iterator of the diff items that diff.py's keyed way yields for short keys: per key form, the
 *       key's versions read through the cursor's set_range, next and item. It stops at a long form
 *       (``long_form``), after ``stretch`` forms (``resume``: the form not taken; -1: no limit), at
 *       ``to_key`` or at the end of the forms; ``left`` is what remains of the stretch.
 *
 *   MergeForms(iterables)
 *       An iterator of the distinct byte strings of strictly ascending iterators, ascending: the merge of
 *       a generation's two index forms (changes.py) and of a few generations' runs (diff.py).
 *
 *   query_scan(records_iter, seq_limit, stop, from_key, to_key, after_key, count, record_type, known, names)
 *       Up to ``count`` records of the query page that reads.py's loop builds from the same records
 *       iterator (no phantom), and the key form where that loop takes over (a long key), or None.
 *
 *   get_many_scan(cursor, prefix, keys, above, record_type, known, names, key_form)
 *       The records of ``keys`` visible below the encoded seq ``above`` (reads.py's get_many without a
 *       phantom), in the order asked: per key a seek to its head | above and a step back, through the
 *       cursor's set_range, prev, last and item; None when a key is not bytes of a key's length (the
 *       Python loop then refuses it in its place). ``key_form`` makes the forms of long keys.
 *
 *   digest_pairs(pairs), digest_rows(records_iter, prefix, encoded)
 *       (live records, their sum modulo 2^128) of layout.record_digest over (form, stored value) pairs, or
 *       over the rows of a records iterator that start with ``prefix`` (it stops at the first that does
 *       not) and end with the encoded seq ``encoded``: digests.py's sums, BLAKE2b-128 computed here.
 *
 *   digest_changes(cursor, prefix, forms_iter, encoded, replaces)
 *       ((records, sum), (records, sum)) of the versions a commit wrote and those they replaced, read
 *       through the cursor's set_key, value, prev and key: digests.record_commit's loop.
 *
 *   check_records(records_iter, targets, dropped, sealed, tick, every), check_runs(rows_iter, chunked, ...)
 *       ``check``'s one pass over ``records`` and over a run table: per collection and generation, counts,
 *       sums of form hashes and the digests' deltas (of plain values); the rows that break a rule of their
 *       own, a records row's seal included, handed back (check_scan.py is the twin and says why).
 *
 * See layout.py's docstring for the layout these loops read and write.
 *
 * ``SOURCE`` is the digest of this file that setup.py passed to the build: layout.py does not use a build
 * of another version of the source (a stale in-place build after a pull), it warns and runs the twins.
 *
 * Written for CPython with the GIL (we run 3.11): the row reuse below reads reference counts, which only
 * the GIL makes stable; a free-threaded build never reuses a row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#ifndef DIFFSTORE_ACCEL_SOURCE
#define DIFFSTORE_ACCEL_SOURCE "" /* built by hand: layout.py then runs the twins */
#endif

#define LONG_KEY_PREFIX 200
#define MAX_RECORD_KEY 511 /* LMDB's default key limit */

/* A records key (layout.py, "records"): rcid | K | rseq -- the collection's records prefix (a length byte
 * n, then the cid in n bytes), K, and the encoded seq (a length byte m, the seq in m bytes big-endian, m
 * again: read from the key's end). The *head* is the key without its encoded seq. */
#define MIN_RECORD_KEY 7 /* a 1-byte cid, the shortest K (00 00), a 1-byte seq */

static Py_ssize_t record_prefix_length(const char *key) { return 1 + (unsigned char)key[0]; }

static Py_ssize_t record_head_length(const char *key, Py_ssize_t length) {
    return length - 2 - (unsigned char)key[length - 1];
}

/* The seq of an encoded seq. */
static unsigned long long read_record_seq(const char *encoded) {
    unsigned long long v = 0;
    for (int i = 1; i <= (unsigned char)encoded[0]; i++) v = (v << 8) | (unsigned char)encoded[i];
    return v;
}

/* Whether ``raw`` is an encoded seq (layout.record_seq). */
static int is_encoded_seq(const char *raw, Py_ssize_t length) {
    unsigned char m = length > 0 ? (unsigned char)raw[0] : 0;
    return m >= 1 && m <= 8 && length == m + 2 && (unsigned char)raw[length - 1] == m;
}

/* Whether ``key`` has the shape of a records key (so the functions above stay inside it). */
static int is_record_key(const char *key, Py_ssize_t length) {
    if (length < MIN_RECORD_KEY || length > MAX_RECORD_KEY) return 0;
    unsigned char seq_length = (unsigned char)key[length - 1];
    Py_ssize_t head = length - 2 - seq_length;
    return seq_length >= 1 && seq_length <= 8 && (unsigned char)key[0] >= 1 && (unsigned char)key[0] <= 4 &&
           head >= record_prefix_length(key) + 2 && (unsigned char)key[head] == seq_length;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

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

/* The form of the short key ``k`` (layout.key_form: escaped, then 00 00) written at ``out``; its end. */
static char *short_form_into(char *out, const char *k, Py_ssize_t kl) {
    char *end = escape_into(out, k, kl);
    end[0] = end[1] = 0;
    return end + 2;
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

/* The checked items of a sorted put, each read once: their key forms, escaped once, packed in order into
 * one buffer the way a ``change_chunks`` value packs them -- (u16 length | form)..., so that each chunk's
 * value is a run of the buffer -- and their values. ``records()`` and ``changes()`` iterate the rows,
 * built from these as they are asked for. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;  /* of items */
    PyObject **values; /* each item's value (bytes, or None: a tombstone), held: the caller's list may
                        * change while putmulti has let the GIL go */
    char *forms;       /* (u16 length | key form)... of the items' keys, ascending */
    Py_ssize_t forms_length;
    PyObject *record_prefix, *record_suffix, *change_prefix, *empty; /* bytes */
    PyObject *first_record_key, *first_change_key;
    int seal; /* records values sealed (layout.SEALING; off only to measure what checksums cost) */
} SortedRows;

/* One pass over SortedRows' items, one row per step. Like ``zip``, it hands out the same row tuple again
 * -- its key and value bytes filled anew in place -- when nobody but the iterator holds the row or what is
 * in it any more: putmulti copies each row into LMDB before it asks for the next one, so a batch
 * allocates (and frees) no object per row. Anything kept by the consumer is never written again. */
typedef struct {
    PyObject_HEAD
    SortedRows *rows;
    Py_ssize_t index;
    Py_ssize_t at; /* where the index-th form's length is in rows->forms */
    int changes;   /* 0: rows of ``records``, 1: rows of ``changes`` */
    PyObject *row;
} RowIter;

static PyTypeObject SortedRowsType, RowIterType;

/* ---- sealed record values (layout.py): tag | 0x10, CRC-32 of records key | plain value, the rest ------ */

#define SEALED 0x10
static uint32_t crc_table[8][256]; /* zlib's CRC-32 (reflected 0xEDB88320), sliced by 8; PyInit fills it */

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int n = 0; n < 256; n++) crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xff];
}

/* zlib.crc32(data, crc) */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    uint32_t c = crc ^ 0xffffffffu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static void put_crc(char *out, uint32_t crc) {
    out[0] = (char)(crc >> 24);
    out[1] = (char)(crc >> 16);
    out[2] = (char)(crc >> 8);
    out[3] = (char)crc;
}

/* Raises layout.corrupt_record(record_key): a CorruptRecord naming the key. */
static void raise_corrupt(PyObject *record_key) {
    PyObject *layout = PyImport_ImportModule("diffstore.engine.layout");
    if (layout == NULL) return;
    PyObject *error = PyObject_CallMethod(layout, "corrupt_record", "O", record_key);
    Py_DECREF(layout);
    if (error == NULL) return;
    PyErr_SetObject((PyObject *)Py_TYPE(error), error);
    Py_DECREF(error);
}

/* Whether the sealed value ``r`` (``n`` bytes, its first at least SEALED) stored under the records key ``k``
 * matches its checksum (not layout.seal_fails): reads (seal_holds) and check (read_record_row) ask here. */
static int seal_matches(const unsigned char *k, Py_ssize_t kl, const unsigned char *r, Py_ssize_t n) {
    if (n < 5 || r[0] > (SEALED | 3) || (r[0] == SEALED && n != 5)) return 0;
    unsigned char tag = (unsigned char)(r[0] & 0x0f);
    uint32_t crc = crc32_update(0, k, kl);
    if (r[0] != SEALED) {
        crc = crc32_update(crc, &tag, 1);
        crc = crc32_update(crc, r + 5, n - 5);
    }
    uint32_t stored = (uint32_t)r[1] << 24 | (uint32_t)r[2] << 16 | (uint32_t)r[3] << 8 | r[4];
    return crc == stored;
}

/* Whether the sealed value ``raw`` stored under ``record_key`` matches its checksum (layout.unseal): 1, or
 * 0 with CorruptRecord raised. */
static int seal_holds(PyObject *record_key, PyObject *raw) {
    if (!seal_matches((const unsigned char *)PyBytes_AS_STRING(record_key), PyBytes_GET_SIZE(record_key),
                      (const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))) {
        raise_corrupt(record_key);
        return 0;
    }
    return 1;
}

static Py_ssize_t form_length_at(const char *forms, Py_ssize_t at) {
    return ((Py_ssize_t)(unsigned char)forms[at] << 8) | (unsigned char)forms[at + 1];
}

/* prefix | form | suffix (suffix NULL: none), into ``out``: a row key */
static void row_key_into(char *out, PyObject *prefix, const char *form, Py_ssize_t length, PyObject *suffix) {
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix);
    memcpy(out, PyBytes_AS_STRING(prefix), (size_t)pl);
    memcpy(out + pl, form, (size_t)length);
    if (suffix != NULL)
        memcpy(out + pl + length, PyBytes_AS_STRING(suffix), (size_t)PyBytes_GET_SIZE(suffix));
}

static PyObject *row_key(PyObject *prefix, const char *form, Py_ssize_t length, PyObject *suffix) {
    Py_ssize_t size = PyBytes_GET_SIZE(prefix) + length + (suffix == NULL ? 0 : PyBytes_GET_SIZE(suffix));
    PyObject *key = PyBytes_FromStringAndSize(NULL, size);
    if (key != NULL) row_key_into(PyBytes_AS_STRING(key), prefix, form, length, suffix);
    return key;
}

#if defined(__GNUC__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)0)
#endif
#define AHEAD 8 /* items: a batch is larger than the CPU's caches, its objects scattered in memory */

/* The one pass over the items: checks them (a list of (bytes, bytes | None) tuples, short keys strictly
 * ascending) and packs their forms into ``*forms`` and their values into ``*values`` (both PyMem, the
 * caller's to free, also when it returns 0; the first ``*held`` values are new references).
 * 1: done; 0: not such items; -1: no memory. */
static int pack_items(PyObject *items, Py_ssize_t n, char **forms, Py_ssize_t *forms_length, PyObject ***values,
                      Py_ssize_t *held) {
    /* a 16-byte key packs into 20 bytes; a longer one grows the buffer */
    Py_ssize_t capacity = n * 24 + 2 * LONG_KEY_PREFIX + 4, used = 0;
    *forms = PyMem_Malloc((size_t)capacity);
    *values = PyMem_Malloc((size_t)n * sizeof(PyObject *));
    if (*forms == NULL || *values == NULL) return -1;
    const char *previous = NULL;
    Py_ssize_t previous_length = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the item AHEAD on, and the key and value of the one half as far (its tuple asked for before) */
        if (i + AHEAD < n) PREFETCH(PyList_GET_ITEM(items, i + AHEAD));
        if (i + AHEAD / 2 < n) {
            PyObject *later = PyList_GET_ITEM(items, i + AHEAD / 2);
            if (PyTuple_CheckExact(later) && PyTuple_GET_SIZE(later) == 2) {
                PREFETCH(PyTuple_GET_ITEM(later, 0));
                PREFETCH(PyTuple_GET_ITEM(later, 1));
            }
        }
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) return 0;
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) > LONG_KEY_PREFIX) return 0;
        if (value != Py_None && !PyBytes_CheckExact(value)) return 0;
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key);
        if (previous != NULL && compare_bytes(previous, previous_length, k, kl) >= 0) return 0;
        previous = k;
        previous_length = kl;
        if (used + 2 * LONG_KEY_PREFIX + 4 > capacity) { /* room for the longest form */
            capacity *= 2;
            char *grown = PyMem_Realloc(*forms, (size_t)capacity);
            if (grown == NULL) return -1;
            *forms = grown;
        }
        char *form = *forms + used + 2;
        Py_ssize_t length = short_form_into(form, k, kl) - form; /* at most 2 * LONG_KEY_PREFIX + 2: a u16 */
        (*forms)[used] = (char)(length >> 8);
        (*forms)[used + 1] = (char)(length & 0xff);
        used += 2 + length;
        Py_INCREF(value);
        (*values)[i] = value;
        *held = i + 1;
    }
    *forms_length = used;
    return 1;
}

static PyObject *sorted_short_rows(PyObject *module, PyObject *args) {
    PyObject *items, *record_prefix, *record_suffix, *change_prefix;
    int seal = 1;
    if (!PyArg_ParseTuple(args, "OSSS|p:sorted_short_rows", &items, &record_prefix, &record_suffix,
                          &change_prefix, &seal))
        return NULL;
    if (!PyList_CheckExact(items) || PyList_GET_SIZE(items) == 0) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(items), forms_length = 0, held = 0;
    char *forms = NULL;
    PyObject **values = NULL;
    int packed = pack_items(items, n, &forms, &forms_length, &values, &held);
    SortedRows *rows = packed > 0 ? PyObject_New(SortedRows, &SortedRowsType) : NULL;
    if (rows == NULL) {
        for (Py_ssize_t i = 0; i < held; i++) Py_DECREF(values[i]);
        PyMem_Free(forms);
        PyMem_Free(values);
        if (packed < 0) return PyErr_NoMemory();
        if (packed == 0) Py_RETURN_NONE;
        return NULL;
    }
    rows->count = n;
    rows->seal = seal;
    rows->forms = forms;
    rows->forms_length = forms_length;
    rows->values = values;
    Py_INCREF(record_prefix);
    rows->record_prefix = record_prefix;
    Py_INCREF(record_suffix);
    rows->record_suffix = record_suffix;
    Py_INCREF(change_prefix);
    rows->change_prefix = change_prefix;
    rows->empty = PyBytes_FromStringAndSize(NULL, 0);
    rows->first_record_key = row_key(record_prefix, forms + 2, form_length_at(forms, 0), record_suffix);
    rows->first_change_key = row_key(change_prefix, forms + 2, form_length_at(forms, 0), NULL);
    if (rows->empty == NULL || rows->first_record_key == NULL ||
        rows->first_change_key == NULL) {
        Py_DECREF(rows);
        return NULL;
    }
    return (PyObject *)rows;
}

static void sorted_rows_dealloc(SortedRows *self) {
    for (Py_ssize_t i = 0; i < self->count; i++) Py_DECREF(self->values[i]);
    PyMem_Free(self->values);
    PyMem_Free(self->forms);
    Py_XDECREF(self->record_prefix);
    Py_XDECREF(self->record_suffix);
    Py_XDECREF(self->change_prefix);
    Py_XDECREF(self->empty);
    Py_XDECREF(self->first_record_key);
    Py_XDECREF(self->first_change_key);
    PyObject_Free(self);
}

static PyObject *rows_iter(SortedRows *self, int changes) {
    RowIter *it = PyObject_New(RowIter, &RowIterType);
    if (it == NULL) return NULL;
    Py_INCREF(self);
    it->rows = self;
    it->index = 0;
    it->at = 0;
    it->changes = changes;
    it->row = NULL;
    return (PyObject *)it;
}

static PyObject *sorted_rows_records(SortedRows *self, PyObject *unused) { return rows_iter(self, 0); }
static PyObject *sorted_rows_changes(SortedRows *self, PyObject *unused) { return rows_iter(self, 1); }
static Py_ssize_t sorted_rows_length(SortedRows *self) { return self->count; }

/* The packed rows of ``change_chunks`` for the items (layout.chunk_rows builds the same): a list of
 * (change_prefix | first form, (u16 length | form)...) pairs, each value holding at most ``limit`` bytes
 * of forms (at least one form): runs of the packed forms, cut. */
static PyObject *sorted_rows_chunks(SortedRows *self, PyObject *args) {
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "n:chunks", &limit)) return NULL;
    PyObject *result = PyList_New(0);
    if (result == NULL) return NULL;
    const char *forms = self->forms;
    Py_ssize_t start = 0;
    while (start < self->forms_length) {
        Py_ssize_t first = form_length_at(forms, start), at = start + 2 + first;
        while (at < self->forms_length && at + 2 + form_length_at(forms, at) - start <= limit)
            at += 2 + form_length_at(forms, at);
        PyObject *row_value = PyBytes_FromStringAndSize(forms + start, at - start);
        PyObject *key = row_key(self->change_prefix, forms + start + 2, first, NULL);
        PyObject *row = key != NULL && row_value != NULL ? PyTuple_Pack(2, key, row_value) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(row_value);
        if (row == NULL || PyList_Append(result, row) < 0) {
            Py_XDECREF(row);
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(row);
        start = at;
    }
    return result;
}

static PyObject *sorted_rows_digest(SortedRows *self, PyObject *unused); /* with the digests' hash */

static PyMethodDef sorted_rows_methods[] = {
    {"digest", (PyCFunction)sorted_rows_digest, METH_NOARGS,
     "(live records, sum mod 2^128) of layout.record_digest over the rows of ``records``"},
    {"records", (PyCFunction)sorted_rows_records, METH_NOARGS, "an iterator of the rows of ``records``"},
    {"changes", (PyCFunction)sorted_rows_changes, METH_NOARGS, "an iterator of the rows of ``changes``"},
    {"chunks", (PyCFunction)sorted_rows_chunks, METH_VARARGS, "the packed rows of ``change_chunks``"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sorted_rows_members[] = {
    {"first_record_key", T_OBJECT, offsetof(SortedRows, first_record_key), READONLY, "the lowest records key"},
    {"first_change_key", T_OBJECT, offsetof(SortedRows, first_change_key), READONLY, "the lowest changes key"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods sorted_rows_sequence = {.sq_length = (lenfunc)sorted_rows_length};

static PyTypeObject SortedRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.SortedRows",
    .tp_basicsize = sizeof(SortedRows),
    .tp_dealloc = (destructor)sorted_rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The checked items of a sorted put; records() and changes() iterate their rows.",
    .tp_methods = sorted_rows_methods,
    .tp_members = sorted_rows_members,
    .tp_as_sequence = &sorted_rows_sequence,
};

static void row_iter_dealloc(RowIter *self) {
    Py_XDECREF(self->rows);
    Py_XDECREF(self->row);
    PyObject_Free(self);
}

/* Whether nothing but the row (or the iterator) holds ``object``: with the GIL, no other thread can take
 * a reference while we hold it, and a holder always owns one (py-lmdb's putmulti holds the row it got
 * while it copies the row, buffers exported hold their bytes). */
#ifdef Py_GIL_DISABLED
#define SOLELY_OURS(object) 0
#else
#define SOLELY_OURS(object) (Py_REFCNT(object) == 1)
#endif

/* A bytes object's content changes under it: drop the hash CPython may have cached for the old one
 * (the field is deprecated for readers of bytes, not for their maker). */
static void forget_hash(PyObject *bytes) {
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    ((PyBytesObject *)bytes)->ob_shash = -1;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
}

/* ``slot`` of the row as bytes of ``length``: the one there when only the row holds it and it has that
 * length (filled anew in place), else a new one. Bytes, not bytearrays: py-lmdb reads bytes directly,
 * anything else through the buffer protocol (a GetBuffer and a ReleaseBuffer per key and per value). */
static char *row_buffer(PyObject *row, Py_ssize_t slot, Py_ssize_t length) {
    PyObject *buffer = PyTuple_GET_ITEM(row, slot);
    if (buffer != NULL && PyBytes_CheckExact(buffer) && SOLELY_OURS(buffer) && PyBytes_GET_SIZE(buffer) == length &&
        length > 1) { /* never a shared singleton (b"", one byte) */
        forget_hash(buffer);
        return PyBytes_AS_STRING(buffer);
    }
    PyObject *fresh = PyBytes_FromStringAndSize(NULL, length);
    if (fresh == NULL) return NULL;
    PyTuple_SET_ITEM(row, slot, fresh);
    Py_XDECREF(buffer);
    return PyBytes_AS_STRING(fresh);
}

static PyObject *row_iter_next(RowIter *self) {
    SortedRows *rows = self->rows;
    if (self->index >= rows->count) return NULL;
    Py_ssize_t length = form_length_at(rows->forms, self->at);
    const char *form = rows->forms + self->at + 2;
    PyObject *row = self->row;
    if (row == NULL || !SOLELY_OURS(row)) { /* handed out and still held: a new one */
        row = PyTuple_New(2);
        if (row == NULL) return NULL;
        Py_XSETREF(self->row, row);
    }
    PyObject *prefix = self->changes ? rows->change_prefix : rows->record_prefix;
    PyObject *suffix = self->changes ? NULL : rows->record_suffix;
    char *out = row_buffer(row, 0, PyBytes_GET_SIZE(prefix) + length + (suffix ? PyBytes_GET_SIZE(suffix) : 0));
    if (out == NULL) return NULL;
    row_key_into(out, prefix, form, length, suffix);
    PyObject *value = self->changes ? Py_None : rows->values[self->index];
    if (!self->changes && self->index + 2 < rows->count) { /* the value to copy two rows on: 1-3 lines */
        const char *later = (const char *)rows->values[self->index + 2];
        PREFETCH(later);
        PREFETCH(later + 64);
        PREFETCH(later + 128);
    }
    if (self->changes || (!rows->seal && value == Py_None)) { /* a changes row (or a plain tombstone): b"" */
        if (PyTuple_GET_ITEM(row, 1) != rows->empty) {
            Py_INCREF(rows->empty);
            Py_XSETREF(((PyTupleObject *)row)->ob_item[1], rows->empty);
        }
    } else if (!rows->seal) { /* 01 value */
        Py_ssize_t vl = PyBytes_GET_SIZE(value);
        out = row_buffer(row, 1, vl + 1);
        if (out == NULL) return NULL;
        out[0] = 1;
        memcpy(out + 1, PyBytes_AS_STRING(value), (size_t)vl);
    } else { /* sealed (layout.seal): a tombstone 10 crc, a value 11 crc value */
        PyObject *key = PyTuple_GET_ITEM(row, 0);
        uint32_t crc = crc32_update(0, (const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        if (value == Py_None) {
            out = row_buffer(row, 1, 5);
            if (out == NULL) return NULL;
            out[0] = SEALED;
        } else {
            static const unsigned char one = 1;
            Py_ssize_t vl = PyBytes_GET_SIZE(value);
            out = row_buffer(row, 1, vl + 5);
            if (out == NULL) return NULL;
            out[0] = SEALED | 1;
            memcpy(out + 5, PyBytes_AS_STRING(value), (size_t)vl);
            crc = crc32_update(crc32_update(crc, &one, 1), (const unsigned char *)out + 5, vl);
        }
        put_crc(out + 1, crc);
    }
    self->index++; /* only now: after an error (no memory) the same item comes next */
    self->at += 2 + length;
    Py_INCREF(row);
    return row;
}

static PyTypeObject RowIterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.RowIter",
    .tp_basicsize = sizeof(RowIter),
    .tp_dealloc = (destructor)row_iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The rows of a SortedRows, one table's.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)row_iter_next,
};

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
    int initialised; /* __init__ ran: it runs once (the loop keeps pointers into the bytes it was given) */
    int running;     /* in __next__: the records iterator may call back into Python */
    PyObject *handed; /* the form the keyed way resumes at, or NULL */
} DiffScan;

static void set_raw(PyObject **slot, PyObject *value) {
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
}

/* Whether the arguments both diff loops share are what they take: an iterator, a tuple type for the items
 * and the empty tuple, key bounds of bytes or None; 0 (a TypeError naming ``who``) when not. */
static int check_diff_args(const char *who, PyObject *it, PyObject *item_type, PyObject *empty, PyObject *from_key,
                           PyObject *to_key, PyObject *after_key) {
    if (!PyIter_Check(it) || !PyType_Check(item_type) ||
        !PyType_IsSubtype((PyTypeObject *)item_type, &PyTuple_Type) || !PyTuple_CheckExact(empty)) {
        PyErr_Format(PyExc_TypeError, "%s: bad arguments", who);
        return 0;
    }
    PyObject *keys[3] = {from_key, to_key, after_key};
    for (int i = 0; i < 3; i++) {
        if (keys[i] != Py_None && !PyBytes_CheckExact(keys[i])) {
            PyErr_Format(PyExc_TypeError, "%s: a key bound is bytes or None", who);
            return 0;
        }
    }
    return 1;
}

static int scan_init(DiffScan *self, PyObject *args, PyObject *kwargs) {
    PyObject *it, *from_seq, *to_bound, *stop, *from_key, *to_key, *after_key, *item_type, *empty;
    Py_ssize_t idle_limit;
    if (!PyArg_ParseTuple(args, "OSSSOOOnOO:DiffScan", &it, &from_seq, &to_bound, &stop, &from_key, &to_key,
                          &after_key, &idle_limit, &item_type, &empty))
        return -1;
    if (self->initialised) {
        PyErr_SetString(PyExc_TypeError, "DiffScan: already initialised");
        return -1;
    }
    if (!check_diff_args("DiffScan", it, item_type, empty, from_key, to_key, after_key)) return -1;
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
    self->initialised = 1;
    return 0;
}

/* The scan holds a Python iterator (anything, in principle), which may hold the scan: the cyclic GC must
 * see it. The other fields are bytes (no cycle through them). */
static int scan_traverse(DiffScan *self, visitproc visit, void *arg) {
    Py_VISIT(self->it);
    Py_VISIT(self->item_type);
    Py_VISIT(self->empty_tuple);
    return 0;
}

static int scan_clear(DiffScan *self) {
    self->done = 1; /* a finalizer that still calls __next__ gets StopIteration */
    Py_CLEAR(self->it);
    Py_CLEAR(self->item_type);
    Py_CLEAR(self->empty_tuple);
    return 0;
}

static void scan_dealloc(DiffScan *self) {
    PyObject_GC_UnTrack(self);
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

/* A stored value read in place as its plain form (layout.plain): the plain tag (0: a short key's
 * tombstone, b"") and what follows it. The loops read sealed values (already verified by records_row)
 * through this, so that a scanned row costs no copy. */
typedef struct {
    unsigned char tag;
    const char *body;
    Py_ssize_t length;
} Plain;

static Plain plain_of(PyObject *raw) {
    const char *r = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    Plain p = {0, r, 0};
    if (n == 0) return p;
    unsigned char first = (unsigned char)r[0];
    if (first < SEALED) {
        p.tag = first;
        p.body = r + 1;
        p.length = n - 1;
    } else if (first != SEALED && n >= 5) {
        p.tag = (unsigned char)(first & 0x0f);
        p.body = r + 5;
        p.length = n - 5;
    }
    return p;
}

/* Whether two stored values have the same plain form (a sealed and a plain one included). */
static int raw_equal(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    Plain x = plain_of(a), y = plain_of(b);
    return x.tag == y.tag && x.length == y.length && memcmp(x.body, y.body, (size_t)x.length) == 0;
}

static int is_long_value(PyObject *raw) { return plain_of(raw).tag >= 2; }

/* Whether key ``k`` lies before a read's range: at or below ``after_key``, or below ``from_key`` (None: no
 * such bound). */
static int before_range(const char *k, Py_ssize_t kl, PyObject *from_key, PyObject *after_key) {
    PyObject *b = after_key;
    if (b != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) <= 0) return 1;
    b = from_key;
    return b != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b)) < 0;
}

/* Whether key ``k`` lies at or past a read's ``to_key`` (None: no such bound). */
static int past_range(const char *k, Py_ssize_t kl, PyObject *to_key) {
    return to_key != Py_None && compare_bytes(k, kl, PyBytes_AS_STRING(to_key), PyBytes_GET_SIZE(to_key)) >= 0;
}

static int outside(DiffScan *self, const char *k, Py_ssize_t kl) {
    return before_range(k, kl, self->from_key, self->after_key) || past_range(k, kl, self->to_key);
}

/* The user key of a short key's records head (prefix | K): K[:-2] unescaped, as
 * layout.short_key_of_form. */
static PyObject *short_key_of_head(const char *head, Py_ssize_t head_length) {
    const char *s = head + record_prefix_length(head);
    Py_ssize_t n = head_length - record_prefix_length(head) - 2;
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
    return key;
}

/* The record key and stored value of a records iterator's item; 0 (a ValueError naming ``who``) when the
 * item is not a (bytes, bytes) pair with a records key. */
static int records_row(PyObject **row, const char *who, PyObject **record_key, PyObject **raw) {
    PyObject *pair = *row; /* a pointer: a row may be replaced (none is, since values are read in place) */
    if (!(PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
          PyBytes_CheckExact(*record_key = PyTuple_GET_ITEM(pair, 0)) &&
          PyBytes_CheckExact(*raw = PyTuple_GET_ITEM(pair, 1)) &&
          is_record_key(PyBytes_AS_STRING(*record_key), PyBytes_GET_SIZE(*record_key)))) {
        if (PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 && PyBytes_CheckExact(*record_key) &&
            PyBytes_CheckExact(*raw))
            raise_corrupt(*record_key); /* bytes, but no records key: a damaged key */
        else
            PyErr_Format(PyExc_ValueError, "%s: not a records row", who);
        return 0;
    }
    unsigned char first = PyBytes_GET_SIZE(*raw) > 0 ? (unsigned char)PyBytes_AS_STRING(*raw)[0] : 1;
    if (first >= 1 && first <= 3) return 1; /* a plain value (or none: a tombstone): written before checksums */
    if (first < SEALED) {                   /* a tag neither form has: a sealed tag that lost its bit */
        raise_corrupt(*record_key);
        return 0;
    }
    /* sealed: verified here, read in place by the loops (plain_of) */
    return seal_holds(*record_key, *raw);
}

static PyObject *value_of(PyObject *raw) {
    Plain p = plain_of(raw);
    if (p.tag == 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(p.body, p.length);
}

/* The item of the finished head (short key, written, changed); NULL with no error: outside the bounds. */
static PyObject *head_item(DiffScan *self) {
    PyObject *key = short_key_of_head(self->head, self->head_length);
    if (key == NULL) return NULL;
    if (outside(self, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))) {
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

static PyObject *scan_step(DiffScan *self) {
    const char *fs = PyBytes_AS_STRING(self->from_seq), *tb = PyBytes_AS_STRING(self->to_bound);
    Py_ssize_t fsl = PyBytes_GET_SIZE(self->from_seq), tbl = PyBytes_GET_SIZE(self->to_bound);
    for (;;) {
        PyObject *pair = PyIter_Next(self->it);
        if (pair == NULL) {
            self->done = 1;
            if (PyErr_Occurred()) return NULL;
            if (self->to_raw == self->from_raw || raw_equal(self->to_raw, self->from_raw)) return NULL;
            if (is_long_value(self->to_raw)) {
                hand_over(self, self->head + record_prefix_length(self->head),
                          self->head_length - record_prefix_length(self->head));
                return NULL;
            }
            return head_item(self); /* NULL: outside the bounds, or an error */
        }
        PyObject *record_key, *raw;
        if (!records_row(&pair, "DiffScan", &record_key, &raw)) {
            Py_DECREF(pair);
            self->done = 1;
            return NULL;
        }
        const char *k = PyBytes_AS_STRING(record_key);
        Py_ssize_t kl = PyBytes_GET_SIZE(record_key), fl = record_head_length(k, kl);
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
                    hand_over(self, self->head + record_prefix_length(self->head),
                          self->head_length - record_prefix_length(self->head));
                    return NULL;
                }
                out = head_item(self);
                if (out == NULL && PyErr_Occurred()) {
                    Py_DECREF(pair);
                    self->done = 1;
                    return NULL;
                }
            }
        } else if (++self->idle > self->idle_limit && /* sparse here: seeking the changed keys costs less */
                   /* (not at ``stop``: that row is another collection's, and the scan ends at it below) */
                   compare_bytes(k, kl, PyBytes_AS_STRING(self->stop), PyBytes_GET_SIZE(self->stop)) < 0) {
            int failed = hand_over(self, k + record_prefix_length(k), fl - record_prefix_length(k));
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

static PyObject *scan_next(DiffScan *self) {
    if (!self->initialised) { /* DiffScan.__new__ without __init__: no records to scan, which is no diff */
        PyErr_SetString(PyExc_TypeError, "DiffScan: not initialised (__init__ did not run)");
        return NULL;
    }
    if (self->done || self->it == NULL) return NULL;
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "DiffScan already executing");
        return NULL;
    }
    self->running = 1;
    PyObject *item = scan_step(self);
    self->running = 0;
    return item;
}

/* A new reference to an optional field: ``value``, or None when it is not set. */
static PyObject *or_none(PyObject *value) {
    value = value != NULL ? value : Py_None;
    Py_INCREF(value);
    return value;
}

static PyObject *scan_handed(DiffScan *self, void *closure) { return or_none(self->handed); }

static PyGetSetDef scan_getset[] = {
    {"handed", (getter)scan_handed, NULL, "the form where the keyed way takes over (None: none)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DiffScanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.DiffScan",
    .tp_basicsize = sizeof(DiffScan),
    .tp_dealloc = (destructor)scan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The diff's forward scan over a records iterator (see diff.py).",
    .tp_traverse = (traverseproc)scan_traverse,
    .tp_clear = (inquiry)scan_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)scan_next,
    .tp_getset = scan_getset,
    .tp_init = (initproc)scan_init,
    .tp_new = PyType_GenericNew,
};

/* ---- KeyedScan ----------------------------------------------------------------------------------- */

/* The keyed way of diff.py (_keyed_items) for short keys and no intermediate values: per key form of a
 * forms iterator, the key's versions read through a records cursor's own methods (a seek to the head when
 * the cursor is not already there or just below it, then steps). It stops at the first long form (the
 * Python loop sorts long-key groups in memory), after ``stretch`` forms (the scan probes again), at the
 * end of the forms, or at ``to_key``; ``long_form``, ``resume`` and ``left`` say where it stopped. */
typedef struct {
    PyObject_HEAD
    PyObject *set_range, *step, *item; /* the cursor's bound methods */
    PyObject *prefix, *forms, *from_seq, *to_bound;
    PyObject *from_key, *to_key, *after_key; /* bytes or None */
    PyObject *item_type, *empty_tuple;
    PyObject *current; /* the (record key, value) under the cursor, or NULL: not positioned or exhausted */
    Py_ssize_t left;   /* forms it may still take (-1: no limit) */
    PyObject *long_form, *resume;
    int initialised, running, done;
} KeyedScan;

static int keyed_init(KeyedScan *self, PyObject *args, PyObject *kwargs) {
    PyObject *cursor, *prefix, *forms, *from_seq, *to_bound, *from_key, *to_key, *after_key, *item_type, *empty;
    Py_ssize_t stretch;
    if (!PyArg_ParseTuple(args, "OSOSSOOOnOO:KeyedScan", &cursor, &prefix, &forms, &from_seq, &to_bound, &from_key,
                          &to_key, &after_key, &stretch, &item_type, &empty))
        return -1;
    if (self->initialised) {
        PyErr_SetString(PyExc_TypeError, "KeyedScan: already initialised");
        return -1;
    }
    if (!check_diff_args("KeyedScan", forms, item_type, empty, from_key, to_key, after_key)) return -1;
    PyObject *set_range = PyObject_GetAttrString(cursor, "set_range");
    PyObject *step = set_range ? PyObject_GetAttrString(cursor, "next") : NULL;
    PyObject *item = step ? PyObject_GetAttrString(cursor, "item") : NULL;
    if (item == NULL) {
        Py_XDECREF(set_range);
        Py_XDECREF(step);
        return -1;
    }
    self->set_range = set_range;
    self->step = step;
    self->item = item;
#define KEEP(field, value) \
    Py_INCREF(value);      \
    Py_XSETREF(self->field, value)
    KEEP(prefix, prefix);
    KEEP(forms, forms);
    KEEP(from_seq, from_seq);
    KEEP(to_bound, to_bound);
    KEEP(from_key, from_key);
    KEEP(to_key, to_key);
    KEEP(after_key, after_key);
    KEEP(item_type, item_type);
    KEEP(empty_tuple, empty);
#undef KEEP
    self->left = stretch < 0 ? -1 : stretch;
    self->initialised = 1;
    return 0;
}

static int keyed_traverse(KeyedScan *self, visitproc visit, void *arg) {
    Py_VISIT(self->set_range);
    Py_VISIT(self->step);
    Py_VISIT(self->item);
    Py_VISIT(self->forms);
    Py_VISIT(self->item_type);
    Py_VISIT(self->empty_tuple);
    Py_VISIT(self->current);
    return 0;
}

static int keyed_clear(KeyedScan *self) {
    self->done = 1;
    Py_CLEAR(self->set_range);
    Py_CLEAR(self->step);
    Py_CLEAR(self->item);
    Py_CLEAR(self->forms);
    Py_CLEAR(self->item_type);
    Py_CLEAR(self->empty_tuple);
    Py_CLEAR(self->current);
    return 0;
}

static void keyed_dealloc(KeyedScan *self) {
    PyObject_GC_UnTrack(self);
    keyed_clear(self);
    Py_XDECREF(self->prefix);
    Py_XDECREF(self->from_seq);
    Py_XDECREF(self->to_bound);
    Py_XDECREF(self->from_key);
    Py_XDECREF(self->to_key);
    Py_XDECREF(self->after_key);
    Py_XDECREF(self->long_form);
    Py_XDECREF(self->resume);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Moves the cursor by ``method`` (set_range with ``head``, or next) and reads the row under it into
 * ``current`` (NULL: the cursor left the table). -1 on an error. */
static int keyed_move(KeyedScan *self, PyObject *method, PyObject *head) {
    PyObject *moved = head != NULL ? PyObject_CallOneArg(method, head) : PyObject_CallNoArgs(method);
    if (moved == NULL) return -1;
    int there = PyObject_IsTrue(moved);
    Py_DECREF(moved);
    if (there < 0) return -1;
    Py_CLEAR(self->current);
    if (!there) return 0;
    PyObject *pair = PyObject_CallNoArgs(self->item), *record_key, *raw;
    if (pair == NULL) return -1;
    if (!records_row(&pair, "KeyedScan", &record_key, &raw)) {
        Py_DECREF(pair);
        return -1;
    }
    self->current = pair;
    return 0;
}

/* A short key's user value from its stored value: None for a tombstone; NULL (a ValueError) for a long
 * key's value, which a short form never has. */
static PyObject *short_value_of(PyObject *raw) {
    unsigned char tag = plain_of(raw).tag;
    if (tag != 0 && tag != 1) {
        PyErr_SetString(PyExc_ValueError, "KeyedScan: a short key with a long key's value");
        return NULL;
    }
    return value_of(raw);
}

static PyObject *keyed_stop(KeyedScan *self, PyObject **slot, PyObject *form) {
    self->done = 1;
    if (slot != NULL) {
        Py_INCREF(form);
        Py_XSETREF(*slot, form);
    }
    return NULL;
}

enum { SHORT_FORM = 0, LONG_FORM = 1 };

/* Whether a key form (layout.py) is short (the escaped key, 00 00) or long (it holds the mark 00 01, which
 * escaping never emits); -1: neither. */
static int form_kind(const char *f, Py_ssize_t fl) {
    const char *end = f + fl, *zero = f;
    while ((zero = memchr(zero, 0, (size_t)(end - zero))) != NULL && zero + 1 < end) {
        unsigned char next = (unsigned char)zero[1];
        if (next == 0xff) {
            zero += 2;
            continue;
        }
        if (next == 1) return LONG_FORM;
        return next == 0 && zero + 2 == end ? SHORT_FORM : -1;
    }
    return -1;
}

/* The item of a changed short key (``h``: its records head), NULL with no error when the key is before the
 * read's range; ``*past`` set when it is at or past ``to_key`` (the forms ascend: the keyed way ends). */
static PyObject *keyed_item(KeyedScan *self, const char *h, Py_ssize_t hl, PyObject *from_raw, PyObject *to_raw,
                            int *past) {
    PyObject *key = short_key_of_head(h, hl);
    if (key == NULL) return NULL;
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t kl = PyBytes_GET_SIZE(key);
    if (before_range(k, kl, self->from_key, self->after_key) || (*past = past_range(k, kl, self->to_key))) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *from_value = from_raw != NULL ? short_value_of(from_raw) : (Py_INCREF(Py_None), Py_None);
    PyObject *to_value = from_value != NULL ? short_value_of(to_raw) : NULL;
    PyObject *item = to_value != NULL ? ((PyTypeObject *)self->item_type)->tp_alloc((PyTypeObject *)self->item_type, 4)
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

/* The next item of the keyed way; NULL when it stopped (an error set, or not: see KeyedScan). */
static PyObject *keyed_step(KeyedScan *self) {
    const char *fs = PyBytes_AS_STRING(self->from_seq), *tb = PyBytes_AS_STRING(self->to_bound);
    Py_ssize_t fsl = PyBytes_GET_SIZE(self->from_seq), tbl = PyBytes_GET_SIZE(self->to_bound);
    Py_ssize_t pl = PyBytes_GET_SIZE(self->prefix);
    for (;;) {
        PyObject *form = PyIter_Next(self->forms);
        if (form == NULL) return keyed_stop(self, NULL, NULL); /* the end, or an error */
        Py_ssize_t fl = PyBytes_Check(form) ? PyBytes_GET_SIZE(form) : -1;
        if (fl < 2 || pl + fl > MAX_RECORD_KEY) {
            Py_DECREF(form);
            PyErr_SetString(PyExc_ValueError, "KeyedScan: not a key form");
            return keyed_stop(self, NULL, NULL);
        }
        const char *f = PyBytes_AS_STRING(form);
        int kind = form_kind(f, fl);
        if (kind < 0) {
            Py_DECREF(form);
            PyErr_SetString(PyExc_ValueError, "KeyedScan: not a key form");
            return keyed_stop(self, NULL, NULL);
        }
        if (kind == LONG_FORM || self->left == 0) {
            keyed_stop(self, kind == LONG_FORM ? &self->long_form : &self->resume, form);
            Py_DECREF(form);
            return NULL;
        }
        if (self->left > 0) self->left--;
        PyObject *head = PyBytes_FromStringAndSize(NULL, pl + fl);
        if (head == NULL) {
            Py_DECREF(form);
            return keyed_stop(self, NULL, NULL);
        }
        char *h = PyBytes_AS_STRING(head);
        memcpy(h, PyBytes_AS_STRING(self->prefix), (size_t)pl);
        memcpy(h + pl, f, (size_t)fl);
        Py_DECREF(form);
        Py_ssize_t hl = pl + fl;
        int failed = 0;
        if (self->current == NULL) {
            failed = keyed_move(self, self->set_range, head);
        } else { /* a seek unless the cursor is on this key, or above it (nothing of it stored) */
            PyObject *k = PyTuple_GET_ITEM(self->current, 0);
            Py_ssize_t kl = PyBytes_GET_SIZE(k);
            const char *ck = PyBytes_AS_STRING(k);
            if (!(kl >= hl && memcmp(ck, h, (size_t)hl) == 0) && compare_bytes(ck, kl, h, hl) < 0)
                failed = keyed_move(self, self->set_range, head);
        }
        /* the key's versions, oldest first: the last at or below ``from`` and the last at or below ``to``
         * (the rows that hold them are kept: the cursor moves on) */
        PyObject *from_row = NULL, *to_row = NULL;
        while (!failed && self->current != NULL) {
            PyObject *k = PyTuple_GET_ITEM(self->current, 0);
            Py_ssize_t kl = PyBytes_GET_SIZE(k);
            const char *ck = PyBytes_AS_STRING(k);
            if (kl < hl || memcmp(ck, h, (size_t)hl) != 0) break;
            if (compare_bytes(ck + hl, kl - hl, fs, fsl) <= 0) {
                Py_INCREF(self->current);
                Py_XSETREF(from_row, self->current);
            } else if (compare_bytes(ck + hl, kl - hl, tb, tbl) < 0) {
                Py_INCREF(self->current);
                Py_XSETREF(to_row, self->current);
            }
            failed = keyed_move(self, self->step, NULL);
        }
        PyObject *out = NULL;
        int past = 0;
        if (!failed && to_row != NULL) {
            PyObject *to_raw = PyTuple_GET_ITEM(to_row, 1);
            PyObject *from_raw = from_row != NULL ? PyTuple_GET_ITEM(from_row, 1) : NULL;
            /* no version at or below ``from`` is "absent", which a tombstone equals */
            int same = from_raw != NULL ? raw_equal(to_raw, from_raw) : plain_of(to_raw).tag == 0;
            if (!same) {
                out = keyed_item(self, h, hl, from_raw, to_raw, &past);
                failed = out == NULL && PyErr_Occurred() != NULL;
            }
        }
        Py_DECREF(head);
        Py_XDECREF(from_row);
        Py_XDECREF(to_row);
        if (failed || past) return keyed_stop(self, NULL, NULL);
        if (out != NULL) return out;
    }
}

static PyObject *keyed_next(KeyedScan *self) {
    if (!self->initialised) {
        PyErr_SetString(PyExc_TypeError, "KeyedScan: not initialised (__init__ did not run)");
        return NULL;
    }
    if (self->done || self->forms == NULL) return NULL;
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "KeyedScan already executing");
        return NULL;
    }
    self->running = 1;
    PyObject *item = keyed_step(self);
    self->running = 0;
    return item;
}

static PyObject *keyed_long_form(KeyedScan *self, void *closure) { return or_none(self->long_form); }

static PyObject *keyed_resume(KeyedScan *self, void *closure) { return or_none(self->resume); }

static PyObject *keyed_left(KeyedScan *self, void *closure) {
    if (!self->initialised || self->left < 0) Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->left);
}

static PyGetSetDef keyed_getset[] = {
    {"long_form", (getter)keyed_long_form, NULL, "the long form it stopped at, not handled (None: none)", NULL},
    {"resume", (getter)keyed_resume, NULL, "the form its stretch ended at, not handled (None: none)", NULL},
    {"left", (getter)keyed_left, NULL, "forms it could still have taken (None: no limit)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject KeyedScanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.KeyedScan",
    .tp_basicsize = sizeof(KeyedScan),
    .tp_dealloc = (destructor)keyed_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The diff's keyed way over a records cursor, for short keys (see diff.py).",
    .tp_traverse = (traverseproc)keyed_traverse,
    .tp_clear = (inquiry)keyed_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)keyed_next,
    .tp_getset = keyed_getset,
    .tp_init = (initproc)keyed_init,
    .tp_new = PyType_GenericNew,
};

/* ---- MergeForms ---------------------------------------------------------------------------------- */

/* The merge of changes.py (a generation's forms in both index forms) and diff.py (the runs of a few
 * generations): the distinct byte strings of strictly ascending iterators, ascending. A form held by
 * several iterators is at their heads at the same step, and yielded once. Per form it compares every
 * head: meant for a few iterators (diff.py merges many with heapq). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    PyObject **iters; /* an entry is NULL once its iterator is exhausted */
    PyObject **heads; /* the next form of each iterator (NULL: exhausted or not read yet) */
    int initialised, started, running;
} MergeForms;

static int merge_init(MergeForms *self, PyObject *args, PyObject *kwargs) {
    PyObject *iterables;
    if (!PyArg_ParseTuple(args, "O:MergeForms", &iterables)) return -1;
    if (self->initialised || self->iters != NULL) { /* held iterators are never replaced, even after a failure */
        PyErr_SetString(PyExc_TypeError, "MergeForms: already initialised");
        return -1;
    }
    PyObject *seq = PySequence_Fast(iterables, "MergeForms: a sequence of iterables");
    if (seq == NULL) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    self->iters = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    self->heads = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    if (self->iters == NULL || self->heads == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *it = PyObject_GetIter(PySequence_Fast_GET_ITEM(seq, i));
        if (it == NULL) {
            Py_DECREF(seq);
            return -1; /* the entries taken so far are released with the object */
        }
        self->iters[i] = it;
        self->count = i + 1;
    }
    Py_DECREF(seq);
    self->initialised = 1;
    return 0;
}

static int merge_traverse(MergeForms *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_VISIT(self->iters[i]);
        Py_VISIT(self->heads[i]);
    }
    return 0;
}

static int merge_clear(MergeForms *self) {
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_CLEAR(self->iters[i]);
        Py_CLEAR(self->heads[i]);
    }
    return 0;
}

static void merge_dealloc(MergeForms *self) {
    PyObject_GC_UnTrack(self);
    merge_clear(self);
    PyMem_Free(self->iters);
    PyMem_Free(self->heads);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Reads iterator i's next form into heads[i] (NULL when it is exhausted). -1 on an error. */
static int merge_advance(MergeForms *self, Py_ssize_t i) {
    Py_CLEAR(self->heads[i]);
    if (self->iters[i] == NULL) return 0;
    PyObject *form = PyIter_Next(self->iters[i]);
    if (form == NULL) {
        Py_CLEAR(self->iters[i]);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!PyBytes_CheckExact(form)) {
        PyErr_Format(PyExc_TypeError, "MergeForms: a form must be bytes, not %.100s", Py_TYPE(form)->tp_name);
        Py_DECREF(form);
        return -1;
    }
    self->heads[i] = form;
    return 0;
}

static int compare_forms(PyObject *a, PyObject *b) {
    return compare_bytes(PyBytes_AS_STRING(a), PyBytes_GET_SIZE(a), PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

static PyObject *merge_step(MergeForms *self) {
    if (!self->started) {
        self->started = 1;
        for (Py_ssize_t i = 0; i < self->count; i++)
            if (merge_advance(self, i) < 0) return NULL;
    }
    PyObject *least = NULL;
    for (Py_ssize_t i = 0; i < self->count; i++)
        if (self->heads[i] != NULL && (least == NULL || compare_forms(self->heads[i], least) < 0))
            least = self->heads[i];
    if (least == NULL) return NULL;
    Py_INCREF(least);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (self->heads[i] != NULL && compare_forms(self->heads[i], least) == 0 && merge_advance(self, i) < 0) {
            Py_DECREF(least);
            return NULL;
        }
    }
    return least;
}

static PyObject *merge_next(MergeForms *self) {
    if (!self->initialised) {
        PyErr_SetString(PyExc_TypeError, "MergeForms: not initialised (__init__ did not run)");
        return NULL;
    }
    if (self->running) {
        PyErr_SetString(PyExc_ValueError, "MergeForms already executing");
        return NULL;
    }
    self->running = 1;
    PyObject *form = merge_step(self);
    self->running = 0;
    return form;
}

static PyTypeObject MergeFormsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "diffstore.engine._accel.MergeForms",
    .tp_basicsize = sizeof(MergeForms),
    .tp_dealloc = (destructor)merge_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The distinct forms of strictly ascending iterators of bytes, ascending (see changes.py).",
    .tp_traverse = (traverseproc)merge_traverse,
    .tp_clear = (inquiry)merge_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)merge_next,
    .tp_init = (initproc)merge_init,
    .tp_new = PyType_GenericNew,
};

/* ---- query_scan ---------------------------------------------------------------------------------- */

typedef struct {
    PyObject *list, *record_type, *known, *names;
    PyObject *from_key, *to_key, *after_key;
    PyObject *last_name; /* the name of last_seq: most records of a page share a generation */
    unsigned long long last_seq;
    PyObject *handed;
    int done;
} QueryPageState;

/* The generation id of ``seq``: known[seq], else names(seq) (which caches it in known). */
static PyObject *name_of(QueryPageState *st, unsigned long long seq) {
    if (st->last_name != NULL && st->last_seq == seq) return st->last_name;
    PyObject *number = PyLong_FromUnsignedLongLong(seq);
    if (number == NULL) return NULL;
    PyObject *name = PyDict_GetItemWithError(st->known, number);
    if (name != NULL) {
        Py_INCREF(name);
    } else if (!PyErr_Occurred()) {
        name = PyObject_CallOneArg(st->names, number);
    }
    Py_DECREF(number);
    if (name == NULL) return NULL;
    Py_XSETREF(st->last_name, name);
    st->last_seq = seq;
    return name;
}

/* Adds the record of a finished head (its visible version ``raw`` of ``seq``) to the page, or stops the
 * scan: at a long key (handed over) or at ``to_key``. -1: an error. */
static int emit_record(QueryPageState *st, const char *head, Py_ssize_t head_length, PyObject *raw,
                       unsigned long long seq) {
    Plain p = plain_of(raw);
    if (p.tag == 0) return 0; /* the tombstone of a short key */
    if (p.tag != 1) {         /* a long key: its group is sorted the Python way */
        st->done = 1;
        st->handed = PyBytes_FromStringAndSize(head + record_prefix_length(head),
                                               head_length - record_prefix_length(head));
        return st->handed == NULL ? -1 : 0;
    }
    PyObject *key = short_key_of_head(head, head_length);
    if (key == NULL) return -1;
    const char *k = PyBytes_AS_STRING(key);
    Py_ssize_t length = PyBytes_GET_SIZE(key);
    int skip = before_range(k, length, st->from_key, st->after_key);
    if (!skip && past_range(k, length, st->to_key)) {
        st->done = 1; /* keys only grow from here */
        skip = 1;
    }
    if (skip) {
        Py_DECREF(key);
        return 0;
    }
    PyObject *value = PyBytes_FromStringAndSize(p.body, p.length);
    PyObject *name = value ? name_of(st, seq) : NULL;
    PyObject *record = name ? ((PyTypeObject *)st->record_type)->tp_alloc((PyTypeObject *)st->record_type, 3)
                            : NULL;
    if (record == NULL) {
        Py_DECREF(key);
        Py_XDECREF(value);
        return -1;
    }
    Py_INCREF(name);
    PyTuple_SET_ITEM(record, 0, key);
    PyTuple_SET_ITEM(record, 1, value);
    PyTuple_SET_ITEM(record, 2, name);
    int failed = PyList_Append(st->list, record);
    Py_DECREF(record);
    return failed;
}

static PyObject *query_scan(PyObject *module, PyObject *args) {
    PyObject *it, *seq_limit, *stop, *from_key, *to_key, *after_key, *record_type, *known, *names;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OSSOOOnOOO:query_scan", &it, &seq_limit, &stop, &from_key, &to_key, &after_key,
                          &count, &record_type, &known, &names))
        return NULL;
    if (!PyIter_Check(it) || !is_encoded_seq(PyBytes_AS_STRING(seq_limit), PyBytes_GET_SIZE(seq_limit)) ||
        !PyType_Check(record_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type) || !PyDict_CheckExact(known) ||
        !PyCallable_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "query_scan: bad arguments");
        return NULL;
    }
    PyObject *bounds[3] = {from_key, to_key, after_key};
    for (int i = 0; i < 3; i++) {
        if (bounds[i] != Py_None && !PyBytes_CheckExact(bounds[i])) {
            PyErr_SetString(PyExc_TypeError, "query_scan: a key bound is bytes or None");
            return NULL;
        }
    }
    QueryPageState st = {PyList_New(0), record_type, known, names, from_key, to_key, after_key, NULL, 0, NULL, 0};
    if (st.list == NULL) return NULL;
    const char *limit = PyBytes_AS_STRING(seq_limit);
    Py_ssize_t limit_length = PyBytes_GET_SIZE(seq_limit);
    char head[MAX_RECORD_KEY + 1];
    Py_ssize_t head_length = 0;
    PyObject *best = NULL; /* the head's visible version (owned), or NULL */
    unsigned long long best_seq = 0;
    while (!st.done && PyList_GET_SIZE(st.list) < count) {
        PyObject *pair = PyIter_Next(it);
        if (pair == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        PyObject *record_key, *raw;
        if (!records_row(&pair, "query_scan", &record_key, &raw)) {
            Py_DECREF(pair);
            goto fail;
        }
        const char *k = PyBytes_AS_STRING(record_key);
        Py_ssize_t kl = PyBytes_GET_SIZE(record_key), fl = record_head_length(k, kl);
        if (compare_bytes(k, kl, PyBytes_AS_STRING(stop), PyBytes_GET_SIZE(stop)) >= 0) {
            Py_DECREF(pair);
            break;
        }
        if (head_length == 0 || fl != head_length || memcmp(k, head, (size_t)fl) != 0) { /* a new head */
            if (best != NULL) {
                int failed = emit_record(&st, head, head_length, best, best_seq);
                Py_CLEAR(best);
                if (failed) {
                    Py_DECREF(pair);
                    goto fail;
                }
                if (st.done) {
                    Py_DECREF(pair);
                    break;
                }
            }
            memcpy(head, k, (size_t)fl);
            head_length = fl;
        }
        /* encoded seqs sort as seqs: visible at the read point, and the latest such wins */
        if (compare_bytes(k + fl, kl - fl, limit, limit_length) <= 0) {
            Py_INCREF(raw);
            Py_XSETREF(best, raw);
            best_seq = read_record_seq(k + fl);
        }
        Py_DECREF(pair);
    }
    if (best != NULL && !st.done && PyList_GET_SIZE(st.list) < count) { /* the last head */
        int failed = emit_record(&st, head, head_length, best, best_seq);
        if (failed) goto fail;
    }
    Py_XDECREF(best);
    Py_XDECREF(st.last_name);
    PyObject *handed = st.handed ? st.handed : Py_NewRef(Py_None);
    return Py_BuildValue("(NN)", st.list, handed);
fail:
    Py_XDECREF(best);
    Py_XDECREF(st.last_name);
    Py_XDECREF(st.handed);
    Py_DECREF(st.list);
    return NULL;
}

/* ---- unpack_forms -------------------------------------------------------------------------------- */

/* The forms of a ``change_chunks`` value, (u16 length | form)...: a list of bytes. ValueError when a
 * length runs past the end (layout.unpack_forms: the same list, or IndexError / a shorter last form). */
/* ---- get_many_scan ------------------------------------------------------------------------------ */

#define MAX_KEY_LENGTH ((1 << 24) - 1)

/* The user value of a stored record value (layout.decode_value): None for a tombstone; NULL (a ValueError)
 * for a value of no known form. */
static PyObject *stored_value(PyObject *raw) {
    Plain p = plain_of(raw);
    const unsigned char *r = (const unsigned char *)p.body;
    Py_ssize_t n = p.length;
    if (p.tag == 0 || p.tag == 2) Py_RETURN_NONE;
    if (p.tag == 1) return PyBytes_FromStringAndSize(p.body, n);
    if (p.tag == 3 && n >= 3) {
        Py_ssize_t at = 3 + (((Py_ssize_t)r[0] << 16) | ((Py_ssize_t)r[1] << 8) | r[2]);
        if (at <= n) return PyBytes_FromStringAndSize(p.body + at, n - at);
    }
    PyErr_SetString(PyExc_ValueError, "get_many_scan: not a stored value");
    return NULL;
}

/* The record of ``key`` visible below ``above`` (its records probe: head | above), or None. */
static PyObject *visible_record(QueryPageState *st, PyObject *methods[4], PyObject *key, PyObject *probe,
                                Py_ssize_t head_length) {
    PyObject *moved = PyObject_CallOneArg(methods[0], probe); /* set_range */
    if (moved == NULL) return NULL;
    int there = PyObject_IsTrue(moved);
    Py_DECREF(moved);
    if (there < 0) return NULL;
    moved = PyObject_CallNoArgs(methods[there ? 1 : 2]); /* the version below the probe: prev, or last */
    if (moved == NULL) return NULL;
    there = PyObject_IsTrue(moved);
    Py_DECREF(moved);
    if (there <= 0) return there < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
    PyObject *pair = PyObject_CallNoArgs(methods[3]), *record_key, *raw; /* item */
    if (pair == NULL) return NULL;
    if (!records_row(&pair, "get_many_scan", &record_key, &raw)) {
        Py_DECREF(pair);
        return NULL;
    }
    const char *k = PyBytes_AS_STRING(record_key);
    Py_ssize_t kl = PyBytes_GET_SIZE(record_key);
    /* heads are prefix-free: a key of another head is no version of this key */
    if (record_head_length(k, kl) != head_length || memcmp(k, PyBytes_AS_STRING(probe), (size_t)head_length) != 0) {
        Py_DECREF(pair);
        Py_RETURN_NONE;
    }
    PyObject *value = stored_value(raw), *out = NULL;
    if (value == Py_None) {
        out = value;
    } else if (value != NULL) {
        PyObject *name = name_of(st, read_record_seq(k + head_length));
        out = name != NULL ? ((PyTypeObject *)st->record_type)->tp_alloc((PyTypeObject *)st->record_type, 3) : NULL;
        if (out == NULL) {
            Py_DECREF(value);
        } else {
            Py_INCREF(key);
            Py_INCREF(name);
            PyTuple_SET_ITEM(out, 0, key);
            PyTuple_SET_ITEM(out, 1, value);
            PyTuple_SET_ITEM(out, 2, name);
        }
    }
    Py_DECREF(pair);
    return out;
}

static PyObject *get_many_scan(PyObject *module, PyObject *args) {
    PyObject *cursor, *prefix, *keys, *above, *record_type, *known, *names, *key_form;
    if (!PyArg_ParseTuple(args, "OSOSOOOO:get_many_scan", &cursor, &prefix, &keys, &above, &record_type, &known,
                          &names, &key_form))
        return NULL;
    if (!PyList_Check(keys) || !is_encoded_seq(PyBytes_AS_STRING(above), PyBytes_GET_SIZE(above)) ||
        !PyType_Check(record_type) || !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type) ||
        !PyDict_CheckExact(known) || !PyCallable_Check(names) || !PyCallable_Check(key_form) ||
        PyBytes_GET_SIZE(prefix) < 2 || PyBytes_GET_SIZE(prefix) > 5) {
        PyErr_SetString(PyExc_TypeError, "get_many_scan: bad arguments");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < count; i++) { /* what the Python loop refuses, it refuses, at its place */
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) > MAX_KEY_LENGTH) Py_RETURN_NONE;
    }
    static const char *names_of_methods[4] = {"set_range", "prev", "last", "item"};
    PyObject *methods[4] = {NULL, NULL, NULL, NULL};
    QueryPageState st = {NULL, record_type, known, names, NULL, NULL, NULL, NULL, 0, NULL, 0};
    PyObject *found = NULL, *held = PyList_GetSlice(keys, 0, count); /* names() may change the caller's list */
    if (held == NULL) return NULL;
    for (int m = 0; m < 4; m++) {
        if ((methods[m] = PyObject_GetAttrString(cursor, names_of_methods[m])) == NULL) goto done;
    }
    if ((found = PyList_New(count)) == NULL) goto done;
    const char *pre = PyBytes_AS_STRING(prefix), *ab = PyBytes_AS_STRING(above);
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix), al = PyBytes_GET_SIZE(above);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(held, i), *form = NULL;
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key);
        if (kl > LONG_KEY_PREFIX) { /* its form holds a digest: layout.key_form makes it */
            form = PyObject_CallOneArg(key_form, key);
            if (form == NULL) goto fail;
            if (!PyBytes_CheckExact(form) || PyBytes_GET_SIZE(form) + pl + al > MAX_RECORD_KEY) {
                Py_DECREF(form);
                PyErr_SetString(PyExc_ValueError, "get_many_scan: not a key form");
                goto fail;
            }
        }
        /* head | above: the prefix (at most 5 bytes), a form (a short one at most 2 * 200 + 2), a seq (10) */
        char buffer[MAX_RECORD_KEY + 1], *head_end;
        memcpy(buffer, pre, (size_t)pl);
        if (form != NULL) {
            memcpy(buffer + pl, PyBytes_AS_STRING(form), (size_t)PyBytes_GET_SIZE(form));
            head_end = buffer + pl + PyBytes_GET_SIZE(form);
            Py_DECREF(form);
        } else {
            head_end = short_form_into(buffer + pl, k, kl);
        }
        memcpy(head_end, ab, (size_t)al);
        PyObject *probe = PyBytes_FromStringAndSize(buffer, head_end - buffer + al);
        if (probe == NULL) goto fail;
        PyObject *record = visible_record(&st, methods, key, probe, head_end - buffer);
        Py_DECREF(probe);
        if (record == NULL) goto fail;
        PyList_SET_ITEM(found, i, record);
    }
    goto done;
fail:
    Py_CLEAR(found);
done:
    for (int m = 0; m < 4; m++) Py_XDECREF(methods[m]);
    Py_XDECREF(st.last_name);
    Py_DECREF(held);
    return found;
}

static PyObject *unpack_forms(PyObject *module, PyObject *raw) {
    if (!PyBytes_CheckExact(raw)) {
        PyErr_SetString(PyExc_TypeError, "unpack_forms takes bytes");
        return NULL;
    }
    const unsigned char *at = (const unsigned char *)PyBytes_AS_STRING(raw);
    const unsigned char *end = at + PyBytes_GET_SIZE(raw);
    PyObject *forms = PyList_New(0);
    if (forms == NULL) return NULL;
    while (at < end) {
        if (end - at < 2) goto bad;
        Py_ssize_t length = ((Py_ssize_t)at[0] << 8) | at[1];
        at += 2;
        if (end - at < length) goto bad;
        PyObject *form = PyBytes_FromStringAndSize((const char *)at, length);
        if (form == NULL || PyList_Append(forms, form) < 0) {
            Py_XDECREF(form);
            Py_DECREF(forms);
            return NULL;
        }
        Py_DECREF(form);
        at += length;
    }
    return forms;
bad:
    Py_DECREF(forms);
    PyErr_SetString(PyExc_ValueError, "a change_chunks value that does not unpack");
    return NULL;
}

/* The columns of ``rows`` (a list of tuples, or None for a row absent in every field) for fields
 * 0..fields-1, each a tuple (offsets, data, present): the n byte strings of the field back to back in
 * ``data``, n + 1 little-endian int64 ``offsets`` from 0 to len(data), and ``present`` a byte per row (0:
 * the field is None) or None when every row has one (wire_columns.BinaryColumn.of: the same buffers).
 * Two passes without calling back into Python, so the rows cannot change in between. */
#define PACK_FIELDS_MAX 8
static PyObject *pack_columns(PyObject *module, PyObject *args) {
    PyObject *rows;
    Py_ssize_t fields;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &fields)) return NULL;
    if (fields < 1 || fields > PACK_FIELDS_MAX) {
        PyErr_Format(PyExc_ValueError, "pack_columns takes 1 to %d fields", PACK_FIELDS_MAX);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    Py_ssize_t total[PACK_FIELDS_MAX] = {0};
    int absent[PACK_FIELDS_MAX] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (row == Py_None) {
            for (Py_ssize_t f = 0; f < fields; f++) absent[f] = 1;
            continue;
        }
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < fields) {
            PyErr_Format(PyExc_TypeError, "pack_columns: row %zd is not a tuple of %zd fields", i, fields);
            return NULL;
        }
        for (Py_ssize_t f = 0; f < fields; f++) {
            PyObject *item = PyTuple_GET_ITEM(row, f);
            if (item == Py_None) {
                absent[f] = 1;
            } else if (PyBytes_Check(item)) {
                total[f] += PyBytes_GET_SIZE(item);
            } else {
                PyErr_Format(PyExc_TypeError, "pack_columns: row %zd, field %zd is neither bytes nor None", i, f);
                return NULL;
            }
        }
    }
    PyObject *columns = PyTuple_New(fields);
    if (columns == NULL) return NULL;
    for (Py_ssize_t f = 0; f < fields; f++) {
        PyObject *offsets = PyBytes_FromStringAndSize(NULL, 8 * (n + 1));
        PyObject *data = PyBytes_FromStringAndSize(NULL, total[f]);
        PyObject *present = absent[f] ? PyBytes_FromStringAndSize(NULL, n) : Py_NewRef(Py_None);
        PyObject *column = (offsets && data && present) ? PyTuple_Pack(3, offsets, data, present) : NULL;
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        Py_XDECREF(present);
        if (column == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, f, column);
        unsigned char *offset_at = (unsigned char *)PyBytes_AS_STRING(offsets);
        char *data_at = PyBytes_AS_STRING(data);
        char *present_at = absent[f] ? PyBytes_AS_STRING(present) : NULL;
        unsigned long long position = 0;
        for (Py_ssize_t i = 0;; i++) {
            for (int b = 0; b < 8; b++) offset_at[8 * i + b] = (unsigned char)(position >> (8 * b));
            if (i == n) break;
            PyObject *row = PyList_GET_ITEM(rows, i);
            PyObject *item = row == Py_None ? Py_None : PyTuple_GET_ITEM(row, f);
            if (present_at != NULL) present_at[i] = item != Py_None;
            if (item != Py_None) {
                Py_ssize_t size = PyBytes_GET_SIZE(item);
                memcpy(data_at + position, PyBytes_AS_STRING(item), (size_t)size);
                position += (unsigned long long)size;
            }
        }
    }
    return columns;
}

/* --- the digests' record hash: BLAKE2b-128 (RFC 7693, unkeyed), as layout.record_digest computes it with
 * hashlib, summed here without a Python object per record (digests.py: a commit's digest costs a bulk load
 * ~5 us per key through hashlib and int conversions, against ~0.2 us here). */

static const uint64_t B2_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const unsigned char B2_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

typedef struct {
    uint64_t h[8];
    uint64_t t; /* bytes compressed so far (a record is far below 2^64 bytes: the counter's high word is 0) */
    unsigned char block[128];
    size_t filled;
} Blake2b;

static inline uint64_t b2_load(const unsigned char *p) {
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--) w = (w << 8) | p[i]; /* little-endian on any host */
    return w;
}

static inline uint64_t b2_rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

#define B2_G(a, b, c, d, x, y)            \
    do {                                  \
        v[a] = v[a] + v[b] + (x);         \
        v[d] = b2_rotr(v[d] ^ v[a], 32);  \
        v[c] = v[c] + v[d];               \
        v[b] = b2_rotr(v[b] ^ v[c], 24);  \
        v[a] = v[a] + v[b] + (y);         \
        v[d] = b2_rotr(v[d] ^ v[a], 16);  \
        v[c] = v[c] + v[d];               \
        v[b] = b2_rotr(v[b] ^ v[c], 63);  \
    } while (0)

static void b2_compress(Blake2b *s, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = b2_load(s->block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= s->t;
    if (last) v[14] = ~v[14];
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 12 /* the message schedule's indexes become constants */
#endif
    for (int r = 0; r < 12; r++) {
        const unsigned char *x = B2_SIGMA[r];
        B2_G(0, 4, 8, 12, m[x[0]], m[x[1]]);
        B2_G(1, 5, 9, 13, m[x[2]], m[x[3]]);
        B2_G(2, 6, 10, 14, m[x[4]], m[x[5]]);
        B2_G(3, 7, 11, 15, m[x[6]], m[x[7]]);
        B2_G(0, 5, 10, 15, m[x[8]], m[x[9]]);
        B2_G(1, 6, 11, 12, m[x[10]], m[x[11]]);
        B2_G(2, 7, 8, 13, m[x[12]], m[x[13]]);
        B2_G(3, 4, 9, 14, m[x[14]], m[x[15]]);
    }
    for (int i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void b2_init(Blake2b *s) {
    memcpy(s->h, B2_IV, sizeof s->h);
    s->h[0] ^= 0x01010000ULL ^ 16; /* fanout 1, depth 1, no key, 16-byte digest */
    s->t = 0;
    s->filled = 0;
}

static void b2_update(Blake2b *s, const unsigned char *data, size_t length) {
    while (length > 0) {
        if (s->filled == sizeof s->block) { /* full, and more follows: not the last block */
            s->t += sizeof s->block;
            b2_compress(s, 0);
            s->filled = 0;
        }
        size_t take = sizeof s->block - s->filled;
        if (take > length) take = length;
        memcpy(s->block + s->filled, data, take);
        s->filled += take;
        data += take;
        length -= take;
    }
}

/* The 16-byte digest read as a big-endian number (int.from_bytes(digest, "big")): hi, lo. */
static void b2_final(Blake2b *s, uint64_t *hi, uint64_t *lo) {
    s->t += s->filled;
    memset(s->block + s->filled, 0, sizeof s->block - s->filled);
    b2_compress(s, 1);
    uint64_t words[2] = {s->h[0], s->h[1]};
    uint64_t out[2] = {0, 0};
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 8; i++) out[w] = (out[w] << 8) | ((words[w] >> (8 * i)) & 0xff);
    *hi = out[0];
    *lo = out[1];
}

/* A running sum modulo 2^128 of record hashes and how many records it holds. */
typedef struct {
    uint64_t hi, lo;
    Py_ssize_t count;
} DigestSum;

/* Adds the hash of the record ``form | raw`` unless ``raw`` is a tombstone (empty, or a long key's: 02). */
static void digest_add(DigestSum *sum, const char *form, Py_ssize_t form_length, const char *raw,
                       Py_ssize_t raw_length) {
    unsigned char first = raw_length > 0 ? (unsigned char)raw[0] : 0;
    if (raw_length == 0 || first == 2 || first == SEALED || (first > SEALED && (first & 0x0f) == 2)) return;
    Blake2b s;
    uint64_t hi, lo;
    b2_init(&s);
    b2_update(&s, (const unsigned char *)form, (size_t)form_length);
    if ((unsigned char)raw[0] > SEALED) { /* the plain form's hash (layout.record_digest): tag, then the rest */
        unsigned char tag = (unsigned char)(raw[0] & 0x0f);
        b2_update(&s, &tag, 1);
        if (raw_length > 5) b2_update(&s, (const unsigned char *)raw + 5, (size_t)(raw_length - 5));
    } else {
        b2_update(&s, (const unsigned char *)raw, (size_t)raw_length);
    }
    b2_final(&s, &hi, &lo);
    sum->lo += lo;
    sum->hi += hi + (sum->lo < lo);
    sum->count++;
}

static PyObject *digest_result(DigestSum *sum) {
    PyObject *hi = PyLong_FromUnsignedLongLong(sum->hi), *shift = PyLong_FromLong(64), *high = NULL;
    PyObject *lo = PyLong_FromUnsignedLongLong(sum->lo), *total = NULL, *result = NULL;
    if (hi == NULL || shift == NULL || lo == NULL) goto done;
    high = PyNumber_Lshift(hi, shift);
    if (high == NULL) goto done;
    total = PyNumber_Or(high, lo);
    if (total == NULL) goto done;
    result = Py_BuildValue("(nO)", sum->count, total);
done:
    Py_XDECREF(hi);
    Py_XDECREF(shift);
    Py_XDECREF(high);
    Py_XDECREF(lo);
    Py_XDECREF(total);
    return result;
}

static int bytes_pair(PyObject *item, PyObject **first, PyObject **second, const char *what) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
        PyErr_Format(PyExc_TypeError, "%s takes (bytes, bytes) pairs", what);
        return -1;
    }
    *first = PyTuple_GET_ITEM(item, 0);
    *second = PyTuple_GET_ITEM(item, 1);
    return 0;
}

/* What digest_rows sums over its records() rows, read from the packed items without making the rows: the
 * record of a value is 01 value, a tombstone's (None) is empty and counts for nothing. */
static PyObject *sorted_rows_digest(SortedRows *self, PyObject *unused) {
    static const unsigned char one = 1;
    DigestSum sum = {0, 0, 0};
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_ssize_t length = form_length_at(self->forms, at);
        PyObject *value = self->values[i];
        if (value != Py_None) {
            Blake2b s;
            uint64_t hi, lo;
            b2_init(&s);
            b2_update(&s, (const unsigned char *)self->forms + at + 2, (size_t)length);
            b2_update(&s, &one, 1);
            b2_update(&s, (const unsigned char *)PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
            b2_final(&s, &hi, &lo);
            sum.lo += lo;
            sum.hi += hi + (sum.lo < lo);
            sum.count++;
        }
        at += 2 + length;
    }
    return digest_result(&sum);
}

static PyObject *digest_pairs(PyObject *module, PyObject *pairs) {
    if (!PyList_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "digest_pairs takes a list");
        return NULL;
    }
    DigestSum sum = {0, 0, 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *form, *raw;
        if (bytes_pair(PyList_GET_ITEM(pairs, i), &form, &raw, "digest_pairs") < 0) return NULL;
        digest_add(&sum, PyBytes_AS_STRING(form), PyBytes_GET_SIZE(form), PyBytes_AS_STRING(raw),
                   PyBytes_GET_SIZE(raw));
    }
    return digest_result(&sum);
}

static PyObject *digest_rows(PyObject *module, PyObject *args) {
    PyObject *rows, *prefix, *encoded;
    if (!PyArg_ParseTuple(args, "OO!O!", &rows, &PyBytes_Type, &prefix, &PyBytes_Type, &encoded)) return NULL;
    PyObject *iterator = PyObject_GetIter(rows);
    if (iterator == NULL) return NULL;
    const char *p = PyBytes_AS_STRING(prefix), *e = PyBytes_AS_STRING(encoded);
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix), el = PyBytes_GET_SIZE(encoded);
    DigestSum sum = {0, 0, 0};
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        PyObject *key, *raw;
        if (bytes_pair(item, &key, &raw, "digest_rows") < 0) {
            Py_DECREF(item);
            Py_DECREF(iterator);
            return NULL;
        }
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key);
        if (kl < pl || memcmp(k, p, (size_t)pl) != 0) {
            Py_DECREF(item);
            break;
        }
        if (kl >= pl + el && memcmp(k + kl - el, e, (size_t)el) == 0)
            digest_add(&sum, k + pl, kl - pl - el, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
        Py_DECREF(item);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) return NULL;
    return digest_result(&sum);
}

/* digests.record_commit's loop over a generation's changed key forms: per form a seek to its version in
 * ``encoded`` (set_key) and, when ``replaces``, a step back to the version it replaced (prev, key); both
 * versions' hashes summed: ((added records, sum), (removed records, sum)). */
static PyObject *digest_changes(PyObject *module, PyObject *args) {
    PyObject *cursor, *prefix, *forms, *encoded;
    int replaces;
    if (!PyArg_ParseTuple(args, "OO!OO!p:digest_changes", &cursor, &PyBytes_Type, &prefix, &forms, &PyBytes_Type,
                          &encoded, &replaces))
        return NULL;
    static const char *names_of_methods[4] = {"set_key", "value", "prev", "key"};
    PyObject *methods[4] = {NULL, NULL, NULL, NULL}, *iterator = NULL, *form = NULL, *result = NULL;
    DigestSum added = {0, 0, 0}, removed = {0, 0, 0};
    for (int m = 0; m < 4; m++) {
        if ((methods[m] = PyObject_GetAttrString(cursor, names_of_methods[m])) == NULL) goto done;
    }
    if ((iterator = PyObject_GetIter(forms)) == NULL) goto done;
    const char *pre = PyBytes_AS_STRING(prefix), *enc = PyBytes_AS_STRING(encoded);
    Py_ssize_t pl = PyBytes_GET_SIZE(prefix), el = PyBytes_GET_SIZE(encoded);
    while ((form = PyIter_Next(iterator)) != NULL) {
        if (!PyBytes_Check(form)) {
            PyErr_SetString(PyExc_TypeError, "digest_changes: a key form that is not bytes");
            goto done;
        }
        Py_ssize_t fl = PyBytes_GET_SIZE(form);
        PyObject *probe = PyBytes_FromStringAndSize(NULL, pl + fl + el);
        if (probe == NULL) goto done;
        char *at = PyBytes_AS_STRING(probe);
        memcpy(at, pre, (size_t)pl);
        memcpy(at + pl, PyBytes_AS_STRING(form), (size_t)fl);
        memcpy(at + pl + fl, enc, (size_t)el);
        PyObject *hit = PyObject_CallOneArg(methods[0], probe);
        if (hit == NULL) {
            Py_DECREF(probe);
            goto done;
        }
        int found = PyObject_IsTrue(hit);
        Py_DECREF(hit);
        if (found < 0) {
            Py_DECREF(probe);
            goto done;
        }
        for (int step = 0; found && step < 2; step++) { /* 0: the version written; 1: the one it replaced */
            if (step == 1) {
                if (!replaces) break;
                PyObject *back = PyObject_CallNoArgs(methods[2]);
                if (back == NULL) {
                    Py_DECREF(probe);
                    goto done;
                }
                int moved = PyObject_IsTrue(back);
                Py_DECREF(back);
                if (moved <= 0) {
                    if (moved < 0) {
                        Py_DECREF(probe);
                        goto done;
                    }
                    break;
                }
                PyObject *key = PyObject_CallNoArgs(methods[3]);
                if (key == NULL) {
                    Py_DECREF(probe);
                    goto done;
                }
                int same = PyBytes_Check(key) && PyBytes_GET_SIZE(key) >= pl + fl &&
                           memcmp(PyBytes_AS_STRING(key), at, (size_t)(pl + fl)) == 0;
                Py_DECREF(key);
                if (!same) break;
            }
            PyObject *raw = PyObject_CallNoArgs(methods[1]);
            if (raw == NULL) {
                Py_DECREF(probe);
                goto done;
            }
            if (!PyBytes_Check(raw)) {
                Py_DECREF(raw);
                Py_DECREF(probe);
                PyErr_SetString(PyExc_TypeError, "digest_changes: a value that is not bytes");
                goto done;
            }
            digest_add(step ? &removed : &added, PyBytes_AS_STRING(form), fl, PyBytes_AS_STRING(raw),
                       PyBytes_GET_SIZE(raw));
            Py_DECREF(raw);
        }
        Py_DECREF(probe);
        Py_CLEAR(form);
    }
    if (PyErr_Occurred()) goto done;
    PyObject *first = digest_result(&added), *second = first == NULL ? NULL : digest_result(&removed);
    if (second != NULL) result = PyTuple_Pack(2, first, second);
    Py_XDECREF(first);
    Py_XDECREF(second);
done:
    Py_XDECREF(form);
    Py_XDECREF(iterator);
    for (int m = 0; m < 4; m++) Py_XDECREF(methods[m]);
    return result;
}

/* --- check's scan of records and of the generations' runs (check_scan.py: its twin, and what it is for) ---
 *
 *   check_records(rows_iter, targets, dropped, sealed, tick, every), check_runs(rows_iter, chunked, targets,
 *                 dropped, tick, every)
 *       One pass over the rows of ``records`` (or of ``changes``, ``change_chunks``): per live collection
 *       (``targets``: (cid, current seq, open seq or -1, its registered seqs as u64 big-endian, a bytearray of
 *       CHECK_FIELDS u64s per bucket)) the buckets' counts, form-hash sums and digest deltas added into the
 *       bytearray; (rows read, the rows handed back) where a row breaks a rule of its own. ``tick(rows)``
 *       every ``every`` rows. check_records verifies each row's seal: a plain row is one to hand back in a
 *       ``sealed`` store (layout.SEALED_ROW), else counted: it returns (rows read, handed back, plain rows);
 *       and it hashes the plain values into the digests. */

#define CHECK_FIELDS 8 /* per bucket: records, their sum, entries, their sum, delta lo, hi, counted, unused */

typedef struct {
    unsigned long long cid;
    unsigned long long current;
    long long open; /* -1: none */
    PyObject *held;            /* the bytes of ``seqs``, held: the caller's list may let go of them */
    const unsigned char *seqs; /* u64 big-endian, ascending */
    Py_ssize_t count;          /* of seqs: the stray bucket is ``count`` */
    uint64_t *acc;
} CheckTarget;

typedef struct {
    CheckTarget *targets; /* ascending cid */
    Py_ssize_t count;
    PyObject *dropped;
    Py_buffer *views;
    Py_ssize_t viewed, held; /* buffers got, seqs held (of the first targets) */
} CheckScope;

static uint64_t check_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

/* A form's 64-bit hash for the buckets' sums (any good mix: both sides of a bucket are summed here). */
static uint64_t form_hash(const char *p, Py_ssize_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)n * 0xc2b2ae3d27d4eb4fULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
    return h;
}

static void check_scope_free(CheckScope *scope) {
    for (Py_ssize_t i = 0; i < scope->viewed; i++) PyBuffer_Release(&scope->views[i]);
    for (Py_ssize_t i = 0; scope->targets != NULL && i < scope->held; i++) Py_DECREF(scope->targets[i].held);
    PyMem_Free(scope->views);
    PyMem_Free(scope->targets);
}

static int check_target_order(const void *a, const void *b) {
    unsigned long long x = ((const CheckTarget *)a)->cid, y = ((const CheckTarget *)b)->cid;
    return (x > y) - (x < y);
}

static int check_scope_init(CheckScope *scope, PyObject *targets, PyObject *dropped) {
    memset(scope, 0, sizeof *scope);
    if (!PyList_Check(targets) || !PyAnySet_Check(dropped)) {
        PyErr_SetString(PyExc_TypeError, "check: targets is a list, dropped a set");
        return -1;
    }
    scope->dropped = dropped;
    Py_ssize_t n = PyList_GET_SIZE(targets);
    scope->targets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(CheckTarget));
    scope->views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    if (scope->targets == NULL || scope->views == NULL) {
        PyErr_NoMemory();
        check_scope_free(scope);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        CheckTarget *t = &scope->targets[i];
        PyObject *seqs, *acc;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(targets, i), "KKLO!O!", &t->cid, &t->current, &t->open, &PyBytes_Type,
                              &seqs, &PyByteArray_Type, &acc) ||
            PyObject_GetBuffer(acc, &scope->views[i], PyBUF_WRITABLE) < 0) {
            check_scope_free(scope);
            return -1;
        }
        scope->viewed++;
        Py_INCREF(seqs);
        t->held = seqs;
        scope->held++;
        t->seqs = (const unsigned char *)PyBytes_AS_STRING(seqs);
        t->count = PyBytes_GET_SIZE(seqs) / 8;
        if (scope->views[i].len != (Py_ssize_t)(8 * CHECK_FIELDS * (t->count + 1))) {
            PyErr_SetString(PyExc_ValueError, "check: an accumulator of the wrong size");
            check_scope_free(scope);
            return -1;
        }
        t->acc = scope->views[i].buf;
    }
    qsort(scope->targets, (size_t)n, sizeof(CheckTarget), check_target_order);
    scope->count = n;
    return 0;
}

/* The target of ``cid``; NULL with *flag 0 for a deleted collection, 1 for one neither live nor deleted. */
static CheckTarget *check_target(CheckScope *scope, unsigned long long cid, int *flag) {
    Py_ssize_t low = 0, high = scope->count;
    while (low < high) {
        Py_ssize_t mid = (low + high) / 2;
        if (scope->targets[mid].cid < cid) low = mid + 1;
        else high = mid;
    }
    if (low < scope->count && scope->targets[low].cid == cid) return &scope->targets[low];
    PyObject *number = PyLong_FromUnsignedLongLong(cid);
    if (number == NULL) {
        *flag = -1;
        return NULL;
    }
    int found = PySet_Contains(scope->dropped, number);
    Py_DECREF(number);
    *flag = found < 0 ? -1 : !found;
    return NULL;
}

/* The bucket of ``seq`` in ``t``: the index of the registered seq, or ``t->count`` (stray). */
static Py_ssize_t check_bucket(const CheckTarget *t, unsigned long long seq) {
    Py_ssize_t low = 0, high = t->count;
    while (low < high) {
        Py_ssize_t mid = (low + high) / 2;
        if (check_u64(t->seqs + 8 * mid) < seq) low = mid + 1;
        else high = mid;
    }
    return low < t->count && check_u64(t->seqs + 8 * low) == seq ? low : t->count;
}

/* A records row, read once (check_scan.read_record_row): the one place a row is parsed and its seal
 * verified. */
typedef struct {
    unsigned long long cid, seq;
    const char *form;
    Py_ssize_t form_length, head_length;
    int seal;         /* ROW_SEALED, ROW_PLAIN (no checksum: written before them) or ROW_SEAL_FAILS */
    int tag;          /* the plain value (layout.plain): its tag, -1 when it is empty (b""), */
    const char *body; /* and what follows the tag */
    Py_ssize_t body_length;
} RecordRow;

#define ROW_SEALED 0
#define ROW_PLAIN 1
#define ROW_SEAL_FAILS 2

/* 0: ``key`` is a records key in its one encoding (no leading zero byte in its cid or seq), read into
 * ``row`` with its value ``raw`` (check_scan.read_record_row); -1: it is not. */
static int read_record_row(const char *key, Py_ssize_t kl, const char *raw, Py_ssize_t rl, RecordRow *row) {
    if (!is_record_key(key, kl)) return -1;
    int n = (unsigned char)key[0], m = (unsigned char)key[kl - 1];
    Py_ssize_t head = kl - 2 - m;
    if ((n > 1 && key[1] == 0) || (m > 1 && key[head + 1] == 0)) return -1;
    row->cid = 0;
    for (int i = 1; i <= n; i++) row->cid = (row->cid << 8) | (unsigned char)key[i];
    row->seq = read_record_seq(key + head);
    row->form = key + 1 + n;
    row->form_length = head - 1 - n;
    row->head_length = head;
    unsigned char first = rl > 0 ? (unsigned char)raw[0] : 0;
    row->tag = -1;
    row->body = raw;
    row->body_length = 0;
    if (rl == 0 || first < SEALED) {
        row->seal = ROW_PLAIN;
        if (rl > 0) {
            row->tag = first;
            row->body = raw + 1;
            row->body_length = rl - 1;
        }
        return 0;
    }
    row->seal = seal_matches((const unsigned char *)key, kl, (const unsigned char *)raw, rl) ? ROW_SEALED
                                                                                            : ROW_SEAL_FAILS;
    if (first != SEALED) { /* layout.plain, which reads a damaged one alike */
        row->tag = first & 0x0f;
        row->body = raw + (rl > 5 ? 5 : rl);
        row->body_length = rl > 5 ? rl - 5 : 0;
    }
    return 0;
}

static int has_long_mark(const char *f, Py_ssize_t fl) {
    for (Py_ssize_t i = 0; i + 1 < fl; i++)
        if (f[i] == 0 && f[i + 1] == 1) return 1;
    return 0;
}

/* Whether a record's plain value is sound for its form (check_scan._record_value_problem is None). */
static int record_value_sound(const RecordRow *row) {
    const char *f = row->form, *body = row->body;
    Py_ssize_t fl = row->form_length, bl = row->body_length;
    int long_form = has_long_mark(f, fl);
    if (!long_form) {
        if (fl < 2 || f[fl - 1] != 0 || f[fl - 2] != 0) return 0;
        return row->tag < 0 || row->tag == 1;
    }
    if (bl < 3 || (row->tag != 2 && row->tag != 3)) return 0;
    Py_ssize_t length = ((Py_ssize_t)(unsigned char)body[0] << 16) | ((unsigned char)body[1] << 8) |
                        (unsigned char)body[2];
    if (length > bl - 3) length = bl - 3;
    const char *k = body + 3;
    char built[2 * LONG_KEY_PREFIX + 2 + 16];
    char *end;
    if (length <= LONG_KEY_PREFIX) {
        end = short_form_into(built, k, length);
    } else {
        Blake2b s;
        uint64_t hi, lo;
        b2_init(&s);
        b2_update(&s, (const unsigned char *)k, (size_t)length);
        b2_final(&s, &hi, &lo);
        end = escape_into(built, k, LONG_KEY_PREFIX);
        *end++ = 0;
        *end++ = 1;
        for (int i = 7; i >= 0; i--) *end++ = (char)(hi >> (8 * i));
        for (int i = 7; i >= 0; i--) *end++ = (char)(lo >> (8 * i));
    }
    return end - built == fl && memcmp(built, f, (size_t)fl) == 0;
}

/* The digests' share of check_records -- a BLAKE2b per live version, as much work as reading the row --
 * runs in a thread of its own beside the loop that reads the rows (which holds the GIL for the cursor),
 * fed batches of copied rows in the order read; it keeps no Python object and ends before the call
 * returns. Where no thread can be started the rows are hashed in the loop, with the same sums. */

#define HASH_BATCH_JOBS 4096
#define HASH_BATCH_BYTES (1 << 20)

typedef struct {
    uint64_t *acc;             /* the bucket's fields (delta lo, hi and counted are the hasher's alone) */
    size_t at;                 /* where form | raw begins in the batch's data */
    Py_ssize_t form_length, raw_length;
    int new_head;              /* the first version of its key the digests see: nothing before it */
} HashJob;

typedef struct {
    HashJob *jobs;
    Py_ssize_t count;
    unsigned char *data;
    size_t used, size;
} HashBatch;

typedef struct {
    pthread_t thread;
    int started, stop, ready; /* ready: the batch handed to the thread and not done yet, -1: none */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    HashBatch batches[2];
    int filling; /* the batch the loop fills */
    uint64_t previous_hi, previous_lo; /* the hash of the version before (0: none or a tombstone) */
    int previous_live;
} Hasher;

/* delta += hash - previous (mod 2^128), counted += live - previous live: digests.recompute's sums. */
static void hash_job(Hasher *h, const HashJob *job, const unsigned char *data) {
    if (job->new_head) {
        h->previous_hi = h->previous_lo = 0;
        h->previous_live = 0;
    }
    const unsigned char *raw = data + job->form_length;
    uint64_t hi = 0, lo = 0;
    int live = job->raw_length != 0 && raw[0] != 2;
    if (live) {
        Blake2b s;
        b2_init(&s);
        b2_update(&s, data, (size_t)(job->form_length + job->raw_length));
        b2_final(&s, &hi, &lo);
    }
    uint64_t *acc = job->acc;
    uint64_t dlo = lo - h->previous_lo, dhi = hi - h->previous_hi - (lo < h->previous_lo);
    uint64_t sum_lo = acc[4] + dlo;
    acc[5] += dhi + (sum_lo < dlo);
    acc[4] = sum_lo;
    acc[6] += (uint64_t)(live - h->previous_live);
    h->previous_hi = hi;
    h->previous_lo = lo;
    h->previous_live = live;
}

static void hash_batch(Hasher *h, HashBatch *b) {
    for (Py_ssize_t i = 0; i < b->count; i++) hash_job(h, &b->jobs[i], b->data + b->jobs[i].at);
    b->count = 0;
    b->used = 0;
}

static void *hasher_run(void *arg) {
    Hasher *h = arg;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (h->ready < 0 && !h->stop) pthread_cond_wait(&h->cond, &h->lock);
        if (h->ready < 0) break; /* stopped, nothing left */
        HashBatch *b = &h->batches[h->ready];
        pthread_mutex_unlock(&h->lock);
        hash_batch(h, b);
        pthread_mutex_lock(&h->lock);
        h->ready = -1;
        pthread_cond_broadcast(&h->cond);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static int hasher_start(Hasher *h) {
    memset(h, 0, sizeof *h);
    h->ready = -1;
    for (int i = 0; i < 2; i++) {
        h->batches[i].jobs = PyMem_RawMalloc(HASH_BATCH_JOBS * sizeof(HashJob));
        h->batches[i].data = PyMem_RawMalloc(HASH_BATCH_BYTES);
        h->batches[i].size = HASH_BATCH_BYTES;
        if (h->batches[i].jobs == NULL || h->batches[i].data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    if (pthread_mutex_init(&h->lock, NULL) != 0) return 0; /* no thread: hashed in the loop */
    if (pthread_cond_init(&h->cond, NULL) != 0) {
        pthread_mutex_destroy(&h->lock);
        return 0;
    }
    if (pthread_create(&h->thread, NULL, hasher_run, h) != 0) {
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
        return 0;
    }
    h->started = 1;
    return 0;
}

/* Hands the batch being filled to the thread, once it is done with the one before (waiting without the
 * GIL), and fills the other. */
static void hasher_hand_over(Hasher *h) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&h->lock);
    while (h->ready >= 0) pthread_cond_wait(&h->cond, &h->lock);
    h->ready = h->filling;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    Py_END_ALLOW_THREADS
    h->filling ^= 1;
}

/* Adds a version to hash (a copy of form | its plain value: the digests hash no seal): in the batch, or at
 * once without a thread. */
static int hasher_add(Hasher *h, uint64_t *acc, int new_head, const RecordRow *row) {
    HashBatch *b = &h->batches[h->filling];
    Py_ssize_t fl = row->form_length, rl = row->tag < 0 ? 0 : 1 + row->body_length;
    size_t need = (size_t)(fl + rl);
    if (h->started && b->count > 0 && (b->count == HASH_BATCH_JOBS || b->used + need > b->size)) {
        hasher_hand_over(h);
        b = &h->batches[h->filling];
    }
    if (b->used + need > b->size) { /* one version larger than a batch */
        unsigned char *grown = PyMem_RawRealloc(b->data, b->used + need);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->size = b->used + need;
    }
    HashJob *job = &b->jobs[b->count++];
    job->acc = acc;
    job->at = b->used;
    job->form_length = fl;
    job->raw_length = rl;
    job->new_head = new_head;
    unsigned char *out = b->data + b->used;
    memcpy(out, row->form, (size_t)fl);
    if (rl > 0) {
        out[fl] = (unsigned char)row->tag;
        memcpy(out + fl + 1, row->body, (size_t)row->body_length);
    }
    b->used += need;
    if (!h->started) hash_batch(h, b);
    return 0;
}

/* Hashes what is left (``finish``; else drops it: an error ends the scan) and ends the thread. */
static void hasher_end(Hasher *h, int finish) {
    if (h->started) {
        if (finish && h->batches[h->filling].count > 0) hasher_hand_over(h);
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&h->lock);
        h->stop = 1;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
        pthread_join(h->thread, NULL);
        Py_END_ALLOW_THREADS
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
    }
    for (int i = 0; i < 2; i++) {
        PyMem_RawFree(h->batches[i].jobs);
        PyMem_RawFree(h->batches[i].data);
    }
}

static int check_flag(PyObject *flagged, PyObject *item) { return PyList_Append(flagged, item); }

static int check_tick(PyObject *tick, Py_ssize_t count, Py_ssize_t every) {
    if (every <= 0 || count % every) return 0;
    PyObject *r = PyObject_CallFunction(tick, "n", count);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *check_records(PyObject *module, PyObject *args) {
    PyObject *rows, *targets, *dropped, *tick;
    int sealed;
    Py_ssize_t every;
    if (!PyArg_ParseTuple(args, "OOOpOn:check_records", &rows, &targets, &dropped, &sealed, &tick, &every))
        return NULL;
    CheckScope scope;
    if (check_scope_init(&scope, targets, dropped) < 0) return NULL;
    Hasher hasher;
    int hashed = 0;
    PyObject *iterator = NULL, *flagged = NULL, *item = NULL, *result = NULL;
    if (hasher_start(&hasher) < 0) goto done;
    iterator = PyObject_GetIter(rows);
    flagged = PyList_New(0);
    if (iterator == NULL || flagged == NULL) goto done;
    Py_ssize_t count = 0, unsealed = 0;
    CheckTarget *target = NULL;
    int target_flag = 0;
    unsigned long long last_cid = 0;
    int have_cid = 0;
    char previous_head[MAX_RECORD_KEY];
    Py_ssize_t previous_length = -1;
    while ((item = PyIter_Next(iterator)) != NULL) {
        count++;
        if (check_tick(tick, count, every) < 0) goto done;
        PyObject *key, *raw;
        if (bytes_pair(item, &key, &raw, "check_records") < 0) goto done;
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kl = PyBytes_GET_SIZE(key);
        RecordRow row;
        if (read_record_row(k, kl, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), &row) < 0) {
            if (check_flag(flagged, item) < 0) goto done;
            Py_CLEAR(item);
            continue;
        }
        /* a plain row was written before checksums (counted for the note), unless the store is sealed */
        int seal_bad = row.seal == ROW_SEAL_FAILS || (row.seal == ROW_PLAIN && sealed);
        unsealed += row.seal == ROW_PLAIN && !sealed;
        if (!have_cid || row.cid != last_cid) {
            target_flag = 0;
            target = check_target(&scope, row.cid, &target_flag);
            if (target_flag < 0) goto done;
            last_cid = row.cid;
            have_cid = 1;
        }
        if (target == NULL) { /* a deleted collection's row (the purge's to remove) is not checked */
            if (target_flag && check_flag(flagged, item) < 0) goto done;
            Py_CLEAR(item);
            continue;
        }
        Py_ssize_t at = check_bucket(target, row.seq);
        int open = target->open >= 0 && row.seq == (unsigned long long)target->open;
        if (seal_bad || at == target->count || (row.seq > target->current && !open) || !record_value_sound(&row)) {
            if (check_flag(flagged, item) < 0) goto done;
        }
        uint64_t *acc = target->acc + CHECK_FIELDS * at;
        acc[0]++;
        acc[1] += form_hash(row.form, row.form_length);
        if (row.seq <= target->current) { /* an open generation's version is no digest's */
            int new_head = row.head_length != previous_length || memcmp(k, previous_head, (size_t)row.head_length);
            if (new_head) {
                memcpy(previous_head, k, (size_t)row.head_length);
                previous_length = row.head_length;
            }
            if (hasher_add(&hasher, acc, new_head, &row) < 0) goto done;
        }
        Py_CLEAR(item);
    }
    if (PyErr_Occurred()) goto done;
    hasher_end(&hasher, 1); /* every sum complete before the caller reads them */
    hashed = 1;
    result = Py_BuildValue("(nOn)", count, flagged, unsealed);
done:
    if (!hashed) hasher_end(&hasher, 0);
    Py_XDECREF(item);
    Py_XDECREF(iterator);
    Py_XDECREF(flagged);
    check_scope_free(&scope);
    return result;
}

/* A run row's key (cid(u32) | seq(u64) | K, K at least 2 bytes), read once: the one place a ``changes`` or
 * ``change_chunks`` row is parsed -- and where a per-row verification of it belongs. 0: its cid read, and
 * its seq when the key holds one and a K (``whole``); -1: it is too short to name a collection. */
typedef struct {
    unsigned long long cid, seq;
    int whole;
} RunRow;

static int read_run_row(const char *k, Py_ssize_t kl, RunRow *row) {
    if (kl < 4) return -1;
    row->cid = ((unsigned long long)(unsigned char)k[0] << 24) | ((unsigned long long)(unsigned char)k[1] << 16) |
               ((unsigned long long)(unsigned char)k[2] << 8) | (unsigned char)k[3];
    row->whole = kl >= 12 + 2;
    row->seq = row->whole ? check_u64((const unsigned char *)k + 4) : 0;
    return 0;
}

/* Whether a chunk's value holds strictly ascending forms from ``first`` (check_scan._sound_chunk of its
 * unpacked forms); its last form at *last. */
static int chunk_sound(const char *first, Py_ssize_t first_length, const char *raw, Py_ssize_t rl, const char **last,
                       Py_ssize_t *last_length, Py_ssize_t *forms) {
    Py_ssize_t at = 0, n = 0;
    const char *previous = NULL;
    Py_ssize_t previous_length = 0;
    while (at < rl) {
        if (rl - at < 2) return 0;
        Py_ssize_t length = ((unsigned char)raw[at] << 8) | (unsigned char)raw[at + 1];
        if (rl - at - 2 < length) return 0;
        const char *form = raw + at + 2;
        if (n == 0 ? compare_bytes(form, length, first, first_length) != 0
                   : compare_bytes(previous, previous_length, form, length) >= 0)
            return 0;
        previous = form;
        previous_length = length;
        n++;
        at += 2 + length;
    }
    *last = previous;
    *last_length = previous_length;
    *forms = n;
    return n > 0;
}

static PyObject *check_runs(PyObject *module, PyObject *args) {
    PyObject *rows, *targets, *dropped, *tick;
    int chunked;
    Py_ssize_t every;
    if (!PyArg_ParseTuple(args, "OpOOOn:check_runs", &rows, &chunked, &targets, &dropped, &tick, &every)) return NULL;
    CheckScope scope;
    if (check_scope_init(&scope, targets, dropped) < 0) return NULL;
    PyObject *iterator = PyObject_GetIter(rows), *flagged = PyList_New(0), *item = NULL, *result = NULL;
    PyObject *previous = Py_None; /* (run, last form) of the sound chunk before, or None */
    Py_INCREF(previous);
    if (iterator == NULL || flagged == NULL) goto done;
    Py_ssize_t count = 0;
    CheckTarget *target = NULL;
    int target_flag = 0, have_cid = 0;
    unsigned long long last_cid = 0;
    while ((item = PyIter_Next(iterator)) != NULL) {
        count++;
        if (check_tick(tick, count, every) < 0) goto done;
        PyObject *key, *raw;
        if (bytes_pair(item, &key, &raw, "check_runs") < 0) goto done;
        const char *k = PyBytes_AS_STRING(key), *r = PyBytes_AS_STRING(raw);
        Py_ssize_t kl = PyBytes_GET_SIZE(key), rl = PyBytes_GET_SIZE(raw);
        int flag = 0;
        RunRow row;
        if (read_run_row(k, kl, &row) < 0) {
            flag = 1;
        } else {
            if (!have_cid || row.cid != last_cid) {
                target_flag = 0;
                target = check_target(&scope, row.cid, &target_flag);
                if (target_flag < 0) goto done;
                last_cid = row.cid;
                have_cid = 1;
            }
            if (target == NULL) {
                flag = target_flag;
            } else if (!row.whole) {
                flag = 1;
            } else {
                Py_ssize_t at = check_bucket(target, row.seq);
                uint64_t *acc = target->acc + CHECK_FIELDS * at;
                if (!chunked) {
                    acc[2]++;
                    acc[3] += form_hash(k + 12, kl - 12);
                } else {
                    const char *last;
                    Py_ssize_t last_length, forms;
                    if (!chunk_sound(k + 12, kl - 12, r, rl, &last, &last_length, &forms)) {
                        flag = 1;
                    } else {
                        if (previous != Py_None) {
                            PyObject *run = PyTuple_GET_ITEM(previous, 0), *end = PyTuple_GET_ITEM(previous, 1);
                            if (memcmp(PyBytes_AS_STRING(run), k, 12) == 0 &&
                                compare_bytes(PyBytes_AS_STRING(end), PyBytes_GET_SIZE(end), k + 12, kl - 12) >= 0) {
                                PyObject *entry = PyTuple_Pack(3, key, raw, previous);
                                if (entry == NULL || check_flag(flagged, entry) < 0) {
                                    Py_XDECREF(entry);
                                    goto done;
                                }
                                Py_DECREF(entry);
                            }
                        }
                        PyObject *next = Py_BuildValue("(y#y#)", k, (Py_ssize_t)12, last, last_length);
                        if (next == NULL) goto done;
                        Py_SETREF(previous, next);
                        acc[2] += (uint64_t)forms;
                        Py_ssize_t at2 = 0;
                        while (at2 < rl) {
                            Py_ssize_t length = ((unsigned char)r[at2] << 8) | (unsigned char)r[at2 + 1];
                            acc[3] += form_hash(r + at2 + 2, length);
                            at2 += 2 + length;
                        }
                    }
                }
            }
        }
        if (flag) {
            PyObject *entry = PyTuple_Pack(3, key, raw, previous);
            if (entry == NULL || check_flag(flagged, entry) < 0) {
                Py_XDECREF(entry);
                goto done;
            }
            Py_DECREF(entry);
        }
        Py_CLEAR(item);
    }
    if (PyErr_Occurred()) goto done;
    result = Py_BuildValue("(nO)", count, flagged);
done:
    Py_XDECREF(item);
    Py_XDECREF(iterator);
    Py_XDECREF(flagged);
    Py_XDECREF(previous);
    check_scope_free(&scope);
    return result;
}

static PyMethodDef methods[] = {
    {"sorted_short_rows", sorted_short_rows, METH_VARARGS,
     "The records and changes rows of sorted short (key, value) pairs, or None."},
    {"query_scan", query_scan, METH_VARARGS, "Records of a query page from a records iterator (see reads.py)."},
    {"get_many_scan", get_many_scan, METH_VARARGS, "The records of keys visible at a read point (see reads.py)."},
    {"unpack_forms", unpack_forms, METH_O, "The key forms of a change_chunks value (layout.unpack_forms)."},
    {"pack_columns", pack_columns, METH_VARARGS, "The columns form's buffers of a list of rows (wire_columns)."},
    {"digest_pairs", digest_pairs, METH_O, "(live records, sum mod 2^128) of (form, raw) pairs (digests.py)."},
    {"digest_rows", digest_rows, METH_VARARGS, "(live records, sum mod 2^128) of a seq's rows (digests.py)."},
    {"digest_changes", digest_changes, METH_VARARGS, "The sums of a commit's written and replaced versions."},
    {"check_records", check_records, METH_VARARGS, "check's pass over records (see check_scan.py)."},
    {"check_runs", check_runs, METH_VARARGS, "check's pass over changes or change_chunks (see check_scan.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_accel", "The engine's optional compiled accelerator (see _accel.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__accel(void) {
    crc_init();
    if (PyType_Ready(&DiffScanType) < 0 || PyType_Ready(&KeyedScanType) < 0 || PyType_Ready(&MergeFormsType) < 0 ||
        PyType_Ready(&SortedRowsType) < 0 ||
        PyType_Ready(&RowIterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddType(m, &DiffScanType) < 0 || PyModule_AddType(m, &KeyedScanType) < 0 ||
        PyModule_AddType(m, &MergeFormsType) < 0 ||
        PyModule_AddType(m, &SortedRowsType) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE", DIFFSTORE_ACCEL_SOURCE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
