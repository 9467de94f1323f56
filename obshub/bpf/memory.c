/* obshub memory layer: direct reclaim and compaction stalls and high-order page allocations of the
 * watched processes.
 *
 *   vmscan:mm_vmscan_direct_reclaim_begin/_end -> MEM_RECLAIM (duration = stall, value = nr_reclaimed)
 *   vmscan:mm_vmscan_memcg_reclaim_begin/_end  -> MEM_RECLAIM, payload reclaim = "memcg": the stall of a
 *                                                 task whose cgroup hit its memory limit (the kernel
 *                                                 reclaims from the cgroup, not through direct reclaim)
 *   compaction:mm_compaction_begin/_end        -> MEM_COMPACTION (duration = stall, value = status)
 *   kmem:mm_page_alloc                         -> counted in mem_acc when order >= OBS_THR_PAGE_ORDER;
 *                                                 a single PAGE_ALLOC (value = order, arg0 = gfp flags)
 *                                                 only when order >= OBS_THR_PAGE_ORDER_SINGLE; with
 *                                                 OBS_THR_PAGE_MAY_BLOCK (default) only allocations
 *                                                 whose gfp flags allow direct reclaim
 *                                                 (OBS_GFP_DIRECT_RECLAIM, the loader reads the bit
 *                                                 from the tracepoint's print fmt)
 * Stalls shorter than OBS_THR_RECLAIM_NS / OBS_THR_COMPACTION_NS are not sent alone: they are summed in
 * mem_acc, which the step_end handler ships as MEM_STEP_SUM. Fields are read at the tracefs offsets the
 * loader passes as -D TPOFF_<EVENT>_<FIELD>.
 */
#include "common.h"

BPF_HASH(reclaim_ts, u32, u64, OBS_MAX_TIDS);
BPF_HASH(compact_ts, u32, u64, OBS_MAX_TIDS);

static __always_inline int obs_stall_begin(int which)
{
    if (!obs_current_watched_fast())
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 now = bpf_ktime_get_ns();
    if (which == 0)
        reclaim_ts.update(&tid, &now);
    else
        compact_ts.update(&tid, &now);
    return 0;
}

/* Add what was not sent alone to the process's memory aggregate. */
static __always_inline void obs_mem_stall(u32 tgid, u64 dur)
{
    struct obs_mem_acc zero = {};
    struct obs_mem_acc *acc = mem_acc.lookup_or_try_init(&tgid, &zero);
    if (!acc)
        return;
    __sync_fetch_and_add(&acc->stall_ns, dur);
    __sync_fetch_and_add(&acc->stalls, 1);
    obs_max(&acc->stall_max_ns, dur);
}

int obs_reclaim_begin(void *ctx) { return obs_stall_begin(0); }
int obs_compaction_begin(void *ctx) { return obs_stall_begin(1); }

/* Emit MEM_RECLAIM for a finished stall of the current thread; `memcg` tells a cgroup-limit reclaim
 * (arg0 = 1) from a global direct reclaim (arg0 = 0). */
static __always_inline int obs_reclaim_finish(u64 nr, u64 memcg)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 *begin = reclaim_ts.lookup(&tid);
    if (!begin)
        return 0;
    u64 dur = bpf_ktime_get_ns() - *begin;
    reclaim_ts.delete(&tid);
    if (dur < obs_threshold(OBS_THR_RECLAIM_NS)) {
        obs_mem_stall(bpf_get_current_pid_tgid() >> 32, dur);
        return 0;
    }
    struct obs_event *e = obs_reserve_current(memcg ? OBS_PROBE_MEM_MEMCG_RECLAIM : OBS_PROBE_MEM_RECLAIM,
                                              OBS_KIND_MEM_RECLAIM);
    if (!e)
        return 0;
    e->duration_ns = dur;
    e->value = nr;
    e->arg0 = memcg;
    obs_submit(e);
    return 0;
}

int obs_reclaim_end(void *ctx)
{
    unsigned long nr = 0;
    OBS_TP_READ(nr, ctx, TPOFF_MM_VMSCAN_DIRECT_RECLAIM_END_NR_RECLAIMED);
    return obs_reclaim_finish(nr, 0);
}

int obs_memcg_reclaim_begin(void *ctx) { return obs_stall_begin(0); }

int obs_memcg_reclaim_end(void *ctx)
{
    unsigned long nr = 0;
    OBS_TP_READ(nr, ctx, TPOFF_MM_VMSCAN_MEMCG_RECLAIM_END_NR_RECLAIMED);
    return obs_reclaim_finish(nr, 1);
}

int obs_compaction_end(void *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 *begin = compact_ts.lookup(&tid);
    if (!begin)
        return 0;
    u64 dur = bpf_ktime_get_ns() - *begin;
    compact_ts.delete(&tid);
    if (dur < obs_threshold(OBS_THR_COMPACTION_NS)) {
        obs_mem_stall(bpf_get_current_pid_tgid() >> 32, dur);
        return 0;
    }
    s32 status = 0;
    OBS_TP_READ(status, ctx, TPOFF_MM_COMPACTION_END_STATUS);
    struct obs_event *e = obs_reserve_current(OBS_PROBE_MEM_COMPACTION, OBS_KIND_MEM_COMPACTION);
    if (!e)
        return 0;
    e->duration_ns = dur;
    e->value = status;
    obs_submit(e);
    return 0;
}

int obs_page_alloc(void *ctx)
{
    u32 order = 0;
    OBS_TP_READ(order, ctx, TPOFF_MM_PAGE_ALLOC_ORDER);
    if (order < obs_threshold(OBS_THR_PAGE_ORDER))
        return 0;
    unsigned long gfp = 0;
    OBS_TP_READ(gfp, ctx, TPOFF_MM_PAGE_ALLOC_GFP_FLAGS);
    /* an allocation that may not enter direct reclaim cannot stall its thread: the network stack's
     * order-3 fragment refills (GFP_NOWAIT | __GFP_NORETRY, falling back to order 0), GFP_ATOMIC. Most
     * high-order allocations of a training process that talks TCP are of that kind: skipped before any
     * map work */
    if (!(gfp & OBS_GFP_DIRECT_RECLAIM) && obs_threshold(OBS_THR_PAGE_MAY_BLOCK))
        return 0;
    if (!obs_current_watched_fast())
        return 0;
    if (order < obs_threshold(OBS_THR_PAGE_ORDER_SINGLE)) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        struct obs_mem_acc zero = {};
        struct obs_mem_acc *acc = mem_acc.lookup_or_try_init(&tgid, &zero);
        if (!acc)
            return 0;
        __sync_fetch_and_add(&acc->allocs, 1);
        __sync_fetch_and_add(&acc->pages, 1ull << (order & 31));
        u32 b = order < OBS_HIST_BUCKETS ? order : OBS_HIST_BUCKETS - 1;
        __sync_fetch_and_add(&acc->orders[b], 1);
        return 0;
    }
    struct obs_event *e = obs_reserve_current(OBS_PROBE_MEM_PAGE_ALLOC, OBS_KIND_PAGE_ALLOC);
    if (!e)
        return 0;
    e->value = order;
    e->arg0 = gfp;
    obs_submit(e);
    return 0;
}
