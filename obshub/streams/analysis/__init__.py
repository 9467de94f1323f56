"""Step analysis, pure functions: per-host accumulators of one closed step -> the step summary.

Every formula here is written out in docs/ANALYSIS.md with its reasons; this docstring only names them.

- step time per host: the STEP_END ``duration_ns``;
- compute time per host: step time minus the union of its collective intervals (time not spent inside
  a collective), the ``pytorch`` layer's ``time_ns``;
- per collective ``(pg, coll_seq)`` seen by >= 2 hosts: arrival = offset-corrected COLLECTIVE_BEGIN time,
  skew = latest - earliest, last arriver, uncertainty = clock uncertainty of the latest + the earliest;
- straggler: the host whose late arrival kept the others waiting longest (lead over the second-latest
  arrival, beyond both clocks' uncertainty), or, without collectives, the largest compute excess over the
  peer median; named only when the excess passes ``Thresholds``;
- layer blame for the straggler: per layer ``time_ns`` minus the median of the same layer on its peers,
  the ``pytorch`` layer counting only what the lower layers do not explain; count-only layers
  (retransmits, AER, NIC counters) by count;
- network blame by connection: per host, the fewest retransmits over its busy connections; a host far
  above the others is blamed for ``network`` even when it is not the straggler (loss on one link slows
  every rank alike, so nobody arrives late);
- baseline: median and p99 (nearest rank) of the job's last ``n`` step times before this step; stall;
- pairing check (no clocks needed): a rank cannot wait at a collective longer than its own collective
  lasted, and the paired intervals must overlap; a collective that fails either is reported in
  ``inconsistent`` and never used to blame a host;
- single-step straggler without a baseline: the last arriver, when its lateness over the median arrival
  is large relative to the step, with the late group (every rank that late, with its lateness);
- sequential evidence: per (host, layer) the excess of the host's own layer that made it late, divided by
  the job's recent spread of lateness (``evidence``), for the rules' CUSUM (docs/ANALYSIS.md
  "Sequential detection");
- several ranks per host: a host arrives at a collective with its last rank; the straggler, blame,
  evidence, culprit and hang name the rank too; a one-node job compares its ranks (``ranks``);
- hangs: a rank that never arrived at a collective the others reached, silent for long enough
  (``hang_check``, called by the worker's timer while no step closes).

The step summary is a JSON-able dict and the accumulators typed records (``streams.accumulate``:
``HostAcc``, ``RankRow``; the dict form is accepted and converted); between the modules the baseline, the
evidence and the network statistics are typed records (msgspec Structs: ``Baseline``, ``Evidence``,
``HostEvidence``, ``NetStats``, ``NetEvidence``, ``NetBlame``), which ``summarize`` encodes to the
summary's maps (same keys, same order). Nothing here touches Kafka or Faust. The package is split by
job (``thresholds``, ``stats``, ``straggler``, ``network``, ``evidence``, ``running``, ``summary``); every
name is re-exported here, so ``analysis.summarize`` and the others keep their one address.
"""

from __future__ import annotations

from obshub.streams.analysis.culprit import (
    CULPRIT_LAYER,
    CULPRIT_MIN_EVIDENCE,
    MEMORY_GAP_STEPS,
    MEMORY_QUIET_STEPS,
    PERSIST_STEPS,
    RUNNING_PEER_VIEWS,
    SELF_STEPS,
    STARVED_KEY,
    STEP_KEY,
    charge_persistent,
    charge_running,
    charge_starved,
    culprit,
    hang_culprit,
    hold_ambiguous,
    memory_episode,
    persistent_culprit,
    persistent_key,
    running_applies,
    running_counts,
    running_own_work,
    running_rejudge,
    sched_times,
    slowed,
)
from obshub.streams.analysis.evidence import (
    EVIDENCE_LAYERS,
    TIME_EVIDENCE,
    Baseline,
    Evidence,
    HostEvidence,
    baseline,
    evidence,
    history_entry,
)
from obshub.streams.analysis.network import (
    NetBlame,
    NetEvidence,
    NetStats,
    _net_z,
    net_blame,
    net_drops_evidence,
    net_evidence,
    net_stats,
    net_toward_evidence,
    net_window,
    net_window_part,
    retransmits_toward,
)
from obshub.streams.analysis.ranks import host_ranks, host_view, multi_rank, rank_units
from obshub.streams.analysis.running import (
    _exit_cascade,
    _last_phase,
    _stalled,
    hang_check,
    hang_ranks,
    one_node_hang,
    running_check,
)
from obshub.streams.analysis.stats import LeaveOneOut, median_int, p99_int, quantile_int, union_ns
from obshub.streams.analysis.straggler import (
    _pair_check,
    blame,
    collectives,
    compute_ns,
    find_straggler,
    lateness,
    layer_table,
)
from obshub.streams.analysis.summary import (
    Collective,
    Inconsistent,
    Quality,
    _with_net,
    culprit_rank,
    one_rank_culprit,
    summarize,
)
from obshub.streams.analysis.thresholds import TIME_LAYERS, Thresholds

__all__ = [
    "CULPRIT_LAYER",
    "CULPRIT_MIN_EVIDENCE",
    "culprit",
    "hang_culprit",
    "PERSIST_STEPS",
    "SELF_STEPS",
    "STARVED_KEY",
    "STEP_KEY",
    "charge_persistent",
    "charge_running",
    "hold_ambiguous",
    "memory_episode",
    "MEMORY_QUIET_STEPS",
    "MEMORY_GAP_STEPS",
    "charge_starved",
    "running_applies",
    "RUNNING_PEER_VIEWS",
    "running_counts",
    "running_own_work",
    "running_rejudge",
    "persistent_culprit",
    "persistent_key",
    "sched_times",
    "slowed",
    "TIME_LAYERS",
    "Thresholds",
    "median_int",
    "LeaveOneOut",
    "p99_int",
    "union_ns",
    "quantile_int",
    "compute_ns",
    "layer_table",
    "_pair_check",
    "collectives",
    "lateness",
    "find_straggler",
    "blame",
    "NetStats",
    "NetEvidence",
    "NetBlame",
    "net_stats",
    "net_window_part",
    "net_window",
    "net_blame",
    "net_evidence",
    "net_drops_evidence",
    "net_toward_evidence",
    "_net_z",
    "retransmits_toward",
    "Baseline",
    "HostEvidence",
    "Evidence",
    "baseline",
    "EVIDENCE_LAYERS",
    "TIME_EVIDENCE",
    "evidence",
    "history_entry",
    "running_check",
    "_last_phase",
    "_exit_cascade",
    "_stalled",
    "hang_check",
    "_with_net",
    "Collective",
    "Inconsistent",
    "Quality",
    "summarize",
    "culprit_rank",
    "one_rank_culprit",
    "host_ranks",
    "host_view",
    "multi_rank",
    "rank_units",
    "hang_ranks",
    "one_node_hang",
]
