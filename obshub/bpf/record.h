/* GENERATED from obshub/producer/record.py by `python -m obshub.producer.record`: do not edit here.
 *
 * One ring-buffer record of the agent: written by the BPF programs (common.h includes this file), read
 * by the agent's C batch reader (obshub/producer/_ring.c) and its Python decoder (obshub/producer/reader.py,
 * record.RECORD_STRUCT). 176 bytes, little-endian, no padding. Per-kind meaning of value, arg0..arg3,
 * str0 and str1: docs/AGENT.md "Probes". The kernel types (__u64 ...) come from linux/types.h.
 */
#ifndef OBSHUB_RECORD_H
#define OBSHUB_RECORD_H

#define OBS_STR0_LEN 64
#define OBS_STR1_LEN 32
#define OBS_EVENT_SIZE 176

struct obs_event {
    __u64 ts_ns;                     /* bpf_ktime_get_ns(): CLOCK_MONOTONIC of this host, ns */
    __u64 duration_ns;               /* per kind, ns (0 when the kind has no duration) */
    __u64 trace_key;                 /* TraceKey of the thread when the event happened (0 = none) */
    __s64 step;                      /* full step number of the thread (-1 = none) */
    __s64 value;                     /* per kind (schema.KIND_INFO[kind].value) */
    __u64 arg0;                      /* per kind */
    __u64 arg1;                      /* per kind */
    __u64 arg2;                      /* per kind */
    __u32 pid;                       /* tgid of the process the event belongs to */
    __u32 tid;                       /* thread id (0 when not tied to a thread) */
    __u16 kind;                      /* schema.Kind */
    __u16 probe;                     /* probe id (obshub/producer/probes.py) */
    __u32 arg3;                      /* per kind */
    char str0[OBS_STR0_LEN];         /* per kind, NUL-padded */
    char str1[OBS_STR1_LEN];         /* per kind, NUL-padded */
};

_Static_assert(sizeof(struct obs_event) == OBS_EVENT_SIZE, "struct obs_event: see obshub/producer/record.py");

#endif /* OBSHUB_RECORD_H */
