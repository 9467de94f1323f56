/* obshub BPF program: the layers the loader selected (-D OBS_LAYER_<NAME>), compiled together so they
 * share the maps of common.h (tid -> TraceKey, watched processes, lost counters, thresholds, ring
 * buffer). Run `obshub probes --ebpf` to see the final source and flags bcc compiles. */
#include "common.h"

#ifdef OBS_LAYER_PYTORCH
#include "pytorch.c"
#endif
#ifdef OBS_LAYER_SCHED
#include "sched.c"
#endif
#ifdef OBS_LAYER_MEMORY
#include "memory.c"
#endif
#ifdef OBS_LAYER_NET
#include "net.c"
#endif
#ifdef OBS_LAYER_PCIE
#include "pcie.c"
#endif
#ifdef OBS_LAYER_CUDA
#include "cuda.c"
#endif
#ifdef OBS_LAYER_NIC
#include "nic.c"
#endif
