/* obshub PCIe layer: AER errors from the tracepoint ras:aer_event (system-wide, not filtered by target:
 * a bad link hurts every process behind it).
 *
 *   ras:aer_event -> PCIE_AER: value = status bits, arg0 = severity (0 non-fatal uncorrectable,
 *                    1 fatal, 2 corrected), arg1 = tlp_header_valid, str0 = device name (PCI BDF).
 *                    The reader names the correctable bits 8 (replay number rollover) and 12 (replay
 *                    timer timeout): both mean TLPs were retransmitted on the link.
 * dev_name is a __data_loc string: a u32 at TPOFF_AER_EVENT_DEV_NAME whose low 16 bits are the offset
 * of the string from the start of the record and high 16 bits its length.
 */
#include "common.h"

int obs_aer_event(void *ctx)
{
    u32 loc = 0, status = 0;
    u8 severity = 0, tlp_valid = 0;
    OBS_TP_READ(loc, ctx, TPOFF_AER_EVENT_DEV_NAME);
    OBS_TP_READ(status, ctx, TPOFF_AER_EVENT_STATUS);
    OBS_TP_READ(severity, ctx, TPOFF_AER_EVENT_SEVERITY);
#if TPOFF_AER_EVENT_TLP_HEADER_VALID >= 0
    OBS_TP_READ(tlp_valid, ctx, TPOFF_AER_EVENT_TLP_HEADER_VALID);
#endif
    struct obs_event *e = obs_reserve(OBS_PROBE_PCIE_AER, OBS_KIND_PCIE_AER, 0, 0);
    if (!e)
        return 0;
    e->value = status;
    e->arg0 = severity;
    e->arg1 = tlp_valid;
    bpf_probe_read_kernel_str(e->str0, sizeof(e->str0), (char *)ctx + (loc & 0xFFFF));
    obs_submit(e);
    return 0;
}
