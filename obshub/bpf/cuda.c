/* obshub CUDA and NCCL layer: uprobes (entry + return) on libcudart / libcuda / libnccl symbols.
 *
 * The loader attaches symbol number i of its catalogue (obshub/producer/probes.py CUDA_SYMBOLS) to the pair
 * obs_cuda_entry_<i> / obs_cuda_return_<i>, and writes what that symbol is in cuda_sym[i]:
 *   kind  - the event kind to emit (CUDA_LAUNCH, CUDA_MEMCPY, CUDA_SYNC, NCCL_COLL)
 *   mode  - how `value` is computed from the arguments (OBS_VAL_*), arg - which argument (1-based)
 * The entry saves (ts, value) per (tid, symbol); the return emits the event with the call time as
 * duration_ns (enqueue time for NCCL: the collective itself completes later on the GPU), arg0 = the
 * return code, arg1 = symbol index (the reader names it). Calls shorter than OBS_THR_CUDA_NS are dropped.
 * Kernel launches shorter than OBS_THR_CUDA_LAUNCH_NS are not sent alone: they are counted, summed and
 * binned in cuda_acc, which the step_end handler ships as one CUDA_STEP_SUM per process and step.
 */
#include "common.h"

#ifndef OBS_CUDA_NSYMS
#define OBS_CUDA_NSYMS 32
#endif

#define OBS_VAL_NONE 0
#define OBS_VAL_ARG 1       /* value = argument `arg` (bytes or element count) */
#define OBS_VAL_DIM3 2      /* value = x*y*z of a dim3 passed by value in arguments arg, arg+1 */
#define OBS_VAL_XYZ 3       /* value = product of arguments arg, arg+1, arg+2 */

struct obs_cuda_sym {
    u32 kind;
    u32 mode;
    u32 arg;
    u32 deep; /* 1: a deep-dive symbol, counted within the window's step budget only (obs_deep_allowed) */
};

struct obs_cuda_key {
    u32 tid;
    u32 sym;
};

struct obs_cuda_call {
    u64 ts_ns;
    u64 value;
};

BPF_ARRAY(cuda_sym, struct obs_cuda_sym, OBS_CUDA_NSYMS);
BPF_TABLE("lru_hash", struct obs_cuda_key, struct obs_cuda_call, cuda_calls, OBS_MAX_TIDS);

/* Argument n (1-based) of the probed call. All six are loaded (volatile: in this order) and then selected: a switch would
 * compile to a jump table (an indirect jump BPF lacks) and a conditional load to a modified ctx pointer,
 * which the verifier rejects. */
static __always_inline u64 obs_parm(struct pt_regs *ctx, u32 n)
{
    volatile u64 a1 = PT_REGS_PARM1(ctx), a2 = PT_REGS_PARM2(ctx), a3 = PT_REGS_PARM3(ctx);
    volatile u64 a4 = PT_REGS_PARM4(ctx), a5 = PT_REGS_PARM5(ctx), a6 = PT_REGS_PARM6(ctx);
    return n == 1 ? a1 : n == 2 ? a2 : n == 3 ? a3 : n == 4 ? a4 : n == 5 ? a5 : n == 6 ? a6 : 0;
}

static __always_inline int obs_cuda_entry(struct pt_regs *ctx, u32 sym)
{
    if (!obs_current_watched())
        return 0;
    struct obs_cuda_sym *info = cuda_sym.lookup(&sym);
    if (!info)
        return 0;
    if (info->deep && !obs_deep_allowed(bpf_get_current_pid_tgid() >> 32))
        return 0; /* past the deep dive's steps: no entry, so the return records nothing */
    struct obs_cuda_call call = {.ts_ns = bpf_ktime_get_ns()};
    if (info->mode == OBS_VAL_ARG) {
        call.value = obs_parm(ctx, info->arg);
    } else if (info->mode == OBS_VAL_DIM3) {
        u64 xy = obs_parm(ctx, info->arg), z = obs_parm(ctx, info->arg + 1) & 0xFFFFFFFF;
        call.value = (xy & 0xFFFFFFFF) * (xy >> 32) * z;
    } else if (info->mode == OBS_VAL_XYZ) {
        call.value = (obs_parm(ctx, info->arg) & 0xFFFFFFFF) * (obs_parm(ctx, info->arg + 1) & 0xFFFFFFFF) *
                     (obs_parm(ctx, info->arg + 2) & 0xFFFFFFFF);
    }
    struct obs_cuda_key key = {.tid = (u32)bpf_get_current_pid_tgid(), .sym = sym};
    cuda_calls.update(&key, &call);
    return 0;
}

static __always_inline int obs_cuda_return(struct pt_regs *ctx, u32 sym)
{
    struct obs_cuda_key key = {.tid = (u32)bpf_get_current_pid_tgid(), .sym = sym};
    struct obs_cuda_call *call = cuda_calls.lookup(&key);
    if (!call)
        return 0;
    u64 now = bpf_ktime_get_ns(), dur = now - call->ts_ns, value = call->value;
    cuda_calls.delete(&key);
    struct obs_cuda_sym *info = cuda_sym.lookup(&sym);
    if (!info)
        return 0;
    if (info->kind == OBS_KIND_CUDA_LAUNCH && dur < obs_threshold(OBS_THR_CUDA_LAUNCH_NS)) {
        /* an ordinary launch: into the per-step aggregate (CUDA_STEP_SUM), not a record of its own */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        struct obs_cuda_acc zero = {};
        struct obs_cuda_acc *acc = cuda_acc.lookup_or_try_init(&tgid, &zero);
        if (!acc)
            return 0;
        __sync_fetch_and_add(&acc->launches, 1);
        __sync_fetch_and_add(&acc->sum_ns, dur);
        obs_max(&acc->max_ns, dur);
        u32 b = obs_log2_us(dur);
        __sync_fetch_and_add(&acc->hist[b], 1);
        return 0;
    }
    if (dur < obs_threshold(OBS_THR_CUDA_NS))
        return 0;
    struct obs_event *e = obs_reserve_current(OBS_PROBE_CUDA_BASE + sym, info->kind);
    if (!e)
        return 0;
    e->ts_ns = now;
    e->duration_ns = dur;
    e->value = value;
    e->arg0 = PT_REGS_RC(ctx);
    e->arg1 = sym;
    obs_submit(e);
    return 0;
}

#define OBS_CUDA_PAIR(i)                                                                  \
    int obs_cuda_entry_##i(struct pt_regs *ctx) { return obs_cuda_entry(ctx, i); }       \
    int obs_cuda_return_##i(struct pt_regs *ctx) { return obs_cuda_return(ctx, i); }

OBS_CUDA_PAIR(0) OBS_CUDA_PAIR(1) OBS_CUDA_PAIR(2) OBS_CUDA_PAIR(3) OBS_CUDA_PAIR(4) OBS_CUDA_PAIR(5)
OBS_CUDA_PAIR(6) OBS_CUDA_PAIR(7) OBS_CUDA_PAIR(8) OBS_CUDA_PAIR(9) OBS_CUDA_PAIR(10) OBS_CUDA_PAIR(11)
OBS_CUDA_PAIR(12) OBS_CUDA_PAIR(13) OBS_CUDA_PAIR(14) OBS_CUDA_PAIR(15) OBS_CUDA_PAIR(16)
OBS_CUDA_PAIR(17) OBS_CUDA_PAIR(18) OBS_CUDA_PAIR(19) OBS_CUDA_PAIR(20) OBS_CUDA_PAIR(21)
OBS_CUDA_PAIR(22) OBS_CUDA_PAIR(23) OBS_CUDA_PAIR(24) OBS_CUDA_PAIR(25) OBS_CUDA_PAIR(26)
OBS_CUDA_PAIR(27) OBS_CUDA_PAIR(28) OBS_CUDA_PAIR(29) OBS_CUDA_PAIR(30) OBS_CUDA_PAIR(31)
