/* obshub NIC layer: RDMA completion latency on the user-space verbs data path.
 *
 * uprobe on the post function  (qp, wr, bad_wr)  shaped like ibv_post_send: for each work request of
 *   the chain (up to OBS_MAX_WR), post_ts[(qp_num, wr_id)] = now.
 * uprobe + uretprobe on the poll function (cq, num_entries, wc) shaped like ibv_poll_cq: the entry saves
 *   the wc array pointer per thread, the return reads the n completions it filled (up to OBS_MAX_WC) and
 *   computes latency = now - post_ts[(wc.qp_num, wc.wr_id)].
 * -> RDMA_CQ_DONE when latency > OBS_THR_RDMA_LATENCY_NS (default 20 us = 20000 ns; a map value the
 *    agent can change at run time): duration = latency ns, value = wr_id, arg0 = qp_num, arg1 = status.
 *
 * Layouts (rdma-core <infiniband/verbs.h>, stable ABI): ibv_qp.qp_num at byte 52;
 * ibv_send_wr: wr_id at 0, next at 8; ibv_wc (48 bytes): wr_id at 0, status at 8, qp_num at 28.
 */
#include "common.h"

#define OBS_MAX_WR 8
#define OBS_MAX_WC 16
#define OBS_QP_NUM_OFF 52
#define OBS_WR_NEXT_OFF 8
#define OBS_WC_SIZE 48
#define OBS_WC_STATUS_OFF 8
#define OBS_WC_QP_NUM_OFF 28

struct obs_wr_key {
    u64 wr_id;
    u32 qp_num;
    u32 pad;
};

BPF_TABLE("lru_hash", struct obs_wr_key, u64, post_ts, 65536);
BPF_HASH(poll_wc, u32, u64, OBS_MAX_TIDS); /* tid -> wc array pointer of the poll in progress */

int obs_verbs_post(struct pt_regs *ctx)
{
    if (!obs_current_watched())
        return 0;
    u64 now = bpf_ktime_get_ns();
    void *qp = (void *)PT_REGS_PARM1(ctx);
    void *wr = (void *)PT_REGS_PARM2(ctx);
    struct obs_wr_key key = {};
    bpf_probe_read_user(&key.qp_num, sizeof(key.qp_num), (char *)qp + OBS_QP_NUM_OFF);
    for (int i = 0; i < OBS_MAX_WR; i++) {
        if (!wr)
            break;
        bpf_probe_read_user(&key.wr_id, sizeof(key.wr_id), wr);
        post_ts.update(&key, &now);
        bpf_probe_read_user(&wr, sizeof(wr), (char *)wr + OBS_WR_NEXT_OFF);
    }
    return 0;
}

int obs_verbs_poll_entry(struct pt_regs *ctx)
{
    if (!obs_current_watched())
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 wc = PT_REGS_PARM3(ctx);
    poll_wc.update(&tid, &wc);
    return 0;
}

int obs_verbs_poll_return(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 *wcp = poll_wc.lookup(&tid);
    if (!wcp)
        return 0;
    char *wc = (char *)*wcp;
    poll_wc.delete(&tid);
    int n = PT_REGS_RC(ctx);
    u64 now = bpf_ktime_get_ns(), thr = obs_threshold(OBS_THR_RDMA_LATENCY_NS);
    for (int i = 0; i < OBS_MAX_WC; i++) {
        if (i >= n)
            break;
        struct obs_wr_key key = {};
        u32 status = 0;
        char *w = wc + i * OBS_WC_SIZE;
        bpf_probe_read_user(&key.wr_id, sizeof(key.wr_id), w);
        bpf_probe_read_user(&key.qp_num, sizeof(key.qp_num), w + OBS_WC_QP_NUM_OFF);
        bpf_probe_read_user(&status, sizeof(status), w + OBS_WC_STATUS_OFF);
        u64 *posted = post_ts.lookup(&key);
        if (!posted)
            continue;
        u64 lat = now - *posted;
        post_ts.delete(&key);
        if (lat <= thr)
            continue;
        struct obs_event *e = obs_reserve_current(OBS_PROBE_NIC_VERBS, OBS_KIND_RDMA_CQ_DONE);
        if (!e)
            continue;
        e->ts_ns = now;
        e->duration_ns = lat;
        e->value = key.wr_id;
        e->arg0 = key.qp_num;
        e->arg1 = status;
        obs_submit(e);
    }
    return 0;
}
