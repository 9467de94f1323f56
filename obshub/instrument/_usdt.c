/*
 * obshub.instrument._usdt: the USDT probes of obshub's in-process PyTorch instrumentation.
 *
 * Each Python function below fires exactly one USDT probe of provider `obshub` (plain sys/sdt.h
 * DTRACE_PROBEn, no semaphores). With no tracer attached a probe site is a single NOP instruction, so the
 * cost of a call is the CPython call plus argument parsing. A tracer (the obshub agent, bcc) attaches to
 * the path of this shared object (obshub.instrument.usdt.library_path()) and reads the arguments below.
 *
 * Probe arguments (docs/AGENT.md, "In-process instrumentation (USDT)"):
 *   register(const char *job, int32 rank, int32 world_size, int32 host_id, int32 local_rank)
 *   tracekey(uint64 trace_key, int64 step)
 *   step_begin(int64 step, uint64 trace_key)         step_end(int64 step, uint64 trace_key)
 *   phase_begin(const char *phase, int64 step, uint64 trace_key)          phase_end(same)
 *   coll_begin(const char *pg, uint64 coll_seq, const char *op, uint64 bytes, int64 step,
 *              uint64 trace_key)                                           coll_end(same)
 *   phase_next(const char *old_phase, const char *new_phase, int64 step, uint64 old_key, uint64 new_key)
 *   step_next(int64 step, uint64 trace_key, uint64 next_key, const char *old_phase, uint64 old_key,
 *             const char *new_phase, uint64 new_key)
 *   coll(const char *pg, uint64 coll_seq, const char *op, uint64 bytes, int64 step, uint64 trace_key,
 *        uint64 begin_ns, int32 begin_tid)   one collective at its end: coll_begin and coll_end in one
 *        trap (begin_ns: CLOCK_MONOTONIC at its begin, the clock of bpf_ktime_get_ns; begin_tid: the thread
 *        that issued it). The C++ collective kernel fires it instead of coll_begin + tracekey + coll_end
 *        while a tracer is attached to it (issue #34, docs/ARCHITECTURE.md "one trap per collective").
 *        begin_tid < 0: coll_late sent the begin already (-begin_tid is the issuing thread): the end only.
 *   coll_late(same as coll)   a collective of the one-probe path still in flight after 100 ms (a hang, a
 *        straggler's wait): its begin, fired by the C++ kernel's watchdog thread; its `coll` follows with
 *        begin_tid negated.
 *   caught(const char *where)   the instrumentation caught an exception and went on (fired on that path
 *        only: it costs nothing otherwise); the agent counts it by `where` (obshub_agent_caught_errors_total
 *        {where="instrument_<where>"}, docs/METRICS.md)
 *
 * Python signatures take the same arguments in the same order; integers are range-checked by CPython
 * (OverflowError when out of range), strings must be str (UTF-8 is passed to the probe).
 * `_baseline(...)` parses coll_begin's arguments and fires nothing: bench/usdt_overhead.py uses it to
 * show the cost of the probe site itself.
 *
 * Recording (tests): `_record(True)` makes every probe fired through this module's sites, from Python or
 * from the C++ collective kernel (obshub/instrument/_c10d_kernel.cpp, on any thread, without the GIL),
 * also append (probe, args...) to an in-memory log, in firing order; `_recorded()` returns the log as a
 * list of tuples (strings decoded, integers signed or unsigned as the probe argument) and empties it.
 * Off, it costs one load and a not-taken branch per probe. tests/instrument/loops.py reads the framework
 * loops' probes this way, whichever collective kernel fires them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
/* Probe arguments in registers only ("nor" would let the compiler leave coll_begin's six in stack slots,
 * and a tracer pays one user-memory read per argument in memory at every hit; a register is read from
 * the trap's saved registers). */
#define STAP_SDT_ARG_CONSTRAINT r
#include <sys/sdt.h>
/* A probe site is one 5-byte NOP (`nopl 0x0(%rax,%rax,1)`, GNU as's `.nops 5`) instead of sys/sdt.h's
 * 1-byte `nop`. A uprobe on a 1-byte NOP stays an int3 breakpoint: every hit is a trap (an exception with
 * its entry and exit). On a 5-byte NOP, Linux 6.18+ on x86-64 rewrites the site after its first hit into
 * a call to a per-process trampoline that enters the kernel by the `uprobe` system call: the same BPF
 * programs run, for about 140 ns less per hit here (docs/BENCHMARKS.md, section 1). Other kernels trap
 * on it as on a 1-byte NOP; with no tracer attached it costs one NOP either way. The call writes its
 * return address below the stack pointer, so this file is built with -mno-red-zone (setup.py). */
#undef _SDT_NOP
#define _SDT_NOP .nops 5

/* Argument helpers: small, inlined, no allocation. Each returns 0 on success, -1 with an exception set. */
static int
arg_count(const char *fn, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", fn, want, nargs);
        return -1;
    }
    return 0;
}

static int
arg_i64(PyObject *o, int64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int
arg_u64(PyObject *o, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int
arg_i32(PyObject *o, int32_t *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "value %ld does not fit a 32-bit probe argument", v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int
arg_str(PyObject *o, const char **out)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "expected str, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = PyUnicode_AsUTF8(o); /* cached in the str object: no allocation after the first call */
    return *out ? 0 : -1;
}


/* ---- recording (tests): see the header ---- */
#include <pthread.h>
#include <string.h>
#include <stdlib.h>

enum { P_REGISTER, P_TRACEKEY, P_STEP_BEGIN, P_STEP_END, P_PHASE_BEGIN, P_PHASE_END, P_COLL_BEGIN, P_COLL_END,
       P_PHASE_NEXT, P_STEP_NEXT, P_COLL, P_CAUGHT, P_COLL_LATE, P_COUNT };
/* name and argument types (s: string, i: signed, u: unsigned), in the Python functions' order */
static const char *const rec_names[P_COUNT] = {"register", "tracekey", "step_begin", "step_end", "phase_begin",
                                               "phase_end", "coll_begin", "coll_end", "phase_next", "step_next",
                                               "coll", "caught", "coll_late"};
static const char *const rec_fmts[P_COUNT] = {"siiii", "ui", "iu", "iu", "siu", "siu", "susuiu", "susuiu",
                                              "ssiuu", "iuususu", "susuiuui", "s", "susuiuui"};
#define REC_ARGS 8
#define REC_STR 64
struct rec_entry {
    int probe;
    uint64_t v[REC_ARGS];
    char s[3][REC_STR]; /* a probe has at most 3 string arguments, in order */
};
static volatile int recording;
static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rec_entry *rec_log;
static size_t rec_len, rec_cap;

/* Append one record; vals[i] is the argument (a string argument: its pointer). Any thread, no GIL. */
__attribute__((noinline, cold)) static void
rec_push(int probe, const uint64_t *vals)
{
    pthread_mutex_lock(&rec_mu);
    if (rec_len == rec_cap) {
        size_t cap = rec_cap ? rec_cap * 2 : 1024;
        struct rec_entry *grown = realloc(rec_log, cap * sizeof(*grown));
        if (grown == NULL) { /* out of memory: this record is lost (tests only) */
            pthread_mutex_unlock(&rec_mu);
            return;
        }
        rec_log = grown;
        rec_cap = cap;
    }
    struct rec_entry *e = &rec_log[rec_len++];
    memset(e, 0, sizeof(*e));
    e->probe = probe;
    int ns = 0;
    for (int i = 0; rec_fmts[probe][i]; i++) {
        if (rec_fmts[probe][i] == 's') {
            const char *str = (const char *)(uintptr_t)vals[i];
            if (str)
                strncpy(e->s[ns], str, REC_STR - 1);
            ns++;
        } else {
            e->v[i] = vals[i];
        }
    }
    pthread_mutex_unlock(&rec_mu);
}

#define REC(probe, ...)                                                                                        \
    do {                                                                                                       \
        if (__builtin_expect(recording, 0)) {                                                                  \
            const uint64_t rec_vals_[] = {__VA_ARGS__};                                                        \
            rec_push(probe, rec_vals_);                                                                        \
        }                                                                                                      \
    } while (0)
#define RS(p) ((uint64_t)(uintptr_t)(p))

static PyObject *
usdt_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (arg_count("_record", nargs, 1))
        return NULL;
    int on = PyObject_IsTrue(args[0]);
    if (on < 0)
        return NULL;
    recording = on;
    Py_RETURN_NONE;
}

static PyObject *
usdt_recorded(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (arg_count("_recorded", nargs, 0))
        return NULL;
    pthread_mutex_lock(&rec_mu);
    struct rec_entry *log = rec_log;
    size_t len = rec_len;
    rec_log = NULL;
    rec_len = rec_cap = 0;
    pthread_mutex_unlock(&rec_mu);
    PyObject *out = PyList_New((Py_ssize_t)len);
    for (size_t k = 0; out != NULL && k < len; k++) {
        const struct rec_entry *e = &log[k];
        const char *fmt = rec_fmts[e->probe];
        Py_ssize_t n = (Py_ssize_t)strlen(fmt);
        PyObject *t = PyTuple_New(n + 1);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(t, 0, PyUnicode_FromString(rec_names[e->probe]));
        int ns = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = fmt[i] == 's'   ? PyUnicode_DecodeUTF8(e->s[ns], (Py_ssize_t)strlen(e->s[ns]), "replace")
                             : fmt[i] == 'i' ? PyLong_FromLongLong((long long)(int64_t)e->v[i])
                                             : PyLong_FromUnsignedLongLong(e->v[i]);
            ns += fmt[i] == 's';
            PyTuple_SET_ITEM(t, i + 1, item);
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, t);
    }
    free(log);
    return out;
}

static PyObject *
usdt_register(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *job;
    int32_t rank, world_size, host_id, local_rank;
    if (arg_count("register", nargs, 5) || arg_str(args[0], &job) || arg_i32(args[1], &rank) ||
        arg_i32(args[2], &world_size) || arg_i32(args[3], &host_id) || arg_i32(args[4], &local_rank))
        return NULL;
    DTRACE_PROBE5(obshub, register, job, rank, world_size, host_id, local_rank);
    REC(P_REGISTER, RS(job), (uint64_t)(int64_t)rank, (uint64_t)(int64_t)world_size, (uint64_t)(int64_t)host_id,
        (uint64_t)(int64_t)local_rank);
    Py_RETURN_NONE;
}

/* The sites of tracekey, coll_begin and coll_end, one each: the Python functions below and the C++ c10d
 * kernel (obshub/instrument/_c10d_kernel.cpp, through the capsule `_C_API`) fire them alike, so a tracer
 * sees one site per probe, whoever fires it. Never inlined nor cloned (noipa): the site stays unique. */
__attribute__((noipa)) static void
fire_tracekey(uint64_t key, int64_t step)
{
    DTRACE_PROBE2(obshub, tracekey, key, step);
    REC(P_TRACEKEY, key, (uint64_t)step);
}

__attribute__((noipa)) static void
fire_coll_begin(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key)
{
    DTRACE_PROBE6(obshub, coll_begin, pg, seq, op, bytes, step, key);
    REC(P_COLL_BEGIN, RS(pg), seq, RS(op), bytes, (uint64_t)step, key);
}

__attribute__((noipa)) static void
fire_coll_end(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key)
{
    DTRACE_PROBE6(obshub, coll_end, pg, seq, op, bytes, step, key);
    REC(P_COLL_END, RS(pg), seq, RS(op), bytes, (uint64_t)step, key);
}

/* One collective in one probe, at its end (see the header); eight arguments, all in registers. */
__attribute__((noipa)) static void
fire_coll(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key,
          uint64_t begin_ns, int32_t begin_tid)
{
    DTRACE_PROBE8(obshub, coll, pg, seq, op, bytes, step, key, begin_ns, begin_tid);
    REC(P_COLL, RS(pg), seq, RS(op), bytes, (uint64_t)step, key, begin_ns, (uint64_t)(int64_t)begin_tid);
}

/* A collective of the one-probe path still in flight (see the header): its begin. */
__attribute__((noipa)) static void
fire_coll_late(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key,
               uint64_t begin_ns, int32_t begin_tid)
{
    DTRACE_PROBE8(obshub, coll_late, pg, seq, op, bytes, step, key, begin_ns, begin_tid);
    REC(P_COLL_LATE, RS(pg), seq, RS(op), bytes, (uint64_t)step, key, begin_ns, (uint64_t)(int64_t)begin_tid);
}

/* Is a tracer attached at the `coll` site (see usdt_site_traced)? Its address comes from Python
 * (`_set_coll_site`, from the ELF note: obshub.instrument.usdt.probe_site); 0: unknown, never traced.
 * `_force_coll(True)` (tests) makes it answer yes without a tracer, so the recording shows the one-probe
 * path. One byte load per collective. */
static volatile uintptr_t coll_site;
static volatile int coll_forced;

static int
coll_traced(void)
{
    if (__builtin_expect(coll_forced, 0))
        return 1;
#if defined(__x86_64__)
    uintptr_t addr = coll_site;
    if (addr) {
        unsigned char first = *(volatile const unsigned char *)addr;
        return first == 0xCC || first == 0xE8 || first == 0xE9;
    }
#endif
    return 0;
}

/* What `_C_API` (a PyCapsule named "obshub.instrument._usdt._C_API") points to; _c10d_kernel.cpp declares
 * the same struct. Version 2 (1 plus coll, coll_traced and coll_late). */
struct obshub_usdt_api {
    int version;
    void (*tracekey)(uint64_t key, int64_t step);
    void (*coll_begin)(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key);
    void (*coll_end)(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key);
    void (*coll)(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key,
                 uint64_t begin_ns, int32_t begin_tid);
    int (*coll_traced)(void);
    void (*coll_late)(const char *pg, uint64_t seq, const char *op, uint64_t bytes, int64_t step, uint64_t key,
                      uint64_t begin_ns, int32_t begin_tid);
};

static struct obshub_usdt_api usdt_api = {2, fire_tracekey, fire_coll_begin, fire_coll_end, fire_coll,
                                          coll_traced, fire_coll_late};

static PyObject *
usdt_tracekey(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t key;
    int64_t step;
    if (arg_count("tracekey", nargs, 2) || arg_u64(args[0], &key) || arg_i64(args[1], &step))
        return NULL;
    fire_tracekey(key, step);
    Py_RETURN_NONE;
}

static PyObject *
usdt_caught(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *where;
    if (arg_count("caught", nargs, 1) || arg_str(args[0], &where))
        return NULL;
    DTRACE_PROBE1(obshub, caught, where);
    REC(P_CAUGHT, RS(where));
    Py_RETURN_NONE;
}

static PyObject *
usdt_step_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t step;
    uint64_t key;
    if (arg_count("step_begin", nargs, 2) || arg_i64(args[0], &step) || arg_u64(args[1], &key))
        return NULL;
    DTRACE_PROBE2(obshub, step_begin, step, key);
    REC(P_STEP_BEGIN, (uint64_t)step, key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_step_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t step;
    uint64_t key;
    if (arg_count("step_end", nargs, 2) || arg_i64(args[0], &step) || arg_u64(args[1], &key))
        return NULL;
    DTRACE_PROBE2(obshub, step_end, step, key);
    REC(P_STEP_END, (uint64_t)step, key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_phase_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *phase;
    int64_t step;
    uint64_t key;
    if (arg_count("phase_begin", nargs, 3) || arg_str(args[0], &phase) || arg_i64(args[1], &step) ||
        arg_u64(args[2], &key))
        return NULL;
    DTRACE_PROBE3(obshub, phase_begin, phase, step, key);
    REC(P_PHASE_BEGIN, RS(phase), (uint64_t)step, key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_phase_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *phase;
    int64_t step;
    uint64_t key;
    if (arg_count("phase_end", nargs, 3) || arg_str(args[0], &phase) || arg_i64(args[1], &step) ||
        arg_u64(args[2], &key))
        return NULL;
    DTRACE_PROBE3(obshub, phase_end, phase, step, key);
    REC(P_PHASE_END, RS(phase), (uint64_t)step, key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_phase_next(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *old_phase, *new_phase;
    int64_t step;
    uint64_t old_key, new_key;
    if (arg_count("phase_next", nargs, 5) || arg_str(args[0], &old_phase) || arg_str(args[1], &new_phase) ||
        arg_i64(args[2], &step) || arg_u64(args[3], &old_key) || arg_u64(args[4], &new_key))
        return NULL;
    DTRACE_PROBE5(obshub, phase_next, old_phase, new_phase, step, old_key, new_key);
    REC(P_PHASE_NEXT, RS(old_phase), RS(new_phase), (uint64_t)step, old_key, new_key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_step_next(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const char *old_phase, *new_phase;
    int64_t step;
    uint64_t key, next_key, old_key, new_key;
    if (arg_count("step_next", nargs, 7) || arg_i64(args[0], &step) || arg_u64(args[1], &key) ||
        arg_u64(args[2], &next_key) || arg_str(args[3], &old_phase) || arg_u64(args[4], &old_key) ||
        arg_str(args[5], &new_phase) || arg_u64(args[6], &new_key))
        return NULL;
    DTRACE_PROBE7(obshub, step_next, step, key, next_key, old_phase, old_key, new_phase, new_key);
    REC(P_STEP_NEXT, (uint64_t)step, key, next_key, RS(old_phase), old_key, RS(new_phase), new_key);
    Py_RETURN_NONE;
}

/* coll_begin / coll_end / _baseline share one parser. */
struct coll_args {
    const char *pg, *op;
    uint64_t seq, bytes, key;
    int64_t step;
};

static int
parse_coll(const char *fn, PyObject *const *args, Py_ssize_t nargs, struct coll_args *a)
{
    if (arg_count(fn, nargs, 6) || arg_str(args[0], &a->pg) || arg_u64(args[1], &a->seq) ||
        arg_str(args[2], &a->op) || arg_u64(args[3], &a->bytes) || arg_i64(args[4], &a->step) ||
        arg_u64(args[5], &a->key))
        return -1;
    return 0;
}

static PyObject *
usdt_coll_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct coll_args a;
    if (parse_coll("coll_begin", args, nargs, &a))
        return NULL;
    fire_coll_begin(a.pg, a.seq, a.op, a.bytes, a.step, a.key);
    Py_RETURN_NONE;
}

/* coll_end also takes a 7th argument and ignores it: a Future's done-callback is called with the future,
 * so functools.partial(coll_end, *token) is the callback itself, with no Python frame in between. */
static PyObject *
usdt_coll_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct coll_args a;
    if (parse_coll("coll_end", args, nargs == 7 ? 6 : nargs, &a))
        return NULL;
    fire_coll_end(a.pg, a.seq, a.op, a.bytes, a.step, a.key);
    Py_RETURN_NONE;
}

static PyObject *
usdt_set_coll_site(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t addr;
    if (arg_count("_set_coll_site", nargs, 1) || arg_u64(args[0], &addr))
        return NULL;
    coll_site = (uintptr_t)addr;
    Py_RETURN_NONE;
}

static PyObject *
usdt_force_coll(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (arg_count("_force_coll", nargs, 1))
        return NULL;
    int on = PyObject_IsTrue(args[0]);
    if (on < 0)
        return NULL;
    coll_forced = on;
    Py_RETURN_NONE;
}

static PyObject *
usdt_coll_traced(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (arg_count("coll_traced", nargs, 0))
        return NULL;
    return PyBool_FromLong(coll_traced());
}

static PyObject *
usdt_coll_late(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct coll_args a;
    uint64_t begin_ns;
    int32_t begin_tid;
    if (arg_count("coll_late", nargs, 8) || parse_coll("coll_late", args, 6, &a) || arg_u64(args[6], &begin_ns) ||
        arg_i32(args[7], &begin_tid))
        return NULL;
    fire_coll_late(a.pg, a.seq, a.op, a.bytes, a.step, a.key, begin_ns, begin_tid);
    Py_RETURN_NONE;
}

static PyObject *
usdt_coll(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct coll_args a;
    uint64_t begin_ns;
    int32_t begin_tid;
    if (arg_count("coll", nargs, 8) || parse_coll("coll", args, 6, &a) || arg_u64(args[6], &begin_ns) ||
        arg_i32(args[7], &begin_tid))
        return NULL;
    fire_coll(a.pg, a.seq, a.op, a.bytes, a.step, a.key, begin_ns, begin_tid);
    Py_RETURN_NONE;
}

/* site_traced(address) -> bool: is a tracer attached at the probe site at `address` (usdt.probe_site)? On
 * x86-64 a uprobe puts int3 (0xCC) there, and Linux 6.18+ rewrites it into CALL/JMP rel32 (0xE8/0xE9) into
 * its trampoline after the first hit; an untraced 5-byte NOP starts with 0x0F. One byte read, ~40 ns from
 * Python (ctypes.string_at took ~400 ns); the hooks read three sites at every step boundary. Always False
 * elsewhere. The address must be a probe site of this mapped object (no check: a wrong one faults). */
static PyObject *
usdt_site_traced(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t addr;
    if (arg_count("site_traced", nargs, 1) || arg_u64(args[0], &addr))
        return NULL;
#if defined(__x86_64__)
    unsigned char first = *(volatile const unsigned char *)(uintptr_t)addr;
    if (first == 0xCC || first == 0xE8 || first == 0xE9)
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyObject *
usdt_baseline(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct coll_args a;
    if (parse_coll("_baseline", args, nargs, &a))
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef usdt_methods[] = {
    {"register", (PyCFunction)(void (*)(void))usdt_register, METH_FASTCALL,
     "register(job: str, rank: int, world_size: int, host_id: int, local_rank: int) -> None\n"
     "Fire obshub:register (once per process)."},
    {"tracekey", (PyCFunction)(void (*)(void))usdt_tracekey, METH_FASTCALL,
     "tracekey(trace_key: int, step: int) -> None\nFire obshub:tracekey (the thread's TraceKey changed)."},
    {"step_begin", (PyCFunction)(void (*)(void))usdt_step_begin, METH_FASTCALL,
     "step_begin(step: int, trace_key: int) -> None\nFire obshub:step_begin."},
    {"step_end", (PyCFunction)(void (*)(void))usdt_step_end, METH_FASTCALL,
     "step_end(step: int, trace_key: int) -> None\nFire obshub:step_end."},
    {"phase_begin", (PyCFunction)(void (*)(void))usdt_phase_begin, METH_FASTCALL,
     "phase_begin(phase: str, step: int, trace_key: int) -> None\nFire obshub:phase_begin."},
    {"phase_end", (PyCFunction)(void (*)(void))usdt_phase_end, METH_FASTCALL,
     "phase_end(phase: str, step: int, trace_key: int) -> None\nFire obshub:phase_end."},
    {"coll_begin", (PyCFunction)(void (*)(void))usdt_coll_begin, METH_FASTCALL,
     "coll_begin(pg: str, coll_seq: int, op: str, bytes: int, step: int, trace_key: int) -> None\n"
     "Fire obshub:coll_begin."},
    {"coll_end", (PyCFunction)(void (*)(void))usdt_coll_end, METH_FASTCALL,
     "coll_end(pg: str, coll_seq: int, op: str, bytes: int, step: int, trace_key: int[, ignored]) -> None\n"
     "Fire obshub:coll_end (a 7th argument, the future of a done-callback, is ignored)."},
    {"phase_next", (PyCFunction)(void (*)(void))usdt_phase_next, METH_FASTCALL,
     "phase_next(old_phase: str, new_phase: str, step: int, old_key: int, new_key: int) -> None\n"
     "Fire obshub:phase_next (the open phase ends and the next begins)."},
    {"step_next", (PyCFunction)(void (*)(void))usdt_step_next, METH_FASTCALL,
     "step_next(step: int, trace_key: int, next_key: int, old_phase: str, old_key: int, new_phase: str, "
     "new_key: int) -> None\n"
     "Fire obshub:step_next (phase, step end; next step, phase begin)."},
    {"caught", (PyCFunction)(void (*)(void))usdt_caught, METH_FASTCALL,
     "caught(where: str) -> None\nFire obshub:caught (the instrumentation caught an exception at `where` and went "
     "on)."},
    {"coll", (PyCFunction)(void (*)(void))usdt_coll, METH_FASTCALL,
     "coll(pg: str, coll_seq: int, op: str, bytes: int, step: int, trace_key: int, begin_ns: int, begin_tid: int)"
     " -> None\nFire obshub:coll (one collective at its end: begin time CLOCK_MONOTONIC ns, issuing thread)."},
    {"coll_late", (PyCFunction)(void (*)(void))usdt_coll_late, METH_FASTCALL,
     "coll_late(pg, coll_seq, op, bytes, step, trace_key, begin_ns, begin_tid) -> None\nFire obshub:coll_late (a "
     "collective still in flight: its begin)."},
    {"coll_traced", (PyCFunction)(void (*)(void))usdt_coll_traced, METH_FASTCALL,
     "coll_traced() -> bool\nIs a tracer attached at the coll site (set by _set_coll_site), or _force_coll on?"},
    {"_set_coll_site", (PyCFunction)(void (*)(void))usdt_set_coll_site, METH_FASTCALL,
     "_set_coll_site(address: int) -> None\nThe coll probe's site in this process (usdt.probe_site('coll'))."},
    {"_force_coll", (PyCFunction)(void (*)(void))usdt_force_coll, METH_FASTCALL,
     "_force_coll(on: bool) -> None\nTests: coll_traced() answers True without a tracer (the one-probe path)."},
    {"site_traced", (PyCFunction)(void (*)(void))usdt_site_traced, METH_FASTCALL,
     "site_traced(address: int) -> bool\nIs a tracer attached at the probe site at `address` (x86-64)?"},
    {"_record", (PyCFunction)(void (*)(void))usdt_record, METH_FASTCALL,
     "_record(on: bool) -> None\nStart or stop recording every probe fired (tests; read with _recorded())."},
    {"_recorded", (PyCFunction)(void (*)(void))usdt_recorded, METH_FASTCALL,
     "_recorded() -> list[tuple]\nThe probes recorded since the last call, in firing order: (probe, *args); "
     "empties the log."},
    {"_baseline", (PyCFunction)(void (*)(void))usdt_baseline, METH_FASTCALL,
     "_baseline(pg, coll_seq, op, bytes, step, trace_key) -> None\n"
     "Parse coll_begin's arguments and fire nothing (benchmark baseline)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef usdt_module = {
    PyModuleDef_HEAD_INIT, "obshub.instrument._usdt",
    "USDT probes (provider `obshub`) of obshub's in-process PyTorch instrumentation.", -1, usdt_methods,
};

PyMODINIT_FUNC
PyInit__usdt(void)
{
    PyObject *m = PyModule_Create(&usdt_module);
    if (m == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New(&usdt_api, "obshub.instrument._usdt._C_API", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
