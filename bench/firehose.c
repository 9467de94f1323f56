/* A controlled-rate source of real BPF events for bench/agent_throughput.py: fires obshub's USDT probe
 * obshub:step_begin (same provider, name and argument types as obshub/instrument/_usdt.c: int64 step,
 * uint64 trace_key; plain sys/sdt.h, no semaphore) from a C loop, so the rate does not depend on Python.
 *
 * Protocol on stdin/stdout, one line each:
 *   "RATE SECONDS"  -> fire RATE probes per second for SECONDS, paced in 1 ms ticks (absolute deadlines,
 *                      CLOCK_MONOTONIC); answers "fired N in S s" (S = elapsed seconds). A tick that
 *                      falls behind is not made up: N/S is the rate actually offered.
 *   "quit"          -> exit 0.
 * Build: gcc -O2 -o firehose bench/firehose.c (needs sys/sdt.h, systemtap-sdt-dev). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void fire(int64_t step, uint64_t key)
{
    DTRACE_PROBE2(obshub, step_begin, step, key);
}

/* Never called: only defines obshub:step_end, which the agent's pytorch_step probe also attaches to. */
__attribute__((noinline, used)) void firehose_step_end(int64_t step, uint64_t key)
{
    DTRACE_PROBE2(obshub, step_end, step, key);
}

int main(void)
{
    char line[128];
    int64_t step = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        double rate = 0, seconds = 0;
        if (strncmp(line, "quit", 4) == 0)
            return 0;
        if (sscanf(line, "%lf %lf", &rate, &seconds) != 2 || rate <= 0 || seconds <= 0) {
            printf("error: expected 'RATE SECONDS'\n");
            continue;
        }
        uint64_t t0 = now_ns(), ticks = (uint64_t)(seconds * 1000), fired = 0;
        double per_tick = rate / 1000.0, owed = 0;
        for (uint64_t t = 1; t <= ticks; t++) {
            owed += per_tick;
            uint64_t n = (uint64_t)owed;
            owed -= (double)n;
            for (uint64_t i = 0; i < n; i++, step++)
                fire(step, ((uint64_t)7 << 48) | ((uint64_t)(step & 0xFFFF) << 32));
            fired += n;
            uint64_t deadline = t0 + t * 1000000ull;
            if (now_ns() < deadline) {
                struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            }
        }
        printf("fired %llu in %.6f s\n", (unsigned long long)fired, (now_ns() - t0) / 1e9);
    }
    return 0;
}
