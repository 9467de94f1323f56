/* obshub scheduler layer: off-CPU time and run-queue latency of the watched threads.
 *
 * Tracepoints sched:sched_switch, sched:sched_wakeup, sched:sched_wakeup_new. Fields are read at the
 * byte offsets the loader found in tracefs (-D TPOFF_<EVENT>_<FIELD>), so no kernel struct layout is
 * compiled in (bcc's 6.1 headers do not match newer kernels' task_struct).
 *
 * run-queue latency = time from wakeup (or from being preempted while runnable) to running again;
 * off-CPU time      = time from switching out to switching in again (includes the run-queue wait).
 * Events above the thresholds OBS_THR_RUNQ_NS / OBS_THR_OFFCPU_NS are emitted as SCHED_RUNQ /
 * SCHED_OFFCPU, at most OBS_THR_SCHED_SINGLES per process and step (beyond that a wait twice the step's
 * longest sent one, and every stopped or traced thread's off-CPU time, value = its state 0x4 / 0x8); the per-step sums, maxima and run-queue histogram of training threads (threads with a
 * TraceKey) go to sched_acc and are emitted as SCHED_STEP_SUM by the step_end USDT handler (obshub/bpf/pytorch.c);
 * the run-queue waits of the process's other threads that no single carries are summed there too and sent by
 * step_end as one SCHED_RUNQ with value -1 when they reach OBS_THR_RUNQ_NS.
 */
#include "common.h"

#define OBS_TASK_STATE_MASK 0xFF
/* EXIT_DEAD | EXIT_ZOMBIE as sched_switch reports them: the task is switching out for the last time */
#define OBS_TASK_EXITING 0x30

/* `ts`: the state entry (obshub/bpf/common.h, struct obs_tstate) of a training thread `tid` of process `tgid`
 * that comes on a CPU now: add what it did since it last came on a CPU to the process's step sums. A
 * switch-out and the wakeups of a sleeping thread are counted here, when the thread comes back (a thread
 * cannot change its step while it is off the CPU), so the switch-out and wakeup programs touch only the
 * thread's own entry; only the fields that change are written (each atomic add costs). */
static __always_inline void obs_acc_in(u32 tgid, struct obs_tstate *ts, u64 offcpu, u64 runq, int was_off,
                                       int waited)
{
    u32 wk = ts->wakes;
    if (!was_off && !waited && !wk)
        return;
    struct obs_sched_acc zero = {};
    struct obs_sched_acc *acc = sched_acc.lookup_or_try_init(&tgid, &zero);
    if (!acc)
        return;
    if (was_off) {
        __sync_fetch_and_add(&acc->switches, 1);
        __sync_fetch_and_add(&acc->offcpu_ns, offcpu);
        obs_max(&acc->offcpu_max_ns, offcpu);
    }
    if (wk) {
        __sync_fetch_and_add(&acc->wakeups, wk);
        __sync_fetch_and_add(&ts->wakes, -wk);
    }
    if (waited) {
        __sync_fetch_and_add(&acc->runq_ns, runq);
        obs_max(&acc->runq_max_ns, runq);
        u32 b = obs_log2_us(runq);
        __sync_fetch_and_add(&acc->runq_hist[b], 1);
    }
}

/* TASK_REPORT bits of a stopped (__TASK_STOPPED, "T") or traced (TASK_TRACED, "t") task at switch-out:
 * SIGSTOP, a debugger, a freezer that stops it. Such an off-CPU time is the process's own stall, whatever it
 * was waiting for, and is rare (one record per thread and stop): it is always sent. */
#define OBS_TASK_STOPPED_MASK 0x0C

/* May one more single scheduler record of a wait of `ns` be sent for process tgid in this step? (counts it
 * if so.) The first OBS_THR_SCHED_SINGLES are; beyond them one that is at least twice the longest sent so
 * far in the step (a burst that starves a thread late in a step, after the cap was spent on short waits,
 * still arrives: the step's longest wait is always sent, at most ~log2(longest / threshold) more records). */
static __always_inline int obs_sched_single_ok(u32 tgid, u64 ns)
{
    struct obs_sched_acc *acc = sched_acc.lookup(&tgid);
    if (!acc)
        return 1; /* not in a step: nothing to cap against */
    u64 longest = acc->singles_max_ns;
    if (acc->singles >= obs_threshold(OBS_THR_SCHED_SINGLES) && ns < 2 * longest)
        return 0;
    __sync_fetch_and_add(&acc->singles, 1);
    if (ns > longest)
        acc->singles_max_ns = ns;
    return 1;
}

static __always_inline void obs_mark_runnable(u32 tid)
{
    if (!obs_tid_maybe(tid))
        return;
    struct obs_tstate *ts = obs_tstate_get(tid);
    if (ts) {
        ts->wake_ns = bpf_ktime_get_ns();
        if (ts->trained)
            __sync_fetch_and_add(&ts->wakes, 1);
        return;
    }
    u32 *tgid = wtids.lookup(&tid);
    if (!tgid)
        return;
    /* a thread with a TraceKey has an entry already (its key is in it): this one is not a training thread */
    struct obs_tstate v = {.wake_ns = bpf_ktime_get_ns(), .tgid = *tgid};
    obs_tstate_new(tid, &v);
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
    OBS_TP_READ(prev_state, ctx, TPOFF_SCHED_SWITCH_PREV_STATE);
    /* an exiting task's last switch-out comes after sched_process_exit forgot it: do not add it again
     * (its map entries and bits would outlive it) */
    int prev_watched = prev && !(prev_state & OBS_TASK_EXITING) && obs_current_watched_fast();
    if (!prev_watched && !(next && obs_tid_maybe(next)))
        return 0; /* neither task is watched: the common case on a busy machine, no map work */
    u64 now = bpf_ktime_get_ns();

    /* 1. the previous task (the current one) leaves the CPU */
    if (prev_watched) {
        /* the low byte is the task state (TASK_REPORT bits); 0 = runnable ("R", or "R+" when preempted:
         * the tracepoint then sets TASK_REPORT_MAX, 0x100 since 4.14, above the low byte) */
        s64 state = prev_state & OBS_TASK_STATE_MASK;
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        /* preempted while runnable (state 0): it waits in the run queue from now */
        struct obs_tstate *ts = obs_tstate_get(prev);
        if (ts) {
            ts->off_ns = now;
            ts->state = state;
            if (state == 0)
                ts->wake_ns = now;
        } else {
            struct obs_tstate v = {.off_ns = now,
                                   .state = state,
                                   .wake_ns = state == 0 ? now : 0,
                                   .tgid = tgid};
            obs_tstate_new(prev, &v);
        }
    }

    /* 2. the next task comes on the CPU (a watched thread without a state entry has not left a CPU or
     * been woken since it was watched: nothing to measure) */
    if (!next || !obs_tid_maybe(next))
        return 0;
    struct obs_tstate *ts = obs_tstate_get(next);
    if (!ts)
        return 0;
    u32 tgid = ts->tgid;
    u64 runq = 0, offcpu = 0;
    s64 state = 0;
    int waited = 0, was_off = 0;
    if (ts->wake_ns) {
        runq = now - ts->wake_ns;
        waited = 1;
        ts->wake_ns = 0;
    }
    if (ts->off_ns) {
        offcpu = now - ts->off_ns;
        state = ts->state;
        was_off = 1;
        ts->off_ns = 0;
    }
    if (ts->trained)
        obs_acc_in(tgid, ts, offcpu, runq, was_off, waited);
    int sent = 0;
    if (waited && runq >= obs_threshold(OBS_THR_RUNQ_NS) && obs_sched_single_ok(tgid, runq)) {
        struct obs_event *e = obs_reserve(OBS_PROBE_SCHED, OBS_KIND_SCHED_RUNQ, tgid, next);
        if (e) {
            e->ts_ns = now;
            e->duration_ns = runq;
            e->value = bpf_get_smp_processor_id();
            obs_submit(e);
            sent = 1;
        }
    }
    if (waited && !sent && !ts->trained) {
        /* a wait of a thread without a TraceKey (gloo's I/O threads, intra-op workers) that no single
         * carries: summed per process and step, sent by step_end as one SCHED_RUNQ (value -1). A CPU burst
         * that lands while every rank waits in a collective starves these threads in many short waits
         * past the cap on singles, and only their sum shows it (stall7) */
        struct obs_sched_acc *acc = sched_acc.lookup(&tgid);
        if (acc) {
            __sync_fetch_and_add(&acc->others_runq_ns, runq);
            __sync_fetch_and_add(&acc->others_waits, 1);
        }
    }
    if (was_off && offcpu >= obs_threshold(OBS_THR_OFFCPU_NS)
        && ((state & OBS_TASK_STOPPED_MASK) || obs_sched_single_ok(tgid, offcpu))) {
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

/* How each watched process ended: the wait status (the waitpid(2) form: a signal in bits 0-6, 0x80 a core
 * dump, an exit code in bits 8-15) its parent will read, recorded in the kernel when the process exits, so
 * the agent (obshub/producer/rankstate.py) knows it however soon the parent reaps the zombie. The members
 * are read at the running kernel's offsets, from its BTF (obshub/producer/btf.py, -D OBS_*_OFF; -1 when
 * unknown: nothing is recorded and the agent falls back to the zombie's /proc/<pid>/stat), never at bcc's
 * 6.1 headers'. The status wait_task_zombie() reports: signal->group_exit_code when SIGNAL_GROUP_EXIT is
 * set (exit_group(2), every fatal signal: the signal that killed the group even when its threads were
 * taken down by SIGKILL), else the main thread's own exit_code (it ended by exit(2) of itself alone). */
#ifndef OBS_TASK_EXIT_CODE_OFF
#define OBS_TASK_EXIT_CODE_OFF -1
#endif
#ifndef OBS_TASK_SIGNAL_OFF
#define OBS_TASK_SIGNAL_OFF -1
#endif
#ifndef OBS_SIGNAL_FLAGS_OFF
#define OBS_SIGNAL_FLAGS_OFF -1
#endif
#ifndef OBS_SIGNAL_GROUP_EXIT_CODE_OFF
#define OBS_SIGNAL_GROUP_EXIT_CODE_OFF -1
#endif
#define OBS_SIGNAL_GROUP_EXIT 0x00000004 /* include/linux/sched/signal.h, unchanged since 2.6 */

struct obs_exit {
    u64 ts_ns;  /* CLOCK_MONOTONIC ns of the exit that wrote it */
    u32 status; /* the wait status */
    u32 pad;
};
BPF_TABLE("lru_hash", u32, struct obs_exit, exit_status, 4096); /* tgid -> how it ended (read by the agent) */

/* Note the status of process tgid, whose thread tid exits now: at its main thread's exit when the process is
 * watched, and again at a later thread's exit when a group exit began after the main thread had gone (its
 * entry exists then). An unwatched process's end costs an array load (its bit in wbits), a thread's end
 * (not the main thread's) one hash look-up. */
static __always_inline void obs_note_exit(u32 tid, u32 tgid)
{
#if OBS_TASK_EXIT_CODE_OFF >= 0 && OBS_TASK_SIGNAL_OFF >= 0 && OBS_SIGNAL_FLAGS_OFF >= 0                        \
    && OBS_SIGNAL_GROUP_EXIT_CODE_OFF >= 0
    if (tid != tgid) {
        if (exit_status.lookup(&tgid) == NULL)
            return;
    } else {
#ifndef OBS_WATCH_ALL
        if (!obs_bit_test(obs_tgid_word(tgid), tgid))
            return; /* the common case: an unwatched process ends, one array load */
#endif
        if (!obs_tgid_watched(tgid))
            return;
    }
    char *task = (char *)bpf_get_current_task();
    char *sig = NULL;
    u32 flags = 0;
    int code = 0;
    bpf_probe_read_kernel(&sig, sizeof(sig), task + OBS_TASK_SIGNAL_OFF);
    if (sig)
        bpf_probe_read_kernel(&flags, sizeof(flags), sig + OBS_SIGNAL_FLAGS_OFF);
    if (flags & OBS_SIGNAL_GROUP_EXIT)
        bpf_probe_read_kernel(&code, sizeof(code), sig + OBS_SIGNAL_GROUP_EXIT_CODE_OFF);
    else if (tid == tgid)
        bpf_probe_read_kernel(&code, sizeof(code), task + OBS_TASK_EXIT_CODE_OFF);
    else
        return; /* a thread of its own ends: not the process's status */
    struct obs_exit v = {.ts_ns = bpf_ktime_get_ns(), .status = (u32)code};
    exit_status.update(&tgid, &v);
#endif
}

/* sched:sched_process_exit: note how a watched process ended (obs_note_exit); forget the exiting thread
 * (keeps the per-thread maps small), and the process when its main thread exits (a later process with the
 * same pid is not watched by mistake). */
int obs_sched_exit(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    obs_note_exit(tid, tgid);
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
    obs_tstate_del(tid); /* its state and its TraceKey */
    return 0;
}
