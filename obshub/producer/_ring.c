/*
 * producer._ring: batch consumer of the agent's BPF ring buffer (BPF_MAP_TYPE_RINGBUF).
 *
 * The ring buffer is read through its own mmap (the layout of kernel/bpf/ringbuf.c): one read-write page
 * with the consumer position, then, read-only, one page with the producer position followed by the data
 * area mapped twice in a row (a record that wraps around the end is contiguous in memory). Each record has
 * an 8-byte header: u32 length (bit 31 = still being written, bit 30 = discarded) and u32 page offset,
 * then the sample, rounded up to 8 bytes. The consumer position is advanced once per drained batch (with
 * release semantics), so producers see the space freed in batches too.
 *
 * Records are `struct obs_event` (obshub/bpf/common.h, 176 bytes). Per kind a table says how a record becomes an
 * obshub event (the msgpack array [kind, ts_ns, duration_ns, trace_key, step, pid, tid, gpu, value,
 * payload] of obshub/core/schema.py):
 *   FMT_PY      (0)  - not here: the raw record is handed to Python (obshub/producer/reader.py Decoder);
 *   FMT_NIL     (1)  - payload nil;
 *   FMT_PHASE   (2)  - payload {"phase": str0};
 *   FMT_COLL    (3)  - payload {"pg": str0, "coll_seq": arg0, "op": str1};
 *   FMT_SCHEDSUM(4)  - payload {"switches": arg0, "wakeups": arg1};
 *   FMT_SCHEDSTEP(5) - SCHED_STEP_SUM: {"switches": arg0, "wakeups": arg1, "runq_max_ns": arg2,
 *                      "offcpu_max_ns": u64 at str1, "runq_hist_us": hist(str0)};
 *   FMT_MEMSTEP (6)  - MEM_STEP_SUM: {"pages": arg0, "stalls": arg1, "stall_max_ns": arg2, "orders": hist(str0)};
 *   FMT_CUDASTEP(7)  - CUDA_STEP_SUM: {"max_ns": arg0, "hist_us": hist(str0)};
 *   hist(b) is the text of a u32[16] little-endian histogram: the counts from bucket 0 in decimal, comma
 *   separated, trailing empty buckets left out ("" when all are empty), as producer.reader.hist_text.
 * Strings must be ASCII here (any other byte sends the record to Python, which decodes UTF-8 with
 * replacement). The bytes are exactly msgpack-python's (smallest int encoding, str8 for use_bin_type), so
 * a batch built from them equals obshub.core.schema.encode_batch of the decoded events.
 *
 * Ring(map_fd, data_size, events=True)  map the ring (data_size: the map's max_entries, a power-of-2
 *                              multiple of the page size); raises OSError. events=False: a ring of the same
 *                              layout in a file (the collective ring of obshub/instrument/_c10d_kernel.cpp,
 *                              a memfd), no epoll (wait() then only sleeps its timeout).
 * Ring.wait(timeout_ms) -> int epoll on the map fd, edge-triggered: > 0 when the kernel signalled since the
 *                              previous wait (records submitted with BPF_RB_NO_WAKEUP do not signal, and
 *                              records already pending do not make it return: call drain anyway).
 * Ring.drain(fmt, max_records, pid=-1) -> list: consumes up to max_records records in order (pid >= 0: the
 *                              pid every packed event carries, whatever its record says); consecutive packed
 *                              records form one tuple (data: bytes, ends: bytes of native u32 end offsets,
 *                              kinds: {kind: count}); a FMT_PY record is a bytes object of its first 176
 *                              bytes. fmt: bytes of 256 format codes, one per kind.
 * Ring.pending() -> int        bytes produced and not yet consumed.
 * Ring.consumed -> int         records consumed since the Ring was made (discarded ones excluded).
 * Ring.close()                 unmap (also on garbage collection).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#define RB_BUSY_BIT (1u << 31)
#define RB_DISCARD_BIT (1u << 30)
#define RB_HDR_SZ 8u

#define EV_SIZE OBS_EVENT_SIZE
#define FMT_PY 0
#define FMT_NIL 1
#define FMT_PHASE 2
#define FMT_COLL 3
#define FMT_SCHEDSUM 4
#define FMT_SCHEDSTEP 5
#define FMT_MEMSTEP 6
#define FMT_CUDASTEP 7

/* struct obs_event: generated from obshub/producer/record.py, the same header the BPF programs include */
#include <linux/types.h>
#include "../bpf/record.h"

typedef struct {
    PyObject_HEAD
    int map_fd;
    int epfd;
    size_t page;
    size_t data_size;
    void *cons_map;
    void *prod_map;
    unsigned long long consumed;
} Ring;

/* ---- msgpack writers (msgpack-python's smallest encodings) -------------------------------------------- */
static inline uint8_t *put_be16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; return p + 2; }
static inline uint8_t *put_be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
    return p + 4;
}
static inline uint8_t *put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    return put_be32(p + 4, (uint32_t)v);
}

static inline uint8_t *pack_u64(uint8_t *p, uint64_t v)
{
    if (v < 128) { *p++ = (uint8_t)v; return p; }
    if (v < 256) { *p++ = 0xcc; *p++ = (uint8_t)v; return p; }
    if (v < 65536) { *p++ = 0xcd; return put_be16(p, (uint16_t)v); }
    if (v <= 0xFFFFFFFFull) { *p++ = 0xce; return put_be32(p, (uint32_t)v); }
    *p++ = 0xcf;
    return put_be64(p, v);
}

static inline uint8_t *pack_i64(uint8_t *p, int64_t v)
{
    if (v >= 0)
        return pack_u64(p, (uint64_t)v);
    if (v >= -32) { *p++ = (uint8_t)(int8_t)v; return p; }
    if (v >= -128) { *p++ = 0xd0; *p++ = (uint8_t)(int8_t)v; return p; }
    if (v >= -32768) { *p++ = 0xd1; return put_be16(p, (uint16_t)(int16_t)v); }
    if (v >= -2147483648ll) { *p++ = 0xd2; return put_be32(p, (uint32_t)(int32_t)v); }
    *p++ = 0xd3;
    return put_be64(p, (uint64_t)v);
}

/* Pack the C string in buf[0..cap) (up to the first NUL); -1 when it is not ASCII. */
static inline int pack_ascii(uint8_t **pp, const char *buf, size_t cap)
{
    size_t n = 0;
    while (n < cap && buf[n]) {
        if ((unsigned char)buf[n] & 0x80)
            return -1;
        n++;
    }
    uint8_t *p = *pp;
    if (n < 32) {
        *p++ = 0xa0 | (uint8_t)n;
    } else {
        *p++ = 0xd9;
        *p++ = (uint8_t)n;
    }
    memcpy(p, buf, n);
    *pp = p + n;
    return 0;
}

static inline uint8_t *pack_key(uint8_t *p, const char *key)
{
    size_t n = strlen(key);
    *p++ = 0xa0 | (uint8_t)n;
    memcpy(p, key, n);
    return p + n;
}

/* Pack the u32[16] little-endian histogram at buf as its text (see FMT_SCHEDSTEP): at most 16 x 10
 * digits + 15 commas = 175 bytes, a str8 when 32 bytes or longer. */
static inline uint8_t *pack_hist(uint8_t *p, const char *buf)
{
    uint32_t c[16];
    memcpy(c, buf, sizeof c);
    int last = 15;
    while (last >= 0 && c[last] == 0)
        last--;
    char text[192];
    size_t n = 0;
    for (int i = 0; i <= last; i++) {
        if (i)
            text[n++] = ',';
        char digits[10];
        int k = 0;
        uint32_t v = c[i];
        do {
            digits[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (k)
            text[n++] = digits[--k];
    }
    if (n < 32) {
        *p++ = 0xa0 | (uint8_t)n;
    } else {
        *p++ = 0xd9;
        *p++ = (uint8_t)n;
    }
    memcpy(p, text, n);
    return p + n;
}

/* Encode one record into p (room for MAX_PACKED bytes); returns the end, or NULL to hand it to Python. */
#define MAX_PACKED 512
static uint8_t *pack_event(uint8_t *p, const struct obs_event *e, int fmt, long long pid)
{
    *p++ = 0x9a; /* fixarray of 10 */
    p = pack_u64(p, e->kind);
    p = pack_u64(p, e->ts_ns);
    p = pack_u64(p, e->duration_ns);
    p = pack_u64(p, e->trace_key);
    p = pack_i64(p, e->step);
    p = pack_u64(p, pid >= 0 ? (uint64_t)pid : e->pid);
    p = pack_u64(p, e->tid);
    *p++ = 0xff; /* gpu = -1 */
    p = pack_i64(p, e->value);
    switch (fmt) {
    case FMT_NIL:
        *p++ = 0xc0;
        break;
    case FMT_PHASE:
        *p++ = 0x81;
        p = pack_key(p, "phase");
        if (pack_ascii(&p, e->str0, sizeof e->str0) < 0)
            return NULL;
        break;
    case FMT_COLL:
        *p++ = 0x83;
        p = pack_key(p, "pg");
        if (pack_ascii(&p, e->str0, sizeof e->str0) < 0)
            return NULL;
        p = pack_key(p, "coll_seq");
        p = pack_u64(p, e->arg0);
        p = pack_key(p, "op");
        if (pack_ascii(&p, e->str1, sizeof e->str1) < 0)
            return NULL;
        break;
    case FMT_SCHEDSUM:
        *p++ = 0x82;
        p = pack_key(p, "switches");
        p = pack_u64(p, e->arg0);
        p = pack_key(p, "wakeups");
        p = pack_u64(p, e->arg1);
        break;
    case FMT_SCHEDSTEP: {
        uint64_t offcpu_max;
        memcpy(&offcpu_max, e->str1, sizeof offcpu_max);
        *p++ = 0x85;
        p = pack_key(p, "switches");
        p = pack_u64(p, e->arg0);
        p = pack_key(p, "wakeups");
        p = pack_u64(p, e->arg1);
        p = pack_key(p, "runq_max_ns");
        p = pack_u64(p, e->arg2);
        p = pack_key(p, "offcpu_max_ns");
        p = pack_u64(p, offcpu_max);
        p = pack_key(p, "runq_hist_us");
        p = pack_hist(p, e->str0);
        break;
    }
    case FMT_MEMSTEP:
        *p++ = 0x84;
        p = pack_key(p, "pages");
        p = pack_u64(p, e->arg0);
        p = pack_key(p, "stalls");
        p = pack_u64(p, e->arg1);
        p = pack_key(p, "stall_max_ns");
        p = pack_u64(p, e->arg2);
        p = pack_key(p, "orders");
        p = pack_hist(p, e->str0);
        break;
    case FMT_CUDASTEP:
        *p++ = 0x82;
        p = pack_key(p, "max_ns");
        p = pack_u64(p, e->arg0);
        p = pack_key(p, "hist_us");
        p = pack_hist(p, e->str0);
        break;
    default:
        return NULL;
    }
    return p;
}

/* ---- the Ring type ------------------------------------------------------------------------------------ */
static void ring_unmap(Ring *r)
{
    if (r->prod_map) {
        munmap(r->prod_map, r->page + 2 * r->data_size);
        r->prod_map = NULL;
    }
    if (r->cons_map) {
        munmap(r->cons_map, r->page);
        r->cons_map = NULL;
    }
    if (r->epfd >= 0) {
        close(r->epfd);
        r->epfd = -1;
    }
}

static int Ring_init(Ring *r, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"map_fd", "data_size", "events", NULL};
    int fd, events = 1;
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "in|p", kwlist, &fd, &size, &events))
        return -1;
    r->page = (size_t)sysconf(_SC_PAGESIZE);
    if (size <= 0 || (size & (size - 1)) || (size_t)size % r->page) {
        PyErr_Format(PyExc_ValueError, "data_size %zd is not a power-of-2 multiple of the page size %zu", size,
                     r->page);
        return -1;
    }
    ring_unmap(r);
    r->map_fd = fd;
    r->data_size = (size_t)size;
    r->consumed = 0;
    r->cons_map = mmap(NULL, r->page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->cons_map == MAP_FAILED) {
        r->cons_map = NULL;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    r->prod_map = mmap(NULL, r->page + 2 * r->data_size, PROT_READ, MAP_SHARED, fd, (off_t)r->page);
    if (r->prod_map == MAP_FAILED) {
        r->prod_map = NULL;
        PyErr_SetFromErrno(PyExc_OSError);
        ring_unmap(r);
        return -1;
    }
    if (!events) /* a ring laid out as the kernel's in a file (obshub/instrument/_c10d_kernel.cpp): no wakeups */
        return 0;
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    /* edge-triggered: a wait returns when the kernel signals (a forced wakeup, see obshub/bpf/common.h) or on its
     * timeout, not merely because records are pending (the ring's poll reports readable whenever it holds
     * anything), so a reader can let records that trickle in gather between drains */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = fd};
    if (r->epfd < 0 || epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        ring_unmap(r);
        return -1;
    }
    return 0;
}

static void Ring_dealloc(Ring *r)
{
    ring_unmap(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Ring *r = (Ring *)type->tp_alloc(type, 0);
    if (r)
        r->epfd = -1;
    return (PyObject *)r;
}

static int ring_check(Ring *r)
{
    if (!r->prod_map) {
        PyErr_SetString(PyExc_ValueError, "the ring is closed");
        return -1;
    }
    return 0;
}

static PyObject *Ring_wait(Ring *r, PyObject *arg)
{
    int timeout = (int)PyLong_AsLong(arg);
    if (timeout == -1 && PyErr_Occurred())
        return NULL;
    if (ring_check(r) < 0)
        return NULL;
    struct epoll_event ev;
    int n;
    Py_BEGIN_ALLOW_THREADS
    if (r->epfd < 0) { /* events=False: nothing signals */
        if (timeout > 0)
            usleep((useconds_t)timeout * 1000);
        n = 0;
    } else
        n = epoll_wait(r->epfd, &ev, 1, timeout);
    Py_END_ALLOW_THREADS
    if (n < 0 && errno != EINTR)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(n < 0 ? 0 : n);
}

static PyObject *Ring_pending(Ring *r, PyObject *unused)
{
    if (ring_check(r) < 0)
        return NULL;
    uint64_t cons = __atomic_load_n((uint64_t *)r->cons_map, __ATOMIC_ACQUIRE);
    uint64_t prod = __atomic_load_n((uint64_t *)r->prod_map, __ATOMIC_ACQUIRE);
    return PyLong_FromUnsignedLongLong(prod - cons);
}

/* Close the open packed run: append (data, ends, kinds) to out. */
static int flush_run(PyObject *out, uint8_t *buf, size_t len, uint32_t *ends, size_t n, uint64_t *kinds,
                     uint16_t *kind_list, size_t nkinds)
{
    if (n == 0)
        return 0;
    PyObject *data = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    PyObject *e = PyBytes_FromStringAndSize((const char *)ends, (Py_ssize_t)(n * sizeof(uint32_t)));
    PyObject *k = PyDict_New();
    int rc = -1;
    if (data && e && k) {
        rc = 0;
        for (size_t i = 0; i < nkinds && rc == 0; i++) {
            PyObject *key = PyLong_FromLong(kind_list[i]);
            PyObject *val = PyLong_FromUnsignedLongLong(kinds[kind_list[i]]);
            if (!key || !val || PyDict_SetItem(k, key, val) < 0)
                rc = -1;
            Py_XDECREF(key);
            Py_XDECREF(val);
            kinds[kind_list[i]] = 0;
        }
        if (rc == 0) {
            PyObject *t = PyTuple_Pack(3, data, e, k);
            rc = (t && PyList_Append(out, t) == 0) ? 0 : -1;
            Py_XDECREF(t);
        }
    }
    Py_XDECREF(data);
    Py_XDECREF(e);
    Py_XDECREF(k);
    return rc;
}

static PyObject *Ring_drain(Ring *r, PyObject *args)
{
    Py_buffer fmtbuf;
    Py_ssize_t max_records;
    long long pid = -1; /* >= 0: the pid of every packed event (a ring a process writes itself: no forging) */
    if (!PyArg_ParseTuple(args, "y*n|L", &fmtbuf, &max_records, &pid))
        return NULL;
    if (fmtbuf.len != 256) {
        PyBuffer_Release(&fmtbuf);
        PyErr_SetString(PyExc_ValueError, "fmt must be 256 bytes (one format code per kind)");
        return NULL;
    }
    if (ring_check(r) < 0) {
        PyBuffer_Release(&fmtbuf);
        return NULL;
    }
    const uint8_t *fmt = fmtbuf.buf;
    PyObject *out = PyList_New(0);
    size_t cap = 1 << 16, len = 0, n = 0, ncap = 1024, nkinds = 0;
    uint8_t *buf = PyMem_Malloc(cap);
    uint32_t *ends = PyMem_Malloc(ncap * sizeof(uint32_t));
    uint64_t kinds[256] = {0};
    uint16_t kind_list[256];
    uint64_t cons = 0;
    int cons_read = 0;
    if (!out || !buf || !ends)
        goto fail;

    uint64_t *cons_pos = (uint64_t *)r->cons_map;
    const uint64_t *prod_pos = (const uint64_t *)r->prod_map;
    const uint8_t *data = (const uint8_t *)r->prod_map + r->page;
    uint64_t mask = r->data_size - 1;
    cons = __atomic_load_n(cons_pos, __ATOMIC_ACQUIRE);
    cons_read = 1;
    Py_ssize_t taken = 0;
    while (taken < max_records) {
        uint64_t prod = __atomic_load_n(prod_pos, __ATOMIC_ACQUIRE);
        if (cons >= prod)
            break;
        int progressed = 0;
        while (cons < prod && taken < max_records) {
            const uint8_t *hdr = data + (cons & mask);
            uint32_t rlen = __atomic_load_n((const uint32_t *)hdr, __ATOMIC_ACQUIRE);
            if (rlen & RB_BUSY_BIT)
                goto done; /* a producer is still writing this record: the next drain takes it */
            progressed = 1;
            uint32_t slen = rlen & ~(RB_BUSY_BIT | RB_DISCARD_BIT);
            cons += (slen + RB_HDR_SZ + 7) & ~7u;
            if (rlen & RB_DISCARD_BIT)
                continue;
            taken++;
            r->consumed++;
            if (slen < EV_SIZE)
                continue; /* not an obs_event (cannot happen with obshub/bpf/common.h); counted, not delivered */
            const struct obs_event *ev = (const struct obs_event *)(hdr + RB_HDR_SZ);
            int f = fmt[ev->kind & 0xFF];
            uint8_t *end = NULL;
            if (f != FMT_PY && ev->kind < 256) {
                if (len + MAX_PACKED > cap) {
                    size_t ncap2 = cap * 2;
                    uint8_t *nb = PyMem_Realloc(buf, ncap2);
                    if (!nb)
                        goto fail;
                    buf = nb;
                    cap = ncap2;
                }
                end = pack_event(buf + len, ev, f, pid);
            }
            if (end) {
                if (n == ncap) {
                    uint32_t *ne = PyMem_Realloc(ends, ncap * 2 * sizeof(uint32_t));
                    if (!ne)
                        goto fail;
                    ends = ne;
                    ncap *= 2;
                }
                len = (size_t)(end - buf);
                ends[n++] = (uint32_t)len;
                if (kinds[ev->kind]++ == 0)
                    kind_list[nkinds++] = ev->kind;
                continue;
            }
            /* handed to Python: close the open run first so the order is kept */
            if (flush_run(out, buf, len, ends, n, kinds, kind_list, nkinds) < 0)
                goto fail;
            len = n = nkinds = 0;
            PyObject *raw = PyBytes_FromStringAndSize((const char *)ev, EV_SIZE);
            if (!raw || PyList_Append(out, raw) < 0) {
                Py_XDECREF(raw);
                goto fail;
            }
            Py_DECREF(raw);
        }
        if (!progressed)
            break;
    }
done:
    __atomic_store_n(cons_pos, cons, __ATOMIC_RELEASE);
    if (flush_run(out, buf, len, ends, n, kinds, kind_list, nkinds) < 0)
        goto fail_released;
    PyMem_Free(buf);
    PyMem_Free(ends);
    PyBuffer_Release(&fmtbuf);
    return out;
fail:
    /* records already taken are consumed (the kernel must not see them twice); the error says so */
    if (cons_read && r->cons_map)
        __atomic_store_n((uint64_t *)r->cons_map, cons, __ATOMIC_RELEASE);
fail_released:
    PyMem_Free(buf);
    PyMem_Free(ends);
    PyBuffer_Release(&fmtbuf);
    Py_XDECREF(out);
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    return NULL;
}

static PyObject *Ring_close(Ring *r, PyObject *unused)
{
    ring_unmap(r);
    Py_RETURN_NONE;
}

static PyObject *Ring_get_consumed(Ring *r, void *closure)
{
    return PyLong_FromUnsignedLongLong(r->consumed);
}

static PyMethodDef Ring_methods[] = {
    {"wait", (PyCFunction)Ring_wait, METH_O, "wait(timeout_ms) -> int: epoll on the ring's map fd."},
    {"drain", (PyCFunction)Ring_drain, METH_VARARGS,
     "drain(fmt: bytes[256], max_records: int) -> list of (data, ends, kinds) runs and raw records."},
    {"pending", (PyCFunction)Ring_pending, METH_NOARGS, "pending() -> int: bytes not yet consumed."},
    {"close", (PyCFunction)Ring_close, METH_NOARGS, "close(): unmap the ring."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"consumed", (getter)Ring_get_consumed, NULL, "records consumed since the Ring was made", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "producer._ring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(map_fd, data_size): batch consumer of a BPF ring buffer (see the module doc).",
    .tp_new = Ring_new,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_methods = Ring_methods,
    .tp_getset = Ring_getset,
};

static struct PyModuleDef ring_module = {
    PyModuleDef_HEAD_INIT, "producer._ring",
    "Batch consumer of the agent's BPF ring buffer: records -> msgpack events in C (see _ring.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__ring(void)
{
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&ring_module);
    if (!m)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "EVENT_SIZE", EV_SIZE);
    PyModule_AddIntConstant(m, "FMT_PY", FMT_PY);
    PyModule_AddIntConstant(m, "FMT_NIL", FMT_NIL);
    PyModule_AddIntConstant(m, "FMT_PHASE", FMT_PHASE);
    PyModule_AddIntConstant(m, "FMT_COLL", FMT_COLL);
    PyModule_AddIntConstant(m, "FMT_SCHEDSUM", FMT_SCHEDSUM);
    PyModule_AddIntConstant(m, "FMT_SCHEDSTEP", FMT_SCHEDSTEP);
    PyModule_AddIntConstant(m, "FMT_MEMSTEP", FMT_MEMSTEP);
    PyModule_AddIntConstant(m, "FMT_CUDASTEP", FMT_CUDASTEP);
    return m;
}
