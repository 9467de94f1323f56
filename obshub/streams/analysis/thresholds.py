"""The analysis's tunables (``Thresholds``: every number docs/ANALYSIS.md names, with its unit) and the
layers that carry time."""

from __future__ import annotations

from dataclasses import dataclass

from obshub.core.schema import Layer

TIME_LAYERS = tuple(layer.value for layer in Layer if layer is not Layer.AGENT)


@dataclass(frozen=True)
class Thresholds:
    """When a step names a straggler and when a layer is blamed (docs/ANALYSIS.md "Thresholds").

    - ``straggler_min_ns`` / ``straggler_rel``: the straggler's excess must be at least
      ``max(straggler_min_ns, straggler_rel * median host step time)``; below that the step is clean.
    - ``blame_min_ns`` / ``blame_rel``: a layer is blamed when its excess is at least
      ``max(blame_min_ns, blame_rel * straggler excess)``.
    - ``count_min`` / ``count_factor``: a count-only layer is blamed when the straggler's count is at least
      ``count_min`` and at least ``count_factor`` times the peers' median count.
    - ``baseline_n`` / ``baseline_min_n``: the sliding history length, and how many steps it needs before
      ``stall`` may be true.
    - ``net_busy_rel``: a connection of a host is busy when it has at least this fraction of the RTT
      samples of the host's busiest connection; ``net_rtt_min_ns`` / ``net_rtt_factor``: a host is
      blamed by RTT when its lowest mean RTT over busy connections is at least this and this many times
      the other hosts' median (``net_blame``).
    - ``pair_slack_ns``: tolerance (beyond both clocks' uncertainty) of the pairing check of a collective.
    - ``spread_min_ns`` / ``spread_rel`` / ``spread_q``: the job's recent spread of lateness is the
      ``spread_q`` quantile (nearest rank) of the largest lateness per step over the baseline's steps,
      at least ``max(spread_min_ns, spread_rel * baseline median step time)`` (``baseline``).
    - ``evidence_clip``: one step's evidence is clipped to ``[0, evidence_clip]`` spreads: with the
      rules' CUSUM (drift 1.5, threshold 5) a step fires alone only from 6.5 spreads, and the clip bounds
      what one step can add (docs/ANALYSIS.md "The test: Page's CUSUM").
    - ``net_count_min``: the fewest retransmits on every busy connection of a host (``rx``) that count as
      network evidence (with ``count_factor`` times the other hosts' median): lower than ``count_min``
      because the evidence adds up over steps in the rules' CUSUM, where one step's blame stands alone.
    - ``rtt_scale_ns``: the smallest RTT scale of the network evidence (``(rtt - peers) / max(peers,
      rtt_scale_ns)``).
    - ``hang_min_ns`` / ``hang_factor``: a rank hangs when others arrived at a collective it never reached
      and it sent nothing for at least ``max(hang_min_ns, hang_factor * baseline median step time)``;
      (the arrived ranks must have waited half of it);
      ``hang_hold_ns``: how long a hung step is kept open (hang records repeat) before the window closes it.
    - ``hang_state_wait_ns``: a rank its agent found frozen, stopped or exited (RANK_STATE) hangs without
      the silence once the other ranks have waited this long in a collective it holds up.
    - ``hang_exit_gap_ns``: when the ranks that waited in a collective exited too (they failed on the lost
      peer), the rank that exited at least this long before them is the one that stopped first.
    - ``hang_exit_settle_ns``: a hang with exited ranks is judged only this long after the earliest exit
      known, so that every agent's report of an earlier exit has arrived; of several exits only those
      within ``hang_exit_gap_ns`` of the earliest are named.
    - ``hang_cancel_wait_ns``: a hang with a rank ended by a stop signal (SIGHUP, SIGINT, SIGTERM: a job
      cancelled by its scheduler, Ctrl-C) is judged only this long after that exit was received; when every
      registered rank of the step's hosts was then ended by a stop signal, the job was cancelled and
      nothing is named.
    - ``hang_quiet_steps``: a step that hung and this many of the job's steps after it carry no
      sequential evidence (the ranks resynchronise after the thaw: lateness that is no layer's fault).
    - ``running_min_ns`` / ``running_factor``: a step still open (no summary yet) is checked for network
      evidence once it has run ``max(running_min_ns, running_factor * baseline median step time)``
      (``running_check``); ``running_time_rel``: a host whose own time-layer excess in the running step
      reaches this fraction of its elapsed time is not judged on its connections (a CPU-starved or
      memory-stalled host answers late on every connection).
    - ``net_directed_keep_steps``: once a step of a job meets the directed view's condition
      (``net_stats``), the worker reads the job's network evidence in the directed view for this many
      steps after it, although a step of its own does not meet it.
    - ``net_window_steps`` / ``net_window_stall``: a step that took at least ``net_window_stall`` times
      the job's baseline median step time reads its retransmits together with those of the job's
      previous ``net_window_steps`` closed steps (``net_window``; docs/ANALYSIS.md "Loss over a window of
      steps"); over the window a host's fewest retransmits count only from ``net_window_min`` and from
      ``net_window_factor`` times its reference (a CPU-starved host's connections gather a few spurious
      retransmits over 8 steps too).
    - ``net_toward_clip``: the most evidence one slowed step's retransmits toward a host give it
      (``net_toward_evidence``, a blackout's back-off): enough to name a stalled step's host (the
      culprit needs 2), while the rules' CUSUM (drift 1.5, threshold 5) needs 4 such steps in a row;
      ``net_toward_late_rel``: a host that kept the others waiting at a collective for this part of its
      step time or more gets none (a stopped rank's peers retransmit toward it too).
    - ``net_queue_min_ns``: the toward view's evidence goes to the host that sent the most of those
      retransmits when its own egress queue held a watched socket's segment this long in the step
      (``HostNet.queue_max_ns``; half TCP's minimum RTO: a link that queues, not the receiver's loss). The
      agent sends TCP_QUEUE from its ``queue_ns`` (100 ms): a lower value here sees no more.
    - ``net_drops_min``: the fewest of a host's own dropped segments in a slowed step that give it network
      evidence (``net_drops_evidence``, a blackout's drops; also ``count_factor`` times the most any other
      host dropped and its own drops over the window): one or two drops are a loaded machine's chance.
    """

    straggler_min_ns: int = 2_000_000
    straggler_rel: float = 0.05
    blame_min_ns: int = 1_000_000
    blame_rel: float = 0.10
    count_min: int = 3
    count_factor: float = 2.0
    baseline_n: int = 50
    baseline_min_n: int = 10
    net_busy_rel: float = 0.25
    net_rtt_min_ns: int = 5_000_000
    net_rtt_factor: float = 3.0
    pair_slack_ns: int = 100_000
    spread_min_ns: int = 2_000_000
    spread_rel: float = 0.02
    spread_q: float = 0.9
    evidence_clip: float = 7.0
    net_count_min: int = 2
    rtt_scale_ns: int = 2_000_000
    hang_min_ns: int = 3_000_000_000
    hang_factor: float = 3.0
    hang_hold_ns: int = 300_000_000_000
    hang_state_wait_ns: int = 500_000_000
    hang_exit_gap_ns: int = 20_000_000
    hang_exit_settle_ns: int = 750_000_000
    hang_cancel_wait_ns: int = 2_000_000_000
    hang_quiet_steps: int = 3
    running_min_ns: int = 500_000_000
    running_factor: float = 3.0
    running_time_rel: float = 0.05
    net_directed_keep_steps: int = 200
    net_window_steps: int = 8
    net_window_stall: float = 2.0
    net_window_min: int = 10
    net_window_factor: float = 3.0
    net_toward_clip: float = 3.0
    net_toward_late_rel: float = 0.25
    net_queue_min_ns: int = 100_000_000
    net_drops_min: int = 3
