/* obshub network layer: TCP retransmissions, RTT samples and packet drops of the watched processes.
 *
 * Sockets are attributed to a process without reading struct sock (whose layout differs between the
 * 6.1 headers bcc compiles with and newer kernels):
 *   - sock:inet_sock_set_state in the process's own context (connect -> SYN_SENT, listen -> LISTEN)
 *     records socks[skaddr] = tgid and, for a listener, lports[port] = tgid;
 *   - sockets accepted on a watched listener (state change in softirq, local port = listener's port)
 *     are recorded from lports;
 *   - the loader seeds lports with the local ports of sockets the process already had
 *     (/proc/<pid>/fd + /proc/<pid>/net/tcp{,6}).
 *
 *   tcp:tcp_retransmit_skb -> TCP_RETRANSMIT (value 1; arg0/arg1 IPv4 saddr/daddr, str0/str1 IPv6
 *                             addresses, arg2 = family | state << 16, arg3 = sport << 16 | dport)
 *   tcp:tcp_probe          -> TCP_RTT at most every OBS_THR_RTT_INTERVAL_NS per socket
 *                             (duration = smoothed RTT ns; str0/str1 = sockaddr of both ends)
 *   skb:kfree_skb          -> SKB_DROP of a watched socket, in any context: the receiving socket (rx_sk,
 *                             6.11+) or, without one, the skb's owner (skb->sk: a segment of its own
 *                             dropped by its host's netfilter or qdisc, in its process's context or in
 *                             softirq/timer context); a drop of any other socket is nobody's, even in a
 *                             watched process's context (a peer namespace's drop that a veth ran inline in
 *                             the sender's context). A drop without a socket is the watched process's in
 *                             whose context it runs only when the skb's device is in the process's own
 *                             network namespace (skb->dev->nd_net == current->nsproxy->net_ns, offsets
 *                             from the kernel's BTF; without BTF such drops are not counted) (value = drop
 *                             reason code, named by the loader from tracefs)
 *   qdisc:qdisc_dequeue    -> TCP_QUEUE when a watched socket's segment (skb->sk in `socks`) waited at
 *                             least OBS_THR_QUEUE_NS in its host's egress qdisc (now - skb->tstamp, TCP's
 *                             departure time, CLOCK_MONOTONIC), at most every OBS_THR_RTT_INTERVAL_NS per
 *                             socket (duration = the longest wait since the socket's previous TCP_QUEUE,
 *                             value = ifindex); compiled only where the tracepoint exists
 */
#include "common.h"

#define OBS_TCP_ESTABLISHED 1
#define OBS_TCP_SYN_SENT 2
#define OBS_TCP_SYN_RECV 3
#define OBS_TCP_CLOSE 7
#define OBS_TCP_LISTEN 10
#define OBS_IPPROTO_TCP 6

/* A watched socket: its owner and when its last TCP_RTT sample was sent (0: none yet), in one entry, so
 * that tcp_probe, which runs for every segment a watched socket receives, makes one look-up. */
struct obs_sock {
    u32 tgid;
    u32 pad;
    u64 rtt_ns;
    u64 queue_ns;      /* the longest egress-queue wait >= OBS_THR_QUEUE_NS not sent yet (ns) */
    u64 queue_sent_ns; /* when its last TCP_QUEUE was sent (0: none yet) */
};

BPF_TABLE("lru_hash", u64, struct obs_sock, socks, 65536);  /* struct sock address -> owner, last RTT sample */
BPF_HASH(lports, u16, u32, 4096);      /* local TCP port (host order) -> owner tgid */

int obs_sock_set_state(void *ctx)
{
    u64 sk = 0;
    s32 oldstate = 0, newstate = 0;
    u16 sport = 0, protocol = 0;
    OBS_TP_READ(protocol, ctx, TPOFF_INET_SOCK_SET_STATE_PROTOCOL);
    if (protocol != OBS_IPPROTO_TCP)
        return 0;
    OBS_TP_READ(sk, ctx, TPOFF_INET_SOCK_SET_STATE_SKADDR);
    OBS_TP_READ(oldstate, ctx, TPOFF_INET_SOCK_SET_STATE_OLDSTATE);
    OBS_TP_READ(newstate, ctx, TPOFF_INET_SOCK_SET_STATE_NEWSTATE);
    OBS_TP_READ(sport, ctx, TPOFF_INET_SOCK_SET_STATE_SPORT);
    if (newstate == OBS_TCP_CLOSE) {
        socks.delete(&sk);
        if (oldstate == OBS_TCP_LISTEN)
            lports.delete(&sport);
        return 0;
    }
    if (newstate == OBS_TCP_SYN_SENT || newstate == OBS_TCP_LISTEN) {
        /* process context: the caller of connect() / listen() owns the socket */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!obs_tgid_watched(tgid))
            return 0;
        struct obs_sock v = {.tgid = tgid};
        socks.update(&sk, &v);
        if (newstate == OBS_TCP_LISTEN)
            lports.update(&sport, &tgid);
        return 0;
    }
    if (newstate == OBS_TCP_SYN_RECV || newstate == OBS_TCP_ESTABLISHED) {
        u32 *owner = lports.lookup(&sport);
        if (owner) {
            struct obs_sock v = {.tgid = *owner};
            socks.update(&sk, &v);
        }
    }
    return 0;
}

/* Owner tgid of a socket, 0 when not watched. */
static __always_inline u32 obs_sock_owner(u64 sk, u16 sport)
{
    struct obs_sock *so = socks.lookup(&sk);
    if (so)
        return so->tgid;
    u32 *owner = lports.lookup(&sport);
    return owner ? *owner : 0;
}

int obs_tcp_retransmit(void *ctx)
{
    u64 sk = 0;
    u16 sport = 0, dport = 0, family = 0;
    s32 state = 0;
    OBS_TP_READ(sk, ctx, TPOFF_TCP_RETRANSMIT_SKB_SKADDR);
    OBS_TP_READ(sport, ctx, TPOFF_TCP_RETRANSMIT_SKB_SPORT);
    u32 tgid = obs_sock_owner(sk, sport);
    if (!tgid)
        return 0;
    OBS_TP_READ(dport, ctx, TPOFF_TCP_RETRANSMIT_SKB_DPORT);
    OBS_TP_READ(family, ctx, TPOFF_TCP_RETRANSMIT_SKB_FAMILY);
    OBS_TP_READ(state, ctx, TPOFF_TCP_RETRANSMIT_SKB_STATE);
    struct obs_event *e = obs_reserve(OBS_PROBE_NET_RETRANSMIT, OBS_KIND_TCP_RETRANSMIT, tgid, 0);
    if (!e)
        return 0;
    e->value = 1;
    u32 saddr = 0, daddr = 0;
    OBS_TP_READ(saddr, ctx, TPOFF_TCP_RETRANSMIT_SKB_SADDR);
    OBS_TP_READ(daddr, ctx, TPOFF_TCP_RETRANSMIT_SKB_DADDR);
    e->arg0 = saddr;
    e->arg1 = daddr;
    e->arg2 = (u64)family | ((u64)(u32)state << 16);
    e->arg3 = ((u32)sport << 16) | dport;
    bpf_probe_read_kernel(e->str0, 16, (char *)ctx + TPOFF_TCP_RETRANSMIT_SKB_SADDR_V6);
    bpf_probe_read_kernel(e->str1, 16, (char *)ctx + TPOFF_TCP_RETRANSMIT_SKB_DADDR_V6);
    obs_submit(e);
    return 0;
}

int obs_tcp_probe(void *ctx)
{
    u64 sk = 0;
    u16 sport = 0;
    OBS_TP_READ(sk, ctx, TPOFF_TCP_PROBE_SKADDR);
    u64 now;
    u32 tgid;
    struct obs_sock *so = socks.lookup(&sk);
    if (so) {
        now = bpf_ktime_get_ns();
        if (so->rtt_ns && now - so->rtt_ns < obs_threshold(OBS_THR_RTT_INTERVAL_NS))
            return 0;
        so->rtt_ns = now;
        tgid = so->tgid;
    } else {
        /* not seen at a state change (an accepted socket of a listener the loader seeded): known by its
         * local port; remembered from now on with this sample's time */
        OBS_TP_READ(sport, ctx, TPOFF_TCP_PROBE_SPORT);
        u32 *owner = lports.lookup(&sport);
        if (!owner)
            return 0;
        tgid = *owner;
        now = bpf_ktime_get_ns();
        struct obs_sock v = {.tgid = tgid, .rtt_ns = now};
        socks.update(&sk, &v);
    }
    u32 srtt_us = 0;
    u16 dport = 0;
    OBS_TP_READ(sport, ctx, TPOFF_TCP_PROBE_SPORT);
    OBS_TP_READ(srtt_us, ctx, TPOFF_TCP_PROBE_SRTT);
    OBS_TP_READ(dport, ctx, TPOFF_TCP_PROBE_DPORT);
    struct obs_event *e = obs_reserve(OBS_PROBE_NET_RTT, OBS_KIND_TCP_RTT, tgid, 0);
    if (!e)
        return 0;
    e->ts_ns = now;
    e->duration_ns = (u64)srtt_us * 1000;
    e->arg3 = ((u32)sport << 16) | dport;
    bpf_probe_read_kernel(e->str0, 28, (char *)ctx + TPOFF_TCP_PROBE_SADDR);
    bpf_probe_read_kernel(e->str1, 28, (char *)ctx + TPOFF_TCP_PROBE_DADDR);
    obs_submit(e);
    return 0;
}

/* struct sk_buff's `dev` and `sk` (its owning socket, NULL for most received skbs before the socket look-up):
 * the same offsets in the 6.1 headers bcc compiles with and in 6.18. */
#ifndef OBS_SKB_DEV_OFF
#define OBS_SKB_DEV_OFF 16
#endif
#ifndef OBS_SKB_SK_OFF
#define OBS_SKB_SK_OFF 24
#endif
/* Offsets the loader reads from the running kernel's BTF (obshub/producer/btf.py), -1 where it has none:
 * task_struct.nsproxy, nsproxy.net_ns, net_device.nd_net.net. */
#ifndef OBS_TASK_NSPROXY_OFF
#define OBS_TASK_NSPROXY_OFF -1
#endif
#ifndef OBS_NSPROXY_NET_OFF
#define OBS_NSPROXY_NET_OFF -1
#endif
#ifndef OBS_NETDEV_NET_OFF
#define OBS_NETDEV_NET_OFF -1
#endif

/* Was `skb` freed in the current task's network namespace (its device's, skb->dev->nd_net, is the task's,
 * current->nsproxy->net_ns)? 0 when either is unknown: no device, no BTF offsets. */
static __always_inline int obs_skb_in_current_netns(u64 skb)
{
#if OBS_TASK_NSPROXY_OFF >= 0 && OBS_NSPROXY_NET_OFF >= 0 && OBS_NETDEV_NET_OFF >= 0
    u64 dev = 0, skb_net = 0, nsproxy = 0, task_net = 0;
    bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(skb + OBS_SKB_DEV_OFF));
    if (!dev)
        return 0;
    bpf_probe_read_kernel(&skb_net, sizeof(skb_net), (void *)(dev + OBS_NETDEV_NET_OFF));
    u64 task = bpf_get_current_task();
    bpf_probe_read_kernel(&nsproxy, sizeof(nsproxy), (void *)(task + OBS_TASK_NSPROXY_OFF));
    if (!nsproxy)
        return 0; /* an exiting task */
    bpf_probe_read_kernel(&task_net, sizeof(task_net), (void *)(nsproxy + OBS_NSPROXY_NET_OFF));
    return skb_net && skb_net == task_net;
#else
    return 0;
#endif
}

int obs_kfree_skb(void *ctx)
{
    /* The drop's socket: the receiving one where the kernel names it, else the skb's owner. A socket's drop
     * is its owner's when the socket is watched, in any context (its process's own: tid set; softirq, the
     * retransmit timer, another process: tid 0); a drop of another socket is nobody's, even in a watched
     * process's context (a peer namespace's drop that a veth ran inline in the sender's context, a
     * sidecar's socket). A drop without a socket is the current process's when it is watched and the skb
     * was freed in its own network namespace (a received segment dropped by its host's netfilter before
     * the socket look-up). */
    u64 sk = 0, skb = 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = 0, tid = 0;
#if TPOFF_KFREE_SKB_RX_SK >= 0
    OBS_TP_READ(sk, ctx, TPOFF_KFREE_SKB_RX_SK);
#endif
    OBS_TP_READ(skb, ctx, TPOFF_KFREE_SKB_SKBADDR);
    if (!sk && skb)
        bpf_probe_read_kernel(&sk, sizeof(sk), (void *)(skb + OBS_SKB_SK_OFF));
    if (sk) {
        struct obs_sock *so = socks.lookup(&sk);
        if (!so)
            return 0;
        tgid = so->tgid;
        if (tgid == (u32)(id >> 32))
            tid = (u32)id;
    } else {
        if (!skb || !obs_tgid_watched(id >> 32) || !obs_skb_in_current_netns(skb))
            return 0;
        tgid = id >> 32;
        tid = (u32)id;
    }
    struct obs_event *e = obs_reserve(OBS_PROBE_NET_DROP, OBS_KIND_SKB_DROP, tgid, tid);
    if (!e)
        return 0;
#if TPOFF_KFREE_SKB_REASON >= 0
    u32 reason = 0;
    OBS_TP_READ(reason, ctx, TPOFF_KFREE_SKB_REASON);
    e->value = reason;
#endif
    u64 location = 0;
    u16 protocol = 0;
    OBS_TP_READ(location, ctx, TPOFF_KFREE_SKB_LOCATION);
    OBS_TP_READ(protocol, ctx, TPOFF_KFREE_SKB_PROTOCOL);
    e->arg0 = location;
    e->arg1 = protocol;
    obs_submit(e);
    return 0;
}

#ifdef OBS_ATTACHED_NET_QUEUE
/* struct sk_buff's `tstamp` (OBS_SKB_SK_OFF: above): the same offset in the 6.1 headers bcc compiles with and
 * in 6.18 (TCP's departure time, CLOCK_MONOTONIC, copied to the segments when a qdisc splits a GSO skb;
 * `sk` is cleared on the far side of a veth, so only the sending host's own egress queue counts). */
#ifndef OBS_SKB_TSTAMP_OFF
#define OBS_SKB_TSTAMP_OFF 32
#endif

int obs_qdisc_dequeue(void *ctx)
{
    u64 skb = 0, sk = 0, tstamp = 0;
    OBS_TP_READ(skb, ctx, TPOFF_QDISC_DEQUEUE_SKBADDR);
    if (!skb)
        return 0; /* a dequeue that found nothing */
    bpf_probe_read_kernel(&sk, sizeof(sk), (void *)(skb + OBS_SKB_SK_OFF));
    if (!sk)
        return 0;
    struct obs_sock *so = socks.lookup(&sk);
    if (!so)
        return 0;
    bpf_probe_read_kernel(&tstamp, sizeof(tstamp), (void *)(skb + OBS_SKB_TSTAMP_OFF));
    u64 now = bpf_ktime_get_ns();
    if (!tstamp || tstamp >= now)
        return 0; /* no departure time, or a paced socket's future one (fq, SO_TXTIME): no sample */
    u64 wait_ns = now - tstamp;
    if (wait_ns < obs_threshold(OBS_THR_QUEUE_NS))
        return 0;
    if (wait_ns > so->queue_ns)
        so->queue_ns = wait_ns;
    if (so->queue_sent_ns && now - so->queue_sent_ns < obs_threshold(OBS_THR_RTT_INTERVAL_NS))
        return 0; /* kept in the entry: the socket's next TCP_QUEUE carries it */
    struct obs_event *e = obs_reserve(OBS_PROBE_NET_QUEUE, OBS_KIND_TCP_QUEUE, so->tgid, 0);
    if (!e)
        return 0;
    s32 ifindex = 0;
    OBS_TP_READ(ifindex, ctx, TPOFF_QDISC_DEQUEUE_IFINDEX);
    e->ts_ns = now;
    e->duration_ns = so->queue_ns;
    e->value = ifindex;
    so->queue_sent_ns = now;
    so->queue_ns = 0;
    obs_submit(e);
    return 0;
}
#endif
