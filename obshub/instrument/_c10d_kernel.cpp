/*
 * obshub.instrument._c10d_kernel: obshub's collective hook as a C++ kernel at the BackendSelect key of the
 * c10d dispatcher ops (the same job as the Python kernel of obshub/instrument/hooks.py, _make_kernel, which
 * stays the fallback when this extension is absent or failed to build).
 *
 * Why C++ (issue #34, docs/ARCHITECTURE.md "collective kernel"): a Python kernel at the dispatcher costs
 * ~12-16 µs per op before it does anything (boxing the arguments into Python objects, taking the GIL,
 * redispatching from Python), and ~55-70 µs per op inside DDP's backward, where the reducer issues each
 * bucket's all-reduce from the autograd engine with the GIL released. This kernel is boxed (one function
 * for every op; the dispatcher's IValue stack, no Python object) and never takes the GIL: it counts the
 * collective, fires coll_begin, redispatches to the keys after BackendSelect, restores the thread's key
 * (tracekey) and fires coll_end when the returned Work's future completes (a C++ callback on the thread that
 * completes it: gloo's), all through the probe sites of obshub.instrument._usdt (its capsule `_C_API`), so
 * the agent sees the same sites and the same arguments as from the Python kernel.
 *
 * One trap per collective (issue #34): while a tracer is attached at the `coll` probe site (a byte read,
 * _usdt's coll_traced), the kernel fires no coll_begin and no tracekey: it takes the begin time
 * (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns) and the issuing thread's id, and fires one `coll` at the
 * end with them; the agent's program (obshub/bpf/pytorch.c obs_usdt_coll) makes the same COLLECTIVE_BEGIN
 * and COLLECTIVE_END records from it. Not traced, it fires the three probes as before, so a tracer that
 * attaches only coll_begin/coll_end still sees every collective. A collective still in flight after 100 ms
 * gets its begin from a watchdog thread (`coll_late`, see "in flight" below), so a hang still shows who
 * arrived.
 *
 * Shared with hooks.py (which owns steps and phases): the step, the step's op counter (op_seq: phases
 * and collectives count in one sequence), the host id, and a per-thread mirror of the thread's TraceKey.
 * hooks.py calls set_state() when it begins or ends a step, next_op() for a phase's op_seq and
 * set_thread_key() when a thread's key changes. Built by `make setup` (obshub/instrument/native_build.py).
 *
 * Python API (module functions, METH_FASTCALL):
 *   install(ops) ops: list of (name, probe_name, pg_index, peer_index|-1, any_source, size_index|-1)
 *   uninstall()                       set_state(step, op_seq, host_id)       next_op() -> op_seq
 *   reset_coll_seq()                  set_thread_key(trace_key, step)        calls() -> kernel calls
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

struct obshub_usdt_api {  // obshub/instrument/_usdt.c, version 2
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

const obshub_usdt_api *api = nullptr;

struct OpInfo {
    std::string probe;  // the torch.distributed name the probe carries
    int pg_index, peer_index, size_index;
    bool any_source;
};

// the shared state: guarded by mu (never held across the redispatch)
std::mutex mu;
int64_t g_step = -1;
uint32_t g_op_seq = 0;
uint64_t g_host = 0;
std::unordered_map<std::string, uint64_t> g_coll_seq;

std::unordered_map<std::string, OpInfo> g_ops;  // written by install() only, before any kernel runs
std::unique_ptr<torch::Library> g_lib;
std::atomic<uint64_t> g_calls{0};

thread_local uint64_t t_key = 0;
thread_local int64_t t_step = -1;
thread_local bool t_in_coll = false;
thread_local int32_t t_tid = 0;  // the thread's id (gettid), cached at its first collective

inline uint64_t monotonic_ns() {  // the clock of bpf_ktime_get_ns (vDSO: no system call)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

inline uint64_t make_key(int64_t step, uint32_t op_seq) {
    uint64_t step16 = step < 0 ? 0xFFFF : (uint64_t)(step & 0xFFFF);
    return (g_host << 48) | (step16 << 32) | op_seq;
}

uint64_t ivalue_bytes(const c10::IValue &v, int depth = 0) {
    if (v.isTensor())
        return v.toTensor().defined() ? v.toTensor().nbytes() : 0;
    if (v.isTensorList()) {
        uint64_t n = 0;
        for (const at::Tensor &t : v.toTensorList().vec())
            n += t.defined() ? t.nbytes() : 0;
        return n;
    }
    if (v.isList() && depth < 2) {
        uint64_t n = 0;
        for (const c10::IValue &item : v.toListRef())
            n += ivalue_bytes(item, depth + 1);
        return n;
    }
    return 0;
}

// the first tensor among the op's arguments (tensor, list of tensors, list of lists), else nullptr
const at::Tensor *first_tensor(const c10::IValue &v, int depth = 0) {
    if (v.isTensor())
        return &v.toTensor();
    if (v.isList() && depth < 2)
        for (const c10::IValue &item : v.toListRef()) {
            const at::Tensor *t = first_tensor(item, depth + 1);
            if (t)
                return t;
        }
    return nullptr;
}

const c10::DispatchKeySet after_backend_select(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

// ---- the one-probe path's collectives in flight, and the watchdog that announces the late ones ----
// A collective of the one-probe path fires nothing until it ends; one still in flight after kLateNs (a
// hang, a rank waiting for a straggler) would show no COLLECTIVE_BEGIN, which the analysis reads as "not
// arrived" (docs/ANALYSIS.md "Hangs"). So each is registered while in flight, and a watchdog thread
// (started at the first such collective, waking every kLateNs) fires `coll_late` (its begin, with the
// begin time and thread) for each one older than kLateNs; its `coll` then carries the thread id negated
// (the end only). coll_late fires under fly_mu, and the end reads `announced` under it and fires after.
struct Flight {
    std::shared_ptr<std::pair<std::string, std::string>> token;  // process group name, probe name
    uint64_t seq, nbytes;
    int64_t step;
    uint64_t key, begin;
    int32_t tid;
    bool announced;
    // in the in-flight list (under fly_mu): neighbours, and itself kept alive while listed (a Work dropped
    // unfinished drops the callback that holds the other reference)
    Flight *prev, *next;
    std::shared_ptr<Flight> self;
};

constexpr uint64_t kLateNs = 100000000ull;  // 100 ms: a hang needs >= 500 ms (hang_state_wait_ns)
// never destroyed: the watchdog may still run while the process exits. An intrusive list: adding and
// removing a collective is a few stores under the lock, no allocation there (the lock is short: the thread
// that completes one collective and the one that issues the next meet on it)
std::mutex &fly_mu = *new std::mutex;
Flight *g_fly_head = nullptr;
std::once_flag g_watchdog_once;

void watchdog() {
    for (;;) {
        struct timespec ts = {0, (long)kLateNs};
        nanosleep(&ts, nullptr);
        const uint64_t now = monotonic_ns();
        std::lock_guard<std::mutex> lock(fly_mu);  // coll_late fires under it: its coll comes after
        for (Flight *f = g_fly_head; f != nullptr; f = f->next) {
            if (!f->announced && now - f->begin >= kLateNs) {
                f->announced = true;
                api->coll_late(f->token->first.c_str(), f->seq, f->token->second.c_str(), f->nbytes, f->step, f->key,
                               f->begin, f->tid);
            }
        }
    }
}

void fly_add(const std::shared_ptr<Flight> &f) {
    std::call_once(g_watchdog_once, [] { std::thread(watchdog).detach(); });
    std::lock_guard<std::mutex> lock(fly_mu);
    f->self = f;
    f->prev = nullptr;
    f->next = g_fly_head;
    if (g_fly_head != nullptr)
        g_fly_head->prev = f.get();
    g_fly_head = f.get();
}

void fly_end(const std::shared_ptr<Flight> &f) {
    bool announced;
    {
        std::lock_guard<std::mutex> lock(fly_mu);
        if (f->prev != nullptr)
            f->prev->next = f->next;
        else
            g_fly_head = f->next;
        if (f->next != nullptr)
            f->next->prev = f->prev;
        announced = f->announced;
        f->self.reset();  // f (the caller's reference) keeps it alive until this returns
    }
    // outside the lock: a coll_late for it, if any, fired before the lock was released
    api->coll(f->token->first.c_str(), f->seq, f->token->second.c_str(), f->nbytes, f->step, f->key, f->begin,
              announced ? -f->tid : f->tid);
}

// the future of the Work the op returned (top of the stack), or null (none: a coalesced Work; end = enqueue)
c10::intrusive_ptr<c10::ivalue::Future> work_future(const torch::jit::Stack *stack) {
    const c10::IValue &ret = stack->empty() ? c10::IValue() : stack->back();
    try {
        if (ret.isCustomClass())
            return ret.toCustomClass<c10d::Work>()->getFuture();
    } catch (const std::exception &) {
    }
    return c10::intrusive_ptr<c10::ivalue::Future>();
}

void kernel(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
    const c10::DispatchKeySet keys = ks & after_backend_select;
    if (t_in_coll || api == nullptr) {  // an op issued inside another: the backend's kernel alone
        op.redispatchBoxed(keys, stack);
        return;
    }
    const size_t nargs = op.schema().arguments().size();
    auto found = g_ops.find(op.schema().name().substr(6));  // "c10d::" + name
    const at::Tensor *tensor = nullptr;
    for (size_t i = 0; i < nargs && tensor == nullptr; i++)
        tensor = first_tensor(torch::jit::peek(*stack, i, nargs));
    // tracing (fake tensors and tensor subclasses carry the Python key; meta tensors): not counted
    if (found == g_ops.end() ||
        (tensor != nullptr && (tensor->is_meta() || tensor->key_set().has(c10::DispatchKey::Python)))) {
        op.redispatchBoxed(keys, stack);
        return;
    }
    const OpInfo &info = found->second;
    std::string name;
    uint64_t nbytes = 0;
    try {
        auto pg = torch::jit::peek(*stack, info.pg_index, nargs).toCustomClass<c10d::ProcessGroup>();
        name = pg->getGroupName();
        if (info.peer_index >= 0) {
            int64_t peer = torch::jit::peek(*stack, info.peer_index, nargs).toInt(), me = pg->getRank();
            name += ":p2p:" + std::to_string(std::min(peer, me)) + "-" + std::to_string(std::max(peer, me));
        } else if (info.any_source) {
            name += ":p2p:any";
        }
        if (info.size_index >= 0)
            nbytes = ivalue_bytes(torch::jit::peek(*stack, info.size_index, nargs));
    } catch (const std::exception &) {  // let PyTorch raise its own error, or run it unseen
        op.redispatchBoxed(keys, stack);
        return;
    }
    uint64_t seq, key;
    int64_t step;
    {
        std::lock_guard<std::mutex> lock(mu);
        uint64_t &count = g_coll_seq[name];
        seq = count++;
        step = g_step;
        key = make_key(step, ++g_op_seq);
    }
    g_calls.fetch_add(1, std::memory_order_relaxed);
    // the strings the probes point to live as long as the collective: the callback owns copies (a later
    // install() replaces g_ops while a collective may still be running)
    auto token = std::make_shared<std::pair<std::string, std::string>>(std::move(name), info.probe);
    const char *pg_name = token->first.c_str(), *probe = token->second.c_str();
    if (api->coll_traced()) {  // one trap, at the end: begin time and thread travel with it
        if (t_tid == 0)
            t_tid = (int32_t)syscall(SYS_gettid);
        auto fly = std::make_shared<Flight>(
            Flight{token, seq, nbytes, step, key, monotonic_ns(), t_tid, false, nullptr, nullptr, nullptr});
        fly_add(fly);
        t_in_coll = true;
        try {
            op.redispatchBoxed(keys, stack);
        } catch (...) {
            t_in_coll = false;
            fly_end(fly);  // a failed collective ends where it failed
            throw;
        }
        t_in_coll = false;
        c10::intrusive_ptr<c10::ivalue::Future> fut = work_future(stack);
        if (!fut || fut->completed()) {
            fly_end(fly);
            return;
        }
        fut->addCallback([fly](c10::ivalue::Future &) { fly_end(fly); });
        return;
    }
    const uint64_t prev_key = t_key;
    const int64_t prev_step = t_step;
    api->coll_begin(pg_name, seq, probe, nbytes, step, key);
    t_in_coll = true;
    try {
        op.redispatchBoxed(keys, stack);
    } catch (...) {
        t_in_coll = false;
        api->tracekey(prev_key, prev_step);
        api->coll_end(pg_name, seq, probe, nbytes, step, key);  // a failed collective ends where it failed
        throw;
    }
    t_in_coll = false;
    api->tracekey(prev_key, prev_step);  // the thread's key is its own again (coll_begin carried the op's)
    c10::intrusive_ptr<c10::ivalue::Future> fut = work_future(stack);
    if (!fut || fut->completed()) {  // a synchronous op; NCCL completes its future at enqueue
        api->coll_end(pg_name, seq, probe, nbytes, step, key);
        return;
    }
    // run by the thread that completes the work (gloo's), without the GIL
    fut->addCallback([token, seq, nbytes, step, key](c10::ivalue::Future &) {
        api->coll_end(token->first.c_str(), seq, token->second.c_str(), nbytes, step, key);
    });
}

// ---------------------------------------------------------------------------------------------------------
// Python functions
// ---------------------------------------------------------------------------------------------------------
bool load_api() {
    if (api == nullptr)
        api = static_cast<const obshub_usdt_api *>(PyCapsule_Import("obshub.instrument._usdt._C_API", 0));
    if (api == nullptr)
        return false;
    if (api->version != 2) {
        PyErr_Format(PyExc_ImportError, "obshub.instrument._usdt _C_API version %d, want 2", api->version);
        api = nullptr;
        return false;
    }
    return true;
}

PyObject *py_install(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "install(ops: list of (name, probe, pg_index, peer_index, any_source, "
                                         "size_index))");
        return NULL;
    }
    if (g_lib) {
        PyErr_SetString(PyExc_RuntimeError, "the c10d kernels are installed already");
        return NULL;
    }
    std::unordered_map<std::string, OpInfo> ops;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        const char *name, *probe;
        int pg, peer, any, size;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(args[0], i), "ssiipi", &name, &probe, &pg, &peer, &any, &size))
            return NULL;
        ops[name] = OpInfo{probe, pg, peer, size, any != 0};
    }
    try {
        g_ops = std::move(ops);
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d",
                                                    std::optional<c10::DispatchKey>(c10::DispatchKey::BackendSelect),
                                                    __FILE__, __LINE__);
        for (const auto &entry : g_ops)
            lib->impl(entry.first.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
        g_lib = std::move(lib);
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "registering the c10d kernels failed: %s", e.what());
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *py_uninstall(PyObject *, PyObject *const *, Py_ssize_t) {
    g_lib.reset();  // deregisters every kernel
    Py_RETURN_NONE;
}

PyObject *py_set_state(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_state(step, op_seq, host_id)");
        return NULL;
    }
    long long step = PyLong_AsLongLong(args[0]);
    unsigned long long op_seq = PyLong_AsUnsignedLongLong(args[1]), host = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    std::lock_guard<std::mutex> lock(mu);
    g_step = step;
    g_op_seq = (uint32_t)op_seq;
    g_host = host & 0xFFFF;
    Py_RETURN_NONE;
}

PyObject *py_next_op(PyObject *, PyObject *const *, Py_ssize_t) {
    uint32_t value;
    {
        std::lock_guard<std::mutex> lock(mu);
        value = ++g_op_seq;
    }
    return PyLong_FromUnsignedLong(value);
}

PyObject *py_reset_coll_seq(PyObject *, PyObject *const *, Py_ssize_t) {
    std::lock_guard<std::mutex> lock(mu);
    g_coll_seq.clear();
    Py_RETURN_NONE;
}

PyObject *py_set_thread_key(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_thread_key(trace_key, step)");
        return NULL;
    }
    unsigned long long key = PyLong_AsUnsignedLongLong(args[0]);
    long long step = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    t_key = key;
    t_step = step;
    Py_RETURN_NONE;
}

PyObject *py_calls(PyObject *, PyObject *const *, Py_ssize_t) {
    return PyLong_FromUnsignedLongLong(g_calls.load());
}

PyMethodDef methods[] = {
    {"install", (PyCFunction)(void (*)(void))py_install, METH_FASTCALL,
     "install(ops) -> None\nRegister the kernel at BackendSelect for each (name, probe_name, pg_index, "
     "peer_index or -1, any_source, size_index or -1)."},
    {"uninstall", (PyCFunction)(void (*)(void))py_uninstall, METH_FASTCALL, "uninstall() -> None"},
    {"set_state", (PyCFunction)(void (*)(void))py_set_state, METH_FASTCALL,
     "set_state(step: int, op_seq: int, host_id: int) -> None\nThe open step (-1: none), its op counter, the "
     "host id (TraceKeys)."},
    {"next_op", (PyCFunction)(void (*)(void))py_next_op, METH_FASTCALL,
     "next_op() -> int\nCount one op of the step (a phase); returns its op_seq."},
    {"reset_coll_seq", (PyCFunction)(void (*)(void))py_reset_coll_seq, METH_FASTCALL,
     "reset_coll_seq() -> None\nRestart every group's collective sequence at 0 (registration)."},
    {"set_thread_key", (PyCFunction)(void (*)(void))py_set_thread_key, METH_FASTCALL,
     "set_thread_key(trace_key: int, step: int) -> None\nThe calling thread's current key (restored after each "
     "collective)."},
    {"calls", (PyCFunction)(void (*)(void))py_calls, METH_FASTCALL,
     "calls() -> int\nCollectives counted by the kernel since the module was loaded."},
    {NULL, NULL, 0, NULL},
};

struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "obshub.instrument._c10d_kernel",
    "obshub's collective hook as a C++ kernel at the c10d dispatcher's BackendSelect key.", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__c10d_kernel(void) {
    if (!load_api())
        return NULL;
    return PyModule_Create(&module);
}
