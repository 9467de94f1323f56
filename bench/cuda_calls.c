/* bench/cuda_calls.py's caller: reads "LIB SYMBOL N" lines on stdin, calls SYMBOL of LIB (dlopen'ed once)
 * N times with zero arguments (without a GPU each call fails fast; a uprobe on it fires the same) and
 * prints the ns per call (CLOCK_MONOTONIC, loop included). "go" lines are echoed (a sync point). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int (*fn6)(void *, void *, void *, void *, void *, void *);

int main(void)
{
    char lib[4096], sym[256];
    long n;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (scanf("%4095s %255s %ld", lib, sym, &n) == 3) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
        fn6 f = h ? (fn6)dlsym(h, sym) : NULL;
        if (!f) {
            printf("error %s\n", dlerror());
            continue;
        }
        f(0, 0, 0, 0, 0, 0); /* the first call initialises the runtime */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++)
            f(0, 0, 0, 0, 0, 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n);
    }
    return 0;
}
