/* A controlled-rate source of real BPF events for bench/agent_throughput.py: fires obshub's USDT probe
 * obshub:step_begin (same provider, name and argument types as obshub/instrument/_usdt.c: int64 step,
 * uint64 trace_key; plain sys/sdt.h, no semaphore) from a C loop, so the rate does not depend on Python.
 *
 * Protocol on stdin/stdout, one line each:
 *   "RATE SECONDS [BURST]" -> offer RATE events per second for SECONDS, paced in 1 ms ticks (absolute
 *                      deadlines, CLOCK_MONOTONIC); answers "fired N in S s cpu C" (S = elapsed seconds,
 *                      C = this process's CPU seconds in that time). A tick that falls behind is not made
 *                      up: N/S is the rate actually offered. BURST 0 or absent: one USDT probe hit per
 *                      event; BURST b > 0: one call of fire_burst(first, n <= b) per b events, which
 *                      bench/firehose_burst.c (a uprobe handler the bench agent adds) turns into n records.
 *   "quit"          -> exit 0.
 * Build: gcc -O2 -o firehose bench/firehose.c (needs sys/sdt.h, systemtap-sdt-dev). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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

/* Entry point of the burst handler (bench/firehose_burst.c reads first, n from the argument registers). */
__attribute__((noinline, used)) void fire_burst(int64_t first, uint32_t n)
{
    __asm__ volatile("" ::"r"(first), "r"(n) : "memory");
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
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
        unsigned burst = 0;
        if (strncmp(line, "quit", 4) == 0)
            return 0;
        if (sscanf(line, "%lf %lf %u", &rate, &seconds, &burst) < 2 || rate <= 0 || seconds <= 0) {
            printf("error: expected 'RATE SECONDS [BURST]'\n");
            continue;
        }
        double c0 = cpu_s();
        uint64_t t0 = now_ns(), ticks = (uint64_t)(seconds * 1000), fired = 0;
        double per_tick = rate / 1000.0, owed = 0;
        for (uint64_t t = 1; t <= ticks; t++) {
            owed += per_tick;
            uint64_t n = (uint64_t)owed;
            owed -= (double)n;
            if (burst) {
                for (uint64_t i = 0; i < n; i += burst) {
                    uint32_t k = (uint32_t)(n - i < burst ? n - i : burst);
                    fire_burst(step, k);
                    step += k;
                }
            } else {
                for (uint64_t i = 0; i < n; i++, step++)
                    fire(step, ((uint64_t)7 << 48) | ((uint64_t)(step & 0xFFFF) << 32));
            }
            fired += n;
            uint64_t deadline = t0 + t * 1000000ull;
            if (now_ns() < deadline) {
                struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            }
        }
        printf("fired %llu in %.6f s cpu %.6f\n", (unsigned long long)fired, (now_ns() - t0) / 1e9, cpu_s() - c0);
    }
    return 0;
}
