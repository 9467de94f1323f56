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
 * No trap at all while the agent reads the process's collective ring (issue #34, "the collective ring"
 * below): the kernel writes the two records the `coll` program would make into a memfd the agent drains;
 * a full ring or no reader sends the collective down the USDT path above.
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
 *   ring_info() -> {fd, data_size, drops, written, live} | None
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
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
    const char *probe;  // the torch.distributed name the probe carries (interned: never freed)
    int pg_index, peer_index, size_index;
    bool any_source;
    bool returns_work = false;  // the schema's last return is c10d's Work (set by install())
    bool pg_typed = false;      // the schema declares argument pg_index a c10d ProcessGroup (set by install())
};

// the shared state: guarded by mu (never held across the redispatch)
std::mutex mu;
int64_t g_step = -1;
uint32_t g_op_seq = 0;
uint64_t g_host = 0;
std::unordered_map<std::string, uint64_t> g_coll_seq;

std::unordered_map<std::string, OpInfo> g_ops;  // written by install() only, before any kernel runs
// the same by the op's schema (its address: stable while the op is registered), filled by install(): the
// kernel's look-up is a pointer hash, not a substring copy and a string hash per collective
std::unordered_map<const c10::FunctionSchema *, const OpInfo *> g_by_schema;
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
    if (v.isTensorList()) {  // read in place (toTensorList().vec() copied the list: an allocation per collective)
        uint64_t n = 0;
        for (const c10::IValue &item : v.toListRef())
            if (item.isTensor() && item.toTensor().defined())
                n += item.toTensor().nbytes();
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

// ---- the collective ring: no trap on the common path (issue #34) ----------------------------------------
// A memfd named "obshub-coll" (the agent finds it through /proc/<pid>/fd: it lives exactly as long as the
// process, nothing to clean up, and it is reachable across mount namespaces) laid out as the kernel lays out
// a BPF ring buffer (kernel/bpf/ringbuf.c), so the agent's batch reader (obshub/producer/_ring.c Ring) drains
// it with the same code and the same msgpack encoding as its BPF ring:
//   page 0: u64 consumer position (the reader's), then at kHdr the header below;
//   page 1: u64 producer position (ours);
//   page 2: the data area (kRingData bytes); a record is an 8-byte header (u32 length, u32 unused) and one
//           176-byte struct obs_event (obshub/bpf/record.h). A record never wraps: the space left at the end
//           is filled with one discarded record (the ring buffer's discard bit), which the reader skips. The
//           file is 2 pages + 2 x kRingData long (the reader maps the data area twice, as the kernel's).
// The records are the ones obshub/bpf/pytorch.c obs_coll_one makes from the `coll` probe (COLLECTIVE_BEGIN at
// the begin time on the issuing thread, COLLECTIVE_END at the end on the completing thread, with the
// duration), stamped with the probe id, the kinds and the pid the agent wrote into the header. The ring is
// used only while a reader is live (it wrote reader_ns within kReaderStaleNs); else the USDT path (one `coll`
// trap while traced, else the three probes) runs as before. A full ring drops nothing silently: the
// collective is counted in `drops` and sent through the trap path instead. Never blocks: the writers (the
// issuing thread, gloo's completing thread, the watchdog) share one spin lock held for two record copies.
struct RingHeader {                   // at kHdr of page 0; fields marked (agent) are written by the reader
    uint64_t magic;                   // kRingMagic
    uint32_t version, pid;            // 1, getpid() of the process that made the ring
    uint64_t data_size;               // bytes of the data area
    std::atomic<uint64_t> drops;      // collectives not written (the ring was full): sent by trap instead
    std::atomic<uint64_t> written;    // records written (discard padding excluded)
    uint32_t probe;                   // (agent) the probe id stamped on each record
    uint16_t kind_begin, kind_end;    // (agent) schema.Kind of COLLECTIVE_BEGIN and COLLECTIVE_END
    uint32_t host_pid, pad;           // (agent) the process's pid as the agent sees it (its pid namespace)
    std::atomic<uint64_t> reader_ns;  // (agent, written last) CLOCK_MONOTONIC ns of the reader's last drain
};
struct RingEvent {  // struct obs_event of obshub/bpf/record.h (generated from obshub/producer/record.py)
    uint64_t ts_ns, duration_ns, trace_key;
    int64_t step, value;
    uint64_t arg0, arg1, arg2;
    uint32_t pid, tid;
    uint16_t kind, probe;
    uint32_t arg3;
    char str0[64], str1[32];
};
static_assert(sizeof(RingEvent) == 176 && offsetof(RingEvent, pid) == 64 && offsetof(RingEvent, kind) == 72 &&
                  offsetof(RingEvent, str0) == 80 && offsetof(RingEvent, str1) == 144,
              "struct obs_event: see obshub/producer/record.py");
constexpr uint64_t kRingMagic = 0x314c4c4f43534f42ull;  // "BOSCOLL1" little-endian
constexpr size_t kHdr = 64;
constexpr uint32_t kRecLen = 8 + sizeof(RingEvent);  // 184: a multiple of 8, as the ring buffer's records
constexpr uint32_t kDiscardBit = 1u << 30;
constexpr uint64_t kReaderStaleNs = 2000000000ull;  // a reader silent for 2 s is gone: the trap path again
size_t g_ring_data = 1u << 20;                       // the data area: 5,698 records, 2,849 collectives
uint8_t *g_ring = nullptr;                           // the mapping (null: no ring)
uint8_t *g_ring_dat = nullptr;                       // its data area
int g_ring_fd = -1;
RingHeader *g_rh = nullptr;
std::atomic<uint64_t> *g_prod = nullptr, *g_cons = nullptr;
std::atomic_flag g_ring_lock = ATOMIC_FLAG_INIT;

inline bool ring_live(uint64_t now) {
    if (g_rh == nullptr)
        return false;
    uint64_t r = g_rh->reader_ns.load(std::memory_order_acquire);
    return r != 0 && now - r < kReaderStaleNs;  // a reader clock ahead of ours wraps to a huge number: stale
}

// make the ring (at install); false when the system refuses (the USDT path then runs alone)
bool ring_open() {
    if (g_ring != nullptr)
        return true;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (const char *kb = getenv("OBSHUB_COLL_RING_KB")) {  // a power of 2 of at least one page
        size_t n = (size_t)strtoull(kb, nullptr, 10) * 1024;
        if (n >= page && (n & (n - 1)) == 0)
            g_ring_data = n;
        else if (n == 0)
            return false;  // OBSHUB_COLL_RING_KB=0: no ring (the USDT path only)
    }
    int fd = (int)syscall(SYS_memfd_create, "obshub-coll", 1u /* MFD_CLOEXEC: not into exec'd children */);
    if (fd < 0)
        return false;
    const size_t len = 2 * page + 2 * g_ring_data;
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return false;
    }
    // MAP_POPULATE: every page of the ring is allocated and mapped now (one time, ~0.1-0.3 ms for 1 MiB), not
    // at the first record written into it: otherwise a collective in ~11 pays a page fault (a shmem page
    // allocated and zeroed, ~2-5 µs) until the ring has wrapped once, which a job with few collectives per
    // second never does in its first minutes (issue #34: ~1.4 µs per collective, averaged, in a ring not yet wrapped)
    void *m = mmap(nullptr, 2 * page + g_ring_data, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return false;
    }
    // the fd stays open: it is how the agent finds the ring (/proc/<pid>/fd/N -> "/memfd:obshub-coll")
    g_ring = static_cast<uint8_t *>(m);
    g_ring_dat = g_ring + 2 * page;
    g_ring_fd = fd;
    g_cons = reinterpret_cast<std::atomic<uint64_t> *>(g_ring);
    g_prod = reinterpret_cast<std::atomic<uint64_t> *>(g_ring + page);
    RingHeader *h = reinterpret_cast<RingHeader *>(g_ring + kHdr);
    h->version = 1;
    h->pid = (uint32_t)getpid();
    h->data_size = g_ring_data;
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = kRingMagic;
    g_rh = h;
    return true;
}

inline void fill(RingEvent &e, uint16_t kind, uint64_t ts, uint64_t dur, uint32_t tid, const char *pg, uint64_t seq,
                 const char *op, uint64_t nbytes, int64_t step, uint64_t key) {
    e.ts_ns = ts;
    e.duration_ns = dur;
    e.trace_key = key;
    e.step = step;
    e.value = (int64_t)nbytes;
    e.arg0 = seq;
    e.arg1 = e.arg2 = 0;
    e.pid = g_rh->host_pid;
    e.tid = tid;
    e.kind = kind;
    e.probe = (uint16_t)g_rh->probe;
    e.arg3 = 0;
    memset(e.str0, 0, sizeof(e.str0));
    memset(e.str1, 0, sizeof(e.str1));
    strncpy(e.str0, pg, 15);  // 16 bytes with the NUL, as the BPF program's (struct obs_coll_key)
    strncpy(e.str1, op, sizeof(e.str1) - 1);
}

// write the BEGIN (begin_tid > 0) and/or the END (end_tid > 0) record of one collective: false (counted
// in drops) when the ring has no room for them
bool ring_put(const char *pg, uint64_t seq, const char *op, uint64_t nbytes, int64_t step, uint64_t key,
              uint64_t begin, int32_t begin_tid, uint64_t now, int32_t end_tid) {
    RingEvent ev[2];
    int n = 0;
    if (begin_tid > 0)
        fill(ev[n++], g_rh->kind_begin, begin, 0, (uint32_t)begin_tid, pg, seq, op, nbytes, step, key);
    if (end_tid > 0)
        fill(ev[n++], g_rh->kind_end, now, now - begin, (uint32_t)end_tid, pg, seq, op, nbytes, step, key);
    const uint64_t size = g_ring_data, mask = size - 1;
    while (g_ring_lock.test_and_set(std::memory_order_acquire)) {
    }
    uint64_t prod = g_prod->load(std::memory_order_relaxed);
    const uint64_t cons = g_cons->load(std::memory_order_acquire);
    const uint64_t off = prod & mask, need = (uint64_t)n * kRecLen;
    const uint64_t pad = off + need > size ? size - off : 0;  // a record never wraps: skip to the start
    if (prod + pad + need - cons > size) {
        g_ring_lock.clear(std::memory_order_release);
        g_rh->drops.fetch_add(1, std::memory_order_relaxed);
        return false;
    }
    uint8_t *data = g_ring_dat;
    if (pad) {
        const uint32_t hdr[2] = {(uint32_t)(pad - 8) | kDiscardBit, 0};
        memcpy(data + off, hdr, 8);
        prod += pad;
    }
    for (int i = 0; i < n; i++) {
        uint8_t *rec = data + ((prod + (uint64_t)i * kRecLen) & mask);
        const uint32_t hdr[2] = {(uint32_t)sizeof(RingEvent), 0};
        memcpy(rec, hdr, 8);
        memcpy(rec + 8, &ev[i], sizeof(RingEvent));
    }
    g_prod->store(prod + need, std::memory_order_release);
    // under the lock: a plain add, no locked instruction (its readers only read it)
    g_rh->written.store(g_rh->written.load(std::memory_order_relaxed) + (uint64_t)n, std::memory_order_relaxed);
    g_ring_lock.clear(std::memory_order_release);
    return true;
}

inline int32_t my_tid() {
    if (t_tid == 0)
        t_tid = (int32_t)syscall(SYS_gettid);
    return t_tid;
}

// ---- the one-probe path's collectives in flight, and the watchdog that announces the late ones ----
// A collective of the one-probe path fires nothing until it ends; one still in flight after kLateNs (a
// hang, a rank waiting for a straggler) would show no COLLECTIVE_BEGIN, which the analysis reads as "not
// arrived" (docs/ANALYSIS.md "Hangs"). So each is registered while in flight, and a watchdog thread
// (started at the first such collective, waking every kLateNs) fires `coll_late` (its begin, with the
// begin time and thread) for each one older than kLateNs; its `coll` then carries the thread id negated
// (the end only). coll_late fires under fly_mu, and the end reads `announced` under it and fires after.
struct Flight {
    std::string pg;     // process group name (short: in place, no allocation)
    const char *probe;  // OpInfo's probe name (interned by install(): never freed)
    uint64_t seq, nbytes;
    int64_t step;
    uint64_t key, begin;
    int32_t tid;
    bool announced;
    // in the in-flight list (under fly_mu): neighbours. Owned by the list: allocated by the kernel, freed by
    // fly_end after it is unlisted (a Work dropped unfinished drops its callback: its Flight stays listed)
    Flight *prev, *next;
};

constexpr uint64_t kLateNs = 100000000ull;  // 100 ms: a hang needs >= 500 ms (hang_state_wait_ns)
// never destroyed: the watchdog may still run while the process exits. An intrusive list: adding and
// removing a collective is a few stores under the lock, no allocation there (the lock is short: the thread
// that completes one collective and the one that issues the next meet on it)
std::mutex &fly_mu = *new std::mutex;
Flight *g_fly_head = nullptr;
std::atomic<bool> g_watchdog_started{false};

void watchdog() {
    for (;;) {
        struct timespec ts = {0, (long)kLateNs};
        nanosleep(&ts, nullptr);
        const uint64_t now = monotonic_ns();
        std::lock_guard<std::mutex> lock(fly_mu);  // coll_late fires under it: its coll comes after
        for (Flight *f = g_fly_head; f != nullptr; f = f->next) {
            if (!f->announced && now - f->begin >= kLateNs) {
                f->announced = true;
                // the collective ring's BEGIN record while a reader drains it (its `coll` END goes there too:
                // one source, in order; the agent's next drain, <= its poll bound), else the USDT coll_late
                if (!ring_live(now) ||
                    !ring_put(f->pg.c_str(), f->seq, f->probe, f->nbytes, f->step,
                              f->key, f->begin, f->tid, 0, 0))
                    api->coll_late(f->pg.c_str(), f->seq, f->probe, f->nbytes, f->step,
                                   f->key, f->begin, f->tid);
            }
        }
    }
}

void fly_add(Flight *f) {
    if (!g_watchdog_started.load(std::memory_order_acquire) && !g_watchdog_started.exchange(true))
        std::thread(watchdog).detach();
    std::lock_guard<std::mutex> lock(fly_mu);
    f->prev = nullptr;
    f->next = g_fly_head;
    if (g_fly_head != nullptr)
        g_fly_head->prev = f;
    g_fly_head = f;
}

// the collective's end: unlist it, write its records (or fire its trap) and free it
void fly_end(Flight *f) {
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
    }
    // outside the lock: a coll_late for it, if any, fired before the lock was released. The ring while a
    // reader drains it (no trap), else the one `coll` trap
    const uint64_t now = monotonic_ns();
    if (!(ring_live(now) && ring_put(f->pg.c_str(), f->seq, f->probe, f->nbytes, f->step, f->key, f->begin,
                                     announced ? 0 : f->tid, now, my_tid())))
        api->coll(f->pg.c_str(), f->seq, f->probe, f->nbytes, f->step, f->key, f->begin,
                  announced ? -f->tid : f->tid);
    delete f;
}

// fork (a data loader's workers, a subprocess): the child has only the forking thread, so a lock another
// thread held at the fork would stay held forever. pthread_atfork takes every lock before the fork and
// releases them on both sides after; the child then has no watchdog (the next collective starts one), no
// collective in flight, and no ring (the parent's ring and its reader are the parent's: the child's
// collectives, if any, take the USDT path).
void atfork_prepare() {
    mu.lock();
    fly_mu.lock();
    while (g_ring_lock.test_and_set(std::memory_order_acquire)) {
    }
}
void atfork_parent() {
    g_ring_lock.clear(std::memory_order_release);
    fly_mu.unlock();
    mu.unlock();
}
void atfork_child() {
    g_ring_lock.clear(std::memory_order_release);
    g_fly_head = nullptr;  // the parent's flights: their callbacks never run here
    g_watchdog_started.store(false);
    g_rh = nullptr;
    fly_mu.unlock();
    mu.unlock();
}

// the future of the Work the op returned (top of the stack), or null (none: a coalesced Work; end = enqueue).
// `returns_work`: the op's schema declares a Work as its last return (install() checked it against the
// registered class), so the object is read in place without the custom-class type check (a few reference
// counts and a type comparison per collective)
c10::intrusive_ptr<c10::ivalue::Future> work_future(const torch::jit::Stack *stack, bool returns_work) {
    const c10::IValue &ret = stack->empty() ? c10::IValue() : stack->back();
    try {
        if (returns_work && ret.isObject()) {
            const std::vector<c10::IValue> &slots = ret.toObjectRef().slots();
            if (slots.size() == 1 && slots[0].isCapsule())
                return static_cast<c10d::Work &>(*slots[0].toCapsule()).getFuture();
        }
        if (ret.isCustomClass())
            return ret.toCustomClass<c10d::Work>()->getFuture();
    } catch (const std::exception &) {
    }
    return c10::intrusive_ptr<c10::ivalue::Future>();
}

// ---- the process groups seen (issue #34): a group's sequence counter is found once per group, not by a
// string hash per collective. Keyed by the ProcessGroup's address, read in place from the op's argument
// (the custom-class object's capsule: install() checked the argument's declared type, so no type check per
// call; the TorchScript object around it is new at every call from Python, the ProcessGroup is not). No
// reference is held (a destroyed group is freed as before); an entry counts only while its name is still
// the group's (an address reused by a later group with another name makes a new entry). Under mu.
struct Group {
    const c10d::ProcessGroup *pg;
    std::string name;
    uint64_t *seq;  // its counter in g_coll_seq (a map node: stable; reset_coll_seq zeroes, never erases)
};
std::vector<Group> g_groups;
constexpr size_t kMaxGroups = 64;  // more (groups made and destroyed in a loop): the list starts over

// the counter of the group `pg` (alive: the op's argument holds it). Caller holds mu.
uint64_t *group_seq(const c10d::ProcessGroup &pg, const std::string &name) {
    for (const Group &g : g_groups)
        if (g.pg == &pg && g.name == name)
            return g.seq;
    if (g_groups.size() >= kMaxGroups)
        g_groups.clear();
    g_groups.push_back(Group{&pg, name, &g_coll_seq[name]});
    return g_groups.back().seq;
}

// the ProcessGroup of the op's argument `v`: read in place when the schema declares it (`typed`), else with
// the custom-class check (throws when it is not one)
c10::intrusive_ptr<c10d::ProcessGroup> process_group(const c10::IValue &v, bool typed) {
    if (typed && v.isObject()) {
        const std::vector<c10::IValue> &slots = v.toObjectRef().slots();
        if (slots.size() == 1 && slots[0].isCapsule())
            return c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(slots[0].toCapsule());
    }
    return v.toCustomClass<c10d::ProcessGroup>();
}

void kernel(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
    const c10::DispatchKeySet keys = ks & after_backend_select;
    if (t_in_coll || api == nullptr) {  // an op issued inside another: the backend's kernel alone
        op.redispatchBoxed(keys, stack);
        return;
    }
    const c10::FunctionSchema &schema = op.schema();
    const size_t nargs = schema.arguments().size();
    const OpInfo *pinfo = nullptr;
    if (auto hit = g_by_schema.find(&schema); hit != g_by_schema.end()) {
        pinfo = hit->second;
    } else if (auto found = g_ops.find(schema.name().substr(6)); found != g_ops.end()) {  // "c10d::" + name
        pinfo = &found->second;
    }
    const at::Tensor *tensor = nullptr;
    for (size_t i = 0; i < nargs && tensor == nullptr; i++)
        tensor = first_tensor(torch::jit::peek(*stack, i, nargs));
    // tracing (fake tensors and tensor subclasses carry the Python key; meta tensors): not counted
    if (pinfo == nullptr ||
        (tensor != nullptr && (tensor->is_meta() || tensor->key_set().has(c10::DispatchKey::Python)))) {
        op.redispatchBoxed(keys, stack);
        return;
    }
    const OpInfo &info = *pinfo;
    const bool p2p = info.peer_index >= 0 || info.any_source;
    std::string pg_name;  // the group's name; a point-to-point pair's own sequence: "<group>:p2p:<lo>-<hi>"
    uint64_t nbytes = 0, seq, key;
    int64_t step;
    try {
        auto pg = process_group(torch::jit::peek(*stack, info.pg_index, nargs), info.pg_typed);
        const std::string &group = pg->getGroupName();
        if (info.peer_index >= 0) {
            int64_t peer = torch::jit::peek(*stack, info.peer_index, nargs).toInt(), me = pg->getRank();
            pg_name = group + ":p2p:" + std::to_string(std::min(peer, me)) + "-" + std::to_string(std::max(peer, me));
        } else if (info.any_source) {
            pg_name = group + ":p2p:any";
        } else {
            pg_name = group;  // short: in place (no allocation)
        }
        if (info.size_index >= 0)
            nbytes = ivalue_bytes(torch::jit::peek(*stack, info.size_index, nargs));
        std::lock_guard<std::mutex> lock(mu);
        uint64_t *count = p2p ? &g_coll_seq[pg_name] : group_seq(*pg, group);
        seq = (*count)++;
        step = g_step;
        key = make_key(step, ++g_op_seq);
        g_calls.store(g_calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // under mu
    } catch (const std::exception &) {  // let PyTorch raise its own error, or run it unseen
        op.redispatchBoxed(keys, stack);
        return;
    }
    const uint64_t begin = monotonic_ns();
    if (ring_live(begin) || api->coll_traced()) {  // the ring, or one trap: at the end, with begin time and thread
        // one allocation per collective (the Flight, its group name in place), owned by the in-flight list
        // until fly_end frees it; the callback carries its pointer (stored in the std::function: no allocation)
        Flight *fly = new Flight{std::move(pg_name), info.probe, seq, nbytes, step, key, begin, my_tid(), false, nullptr, nullptr};
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
        c10::intrusive_ptr<c10::ivalue::Future> fut = work_future(stack, info.returns_work);
        if (!fut || fut->completed()) {
            fly_end(fly);
            return;
        }
        fut->addCallback([fly](c10::ivalue::Future &) { fly_end(fly); });
        return;
    }
    // the strings the probes point to live as long as the collective: the callback owns a copy of the name
    // (a later install() may replace g_ops, and the group may go, while a collective still runs)
    auto token = std::make_shared<std::string>(std::move(pg_name));
    const char *probe = info.probe;
    const char *pg_str = token->c_str();
    const uint64_t prev_key = t_key;
    const int64_t prev_step = t_step;
    api->coll_begin(pg_str, seq, probe, nbytes, step, key);
    t_in_coll = true;
    try {
        op.redispatchBoxed(keys, stack);
    } catch (...) {
        t_in_coll = false;
        api->tracekey(prev_key, prev_step);
        api->coll_end(pg_str, seq, probe, nbytes, step, key);  // a failed collective ends where it failed
        throw;
    }
    t_in_coll = false;
    api->tracekey(prev_key, prev_step);  // the thread's key is its own again (coll_begin carried the op's)
    c10::intrusive_ptr<c10::ivalue::Future> fut = work_future(stack, info.returns_work);
    if (!fut || fut->completed()) {  // a synchronous op; NCCL completes its future at enqueue
        api->coll_end(pg_str, seq, probe, nbytes, step, key);
        return;
    }
    // run by the thread that completes the work (gloo's), without the GIL
    fut->addCallback([token, probe, seq, nbytes, step, key](c10::ivalue::Future &) {
        api->coll_end(token->c_str(), seq, probe, nbytes, step, key);
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
        static std::unordered_set<std::string> &interned = *new std::unordered_set<std::string>;
        ops[name] = OpInfo{interned.insert(probe).first->c_str(), pg, peer, size, any != 0};
    }
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
    ring_open();  // false: no ring (the USDT path alone), never an error
    try {
        g_ops = std::move(ops);
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d",
                                                    std::optional<c10::DispatchKey>(c10::DispatchKey::BackendSelect),
                                                    __FILE__, __LINE__);
        for (const auto &entry : g_ops)
            lib->impl(entry.first.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
        std::unordered_map<const c10::FunctionSchema *, const OpInfo *> by_schema;
        const c10::TypePtr work_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::Work>>();
        const c10::TypePtr pg_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
        for (auto &entry : g_ops)
            if (auto h = c10::Dispatcher::singleton().findOp(c10::OperatorName("c10d::" + entry.first, "")))
                if (h->hasSchema()) {
                    by_schema[&h->schema()] = &entry.second;
                    const auto &rets = h->schema().returns();
                    entry.second.returns_work = !rets.empty() && rets.back().type() == work_type;
                    const auto &args = h->schema().arguments();
                    const int pgi = entry.second.pg_index;
                    entry.second.pg_typed = pgi >= 0 && (size_t)pgi < args.size() && args[pgi].type() == pg_type;
                }
        g_by_schema = std::move(by_schema);
        g_lib = std::move(lib);
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "registering the c10d kernels failed: %s", e.what());
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *py_uninstall(PyObject *, PyObject *const *, Py_ssize_t) {
    g_lib.reset();  // deregisters every kernel
    g_by_schema.clear();
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
    for (auto &entry : g_coll_seq)  // zeroed, not erased: the groups' entries point at their counters
        entry.second = 0;
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

PyObject *py_ring_info(PyObject *, PyObject *const *, Py_ssize_t) {
    if (g_rh == nullptr)
        Py_RETURN_NONE;
    return Py_BuildValue("{s:i,s:K,s:K,s:K,s:O}", "fd", g_ring_fd, "data_size", (unsigned long long)g_ring_data,
                         "drops", (unsigned long long)g_rh->drops.load(), "written",
                         (unsigned long long)g_rh->written.load(), "live", ring_live(monotonic_ns()) ? Py_True : Py_False);
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
    {"ring_info", (PyCFunction)(void (*)(void))py_ring_info, METH_FASTCALL,
     "ring_info() -> dict | None\nThe collective ring (None: none was made): its memfd `fd`, `data_size` "
     "(bytes), `drops` (collectives sent by trap because it was full), `written` (records), `live` (a reader "
     "drained it within 2 s)."},
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
