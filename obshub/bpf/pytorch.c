/* obshub PyTorch layer: handlers of the `obshub` USDT probes fired by obshub.instrument._usdt (or any library
 * with the same probe names and arguments, see docs/AGENT.md "Probes").
 *
 *   register(job, rank, world_size, host_id, local_rank)  -> REGISTER; with OBS_TARGET_REGISTERED the
 *                                                            process becomes watched, in the kernel
 *   tracekey(trace_key, step)                             -> the thread's key = (trace_key, step)
 *   step_begin/step_end(step, trace_key)                  -> STEP_BEGIN, STEP_END (+ the per-step
 *                                                            aggregates SCHED_STEP_SUM, MEM_STEP_SUM,
 *                                                            CUDA_STEP_SUM of the process);
 *                                                            step_begin also sets the key
 *   phase_begin/phase_end(phase, step, trace_key)         -> PHASE (on end, with its duration);
 *                                                            phase_begin sets the key, phase_end sets
 *                                                            it back to the step's key (trace_key with
 *                                                            op_seq 0, the low 32 bits)
 *   coll_begin/coll_end(pg, coll_seq, op, bytes, step, trace_key) -> COLLECTIVE_BEGIN/_END; coll_begin
 *                                                            also sets the key
 *   coll(pg, coll_seq, op, bytes, step, trace_key, begin_ns, begin_tid) -> COLLECTIVE_BEGIN (at begin_ns,
 *                                                            thread begin_tid) and COLLECTIVE_END (now,
 *                                                            with the duration), from one trap at the end
 *                                                            (begin_tid < 0: the END only)
 *   coll_late(same)                                       -> COLLECTIVE_BEGIN of a collective still in
 *                                                            flight after 100 ms (the C++ kernel's watchdog)
 *   caught(where)                                         -> inst_caught[where]++ (no record: the agent
 *                                                            reads the counts into
 *                                                            obshub_agent_caught_errors_total)
 *   phase_next(old_phase, new_phase, step, old_key, new_key) -> phase_end of the open phase and
 *                                                            phase_begin of the next, at one instant
 *   step_next(step, key, next_key, old_phase, old_key, new_phase, new_key) -> phase_end, step_end,
 *                                                            step_begin(step + 1), phase_begin, at one
 *                                                            instant
 * The instrumentation fires phase_next/step_next instead of the separate probes only when a tracer is
 * attached to them (obshub/instrument/hooks.py reads the probe site), so an agent that does not attach
 * them still sees the separate probes.
 */
#include "common.h"

/* Begin/end pairing (docs/AGENT.md "Pairing begin and end"): begin and end may fire on different threads
 * of the process (autograd device threads, gloo workers), so never pair by tid. A process has one step
 * and at most one phase open at a time (the instrumentation ends the open phase before it begins the
 * next), so steps and phases are paired in one slot per process (tgid), written in place: after the
 * process's first step and phase, a begin is a look-up and a few stores, not a map update (an LRU hash
 * update takes a node from the LRU's free lists and links it; measured several times a look-up). An end
 * pairs with the slot when the step (phases: the phase name and TraceKey) match, and marks it used
 * (ts 0). Collectives can be in flight several at a time (async ops, DDP buckets): paired by key. */
struct obs_open_step {
    s64 step;
    u64 ts;
};

struct obs_open_phase {
    u64 trace_key;
    u64 ts;
    char phase[16];
};

struct obs_coll_key {
    u32 tgid;
    u32 pad;
    u64 coll_seq;
    char pg[16];
};

BPF_TABLE("lru_hash", u32, struct obs_open_step, step_open, 4096);   /* tgid -> its open step */
BPF_TABLE("lru_hash", u32, struct obs_open_phase, phase_open, 4096); /* tgid -> its open phase */
/* Collectives in flight of one process and process group: the begin time of collective coll_seq in slot
 * coll_seq % OBS_COLL_SLOTS (ts 0: free), written in place, so after a group's first collective a begin
 * and an end are a look-up and a few stores each (an LRU hash update and delete per collective cost
 * several times that). A begin whose slot is still taken (more than OBS_COLL_SLOTS collectives of the
 * group in flight, or one whose end never came) goes to coll_begin_ts, keyed by collective, as does the
 * first begin of a group whose slot entry cannot be made; an end looks in its slot first. */
#define OBS_COLL_SLOTS 16
struct obs_coll_pg {
    u32 tgid;
    u32 pad;
    char pg[16];
};

struct obs_coll_slot {
    u64 seq;
    u64 ts;
};

/* a slot's collective number and begin time side by side: a begin or an end touches one cache line of
 * the entry, not two */
struct obs_coll_open {
    struct obs_coll_slot slot[OBS_COLL_SLOTS];
};

BPF_TABLE("lru_hash", struct obs_coll_pg, struct obs_coll_open, coll_open, 4096);
BPF_TABLE("lru_hash", struct obs_coll_key, u64, coll_begin_ts, 65536);

/* step_begin and phase_begin carry the key the calling thread works under from now on: set it here too,
 * so the thread's entry is right from the probe on, whatever order the instrumentation fires `tracekey`
 * in. The key lives in the thread's state entry (obshub/bpf/common.h, struct obs_tstate), which lives until the
 * thread exits, so after its first key it is written in place (the first key makes the entry, or marks
 * the one the scheduler layer made as a training thread's). Only the thread itself writes its key; a
 * reader on another CPU can see the key of one change with the step of the next for the instant between
 * the two stores. */
static __always_inline void obs_set_key(u32 tid, u64 key, s64 step)
{
    struct obs_tstate *cur = obs_tstate_get(tid);
    if (cur) {
        cur->trace_key = key;
        cur->step = step;
        if (!cur->trained)
            cur->trained = 1;
        return;
    }
    struct obs_tstate v = {
        .trace_key = key, .step = step, .trained = 1, .tgid = bpf_get_current_pid_tgid() >> 32};
    obs_tstate_new(tid, &v);
}

/* Is the calling thread watched? The bitmap pre-filter of obshub/bpf/common.h first: with the scheduler layer
 * loaded, a thread whose process and thread bits are set costs no hash look-up. */
static __always_inline int obs_usdt_gate(void)
{
    return obs_current_watched_fast();
}

int obs_usdt_register(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
#ifdef OBS_TARGET_REGISTERED
    u8 one = 1;
    watched.update(&tgid, &one);
#endif
    if (!obs_current_watched())
        return 0;
    u64 job = 0;
    s32 rank = 0, world = 0, host = 0, local = 0;
    bpf_usdt_readarg(1, ctx, &job);
    bpf_usdt_readarg(2, ctx, &rank);
    bpf_usdt_readarg(3, ctx, &world);
    bpf_usdt_readarg(4, ctx, &host);
    bpf_usdt_readarg(5, ctx, &local);
    struct obs_event *e = obs_reserve_current(OBS_PROBE_PYTORCH_REGISTER, OBS_KIND_REGISTER);
    if (!e)
        return 0;
    e->value = rank;
    e->arg0 = world;
    e->arg1 = host;
    e->arg2 = local;
    bpf_probe_read_user_str(e->str0, sizeof(e->str0), (void *)job);
    obs_submit(e);
    return 0;
}

int obs_usdt_tracekey(struct pt_regs *ctx)
{
    if (!obs_usdt_gate())
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &key);
    bpf_usdt_readarg(2, ctx, &step);
    obs_set_key(tid, key, step);
    return 0;
}

/* The step of process tgid begins at `now` on thread tid: its slot in step_open, the thread's key, the
 * scheduler sums restarted, STEP_BEGIN. */
static __always_inline void obs_step_begin_at(u32 tgid, u32 tid, u64 now, s64 step, u64 key)
{
    struct obs_open_step *os = step_open.lookup(&tgid);
    if (os) {
        os->step = step;
        os->ts = now;
    } else {
        struct obs_open_step v = {.step = step, .ts = now};
        step_open.update(&tgid, &v);
    }
    obs_set_key(tid, key, step);
#ifdef OBS_LAYER_SCHED
    /* the scheduler sums restart here, in an entry that exists from the step's first instant (the
     * scheduler layer adds to it only when a training thread comes on a CPU): the cap on single
     * scheduler records counts from the start of the step */
    struct obs_sched_acc *sa = sched_acc.lookup(&tgid);
    if (sa) {
        __builtin_memset(sa, 0, sizeof(*sa));
    } else {
        struct obs_sched_acc zero = {};
        sched_acc.update(&tgid, &zero);
    }
#else
    sched_acc.delete(&tgid);
#endif
    struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_STEP, OBS_KIND_STEP_BEGIN, tgid, tid);
    if (!e)
        return;
    e->ts_ns = now;
    e->step = step;
    e->trace_key = key;
    e->value = step;
    obs_submit(e);
}

int obs_usdt_step_begin(struct pt_regs *ctx)
{
    if (!obs_usdt_gate())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    s64 step = 0;
    u64 key = 0, now = bpf_ktime_get_ns();
    bpf_usdt_readarg(1, ctx, &step);
    bpf_usdt_readarg(2, ctx, &key);
    obs_step_begin_at(tgid, tid, now, step, key);
    return 0;
}

/* MEM_STEP_SUM for process tgid (when it has memory activity since its previous step_end), then reset:
 * duration = stall time, value = allocations, arg0 = pages, arg1 = stalls, arg2 = longest stall,
 * str0 = allocations per order (16 x u32). */
static __always_inline void obs_emit_mem_acc(u32 tgid, u32 tid, s64 step, u64 key, u64 now)
{
    struct obs_mem_acc *acc = mem_acc.lookup(&tgid);
    if (!acc)
        return;
    struct obs_event *e = obs_reserve(OBS_PROBE_MEM_PAGE_ALLOC, OBS_KIND_MEM_STEP_SUM, tgid, tid);
    if (e) {
        e->ts_ns = now;
        e->step = step;
        e->trace_key = key;
        e->duration_ns = acc->stall_ns;
        e->value = acc->allocs;
        e->arg0 = acc->pages;
        e->arg1 = acc->stalls;
        e->arg2 = acc->stall_max_ns;
        __builtin_memcpy(e->str0, acc->orders, sizeof(acc->orders));
        obs_submit(e);
    }
    mem_acc.delete(&tgid);
}

/* CUDA_STEP_SUM for process tgid, then reset: duration = launch call time summed, value = launches,
 * arg0 = longest launch call, str0 = log2 µs histogram of the launch call times (16 x u32). */
static __always_inline void obs_emit_cuda_acc(u32 tgid, u32 tid, s64 step, u64 key, u64 now)
{
    struct obs_cuda_acc *acc = cuda_acc.lookup(&tgid);
    if (!acc)
        return; /* no launch counted in this step: it spends none of the deep dive's budget (a window whose
                 * first deep-dive call was an NCCL call after the step's launches: CI saw 2 aggregates of 3) */
    struct obs_deep_left *dl = deep_left.lookup(&tgid); /* a step of the deep dive's budget is spent */
    if (dl && dl->left > 0)
        dl->left--;
    struct obs_event *e = obs_reserve(OBS_PROBE_CUDA_BASE, OBS_KIND_CUDA_STEP_SUM, tgid, tid);
    if (e) {
        e->ts_ns = now;
        e->step = step;
        e->trace_key = key;
        e->duration_ns = acc->sum_ns;
        e->value = acc->launches;
        e->arg0 = acc->max_ns;
        __builtin_memcpy(e->str0, acc->hist, sizeof(acc->hist));
        obs_submit(e);
    }
    cuda_acc.delete(&tgid);
}

/* The step `step` of process tgid ends at `now` on thread tid: STEP_END with the step's wall time (paired
 * with step_open), the process's per-step aggregates, then the reset of its sums. `next`: the next step
 * begins at once (step_next), whose obs_step_begin_at zeroes the scheduler sums in place: their entry is
 * kept instead of deleted and made again. */
static __always_inline void obs_step_end_at(u32 tgid, u32 tid, u64 now, s64 step, u64 key, int next)
{
    u64 dur = 0;
    struct obs_open_step *os = step_open.lookup(&tgid);
    if (os && os->ts && os->step == step) {
        dur = now - os->ts;
        os->ts = 0;
    }
    /* STEP_END is reserved first (so it comes first in the ring) and submitted last, waking the reader
     * (when it drained since the last such wakeup, obs_submit_wake):
     * a reader cannot pass a record still reserved, so when it wakes, the step's aggregates behind the
     * STEP_END are in the ring too, and the agent seals the step's batch with all of them */
    struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_STEP, OBS_KIND_STEP_END, tgid, tid);
    if (e) {
        e->ts_ns = now;
        e->duration_ns = dur;
        e->step = step;
        e->trace_key = key;
        e->value = step;
    }
    /* the per-step scheduler sums of this process's training threads (obshub/bpf/sched.c fills them) */
    struct obs_sched_acc *acc = sched_acc.lookup(&tgid);
    if (acc && (acc->switches || acc->wakeups)) { /* a step without a switch or wakeup ships none */
        struct obs_event *s = obs_reserve(OBS_PROBE_SCHED, OBS_KIND_SCHED_STEP_SUM, tgid, tid);
        if (s) {
            s->ts_ns = now;
            s->step = step;
            s->trace_key = key;
            s->duration_ns = acc->offcpu_ns;
            s->value = acc->runq_ns;
            s->arg0 = acc->switches;
            s->arg1 = acc->wakeups;
            s->arg2 = acc->runq_max_ns;
            __builtin_memcpy(s->str0, acc->runq_hist, sizeof(acc->runq_hist));
            __builtin_memcpy(s->str1, &acc->offcpu_max_ns, sizeof(u64));
            obs_submit(s);
        }
    }
#ifdef OBS_LAYER_SCHED
    /* the run-queue waits of the process's threads without a TraceKey that no single carried (sched.c) */
    if (acc && acc->others_runq_ns && acc->others_runq_ns >= obs_threshold(OBS_THR_RUNQ_NS)) {
        struct obs_event *o = obs_reserve(OBS_PROBE_SCHED, OBS_KIND_SCHED_RUNQ, tgid, tid);
        if (o) {
            o->ts_ns = now;
            o->step = step;
            o->trace_key = key;
            o->duration_ns = acc->others_runq_ns;
            o->value = -1;
            o->arg0 = acc->others_waits;
            obs_submit(o);
        }
    }
#endif
    if (acc && !next)
        sched_acc.delete(&tgid);
    obs_emit_mem_acc(tgid, tid, step, key, now);
    obs_emit_cuda_acc(tgid, tid, step, key, now);
    if (e)
        obs_submit_wake(e, now);
}

int obs_usdt_step_end(struct pt_regs *ctx)
{
    if (!obs_usdt_gate())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    s64 step = 0;
    u64 key = 0, now = bpf_ktime_get_ns();
    bpf_usdt_readarg(1, ctx, &step);
    bpf_usdt_readarg(2, ctx, &key);
    obs_step_end_at(tgid, tid, now, step, key, 0);
    return 0;
}

/* bcc generates the argument readers per handler function, so every handler reads its own arguments
 * (bpf_usdt_readarg must be called in the handler itself) and passes them to the shared code. */
/* bcc generates the argument readers per handler function, so each handler reads its own arguments
 * (bpf_usdt_readarg must be called in the handler itself, not in a macro) and passes them on. */
/* Phase `name` (16 bytes, NUL-padded) of process tgid begins at `now` on thread tid under `key`: its slot
 * in phase_open, the thread's key. */
static __always_inline void obs_phase_begin_at(u32 tgid, u32 tid, u64 now, const char *name, s64 step, u64 key)
{
    struct obs_open_phase pk = {};
    pk.trace_key = key;
    pk.ts = now;
    __builtin_memcpy(pk.phase, name, sizeof(pk.phase));
    struct obs_open_phase *op = phase_open.lookup(&tgid);
    if (op)
        __builtin_memcpy(op, &pk, sizeof(pk));
    else
        phase_open.update(&tgid, &pk);
    obs_set_key(tid, key, step);
}

/* Phase `name` (key `key`) of process tgid ends at `now`: PHASE with its wall time when it pairs with the
 * open slot (the begin happened while the agent was attached). `set_key`: give thread tid the step's key
 * back (not when a next phase or step sets the key at once). */
static __always_inline void obs_phase_end_at(u32 tgid, u32 tid, u64 now, const char *name, s64 step, u64 key,
                                             int set_key)
{
    if (set_key)
        obs_set_key(tid, key & ~0xFFFFFFFFull, step); /* back to the step's key (the instrumentation's too) */
    struct obs_open_phase *op = phase_open.lookup(&tgid);
    if (!op || !op->ts || op->trace_key != key || *(u64 *)op->phase != *(u64 *)name ||
        *(u64 *)(op->phase + 8) != *(u64 *)(name + 8))
        return; /* the begin happened before the agent attached */
    u64 dur = now - op->ts;
    op->ts = 0;
    struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_PHASE, OBS_KIND_PHASE, tgid, tid);
    if (!e)
        return;
    e->ts_ns = now;
    e->duration_ns = dur;
    e->step = step;
    e->trace_key = key;
    __builtin_memcpy(e->str0, name, 16);
    obs_submit(e);
}

static __always_inline int obs_phase(int end, u64 phase, s64 step, u64 key)
{
    if (!obs_usdt_gate())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    char name[16] = {};
    bpf_probe_read_user_str(name, sizeof(name), (void *)phase);
    if (end)
        obs_phase_end_at(tgid, tid, now, name, step, key, 1);
    else
        obs_phase_begin_at(tgid, tid, now, name, step, key);
    return 0;
}

int obs_usdt_phase_begin(struct pt_regs *ctx)
{
    u64 phase = 0, key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &phase);
    bpf_usdt_readarg(2, ctx, &step);
    bpf_usdt_readarg(3, ctx, &key);
    return obs_phase(0, phase, step, key);
}

int obs_usdt_phase_end(struct pt_regs *ctx)
{
    u64 phase = 0, key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &phase);
    bpf_usdt_readarg(2, ctx, &step);
    bpf_usdt_readarg(3, ctx, &key);
    return obs_phase(1, phase, step, key);
}

/* phase_next(old_phase, new_phase, step, old_key, new_key): the open phase ends and the next begins at one
 * instant (one trap and one program run instead of a phase_end and a phase_begin). */
int obs_usdt_phase_next(struct pt_regs *ctx)
{
    if (!obs_usdt_gate())
        return 0;
    u64 old_phase = 0, new_phase = 0, old_key = 0, new_key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &old_phase);
    bpf_usdt_readarg(2, ctx, &new_phase);
    bpf_usdt_readarg(3, ctx, &step);
    bpf_usdt_readarg(4, ctx, &old_key);
    bpf_usdt_readarg(5, ctx, &new_key);
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    char old_name[16] = {}, new_name[16] = {};
    bpf_probe_read_user_str(old_name, sizeof(old_name), (void *)old_phase);
    bpf_probe_read_user_str(new_name, sizeof(new_name), (void *)new_phase);
    obs_phase_end_at(tgid, tid, now, old_name, step, old_key, 0);
    obs_phase_begin_at(tgid, tid, now, new_name, step, new_key);
    return 0;
}

/* step_next(step, key, next_key, old_phase, old_key, new_phase, new_key): at a step boundary the open
 * phase ends, the step ends, step + 1 begins and its first phase begins, at one instant (one trap and one
 * program run instead of four). The phase parts are compiled in when the pytorch_phase probe is attached,
 * so a selection without it gets what step_end and step_begin alone would give. */
int obs_usdt_step_next(struct pt_regs *ctx)
{
    if (!obs_usdt_gate())
        return 0;
    u64 key = 0, next_key = 0, old_phase = 0, old_key = 0, new_phase = 0, new_key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &step);
    bpf_usdt_readarg(2, ctx, &key);
    bpf_usdt_readarg(3, ctx, &next_key);
    bpf_usdt_readarg(4, ctx, &old_phase);
    bpf_usdt_readarg(5, ctx, &old_key);
    bpf_usdt_readarg(6, ctx, &new_phase);
    bpf_usdt_readarg(7, ctx, &new_key);
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
#ifdef OBS_ATTACHED_PYTORCH_PHASE
    char name[16] = {};
    bpf_probe_read_user_str(name, sizeof(name), (void *)old_phase);
    obs_phase_end_at(tgid, tid, now, name, step, old_key, 0);
#endif
    obs_step_end_at(tgid, tid, now, step, key, 1);
    obs_step_begin_at(tgid, tid, now, step + 1, next_key);
#ifdef OBS_ATTACHED_PYTORCH_PHASE
    __builtin_memset(name, 0, sizeof(name));
    bpf_probe_read_user_str(name, sizeof(name), (void *)new_phase);
    obs_phase_begin_at(tgid, tid, now, name, step + 1, new_key);
#endif
    return 0;
}

static __always_inline int obs_coll(int end, u64 pg, u64 seq, u64 op, u64 bytes, s64 step, u64 key)
{
    if (!obs_usdt_gate())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 now = bpf_ktime_get_ns(), dur = 0;
    struct obs_coll_key ck = {};
    ck.tgid = tgid;
    ck.coll_seq = seq;
    bpf_probe_read_user_str(ck.pg, sizeof(ck.pg), (void *)pg);
    struct obs_coll_pg gk = {.tgid = tgid};
    __builtin_memcpy(gk.pg, ck.pg, sizeof(gk.pg));
    struct obs_coll_open *co = coll_open.lookup(&gk);
    u32 i = seq & (OBS_COLL_SLOTS - 1);
    if (!end) {
        if (!co) {
            struct obs_coll_open zero = {};
            coll_open.update(&gk, &zero);
            co = coll_open.lookup(&gk);
        }
        if (co && co->slot[i].ts == 0) {
            co->slot[i].seq = seq;
            co->slot[i].ts = now;
        } else {
            coll_begin_ts.update(&ck, &now);
        }
        obs_set_key(tid, key, step);
    } else if (co && co->slot[i].ts && co->slot[i].seq == seq) {
        dur = now - co->slot[i].ts;
        co->slot[i].ts = 0;
    } else {
        u64 *begin = coll_begin_ts.lookup(&ck);
        if (begin) {
            dur = now - *begin;
            coll_begin_ts.delete(&ck);
        }
    }
    struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_COLLECTIVE,
                                      end ? OBS_KIND_COLLECTIVE_END : OBS_KIND_COLLECTIVE_BEGIN, tgid, tid);
    if (!e)
        return 0;
    e->ts_ns = now;
    e->duration_ns = dur;
    e->step = step;
    e->trace_key = key;
    e->value = bytes;
    e->arg0 = ck.coll_seq;
    __builtin_memcpy(e->str0, ck.pg, sizeof(ck.pg));
    bpf_probe_read_user_str(e->str1, sizeof(e->str1), (void *)op);
    obs_submit(e);
    return 0;
}

int obs_usdt_coll_begin(struct pt_regs *ctx)
{
    u64 pg = 0, seq = 0, op = 0, bytes = 0, key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &pg);
    bpf_usdt_readarg(2, ctx, &seq);
    bpf_usdt_readarg(3, ctx, &op);
    bpf_usdt_readarg(4, ctx, &bytes);
    bpf_usdt_readarg(5, ctx, &step);
    bpf_usdt_readarg(6, ctx, &key);
    return obs_coll(0, pg, seq, op, bytes, step, key);
}

int obs_usdt_coll_end(struct pt_regs *ctx)
{
    u64 pg = 0, seq = 0, op = 0, bytes = 0, key = 0;
    s64 step = 0;
    bpf_usdt_readarg(1, ctx, &pg);
    bpf_usdt_readarg(2, ctx, &seq);
    bpf_usdt_readarg(3, ctx, &op);
    bpf_usdt_readarg(4, ctx, &bytes);
    bpf_usdt_readarg(5, ctx, &step);
    bpf_usdt_readarg(6, ctx, &key);
    return obs_coll(1, pg, seq, op, bytes, step, key);
}

/* coll(pg, coll_seq, op, bytes, step, trace_key, begin_ns, begin_tid): one collective in one trap, fired at
 * its end by the C++ collective kernel while this probe is attached (instead of coll_begin, tracekey and
 * coll_end: three traps). The same two records as the pair: COLLECTIVE_BEGIN with the begin time and the
 * issuing thread, COLLECTIVE_END now on the completing thread with the duration, both with the
 * collective's step and key. No map is touched (the begin time travels with the probe, not in coll_open).
 * begin_tid < 0: the kernel's watchdog sent the begin already (coll_late, below: the collective was still
 * in flight after 100 ms), so only the END. What the pair gave and this does not: the issuing thread's key
 * is not the collective's while it enqueues the op (a few µs; its records then carry the phase's key), and
 * the begin of a collective that hangs arrives when the watchdog sees it (<= 200 ms after it began, with
 * its true begin time), not at once. */
static __always_inline int obs_coll_one(int begin_only, u64 pg, u64 seq, u64 op, u64 bytes, s64 step, u64 key,
                                        u64 begin, s32 btid)
{
    if (!obs_usdt_gate())
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    if (begin == 0 || begin > now)
        begin = now;
    struct obs_event *b = NULL;
    if (btid >= 0) {
        b = obs_reserve(OBS_PROBE_PYTORCH_COLLECTIVE, OBS_KIND_COLLECTIVE_BEGIN, tgid, btid > 0 ? (u32)btid : tid);
        if (!b)
            return 0;
        b->ts_ns = begin;
        b->step = step;
        b->trace_key = key;
        b->value = bytes;
        b->arg0 = seq;
        bpf_probe_read_user_str(b->str0, 16, (void *)pg); /* 16 bytes, as the pair's (struct obs_coll_key) */
        bpf_probe_read_user_str(b->str1, sizeof(b->str1), (void *)op);
        if (begin_only) {
            obs_submit(b);
            return 0;
        }
    }
    struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_COLLECTIVE, OBS_KIND_COLLECTIVE_END, tgid, tid);
    if (!e) {
        if (b)
            obs_submit(b);
        return 0;
    }
    e->ts_ns = now;
    e->duration_ns = now - begin;
    e->step = step;
    e->trace_key = key;
    e->value = bytes;
    e->arg0 = seq;
    if (b) {
        __builtin_memcpy(e->str0, b->str0, 16);
        __builtin_memcpy(e->str1, b->str1, sizeof(e->str1));
        obs_submit(b);
    } else {
        bpf_probe_read_user_str(e->str0, 16, (void *)pg);
        bpf_probe_read_user_str(e->str1, sizeof(e->str1), (void *)op);
    }
    obs_submit(e);
    return 0;
}

/* coll and coll_late read the same 8 arguments in two copies: bcc rewrites each bpf_usdt_readarg for the
 * probe function it appears in, and refuses it inside a macro or a shared helper ("cannot use builtin
 * inside a macro"). */
int obs_usdt_coll(struct pt_regs *ctx)
{
    u64 pg = 0, seq = 0, op = 0, bytes = 0, key = 0, begin = 0;
    s64 step = 0;
    s32 btid = 0;
    bpf_usdt_readarg(1, ctx, &pg);
    bpf_usdt_readarg(2, ctx, &seq);
    bpf_usdt_readarg(3, ctx, &op);
    bpf_usdt_readarg(4, ctx, &bytes);
    bpf_usdt_readarg(5, ctx, &step);
    bpf_usdt_readarg(6, ctx, &key);
    bpf_usdt_readarg(7, ctx, &begin);
    bpf_usdt_readarg(8, ctx, &btid);
    return obs_coll_one(0, pg, seq, op, bytes, step, key, begin, btid);
}

/* coll_late(same as coll): the begin of a collective still in flight (COLLECTIVE_BEGIN at begin_ns on
 * thread begin_tid), fired by the C++ kernel's watchdog thread; its `coll` follows with begin_tid < 0. */
int obs_usdt_coll_late(struct pt_regs *ctx)
{
    u64 pg = 0, seq = 0, op = 0, bytes = 0, key = 0, begin = 0;
    s64 step = 0;
    s32 btid = 0;
    bpf_usdt_readarg(1, ctx, &pg);
    bpf_usdt_readarg(2, ctx, &seq);
    bpf_usdt_readarg(3, ctx, &op);
    bpf_usdt_readarg(4, ctx, &bytes);
    bpf_usdt_readarg(5, ctx, &step);
    bpf_usdt_readarg(6, ctx, &key);
    bpf_usdt_readarg(7, ctx, &begin);
    bpf_usdt_readarg(8, ctx, &btid);
    return obs_coll_one(1, pg, seq, op, bytes, step, key, begin, btid < 0 ? -btid : btid);
}

/* caught(where): the instrumentation of a watched process caught an exception at `where` and went on;
 * counted per `where` (16 bytes, NUL-padded), read by the agent (BpfEventSource.caught, the metric
 * obshub_agent_caught_errors_total{where="instrument_<where>"}). Fired on the catch path only. */
struct obs_caught_key {
    char where[16];
};
BPF_HASH(inst_caught, struct obs_caught_key, u64, 64);

int obs_usdt_caught(struct pt_regs *ctx)
{
    if (!obs_current_watched())
        return 0;
    u64 where = 0;
    bpf_usdt_readarg(1, ctx, &where);
    struct obs_caught_key k = {};
    bpf_probe_read_user_str(k.where, sizeof(k.where), (void *)where);
    u64 zero = 0, *n = inst_caught.lookup_or_try_init(&k, &zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
