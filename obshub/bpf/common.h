/* obshub BPF common header: the event record shared by every layer and by user space
 * (`struct obs_event`, from record.h: generated from obshub/producer/record.py), the maps every
 * layer shares, and the helpers that tag an event with its thread's TraceKey.
 *
 * Compiled by bcc together with the layer files the loader selects (obshub/bpf/obshub.c includes them).
 * Parameters come from the loader as -D flags, never by editing this text:
 *   OBS_RINGBUF_PAGES     ring buffer size in pages (power of two)
 *   OBS_NPROBES           number of probe ids (the lost-counter array has one more slot: their sum)
 *   OBS_NTHRESHOLDS       number of thresholds (size of the thresholds array)
 *   OBS_WATCH_ALL         defined: no target filter (every process is watched)
 *   OBS_WATCH_CGROUP_V2   defined: tasks in the cgroups of `wcgroups` are watched on sight
 *   OBS_PROBE_<NAME>      probe ids, OBS_THR_<NAME> threshold indices, OBS_KIND_<NAME> event kinds
 *   OBS_MAX_TIDS          capacity of the per-thread maps
 *
 * Maps: see the BPF_* lines below; the per-step aggregates (sched_acc, mem_acc, cuda_acc) and what each
 * record kind carries are described in docs/AGENT.md "Aggregation in the kernel".
 */
#ifndef OBSHUB_COMMON_H
#define OBSHUB_COMMON_H

#include <uapi/linux/ptrace.h>

#ifndef OBS_RINGBUF_PAGES
#define OBS_RINGBUF_PAGES 64
#endif
#ifndef OBS_MAX_TIDS
#define OBS_MAX_TIDS 65536
#endif
/* struct obs_event, one event of 176 bytes: generated from obshub/producer/record.py (the one definition the
 * agent's C reader and Python decoder follow too). Per-kind meaning of value/arg0..arg3/str0/str1: docs/AGENT.md
 * "Probes". */
#include "record.h"

/* Per-step aggregates, one per process (a training rank), kept in the kernel and shipped as one record
 * per process and step by the step_end USDT handler (obshub/bpf/pytorch.c), which then resets them. Histograms
 * are log2 buckets of microseconds (bucket i: [2^i, 2^(i+1)) µs, bucket 0 also below 1 µs, bucket 15
 * everything from 2^15 µs). Maxima are plain stores: under updates from several CPUs at once one may be
 * missed (the counts and sums are atomic). */
#define OBS_HIST_BUCKETS 16

/* Scheduler time of the process's training threads within the current step (obshub/bpf/sched.c adds; reset at
 * step_begin) -> SCHED_STEP_SUM. The sums include the waits also sent as SCHED_RUNQ/SCHED_OFFCPU; at most
 * OBS_THR_SCHED_SINGLES of those singles are sent per process and step (the first ones above the
 * thresholds), the rest is only in the sums, maxima and histogram; beyond the cap a wait is still sent
 * when it is at least twice the longest one sent in the step (at most ~log2(step / threshold) more: the
 * step's longest wait always arrives), and a stopped or traced thread's off-CPU time always is. */
struct obs_sched_acc {
    u64 offcpu_ns;
    u64 runq_ns;
    u64 switches;
    u64 wakeups;
    u64 runq_max_ns;
    u64 offcpu_max_ns;
    u64 singles;                       /* SCHED_RUNQ/SCHED_OFFCPU records sent in this step */
    u64 singles_max_ns;                /* the longest wait sent as a single in this step (sched.c) */
    u32 runq_hist[OBS_HIST_BUCKETS];   /* run-queue waits */
    u64 others_runq_ns;                /* run-queue waits of the process's other threads (no TraceKey: gloo's
                                        * I/O threads, intra-op workers) not sent as SCHED_RUNQ singles */
    u64 others_waits;                  /* how many waits others_runq_ns sums */
};

/* Memory activity since the process's previous step_end (obshub/bpf/memory.c adds) -> MEM_STEP_SUM. Holds only
 * what was not sent as a single record (PAGE_ALLOC of order >= OBS_THR_PAGE_ORDER_SINGLE, MEM_RECLAIM and
 * MEM_COMPACTION stalls >= their thresholds), so singles and aggregate never count the same thing twice. */
struct obs_mem_acc {
    u64 allocs;        /* page allocations of order >= OBS_THR_PAGE_ORDER */
    u64 pages;         /* their pages (sum of 2^order) */
    u64 stall_ns;      /* reclaim + compaction stall time */
    u64 stalls;
    u64 stall_max_ns;
    u32 orders[OBS_HIST_BUCKETS]; /* allocations per order (15: order >= 15) */
};

/* CUDA kernel launches since the process's previous step_end (obshub/bpf/cuda.c adds) -> CUDA_STEP_SUM: the
 * launches shorter than OBS_THR_CUDA_LAUNCH_NS (longer ones are sent as single CUDA_LAUNCH records). */
struct obs_cuda_acc {
    u64 launches;
    u64 sum_ns;
    u64 max_ns;
    u32 hist[OBS_HIST_BUCKETS];
};

BPF_RINGBUF_OUTPUT(events, OBS_RINGBUF_PAGES);
BPF_HASH(watched, u32, u8, 4096);                            /* tgid -> 1: processes to watch */
BPF_HASH(wcgroups, u64, u8, 1024);                           /* cgroup v2 id -> 1: cgroups to watch */
BPF_HASH(wtids, u32, u32, OBS_MAX_TIDS);                     /* tid -> tgid of watched threads */
/* probe id -> failed reservations; slot OBS_NPROBES: all of them (the agent reads that one slot a second
 * and the others only when it grew) */
BPF_ARRAY(lost, u64, OBS_NPROBES + 1);
BPF_ARRAY(thresholds, u64, OBS_NTHRESHOLDS);                 /* OBS_THR_* -> value (ns, order...) */
/* Pre-filters for the programs that run on every context switch or wakeup of the machine: in word n / 64
 * of wbits, bit n % 64 of `tid` is set while thread n is in wtids, the same bit of `tgid` while process n
 * is in watched. An array look-up is inlined by the verifier (no hashing, no helper call), so a task that
 * is not watched costs one load and a test. The two words of one range of 64 pid numbers share a 16-byte
 * element: a thread whose tid is near its process's (most of a process's threads are) finds both bits in
 * one cache line (the USDT handlers' and the switch-out's test of a watched thread, which otherwise
 * touched a page of each bitmap after the training had evicted them). The hash maps stay the truth: a set
 * bit only lets the program ask them (a bit may stay set after its thread is gone); a missing bit is set
 * again the next time the thread passes obs_current_watched (every switch-out of a watched thread does).
 * Pids at or above OBS_PID_LIMIT (the loader passes kernel.pid_max) are not in the bitmaps: the programs
 * ask the hash maps for those. */
#ifndef OBS_PID_LIMIT
#define OBS_PID_LIMIT 4194304
#endif
#define OBS_PID_WORDS ((OBS_PID_LIMIT + 63) / 64)
struct obs_wbits {
    u64 tgid; /* bit n % 64: process n is watched */
    u64 tid;  /* bit n % 64: thread n is watched */
};
BPF_ARRAY(wbits, struct obs_wbits, OBS_PID_WORDS);
BPF_HASH(sched_acc, u32, struct obs_sched_acc, 4096);        /* tgid -> sums in the current step */
BPF_HASH(mem_acc, u32, struct obs_mem_acc, 4096);            /* tgid -> memory aggregate of the step */
BPF_HASH(cuda_acc, u32, struct obs_cuda_acc, 4096);          /* tgid -> CUDA launch aggregate of the step */

/* The deep dive's step budget (obshub/producer/loader.py deep_dive_on): while deep_gate[0].gen is not 0, a
 * deep-dive symbol's call (cuda_sym[i].deep) counts only in a process with steps left: its deep_left entry
 * is made at its first such call of window `gen` with `steps` steps (the step open then is the first) and
 * each step end of the process with a launch aggregate takes one (obs_emit_cuda_acc; a step without a
 * counted launch, e.g. one whose launches came before the attach and whose NCCL call after it, takes
 * none). So a window of N steps ships N launch aggregates per process however late the agent reads the
 * step ends and detaches the uprobes. A new
 * request writes a new gen: every process starts again from N. */
struct obs_deep_gate {
    u64 gen;   /* window number; 0: no budget (every call counts) */
    s64 steps; /* steps of the window per process */
};
struct obs_deep_left {
    u64 gen;
    s64 left;
};
BPF_ARRAY(deep_gate, struct obs_deep_gate, 1);
BPF_TABLE("lru_hash", u32, struct obs_deep_left, deep_left, 4096); /* tgid -> its steps left in window gen */

/* May a deep-dive call of process tgid be counted now? (makes its budget at its first call of a window) */
static __always_inline int obs_deep_allowed(u32 tgid)
{
    u32 zero = 0;
    struct obs_deep_gate *g = deep_gate.lookup(&zero);
    if (!g || !g->gen)
        return 1;
    struct obs_deep_left *l = deep_left.lookup(&tgid);
    if (l && l->gen == g->gen)
        return l->left > 0;
    struct obs_deep_left fresh = {.gen = g->gen, .left = g->steps};
    deep_left.update(&tgid, &fresh);
    return fresh.left > 0;
}

/* Per watched thread, one entry for its whole life: its TraceKey and step (`trained`: it has one, set by
 * obs_set_key in obshub/bpf/pytorch.c; every record of the thread carries them, obs_reserve), and the scheduler
 * layer's state (obshub/bpf/sched.c): when it left the CPU (0: on a CPU), its state then, when it became
 * runnable (0: not waiting in a run queue), its process (the tgid wtids holds), its wakeups since it last
 * came on a CPU (summed into sched_acc when it does). Made by the first key or the first scheduler event
 * of the thread, updated in place (a switch or a key change is a look-up, not an insert and a delete),
 * deleted by obs_sched_exit when the thread exits (without the scheduler layer the entry stays until
 * the agent stops); entries exist only for watched threads.
 *
 * Where the entry lives: in slot tid % OBS_TSLOTS of the array tslots when that slot was free when the
 * entry was made (`tid` names the slot's owner, 0 = free), else in the hash tstate. An array look-up is
 * inlined by the verifier (an address computation, one cache line), a hash look-up hashes the key and
 * walks a bucket (a helper call and at least two cache lines, on two pages); the threads of a process
 * have nearby tids, so they rarely share a slot, and the hash takes the rest. The key shares the entry's
 * 64-byte line with the scheduler state: a probe that sets the key and reserves a record, or a switch
 * that reads the state and sends a record, touches one line of the thread's, which matters because most
 * probes fire after milliseconds of the training's own work have evicted the maps from the caches and
 * the TLB. A deleted slot is zeroed before it is freed. */
struct obs_tstate {
    u64 off_ns;
    s64 state;
    u64 wake_ns;
    u64 tid;      /* tslots: the owner (0 = free; 64 bits: bcc's compare-and-swap has no 32-bit form) */
    u32 tgid;
    u32 trained;  /* the thread has a TraceKey (trace_key, step below) */
    u32 wakes;
    u32 pad;
    u64 trace_key;  /* TraceKey of the thread now (valid when trained) */
    s64 step;       /* its full step number */
};

#ifndef OBS_TSLOTS
#define OBS_TSLOTS 32768
#endif
BPF_ARRAY(tslots, struct obs_tstate, OBS_TSLOTS);
BPF_HASH(tstate, u32, struct obs_tstate, OBS_MAX_TIDS);

/* The state entry of thread `tid`, NULL when it has none. */
static __always_inline struct obs_tstate *obs_tstate_get(u32 tid)
{
    u32 i = tid & (OBS_TSLOTS - 1);
    struct obs_tstate *ts = tslots.lookup(&i);
    if (ts && ts->tid == tid)
        return ts;
    return tstate.lookup(&tid);
}

/* Make the state entry of thread `tid` (which has none) from `v`: in its slot when that is free, else in
 * tstate. The slot is claimed with a compare-and-swap of its owner, then filled; a reader on another CPU
 * may see it claimed and still zero for that instant (nothing to measure, as for a thread without one). */
static __always_inline void obs_tstate_new(u32 tid, struct obs_tstate *v)
{
    u32 i = tid & (OBS_TSLOTS - 1);
    struct obs_tstate *ts = tslots.lookup(&i);
    v->tid = tid;
    if (ts && ts->tid == 0 && __sync_val_compare_and_swap(&ts->tid, (u64)0, (u64)tid) == 0) {
        ts->off_ns = v->off_ns;
        ts->state = v->state;
        ts->wake_ns = v->wake_ns;
        ts->tgid = v->tgid;
        ts->wakes = v->wakes;
        ts->trace_key = v->trace_key;
        ts->step = v->step;
        ts->trained = v->trained;
        return;
    }
    tstate.update(&tid, v);
}

/* Forget the state entry of thread `tid` (it exits). */
static __always_inline void obs_tstate_del(u32 tid)
{
    u32 i = tid & (OBS_TSLOTS - 1);
    struct obs_tstate *ts = tslots.lookup(&i);
    if (ts && ts->tid == tid) {
        ts->off_ns = 0;
        ts->state = 0;
        ts->wake_ns = 0;
        ts->tgid = 0;
        ts->trained = 0;
        ts->wakes = 0;
        ts->trace_key = 0;
        ts->step = 0;
        __sync_val_compare_and_swap(&ts->tid, (u64)tid, (u64)0);
        return;
    }
    tstate.delete(&tid);
}

/* log2 bucket of a duration in µs, 0..OBS_HIST_BUCKETS-1 (branches, no loop: verifier-friendly). */
static __always_inline u32 obs_log2_us(u64 ns)
{
    u64 v = ns / 1000;
    u32 b = 0;
    if (v >> 32) { v >>= 32; b += 32; }
    if (v >> 16) { v >>= 16; b += 16; }
    if (v >> 8) { v >>= 8; b += 8; }
    if (v >> 4) { v >>= 4; b += 4; }
    if (v >> 2) { v >>= 2; b += 2; }
    if (v >> 1) { b += 1; }
    return b < OBS_HIST_BUCKETS ? b : OBS_HIST_BUCKETS - 1;
}

static __always_inline void obs_max(u64 *slot, u64 v)
{
    if (v > *slot)
        *slot = v;
}

static __always_inline u64 obs_threshold(u32 idx)
{
    u64 *v = thresholds.lookup(&idx);
    return v ? *v : 0;
}

static __always_inline void obs_count_lost(u32 probe)
{
    u64 *v = lost.lookup(&probe);
    if (v)
        __sync_fetch_and_add(v, 1);
    u32 all = OBS_NPROBES;
    v = lost.lookup(&all);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* Bit operations on a word of the bitmaps (NULL: n is beyond them). bcc allows map calls only in plain
 * code, so each bitmap has its own look-up function. */
static __always_inline int obs_bit_test(u64 *w, u32 n)
{
    return n >= OBS_PID_LIMIT || (w && ((*w >> (n & 63)) & 1));
}

static __always_inline void obs_bit_set(u64 *w, u32 n)
{
    if (w && !((*w >> (n & 63)) & 1))
        __sync_fetch_and_or(w, 1ull << (n & 63));
}

static __always_inline void obs_bit_clear(u64 *w, u32 n)
{
    if (w && ((*w >> (n & 63)) & 1))
        __sync_fetch_and_and(w, ~(1ull << (n & 63)));
}

static __always_inline u64 *obs_tid_word(u32 tid)
{
    u32 w = tid >> 6;
    struct obs_wbits *b = tid < OBS_PID_LIMIT ? wbits.lookup(&w) : NULL;
    return b ? &b->tid : NULL;
}

static __always_inline u64 *obs_tgid_word(u32 tgid)
{
    u32 w = tgid >> 6;
    struct obs_wbits *b = tgid < OBS_PID_LIMIT ? wbits.lookup(&w) : NULL;
    return b ? &b->tgid : NULL;
}

/* May thread `tid` be watched (its bit set, or beyond the bitmap)? */
static __always_inline int obs_tid_maybe(u32 tid)
{
    return obs_bit_test(obs_tid_word(tid), tid);
}

/* Is the process `tgid` watched? With OBS_WATCH_ALL every process is. */
static __always_inline int obs_tgid_watched(u32 tgid)
{
#ifdef OBS_WATCH_ALL
    return 1;
#else
    return watched.lookup(&tgid) != NULL;
#endif
}

/* Is the current task watched? Remembers its tid -> tgid so sched events can filter by tid alone.
 * With a cgroup v2 target (OBS_WATCH_CGROUP_V2) a task running in one of the cgroups of `wcgroups` is
 * watched from its first probe on, without waiting for the loader to re-read cgroup.procs. */
static __always_inline int obs_current_watched(void)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!obs_tgid_watched(tgid)) {
#ifdef OBS_WATCH_CGROUP_V2
        u64 cgid = bpf_get_current_cgroup_id();
        if (wcgroups.lookup(&cgid) == NULL)
            return 0;
        u8 one = 1;
        watched.update(&tgid, &one);
#else
        return 0;
#endif
    }
    if (wtids.lookup(&tid) == NULL)
        wtids.update(&tid, &tgid);
    obs_bit_set(obs_tid_word(tid), tid);
    obs_bit_set(obs_tgid_word(tgid), tgid);
    return 1;
}

/* obs_current_watched for the programs on the hot paths of the whole machine (context switch, page
 * allocation): a task whose process's bit is clear costs one array load and a test; the rest takes the
 * same path as obs_current_watched (which adds a new thread of a watched process on sight). */
static __always_inline int obs_current_watched_fast(void)
{
#if defined(OBS_WATCH_ALL) || defined(OBS_WATCH_CGROUP_V2)
    return obs_current_watched();
#else
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!obs_bit_test(obs_tgid_word(tgid), tgid))
        return 0;
#ifdef OBS_LAYER_SCHED
    /* both bits set (and within the bitmaps): the thread was added by obs_current_watched or the loader;
     * the process's bit is cleared when its main thread exits (the scheduler layer's exit handler) or the
     * loader drops it, so a stale thread bit alone lets nothing through: no hash look-up needed */
    if (tid < OBS_PID_LIMIT && tgid < OBS_PID_LIMIT && obs_bit_test(obs_tid_word(tid), tid))
        return 1;
#endif
    return obs_current_watched();
#endif
}

/* Reserve an event for `probe`, fill the common fields from thread `tid` of process `tgid` (its
 * TraceKey and step from its state entry). Returns NULL and counts the loss when the ring buffer is full. */
static __always_inline struct obs_event *obs_reserve(u32 probe, u16 kind, u32 tgid, u32 tid)
{
    struct obs_event *e = events.ringbuf_reserve(sizeof(struct obs_event));
    if (!e) {
        obs_count_lost(probe);
        return NULL;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = kind;
    e->probe = probe;
    e->pid = tgid;
    e->tid = tid;
    e->step = -1;
    struct obs_tstate *ts = tid ? obs_tstate_get(tid) : NULL;
    if (ts && ts->trained) {
        e->trace_key = ts->trace_key;
        e->step = ts->step;
    }
    return e;
}

/* The same for the current task. */
static __always_inline struct obs_event *obs_reserve_current(u32 probe, u16 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    return obs_reserve(probe, kind, id >> 32, (u32)id);
}

/* Submit without waking the reader, except every OBS_WAKEUP_EVERY-th event (a quarter of the ring, at
 * most 4 MiB of records: the rest of the ring is headroom for the time the woken reader waits for a CPU):
 * the reader polls on a timer anyway, and a wakeup per event would preempt the watched threads sharing
 * the reader's CPU (which would then show up in their own scheduler events). Each CPU counts its own
 * records (a per-CPU counter: no atomic add on a line every CPU writes, which would move between the
 * CPUs' caches with the records) and wakes the reader every OBS_WAKEUP_EVERY / OBS_NCPUS of them, so the
 * records between two wakeups still stay within a quarter of the ring however they spread. */
#define OBS_WAKEUP_BYTES (OBS_RINGBUF_PAGES * 4096 / 4 < (4 << 20) ? OBS_RINGBUF_PAGES * 4096 / 4 : (4 << 20))
#ifndef OBS_WAKEUP_EVERY
#define OBS_WAKEUP_EVERY (OBS_WAKEUP_BYTES / (sizeof(struct obs_event) + 8) + 1)
#endif
#ifndef OBS_NCPUS
#define OBS_NCPUS 1
#endif
#define OBS_WAKEUP_EVERY_CPU (OBS_WAKEUP_EVERY / OBS_NCPUS + 1)
BPF_PERCPU_ARRAY(submitted, u64, 1);

static __always_inline void obs_submit(struct obs_event *e)
{
    u32 zero = 0;
    u64 flags = BPF_RB_NO_WAKEUP;
    u64 *n = submitted.lookup(&zero);
    if (n && (*n)++ % OBS_WAKEUP_EVERY_CPU == 0)
        flags = BPF_RB_FORCE_WAKEUP;
    events.ringbuf_submit(e, flags);
}

/* wake_req[0]: when the next step end may wake the reader. 0: not (the reader is woken already, or
 * sleeps on purpose); otherwise a CLOCK_MONOTONIC time in ns (bpf_ktime_get_ns()): the first step end at
 * or after it wakes the reader and clears the value. The loader writes it before it waits, not after a
 * drain: while the agent's open batch is too young to be sealed by a step end, the time it becomes old
 * enough, so that the step end that can seal it is the one that wakes the reader; else 1 (at once) when
 * the value may be 0 or a time not reached. */
BPF_ARRAY(wake_req, u64, 1);

/* Submit and wake the reader at once: the end of a step (at time `now`), so the agent seals and sends the
 * step's batch the moment the step ends. Only the first step end since the reader's last drain, and not
 * before the time in wake_req, wakes it (a wakeup is an irq_work and an IPI, ~20 µs of the training
 * thread's time on this project's VM, measured by bench/training_overhead.py); the others find the
 * reader already woken, or sleeping through them on purpose (obshub/producer/loader.py `quiet_ms`), and would
 * only add to the edge it reads once. */
static __always_inline void obs_submit_wake(struct obs_event *e, u64 now)
{
    u32 zero = 0;
    u64 *n = submitted.lookup(&zero);
    if (n)
        (*n)++;
    u64 *want = wake_req.lookup(&zero);
    if (want && *want && now >= *want) {
        *want = 0;
        events.ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
    } else {
        events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    }
}

/* Read a tracepoint field at the byte offset the loader found in tracefs (-D TPOFF_...): a direct load
 * from the tracepoint's record when the offset is aligned to the field's size (the verifier allows
 * aligned reads of a tracepoint program's context: no helper call), else bpf_probe_read_kernel (byte
 * arrays read as a word, such as an IPv4 address). Both are compile-time constants: one branch is left. */
#define OBS_TP_READ(dst, ctx, off)                                                                        \
    do {                                                                                                  \
        if ((off) % sizeof(dst) == 0)                                                                     \
            (dst) = *(typeof(dst) *)((char *)(ctx) + (off));                                              \
        else                                                                                              \
            bpf_probe_read_kernel(&(dst), sizeof(dst), (char *)(ctx) + (off));                            \
    } while (0)

#endif /* OBSHUB_COMMON_H */
