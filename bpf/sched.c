/* obshub scheduler layer: off-CPU time and run-queue latency of the watched threads.
 *
 * Tracepoints sched:sched_switch, sched:sched_wakeup, sched:sched_wakeup_new. Fields are read at the
 * byte offsets the loader found in tracefs (-D TPOFF_<EVENT>_<FIELD>), so no kernel struct layout is
 * compiled in (bcc's 6.1 headers do not match newer kernels' task_struct).
 *
 * run-queue latency = time from wakeup (or from being preempted while runnable) to running again;
 * off-CPU time      = time from switching out to switching in again (includes the run-queue wait).
 * Events above the thresholds OBS_THR_RUNQ_NS / OBS_THR_OFFCPU_NS are emitted as SCHED_RUNQ /
 * SCHED_OFFCPU, at most OBS_THR_SCHED_SINGLES per process and step; the per-step sums, maxima and run-queue histogram of training threads (threads with a
 * TraceKey) go to sched_acc and are emitted as SCHED_STEP_SUM by the step_end USDT handler (bpf/pytorch.c).
 */
#include "common.h"

#define OBS_TASK_STATE_MASK 0xFF

struct obs_off {
    u64 ts_ns;
    s64 state;
};

/* Plain hashes (an LRU hash costs more per update): entries exist only for watched threads, are deleted when
 * the thread runs again and at its exit (obs_sched_exit), so they do not outgrow the live watched threads. */
BPF_HASH(wake_ts, u32, u64, OBS_MAX_TIDS);          /* tid -> when it became runnable */
BPF_HASH(off_ts, u32, struct obs_off, OBS_MAX_TIDS); /* tid -> when it left the CPU, its state */

/* `waited`: a run-queue wait ended now (runq is its length; it goes to the maximum and the histogram). */
static __always_inline void obs_acc_add(u32 tgid, u32 tid, u64 offcpu, u64 runq, u64 sw, u64 wk, int waited)
{
    if (tid_key.lookup(&tid) == NULL)
        return; /* only training threads (those with a TraceKey) are summed per step */
    struct obs_sched_acc zero = {};
    struct obs_sched_acc *acc = sched_acc.lookup_or_try_init(&tgid, &zero);
    if (!acc)
        return;
    __sync_fetch_and_add(&acc->offcpu_ns, offcpu);
    __sync_fetch_and_add(&acc->runq_ns, runq);
    __sync_fetch_and_add(&acc->switches, sw);
    __sync_fetch_and_add(&acc->wakeups, wk);
    obs_max(&acc->offcpu_max_ns, offcpu);
    if (waited) {
        obs_max(&acc->runq_max_ns, runq);
        u32 b = obs_log2_us(runq);
        __sync_fetch_and_add(&acc->runq_hist[b], 1);
    }
}

/* May one more single scheduler record be sent for process tgid in this step? (counts it if so) */
static __always_inline int obs_sched_single_ok(u32 tgid)
{
    struct obs_sched_acc *acc = sched_acc.lookup(&tgid);
    if (!acc)
        return 1; /* not in a step: nothing to cap against */
    if (acc->singles >= obs_threshold(OBS_THR_SCHED_SINGLES))
        return 0;
    __sync_fetch_and_add(&acc->singles, 1);
    return 1;
}

static __always_inline void obs_mark_runnable(u32 tid)
{
    if (!obs_tid_maybe(tid))
        return;
    u32 *tgid = wtids.lookup(&tid);
    if (!tgid)
        return;
    u64 now = bpf_ktime_get_ns();
    wake_ts.update(&tid, &now);
    obs_acc_add(*tgid, tid, 0, 0, 0, 1, 0);
}

int obs_sched_wakeup(void *ctx)
{
    s32 pid = 0;
    OBS_TP_READ(pid, ctx, TPOFF_SCHED_WAKEUP_PID);
    obs_mark_runnable((u32)pid);
    return 0;
}

int obs_sched_wakeup_new(void *ctx)
{
    s32 pid = 0;
    OBS_TP_READ(pid, ctx, TPOFF_SCHED_WAKEUP_NEW_PID);
    obs_mark_runnable((u32)pid);
    return 0;
}

int obs_sched_switch(void *ctx)
{
    s32 prev_pid = 0, next_pid = 0;
    long prev_state = 0;
    OBS_TP_READ(prev_pid, ctx, TPOFF_SCHED_SWITCH_PREV_PID);
    OBS_TP_READ(next_pid, ctx, TPOFF_SCHED_SWITCH_NEXT_PID);
    u32 prev = (u32)prev_pid, next = (u32)next_pid;
    int prev_watched = prev && obs_current_watched_fast();
    if (!prev_watched && !(next && obs_tid_maybe(next)))
        return 0; /* neither task is watched: the common case on a busy machine, no map work */
    u64 now = bpf_ktime_get_ns();

    /* 1. the previous task (the current one) leaves the CPU */
    if (prev_watched) {
        OBS_TP_READ(prev_state, ctx, TPOFF_SCHED_SWITCH_PREV_STATE);
        /* the low byte is the task state (TASK_REPORT bits); 0 = runnable ("R", or "R+" when preempted:
         * the tracepoint then sets TASK_REPORT_MAX, 0x100 since 4.14, above the low byte) */
        s64 state = prev_state & OBS_TASK_STATE_MASK;
        struct obs_off off = {.ts_ns = now, .state = state};
        off_ts.update(&prev, &off);
        if (state == 0) /* preempted while runnable: it waits in the run queue from now */
            wake_ts.update(&prev, &now);
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        obs_acc_add(tgid, prev, 0, 0, 1, 0, 0);
    }

    /* 2. the next task comes on the CPU */
    u32 *tgidp = next && obs_tid_maybe(next) ? wtids.lookup(&next) : NULL;
    if (!tgidp)
        return 0;
    u32 tgid = *tgidp;
    u64 runq = 0, offcpu = 0;
    s64 state = 0;
    u64 *wts = wake_ts.lookup(&next);
    if (wts) {
        runq = now - *wts;
        wake_ts.delete(&next);
    }
    struct obs_off *o = off_ts.lookup(&next);
    if (o) {
        offcpu = now - o->ts_ns;
        state = o->state;
        off_ts.delete(&next);
    }
    obs_acc_add(tgid, next, offcpu, runq, 0, 0, wts != NULL);
    if (wts && runq >= obs_threshold(OBS_THR_RUNQ_NS) && obs_sched_single_ok(tgid)) {
        struct obs_event *e = obs_reserve(OBS_PROBE_SCHED, OBS_KIND_SCHED_RUNQ, tgid, next);
        if (e) {
            e->ts_ns = now;
            e->duration_ns = runq;
            e->value = bpf_get_smp_processor_id();
            obs_submit(e);
        }
    }
    if (o && offcpu >= obs_threshold(OBS_THR_OFFCPU_NS) && obs_sched_single_ok(tgid)) {
        struct obs_event *e = obs_reserve(OBS_PROBE_SCHED, OBS_KIND_SCHED_OFFCPU, tgid, next);
        if (e) {
            e->ts_ns = now;
            e->duration_ns = offcpu;
            e->value = state;
            obs_submit(e);
        }
    }
    return 0;
}

/* sched:sched_process_exit: forget the exiting thread (keeps the per-thread maps small), and the process
 * when its main thread exits (a later process with the same pid is not watched by mistake). */
int obs_sched_exit(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    if (!obs_tid_maybe(tid) || wtids.lookup(&tid) == NULL)
        return 0;
    obs_bit_clear(obs_tid_word(tid), tid);
    if (tid == tgid) {
        obs_bit_clear(obs_tgid_word(tgid), tgid);
        watched.delete(&tgid);
        sched_acc.delete(&tgid);
        mem_acc.delete(&tgid);
        cuda_acc.delete(&tgid);
    }
    wtids.delete(&tid);
    wake_ts.delete(&tid);
    off_ts.delete(&tid);
    tid_key.delete(&tid);
    return 0;
}
