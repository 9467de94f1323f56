/* bench/agent_throughput.py's burst handler, appended to the agent's BPF program by bench/agent_host.py
 * (--burst): a uprobe on bench/firehose.c's fire_burst(first, n) emits n (at most OBS_BURST_MAX) records
 * exactly like the step_begin USDT handler of obshub/bpf/pytorch.c (kind STEP_BEGIN, probe pytorch_step, the
 * same ring buffer, reservation, loss counter and wakeup policy). One uprobe trap costs several µs on a
 * virtual machine, which caps a one-record-per-trap firehose far below what the agent's reader takes; a
 * burst spreads that trap over n records, so the firehose can offer millions of records per second. */
#define OBS_BURST_MAX 64

int obs_bench_burst(struct pt_regs *ctx)
{
    if (!obs_current_watched())
        return 0;
    s64 first = (s64)PT_REGS_PARM1(ctx);
    u32 n = (u32)PT_REGS_PARM2(ctx);
    u64 id = bpf_get_current_pid_tgid();
    for (u32 i = 0; i < OBS_BURST_MAX; i++) {
        if (i >= n)
            break;
        struct obs_event *e = obs_reserve(OBS_PROBE_PYTORCH_STEP, OBS_KIND_STEP_BEGIN, id >> 32, (u32)id);
        if (!e)
            continue;
        e->step = first + i;
        e->value = first + i;
        e->trace_key = ((u64)7 << 48) | ((u64)((first + i) & 0xFFFF) << 32);
        obs_submit(e);
    }
    return 0;
}
