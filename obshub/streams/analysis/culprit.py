"""The culprit of a step: the host and layer one step is charged to, for the single-step stall rules
(docs/ANALYSIS.md "Culprit of a step"), and the culprit of a step that hung."""

from __future__ import annotations

import bisect
from collections.abc import Mapping

CULPRIT_LAYER = {"pytorch": "process"}
"""Culprit layer names that differ from the evidence layer's: lateness no lower layer explains is the
rank's own process (stopped, frozen, or its own code slow), named ``process`` as the hang rules do."""
CULPRIT_MIN_EVIDENCE = 2.0
"""The least per-step evidence (spreads) that names a culprit: on recorded demo stalls the true culprit had
4-7, while a blackout step whose retransmits fell outside it left only run-queue noise of 1.4-1.6 spreads
on two hosts, which must not name one of them."""
SPECIFIC_EVIDENCE = 3.0
"""Per-step evidence (spreads) of a culprit, of any layer, that a memory cgroup at its limit
(``_memory_at_limit``) does not outrank: the rules' ``stall_specific_net_evidence`` (docs/RULES.md), since
at 2 two stray retransmits toward a host in a step a neighbour's 300 ms SIGSTOP slowed named it. A host
routinely at its limit (a data loader reading through the page cache) must not take over a CPU burst or a
loss of another host, whose evidence is 4-12 spreads."""
_SPECIFIC_FIRST = {
    layer: i for i, layer in enumerate(("network", "sched", "memory", "memlimit", "cuda", "nic", "pcie", "pytorch"))
}
PERSIST_STEPS = 8
"""How many of the job's previous closed steps ``persistent_culprit`` reads."""
PERSIST_MIN = 2
"""In how many of them the same host and layer must be a step's own culprit (``persistent_key``) for a
persistent fault: a fault that slows every step names its host and layer on most of them from its first
steps on, while a sporadic stall names one step (two when it spans a step boundary) and then the job's
steps are fast again, which keeps nothing alive (``charge_persistent``)."""
PERSIST_SLOW = 2.0
"""A step charged to a persistent fault keeps it alive when it took at least this many times the job's
baseline median step (``charge_persistent``)."""
EXPLAIN_REL = 0.25
"""The least part of what a stalled step lost over the job's median step that a straggler's excess (or a
layer's excess, ``source`` "layers") must make up to be its culprit: a host late by 10 ms in a step that
lost 800 ms is a bystander."""
AMBIGUOUS_REL = 0.5
"""A culprit must stand out: when another host's evidence (or layer excess, ``source`` "layers") is at
least this part of the best one's, no host is named (two hosts starved at once share a cause)."""
STOPPED_MIN_NS = 50_000_000
"""The least time (ns) a rank's thread must have been stopped or traced in a step (``summary.stopped``) to
be a culprit without a baseline; with one, the stop must also make up ``EXPLAIN_REL`` of what the step lost.
Nothing stops a rank in normal training: a stop of 50 ms is an act (SIGSTOP, a debugger, a job control
freeze), never jitter."""
MEMLIMIT_MIN_RECORDS = 16
"""``_memory_limited``: the least memory records (reclaim stalls, summed short ones included, and watched
allocations: the memory layer's ``count``) of a host in one step for the signature of a rank at its memory
cgroup's limit: the kernel retries memory-cgroup reclaim ``MAX_RECLAIM_RETRIES`` (16) times before a charge
fails (mm/memcontrol.c ``try_charge``); a rank in steady state records none (on a recorded 4-host demo run
5 of 1,632 host-steps had any, 4 of them the 4 memory stalls, with 18-27)."""
STARVED_NEXT_STEPS = 2
"""``charge_persistent``: lateness (``process``) of a host whose own ``sched`` was the culprit of one of the
job's last this many closed steps is its run queue's. A CPU burst that spans a step boundary keeps the
starved rank in its old step (whose summary names it ``sched``) while its peers, done with that step,
wait for it at the next step's first collective: that step has the rank late by most of the stall and
its run-queue waits in the step before (live, 800 ms bursts of node-01, 2026-12-05: step 287 named
node-01 / sched with 786 ms of run-queue time, step 288 x4.9 node-01 late by 720 ms with 18 ms of it)."""
LAYER_CULPRIT = ("sched", "memory")
"""Time layers a step with neither evidence nor a straggler may be charged to (``source`` "layers")."""
STARVED_MIN_EVIDENCE = 3.0
"""``starved`` (``_starved``): the least sched evidence (spreads) of the culprit host."""
STARVED_PEER_EVIDENCE_REL = 1 / 3
"""``starved``: every other host's sched evidence is at most this part of the culprit's."""
STARVED_EXPLAIN_REL = 0.6
"""``starved``: the culprit host's run-queue time over its peers' median makes up at least this part of
what the step lost over the job's median step (its own waits explain most of the stall)."""
STARVED_PEER_FACTOR = 3.0
"""``starved``: the culprit host's run-queue time is at least this many times every other host's (a CPU
burst on one host, not load spread over the machine: on the loaded 2-core demo host, clean steps of
x1.5-x2.6 mostly had sched culprits of 0.7-1.9x their busiest peer's run-queue time, outside starvations
of one host 2.8x and 2.9x; 300 ms bursts gave 2.6-6.7x, docs/BENCHMARKS.md section 8)."""
NET_OWN_LAYER_REL = 0.5
"""A ``network`` best of ``culprit``'s 1. gives way to its own host's sched or memory time (``_layer_culprit``)
only when that time over its peers' median makes up at least this part of what the step lost (its own
waits explain most of the stall, as a CPU fault's do: 133-547 % of the loss in the kept CPU faults' steps
that took that turn, 2026-12-06). A blackout's host waited in its run queue on a loaded 2-core machine
too: a 200 ms blackout of node-03 (x2.38, 219 ms lost, 2.0 spreads of directed network evidence) was named
node-03 / sched for 61 ms over its peers' median (28 % of the loss, 1.3 times the busiest peer's,
rqveto14 step 254), which no rule fires on below ``stall_sched_k``."""
RUNQ_VETO_FACTOR = 1.5
"""``runq_veto`` (``_runq_veto``): another host's run-queue time is at least this many times the busiest
host's but its own (and over its peers' median by ``EXPLAIN_REL`` of what the step lost). CPU bursts mostly
stood at 1.5-12x their busiest peer's, 1.5-1.9x at load 8-11 (where every host waited for a CPU); in the steps of
recorded blackouts the top other host stood at 1.0-1.7x with 1-15 % of the loss over its peers' median
(41 kept runs, 36,390 closed steps, 2026-12-06)."""

LOWER_LAYER_REL = 0.1
"""A ``pytorch`` best of ``culprit``'s 1. gives way to a lower layer of its host (sched, memory, cuda, nic; at
least ``CULPRIT_MIN_EVIDENCE``) only when that layer's time over its peers' median (its evidence times the
step's spread, ns) makes up at least this part of the host's lateness (``_host_lateness``). In the kept
runs' CPU faults (47 runs, 315 steps that lost 100 ms or more with the faulted host late by ``EXPLAIN_REL``
of the loss; 2026-12-07) the host's run-queue excess, counted as far as it made the host late, made up
23.5-100 % of its lateness wherever it had any (4 steps had none); the rule's own case, a starved rank
late 626 ms with 2.46 spreads of 64 ms (157 ms), 25 %. A rank slow in its own code is late with its run
queue near its peers': a 3-rank one-node torchrun whose rank 2 slept 600 ms in a micro-batch
(walk25-realpath, steps 450 and 760) was late 600-605 ms with 8.0 and 12.5 ms of run-queue excess (2.2
and 2.7 spreads of 3.6-4.7 ms: 1.3 and 2.1 %) and was named ``sched``, not ``process``."""

CLIPPED_NET_VIEWS = ("toward", "drops")
"""Views of a host's connections (``evidence.net_view``) whose evidence is clipped at
``Thresholds.net_toward_clip`` (3 spreads, ``SPECIFIC_EVIDENCE``): a stall's charge, never more, so their
culprit carries ``runq_veto`` at the clip too (the rules' ``stall_weak_net`` reads it; without it a clipped
view of an undirected step fired only from ``stall_k``)."""


SELF_STEPS = 16
"""``charge_starved``: how many of the job's previous closed steps' run-queue times per host it reads."""
SELF_MIN = 8
"""``charge_starved``: the least of those steps a host needs a run-queue time in (its own reference)."""
SELF_RANK_FACTOR = 1.5
"""``charge_starved``'s rank path (a host of several ranks): the burst rank's rise over its own recent
median is at least this many times every other rank's rise in the job. On 2 cores shared by 16 ranks every
rank waits 100-800 ms a step, so a 300 ms burst on one rank is never 3x its busiest peer's run queue
(1.2-2.2x), but it rises against its own steps 1.8-3.5x more than any other rank (untuned14 r1, node-01
rank 7: x1.70-x1.93); on the 64 kept runs (50,467 closed steps) no rank of a host nobody stalled met this
with ``STARVED_EXPLAIN_REL`` (the nearest, 1.9x, rose 166 ms where 236 were needed)."""
BURST_FACTOR = 2.0
"""``charge_starved``'s burst test (``_burst``): the unit whose run-queue time rose most over its own recent
median (a rank in a job of more rank rows than hosts, else a host) rose at least this many times every
other unit's rise. A CPU burst on one rank puts that rank's threads in the run queue for most of the
burst, whatever the step's ratio: 300 ms bursts of one rank of 16 on 2 cores rose 546-1,051 ms, 2.3-11x
every other rank's rise (stop19-new-cpu44, x1.73-x2.08), a 150 ms burst of one host of 4 rose 509 ms
with no other host risen (early19-new-cpu2 step 530, x1.91); in 11 kept runs (starve20) no unit of a
step nobody stalled reached 2x with ``STARVED_EXPLAIN_REL`` of the loss (the nearest: 2.9x with 46 %, a
step that lost 89 ms; 2.1x with 57 % at x1.16)."""
BURST_MIN_NS = 250_000_000
"""``_burst``: the least the burst unit's rise exceeds every other unit's rise by (ns), whatever the step
lost. On 2 cores shared by 4 one-rank hosts a host's run-queue time rises over its own median by 100-300 ms
in steps nobody stalled (the largest excess over every other host's rise in 11 kept runs: 197 ms, at x1.29
with 61 ms lost), while one 150 ms burst put 509 ms on its host's (x1.91) and 300 ms bursts of one rank
of 16 330-957 ms on that rank's."""

BURST_HOST_MIN_NS = 200_000_000
"""``_burst``'s ``BURST_MIN_NS`` for a host of one rank (a job of one rank per host), set from the noise
measured there (burst21). On 2 cores shared by 4 one-rank hosts, in 6,647 closed steps nobody stalled (29 kept
runs, loads 1-11: outside every persistent fault and from 1 s before to 3 s after every stall's start) the
most-risen host's excess over every other host's rise was 13 ms at the median, 99 ms at p99, 146 ms at
p99.9 and 197 ms at most (a step that lost 61 ms); in the 191 of them that lost the rules' 100 ms
(``stall_burst_floor_ns``) at most 112 ms. 150 ms bursts of one host rose 211-407 ms over every other host's
in the steps they stalled by 100 ms or more (starve20-a-base-1, -a-new-1). A rank's run-queue time on a
host of several ranks is noisier (p99.9 405 ms over 892 steps of 4 x 4): ``BURST_MIN_NS`` stays for ranks."""

BURST_ALIKE_MIN_NS = 200_000_000
"""``_burst_alike``: the least every rank of the burst host rose over its own recent median beyond the
largest rise of any rank of another host (ns). 4 hosts x 4 ranks on 2 cores: in 892 closed steps nobody
stalled (7 kept runs) the host whose least-risen rank rose most stood at most 130 ms over every other
host's ranks where it was 2x them (192 ms where it was not), while a 300 ms burst in which every rank of
node-01 rose alike (stop19-new-cpu44 step 201, x1.31) had each of them 400-603 ms up, 354 ms over any
other rank's rise. Live whole-host bursts (burst21-b-new-1/-2, -b-base-2): named where every
rank stood 217-577 ms over; two at 75-104 ms (inside the noise) stay unnamed."""
BURST_ALIKE_MIN_RANKS = 3
"""``_burst_alike``: the least number of ranks (each with its own baseline) the burst host has. Two ranks of
a host share its CPUs and are delayed together by whatever else runs there: 4 hosts x 2 ranks (a clean
stretch of starve20-untuned-new-1, step 144, x1.97) had both ranks of node-03 up 435-462 ms while no
other rank rose 82 ms, beyond what 200 ms bursts of that job's faulted host gave (167-201 ms); in the
4-rank hosts no such step."""


STEP_KEY = -1
"""``charge_starved``'s part key (neither a host name nor a ``(host, rank)``) of the step's own time
(``step_time_max_ns``, ns), which the job's recent parts keep for ``_crowded``'s noise test."""
STARVED_KEY = -2
"""``charge_starved``'s part key of the host its step's culprit named ``starved`` (None when none): a burst
that spans a step boundary starves its host in the next steps too, which ``_crowded`` leaves starved."""
RECENT_STALL_K = 1.5
"""``_crowded``: in a job of two hosts, a ``starved`` sched culprit (by the same-step test against its one
peer, or its own recent steps) stays starved only when its step took at least this many times the median
step of the job's last ``SELF_STEPS`` closed steps (at least ``SELF_MIN`` of them), its own measured noise,
besides the baseline's ``stall_starved_k``. In a
stretch where the whole machine is slowed (the 2-host e2e clean run of a fresh-clone CI pass, ci-flake22: 23
steps of x1.3-x3.7 with both hosts' run-queue times swinging 40-260 ms) one host's run queue stands 3.6x its
one peer's by chance: step 256, x2.39 of the 50-step baseline but x1.41 of its last 16 steps, fired a wrong
``step_stall`` (stall_starved). A burst stands out of the steps before it: the sporadic campaign's bursts are
seconds apart, tens of steps."""
ALIKE_RISE_REL = 0.75
"""``_crowded``: a host's sched culprit (not a burst, not one rank's) names nobody when another host's
run-queue time rose over its own recent median (``_own_rise``) at least this part of the culprit host's rise
and by ``EXPLAIN_REL`` of what the step lost: the run queues of the machine grew alike, no host's fault (the
rules' ``stall_sched_k`` fired on such steps: ci-flake22's cpu run before the fault, step 33, x4.50, node-00
up 336 ms and node-01 287 ms over their own medians, the straggler blamed sched for 54 ms of the 431 lost;
its clean run's step 267, x4.74, 228 and 211 ms). A CPU burst of one host leaves its peers' run queues
near their own steps' (the e2e cpu fault's first step: node-01 up 142 ms, node-00 5)."""

CROWD_WINDOW_NS = 2_000_000_000
"""``_crowded_ranks``: how far back (ns, the sum of the job's recent steps' own times, ``STEP_KEY``) another
host whose every rank rose alike counts as the machine's own noise. A machine slowed as a whole (another job's
load, CPU steal) delays every rank of a host alike and moves from host to host within a second or two: a clean
4 x 2 Lightning stretch (frame22-lightning-cpuproc-new-1, steps 48-59) had every rank of node-02 up 377-422 ms
0.9 s before rank 7 of node-03 rose 396 ms alone (step 53, a wrong ``stall_burst``), then both ranks of node-01
227-294 ms in the next step. In the kept runs of several ranks per host no right sched alert had another host
whose every rank rose more than 0.30x its culprit's rise within 2 s; the nearest, 0.81x, was 2.4 s before
(stop19-new-cpu44 step 259, a 300 ms burst of rank 6 at load 5-10)."""


LOADED_RISE_REL = 1.0
"""``_loaded_net``: a ``network`` culprit of the step's own evidence is vetoed (``runq_veto`` True) when every
host's run-queue time rose over the median of its own recent steps (``_own_rise``) by at least this part of
what the step lost over the job's median step: the machine was starved of CPU as a whole, and timing of
the receive side measured while every host's threads wait for a CPU is not evidence of a link. A blackout
or a loss burst leaves the ranks sleeping on their sockets, not runnable: in the kept runs' network
culprits of the network faults' steps (loss, blackouts, lossy links beside outside CPU hogs; 2026-12-07) the
least-risen host rose at most 34 % of the loss in every step that lost 100 ms or more (mostly under 10 %),
while make demo's wrong node-03 / network at load 4+ (lead23 step 43, x2.58, 370 ms lost) had every host up
672-851 ms over its own steps (1.8x the loss or more), and a clean 4 x 4 run at load 7-23 (burst21-clean44
step 55, x2.56, 810 ms lost) 1,420-3,079 ms; the real loss's steps of that make demo (54-59) had run queues
at or under their own medians."""


def culprit(summary: dict) -> dict | None:
    """The host and layer one step is charged to, for the single-step stall rules (docs/ANALYSIS.md
    "Culprit of a step"): ``{host, layer, evidence, source, why}`` or None when nothing names one.

    1. ``source`` "evidence": the (host, layer) with the largest per-step evidence (``evidence.hosts``, in
       spreads), at least ``CULPRIT_MIN_EVIDENCE``; on a tie a named layer (network, sched, memory, cuda,
       nic) wins over unexplained lateness (``pytorch``), then the host name; ``evidence`` is that value.
       With network evidence of at least ``CULPRIT_MIN_EVIDENCE`` on any host, ``pytorch`` values are no
       candidates (a lossy link's peers wait for retransmissions and arrive late); a lateness-based value
       (any layer but network) only when the host's lateness (its late-group entry, at least ``z``
       spreads) makes up ``EXPLAIN_REL`` of what the step lost over the baseline median. When another
       host's lateness-based candidate exceeds ``AMBIGUOUS_REL`` of the best one, None: no single host
       stands out, unless one of those hosts is starved by its run-queue times alone (``_alike_starved``:
       its peers waited for it; a ``sched`` culprit, ``starved``, with its busiest ``rank``). A ``pytorch``
       best gives way to a lower layer of the same host with evidence that makes up
       ``LOWER_LAYER_REL`` of the host's lateness (``_host_lateness``); a
       ``network`` best gives way to the host's own sched or memory time when that explains the stall
       (``_layer_culprit`` names the same host, its time over its peers' median at least
       ``NET_OWN_LAYER_REL`` of the loss: a starved host's sockets look lossy), also when another
       host's network evidence under ``SPECIFIC_EVIDENCE`` came first and the host, ``starved``, has
       network evidence of its own (its peers retransmit toward it), or that evidence is undirected
       (not ``net_directed``, no ``CLIPPED_NET_VIEWS`` view) and the starved host's run queue vetoes it
       (``_runq_veto``). A ``network`` best that another host's network evidence ties (the same value:
       only the host name would break it) names nobody (a loss on one host's link shows on its peers'
       connections to it too; ``charge_persistent`` then names the persistent fault's host);
    2. else ``source`` "blame": the straggler and its first blamed layer (``evidence`` 0), when its
       ``excess_ns`` is at least ``EXPLAIN_REL`` of what the step lost over the baseline median (ns;
       any straggler without a baseline): a step without per-step evidence (the job's first steps, the
       steps right after a hang);
    3. else ``source`` "layers" (``_layer_culprit``): the host whose sched or memory time exceeds its
       peers' median by at least ``EXPLAIN_REL`` of what the step lost;
    4. else None (nothing names one: every host equally slow, or nothing to compare).
    5. over 1.-4., unless they named ``memory``, ``network`` with ``net_directed`` (a directed loss or
       blackout), or another host that is starved or has at least ``SPECIFIC_EVIDENCE`` spreads: ``source``
       "memlimit" (``_memory_at_limit``) in a step that lost time, the host whose memory cgroup hit its limit
       in the step (its reclaim retries, none like them on its peers).

    A rank's lateness (``pytorch``), its link's ``network`` best when it is the late one, and a straggler
    with no layer blamed name ``memory`` instead when its memory cgroup hit its limit in the step
    (``_memory_limited``: at least ``MEMLIMIT_MIN_RECORDS`` memory records, none like it on its peers).

    A ``sched`` culprit of ``source`` "evidence" or "layers" carries ``starved`` (bool, ``_starved``; one of
    ``source`` "blame", a straggler blamed for its run queue, only when true, judged as a "layers" one): its
    host's own run-queue waits explain most of the step's loss and stand far above every peer's, the
    specific evidence the rules' ``stall_starved`` fires on below ``stall_k``. A ``network`` culprit of
    ``source`` "evidence" under ``SPECIFIC_EVIDENCE`` (or of a view of ``CLIPPED_NET_VIEWS``) carries
    ``runq_veto`` (bool, ``_runq_veto``): another
    host's run queue stood far above every other host's and explains a quarter of the loss (a CPU burst
    inside a collective, whose peers' sockets look lossy too); the rules' ``stall_weak_net`` reads it.

    The worker then charges a persistent fault's victims to it (``charge_persistent``).
    The worker charges a step that hung to the rank its hang record named instead (``hang_culprit``,
    ``source`` "hang").

    0. before all: ``source`` "stopped" (``_stopped_culprit``): a rank stopped or traced for a large part
       of the step (``stopped``) is the ``process`` culprit, with its ``rank``, however its stop overlapped
       a collective (its peers' lateness and retransmits are then its victims' view).

    Layer ``pytorch`` is named ``process`` (``CULPRIT_LAYER``); a straggler without any blamed layer too.
    Reads only ``stopped``, ``evidence``, ``straggler``, ``blame``, ``baseline``, ``step_time_max_ns``, ``layers``,
    ``layer_stats``, ``layers_omitted`` and ``net_directed`` of ``summary``, so a caller that changes those (the worker drops
    the evidence of the steps after a hang) recomputes it."""
    bl = summary.get("baseline") or {}
    # what the step lost over the job's usual step (ns; 0 without a baseline): a straggler, a late host or
    # a layer that explains a small part of it is a bystander of the stall, not its cause
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    stopped = _stopped_culprit(summary, lost)
    if stopped is not None:
        return stopped
    c = _culprit(summary, lost)
    if c is not None and (c["layer"] == "memory" or (c["layer"] == "network" and summary.get("net_directed"))):
        return c
    # a host whose memory cgroup hit its limit in a step that lost time outranks lateness, run-queue noise
    # and a few stray retransmits: a page cache squeezed at the limit slows its rank by tens of ms a step
    # over several steps, below every gate of those, while its reclaim retries are the kernel's word
    mem = _memory_at_limit(summary, lost) if lost else None
    if mem is None:
        return c
    if (
        c is not None
        and c["host"] != mem["host"]
        and (c.get("starved") or float(c.get("evidence") or 0) >= SPECIFIC_EVIDENCE)
    ):
        return c  # another host's burst or loss, with its own evidence: the limit's host is a bystander
    return mem


def _candidates(summary: dict) -> tuple[list[tuple], tuple | None]:
    """``culprit``'s step 1. up to the ambiguity test: the evidence candidates ``((sort key), host, layer,
    z)``, best first, and the best one (a ``pytorch`` best given way to a lower layer of its host), or None."""
    hosts_ev = (summary.get("evidence") or {}).get("hosts") or {}
    # loss or delay on a host's link makes its peers late too: a rank that waited for a retransmission
    # toward or from the lossy host arrives late at the next collective, with no layer of its own to show
    # for it. With network evidence in the step, lateness no lower layer explains names nobody.
    net_seen = any(zs.get("network", 0.0) >= CULPRIT_MIN_EVIDENCE for zs in hosts_ev.values())
    cands: list[tuple] = []
    for h, zs in hosts_ev.items():
        for layer, z in zs.items():
            if layer == "pytorch" and z >= CULPRIT_MIN_EVIDENCE and _memory_limited(summary, h, z) is not None:
                # lateness of a rank that waited at its memory cgroup's limit: the kernel's reclaim
                # retries say whose the wait was, a lossy link's victims have none (``_memory_limited``)
                layer = "memlimit"
            if z < CULPRIT_MIN_EVIDENCE or (layer == "pytorch" and net_seen):
                continue
            cands.append(((-z, _SPECIFIC_FIRST.get(layer, len(_SPECIFIC_FIRST)), h), h, layer, z))
    cands.sort()
    best = cands[0] if cands else None
    if best is not None and best[2] == "pytorch":
        # lateness no lower layer explains is the process's only while no lower layer of the same host has
        # evidence of its own (a starved rank's run-queue accounting may catch part of its starvation), and
        # that evidence makes up a real share of the host's lateness (LOWER_LAYER_REL): a rank slow in its
        # own code for 600 ms with 8 ms of run-queue noise over its peers is its process's
        late = _host_lateness(summary, best[1])
        spread = (summary.get("evidence") or {}).get("spread_ns", 0)
        named = [c for c in cands if c[1] == best[1] and c[2] != "pytorch" and c[3] * spread >= LOWER_LAYER_REL * late]
        best = named[0] if named else best
    return cands, best


def _host_lateness(summary: dict, host: str) -> int:
    """How late ``host`` was in the step (ns): its entry in the straggler's late group (the straggler's
    ``excess_ns`` for the straggler's host without one), and at least the sum of its lateness-based
    evidence (every layer but network, in spreads) times the step's spread (``evidence.spread_ns``), what
    the evidence split it into (a lower bound where ``pytorch`` sits at the clip); 0 when neither says."""
    strag = summary.get("straggler") or {}
    late = {g.get("host"): int(g.get("late_ns") or 0) for g in strag.get("group") or []}
    if strag.get("host") is not None:
        late.setdefault(strag["host"], int(strag.get("excess_ns") or 0))
    ev = summary.get("evidence") or {}
    zs = (ev.get("hosts") or {}).get(host) or {}
    split = sum(float(z) for layer, z in zs.items() if layer != "network") * int(ev.get("spread_ns") or 0)
    return max(late.get(host, 0), int(split))


def _alike(cands: list[tuple], best: tuple | None) -> list[str]:
    """The hosts that stand out about alike (``AMBIGUOUS_REL``) with a lateness-based best candidate, the
    best's host first; empty when the best stands out alone or is ``network`` (connection-based)."""
    if best is None or best[2] == "network":
        return []
    others = [c[1] for c in cands if c[1] != best[1] and c[2] != "network" and c[3] > AMBIGUOUS_REL * best[3]]
    return [best[1], *sorted(set(others))] if others else []


def ambiguous(summary: dict) -> list[str]:
    """The hosts a step names nobody for because they stood out alike (``culprit``'s 1.: each with
    lateness-based evidence above ``AMBIGUOUS_REL`` of the best one's), the best one first; empty when one
    host stands out or none does. Reads ``evidence`` and ``straggler`` of ``summary``."""
    return _alike(*_candidates(summary))


def _culprit(summary: dict, lost: int) -> dict | None:
    """``culprit``'s steps 1. to 4. (after a stopped rank, before a memory cgroup at its limit); ``lost``: ns
    the step lost over the job's median step (0 without a baseline)."""
    spread = (summary.get("evidence") or {}).get("spread_ns", 0)
    strag = summary.get("straggler")
    group = {g["host"]: g.get("late_ns", 0) for g in (strag or {}).get("group") or []}
    if strag:
        group.setdefault(strag["host"], strag.get("excess_ns", 0))
    cands, best = _candidates(summary)
    alike = _alike(cands, best)
    if alike:
        # two hosts about as late: no single host's fault (a shared cause, or load), unless one of them was
        # starved beyond every other host and rank of the job and the others waited for it
        return _alike_starved(summary, cands, alike, group, lost)
    # a lateness-based value (every layer but the connection-based network) names its host only when its
    # lateness (at least z spreads; exact for the late group) makes up EXPLAIN_REL of what the step lost
    if best is not None and best[2] != "network" and max(best[3] * spread, group.get(best[1], 0)) < EXPLAIN_REL * lost:
        best = None
    if best is not None and best[2] == "network" and lost:
        # a host starved of CPU or stalled in reclaim answers late on every connection, so its peers'
        # retransmits toward it look like a lossy link: when its own run-queue or reclaim time over its
        # peers' explains most of the stall (``_layer_culprit``, NET_OWN_LAYER_REL), that layer is the
        # culprit, not its link; a loaded blackout host's own run-queue noise is not
        own = _layer_culprit(summary, lost, NET_OWN_LAYER_REL)
        if own is not None and own["host"] == best[1]:
            own["why"] += f"; its connections looked lossy too (network evidence {best[3]:g})"
            return own
        # so does a tie the host name broke: a starved host's peers retransmit toward it too, so another
        # host's network evidence under SPECIFIC_EVIDENCE beside the starved host's own gives way to its
        # starved run queue (a 300 ms burst of node-03 inside a collective, x2.94: node-02 and node-03 at
        # 2.0 spreads each, node-03's run queue 5x its busiest peer's; 2026-12-06, docs/BENCHMARKS.md 8)
        if (
            own is not None
            and own.get("starved")
            and best[3] < SPECIFIC_EVIDENCE
            and any(c[1] == own["host"] and c[2] == "network" for c in cands)
        ):
            own["why"] += f"; its connections and {best[1]}'s looked lossy too (network evidence {best[3]:g})"
            return own
        # and so does another host's weak, undirected network evidence of its own connections (``rx``,
        # ``rtt``: no blackout's view) when the starved host's run queue vetoes it (``_runq_veto``): an
        # 800 ms burst on node-02 rank 4 across a step boundary, nobody late, x5.8, node-02's run queue 4.8x
        # the busiest other host's and 280 % of the loss, was node-01 / network at 2 spreads of ``rx`` (a
        # wrong ``step_stall`` by ``stall_k``; rank17, 2 ranks per host, 2026-12-06)
        view = ((summary.get("evidence") or {}).get("net_view") or {}).get(best[1])
        if (
            own is not None
            and own.get("starved")
            and best[3] < SPECIFIC_EVIDENCE
            and own["host"] != best[1]
            and not summary.get("net_directed")
            and view not in CLIPPED_NET_VIEWS
            and (vetoed := _runq_veto(summary, best[1], lost)) is not None
            and vetoed[0] == own["host"]
        ):
            own["why"] += (
                f"; {best[1]}'s connections looked lossy (network evidence {best[3]:g}), vetoed by this run queue"
            )
            return own
        # so does a rank that waited at its memory cgroup's limit, late by most of the stall
        if group.get(best[1], 0) >= EXPLAIN_REL * lost:
            mem = _memory_limited(summary, best[1], best[3])
            if mem is not None:
                mem["why"] += f"; its connections looked lossy too (network evidence {best[3]:g})"
                return mem
    if (
        best is not None
        and best[2] == "network"
        and any(c[1] != best[1] and c[2] == "network" and c[3] == best[3] for c in cands)
    ):
        # two hosts' links tie (the host name would break it): a loss on one host's link shows on its
        # peers' connections to it too, so a tie names neither (make demo, 8 % loss on node-01, x2.5:
        # node-00 and node-01 both 3.0 by rx, node-00 by its name; demo20). A persistent fault's charge
        # (``charge_persistent``) then names the host of the job's recent steps.
        return None
    if best is not None and best[2] == "memlimit":
        return _memory_limited(summary, best[1], best[3])
    if best is not None:
        _key, h, layer, z = best
        why = f"{layer} evidence {z:g} spreads of {spread / 1e6:.1f} ms"
        if strag and strag.get("host") == h:
            why += f"; straggler: {strag.get('reason', '')}"
        c = {"host": h, "layer": CULPRIT_LAYER.get(layer, layer), "evidence": z, "source": "evidence", "why": why}
        view = ((summary.get("evidence") or {}).get("net_view") or {}).get(h) if layer == "network" else None
        if view:  # which view of its connections gave the evidence (absent in an older worker's summary)
            c["net_view"] = view
        if layer == "sched":
            starved = _starved(summary, h, z, lost)
            c["starved"] = starved is not None
            if starved is not None:
                c["why"] += f"; starved: {starved}"
        elif layer == "network" and (z < SPECIFIC_EVIDENCE or view in CLIPPED_NET_VIEWS):
            veto = _runq_veto(summary, h, lost)
            c["runq_veto"] = veto is not None
            if veto is not None:
                c["why"] += f"; {veto[1]}"
        return c
    if strag and strag.get("excess_ns", 0) >= EXPLAIN_REL * lost:
        mine = [b for b in summary.get("blame") or [] if b.get("host") == strag["host"]]
        layer = mine[0]["layer"] if mine else "pytorch"
        if layer == "pytorch":
            mem = _memory_limited(summary, strag["host"], 0.0)
            if mem is not None:
                mem["source"] = "blame"
                mem["why"] = f"straggler: {strag.get('reason', '')}; " + mem["why"]
                return mem
        why = f"straggler: {strag.get('reason', '')}" + (
            f"; blamed {layer} +{mine[0]['excess_ns'] / 1e6:.1f} ms over its peers" if mine else "; no layer blamed"
        )
        c = {
            "host": strag["host"],
            "layer": CULPRIT_LAYER.get(layer, layer),
            "evidence": 0.0,
            "source": "blame",
            "why": why,
        }
        if layer == "sched" and lost:
            # a straggler blamed for its run queue is as starved as an evidence culprit when its run-queue
            # time stands far above every peer's (``_starved``, its excess in spreads as a ``layers``
            # culprit's): a slowed stretch before a CPU fault widened the job's spread so that the hog's steps
            # gave its host 1.4-1.9 spreads of sched evidence, under CULPRIT_MIN_EVIDENCE, and their culprit was
            # the blame, never judged starved (ci-flake22's cpu run: named nothing; docs/ANALYSIS.md)
            starved = _starved(summary, strag["host"], None, lost)
            if starved is not None:  # only then: a summary of an unstarved straggler is as before
                c["starved"] = True
                c["why"] += f"; starved: {starved}"
        return c
    return _layer_culprit(summary, lost) if lost else None


def _alike_starved(
    summary: dict, cands: list[tuple], alike: list[str], group: dict[str, int], lost: int
) -> dict | None:
    """``culprit``'s 1. for a step whose lateness-based candidates ``cands`` (``_candidates``) name the hosts
    ``alike`` (``_alike``, at least two) about alike: the one of them with sched evidence of at least
    ``STARVED_MIN_EVIDENCE`` whose lateness (its late-group entry in ``group``, ns, else ``z`` spreads)
    makes up ``EXPLAIN_REL`` of ``lost`` (ns over the job's median step) and that is ``_starved`` without
    the peer-evidence test (its run queue, or its busiest rank's against every other rank of the job, over
    its peers' median by ``STARVED_EXPLAIN_REL`` of ``lost`` and ``STARVED_PEER_FACTOR`` times the busiest
    peer's): a ``sched`` culprit, ``starved`` True, with ``rank`` its busiest rank (a host of several rank
    rows; else None). None when no alike host, or more than one, is so starved, or ``lost`` is 0.

    A burst rank's ring neighbours on other hosts wait for it inside the collective and arrive as late as
    its host's other rank, and on a loaded machine their run queues rise a little with it: newuser18's
    2-ranks-per-host cpu burst of rank 5 (x7.03, 799 ms lost) had node-02 at 7.0 spreads of sched and
    node-03 at 7.0 of lateness and 6.08 of sched (64 ms of run queue over its peers' median, both late by
    397 ms), while rank 5 waited 1,349 ms in its run queue, 13 times any other rank's. Two hosts starved at
    once each stand above the other ranks, so neither is ``STARVED_PEER_FACTOR`` times the other's: still
    nobody."""
    if lost <= 0:
        return None
    spread = (summary.get("evidence") or {}).get("spread_ns", 0)
    found = []
    ranks: dict[tuple[str, str], int] | None = None  # every rank's run-queue time, read once for all hosts
    for _key, h, layer, z in cands:
        if h not in alike or layer != "sched" or z < STARVED_MIN_EVIDENCE:
            continue
        if max(z * spread, group.get(h, 0)) < EXPLAIN_REL * lost:
            continue
        if ranks is None:
            ranks = _job_ranks(summary, "sched")
        why = _starved(summary, h, z, lost, peer_evidence=False, ranks=ranks)
        if why is not None:
            found.append((h, z, why))
    if len(found) != 1 or ranks is None:
        return None
    h, z, why = found[0]
    times = {r: t for (g, r), t in ranks.items() if g == h}
    others = ", ".join(a for a in alike if a != h)
    return {
        "host": h,
        "layer": "sched",
        "evidence": z,
        "source": "evidence",
        "starved": True,
        "rank": int(_busiest_rank(times)) if len(times) >= 2 else None,
        "why": f"sched evidence {z:g} spreads of {spread / 1e6:.1f} ms, {others} late alike; starved: {why}",
    }


def _starved(
    summary: dict,
    host: str,
    z: float | None,
    lost: int,
    peer_evidence: bool = True,
    ranks: dict[tuple[str, str], int] | None = None,
) -> str | None:
    """Whether ``host``, the step's sched culprit by evidence ``z`` (spreads; None for a culprit of ``source``
    "layers", which nobody's lateness named), was starved of CPU beyond a loaded machine's jitter: a short
    description when ``z`` is at least ``STARVED_MIN_EVIDENCE``, every other host's sched evidence at most
    ``STARVED_PEER_EVIDENCE_REL`` of ``z``, the host's run-queue time (``layers[host].sched.time_ns``) over
    its peers' median at least ``STARVED_EXPLAIN_REL`` of ``lost`` (ns the step lost over the job's median
    step; 0: no baseline, never starved) and at least ``STARVED_PEER_FACTOR`` times every other host's;
    None otherwise (also without a layer row of the host or any peer, e.g. a wide step's omitted rows).
    In a one-node job (one host, several rank rows) the ranks are the peers: the rank with the most
    run-queue time against the others' (``ranks[host][rank].layers.sched.time_ns``), as its straggler is.
    A host of several rank rows in a larger job that fails the host comparison gets a second one by the same
    ratios: its rank with the most run-queue time against every other rank of the job (not a wide step's).
    ``peer_evidence`` False (``_alike_starved``: hosts late alike) skips the test of the other hosts' sched
    evidence, leaving the run-queue times alone to tell. ``ranks``: the step's ``_job_ranks(summary, "sched")``
    when the caller read them already (``_alike_starved``, for each host late alike); None reads them here.

    A ``layers`` culprit (``z`` None) has no lateness, so its ``z`` is its run-queue time over its peers'
    median in units of the step's spread (``evidence.spread_ns``), what its evidence would be had it been
    late by all of it, and at least ``STARVED_MIN_EVIDENCE``: a burst inside a collective of 323 ms over
    its peers' median, 23 spreads of 14 ms, is not made ambiguous by a peer's 1.2 spreads (17 ms) of
    run-queue lateness (300 ms CPU bursts at load 3-5, 2026-12-06, docs/BENCHMARKS.md 8)."""
    layers = summary.get("layers") or {}
    if host not in layers or lost <= 0:
        return None
    times = _layer_times(layers, "sched")
    unit, who = host, ""
    node = _one_node_ranks(summary, "sched") if len(times) == 1 else None
    if node is not None and node[0] == host:
        # a one-node job: its ranks are each other's peers (the host has none, so a CPU burst on one of its
        # ranks was never starved; untuned14, 400 ms bursts on rank 2 of 4: x4.2-x4.3 at 8-20x its busiest
        # peer's run queue, left to stall_sched_k): the rank with the most run-queue time against the others
        times = node[1]
        unit = _busiest_rank(times)
        who = f"rank {unit}: "
    seen = _against_peers(times, unit)
    if seen is None:
        return None
    own, peers, med = seen
    med = _wide_median(summary, "sched", med)
    if z is None:
        spread = int((summary.get("evidence") or {}).get("spread_ns") or 0)
        z = max(STARVED_MIN_EVIDENCE, (own - med) / spread) if spread > 0 else STARVED_MIN_EVIDENCE
    if z < STARVED_MIN_EVIDENCE:
        return None
    hosts_ev = (summary.get("evidence") or {}).get("hosts") or {}
    if peer_evidence and any(
        (zs or {}).get("sched", 0.0) > STARVED_PEER_EVIDENCE_REL * z for h, zs in hosts_ev.items() if h != host
    ):
        return None
    if not _starves(own, peers, med, lost):
        if node is not None or summary.get("layers_omitted"):
            return None
        # a host of several ranks: its run queue is the sum of its ranks', so one rank's burst is never 3x
        # another host's 4-rank sum (untuned14, 4 ranks per host: every host waited >= 1.8 s a step); its
        # busiest rank against every other rank of the job, by the same ratios
        if ranks is None:
            ranks = _job_ranks(summary, "sched")
        mine = {r: t for (h, r), t in ranks.items() if h == host}
        if not mine or len(ranks) <= len(times):
            return None
        unit = _busiest_rank(mine)
        who = f"rank {unit}: "
        seen = _against_peers(ranks, (host, unit))
        if seen is None or not _starves(*seen, lost):
            return None
        own, peers, med = seen
    return who + (
        f"run-queue {own / 1e6:.0f} ms, +{(own - med) / 1e6:.0f} ms over its peers' median"
        f" ({(own - med) / lost:.0%} of the {lost / 1e6:.0f} ms lost), {own / max(peers[-1], 1_000_000):.1f}x the busiest peer's"
    )


def _runq_veto(summary: dict, host: str, lost: int) -> tuple[str, str] | None:
    """Whether a host other than ``host`` (a ``network`` culprit under ``SPECIFIC_EVIDENCE``, or of a
    ``CLIPPED_NET_VIEWS`` view) waited in its run queue far beyond its peers in a step that lost ``lost``
    ns over the job's median step: the vetoing host (the other host with the most run-queue time; ties:
    the greatest name) and a short description naming it, when its run-queue time (``layers[h].sched.time_ns``) is at least
    ``RUNQ_VETO_FACTOR`` times every other host's (``host``'s included; 1 ms at least) and over its peers'
    median by at least ``EXPLAIN_REL`` of ``lost``; None otherwise (also with ``lost`` 0 or fewer than two
    layer rows). A CPU burst that hits a rank inside a collective delays its ACKs, and its peers' sockets
    look lossy toward each other too: 2 spreads of directed network evidence on a peer (node-02 beside
    node-03's burst, x2.94, burst12 step 221) are the burst's, not that peer's link. The rules' weak
    network clause (``stall_weak_net``, docs/RULES.md) does not fire on a culprit so vetoed."""
    times = _layer_times(summary.get("layers") or {}, "sched")
    if lost <= 0 or len(times) < 2:
        return None
    top, top_host = max((int(t), h) for h, t in times.items() if h != host)
    rest = sorted(int(t) for h, t in times.items() if h != top_host)
    med = rest[(len(rest) - 1) // 2]
    med = _wide_median(summary, "sched", med)
    if top - med < EXPLAIN_REL * lost or top < RUNQ_VETO_FACTOR * max(rest[-1], 1_000_000):
        return _runq_group_veto(summary, host, lost, times)
    return top_host, (
        f"{top_host}'s run queue vetoes it: {top / 1e6:.0f} ms, +{(top - med) / 1e6:.0f} ms over its peers' median"
        f" ({(top - med) / lost:.0%} of the {lost / 1e6:.0f} ms lost), {top / max(rest[-1], 1_000_000):.1f}x the"
        " busiest other host's"
    )


def _runq_group_veto(summary: dict, host: str, lost: int, times: dict[str, int]) -> tuple[str, str] | None:
    """``_runq_veto``'s test for a few hosts at once, ``host`` among them: the hosts of the step's run-queue
    times (``times``, ns) sorted from the most, cut at the first gap where one host's time is at least
    ``RUNQ_VETO_FACTOR`` times the next one's (1 ms at least), form the top group when it holds ``host``, at
    most half of the hosts, and its least time is over the median of the others by at least ``EXPLAIN_REL``
    of ``lost`` ns. Then ``(the group's busiest host other than host, description)``, else None. A CPU
    fault on the machine that starves two hosts' ranks alike (one host's process hog, 2 ranks per host on 2
    cores: frame21-lightning-cpuproc step 316, node-02 and node-03 1,450 and 1,443 ms of run-queue time
    against 462-463 ms, x2.55) leaves the starved hosts answering late on every connection, and their
    peers' retransmits toward one of them named it (node-03 / network, 2.8 spreads of ``toward``: a wrong
    ``step_stall``); the single-host test saw the other starved host only 1.0x the culprit's."""
    order = sorted(times.items(), key=lambda kv: (-int(kv[1]), kv[0]))
    cut = next(
        (
            i + 1
            for i in range(len(order) - 1)
            if int(order[i][1]) >= RUNQ_VETO_FACTOR * max(int(order[i + 1][1]), 1_000_000)
        ),
        None,
    )
    if cut is None or cut > len(order) // 2:
        return None
    group = order[:cut]
    if host not in {h for h, _t in group} or len(group) < 2:
        return None
    rest = sorted(int(t) for _h, t in order[cut:])
    med = _wide_median(summary, "sched", rest[(len(rest) - 1) // 2])
    least = int(group[-1][1])
    if least - med < EXPLAIN_REL * lost:
        return None
    other = next(h for h, _t in group if h != host)
    names = " and ".join(h for h, _t in group)
    return other, (
        f"the run queues of {names} veto it: {least / 1e6:.0f} ms or more, +{(least - med) / 1e6:.0f} ms over the"
        f" others' median ({(least - med) / lost:.0%} of the {lost / 1e6:.0f} ms lost), a host starved of CPU"
        " answers late on every connection"
    )


def _memory_limited(summary: dict, host: str, z: float) -> dict | None:
    """A ``memory`` culprit for ``host``, a late rank (its lateness evidence ``z``, spreads; 0 for a
    straggler named by blame) whose memory cgroup hit its limit in the step: at least
    ``MEMLIMIT_MIN_RECORDS`` memory records (``layers[host].memory.count``) while every other host's row
    has at most ``AMBIGUOUS_REL`` of them; None otherwise. A charge the kernel cannot satisfy after its
    reclaim retries does not end in reclaim: with the cgroup's OOM killer disabled its task sleeps in the
    cgroup's OOM wait queue (cgroup v1), and above ``memory.high`` it is throttled (cgroup v2), until memory
    is freed or the limit raised. The memory probes see the retries (short reclaim stalls), not the wait,
    so the rank's lateness carries the stall while its memory time stays small: the records are the
    kernel's word that the wait was memory's. Same ``evidence`` as the lateness it replaces."""
    layers = summary.get("layers") or {}
    own = int(((layers.get(host) or {}).get("memory") or {}).get("count", 0))
    if own < MEMLIMIT_MIN_RECORDS:
        return None
    cells = getattr(layers, "cells", None)  # a wide step's LayerColumns: its memory column, no row built
    peers = (
        ((h, int(v[1])) for h, v in (cells.get("memory") or {}).items())
        if cells is not None
        else ((h, int(((row or {}).get("memory") or {}).get("count", 0))) for h, row in layers.items())
    )
    if any(n > AMBIGUOUS_REL * own for h, n in peers if h != host):
        return None
    mem = (layers[host] or {}).get("memory") or {}
    return {
        "host": host,
        "layer": "memory",
        "evidence": z,
        "source": "evidence",
        "why": f"late with {own} memory records (reclaim at its memory cgroup's limit, {int(mem.get('time_ns', 0)) / 1e6:.1f} ms"
        f" of reclaim) and none like it on its peers: it waited at the limit",
    }


def _memory_at_limit(summary: dict, lost: int) -> dict | None:
    """``source`` "memlimit": the host with the most memory records in a step that lost ``lost`` ns (> 0)
    over the job's median step, when ``_memory_limited`` holds for it (at least ``MEMLIMIT_MIN_RECORDS``
    records, every other host's row at most ``AMBIGUOUS_REL`` of them), with ``evidence`` 0; None otherwise.
    Read only when no per-step evidence named a culprit: a memory cgroup squeezed to its page cache
    (``obshub demo --fault stall --param layer=mem``, node-02, 2026-12-06) slowed its rank by 15-90 ms a
    step (x1.1-x1.7) for about 4 steps per 800 ms stall with 29-48 memory records a step and 2-18 ms of
    reclaim, none on its peers, while lateness, run-queue noise or nobody named those steps; clean training
    at its limit on one host alone does not happen in steady state (``MEMLIMIT_MIN_RECORDS``). The rule
    ``memory_stall_over_steps`` sums what such steps lost (docs/RULES.md "Single-step stall rules")."""
    layers = summary.get("layers") or {}
    cells = getattr(layers, "cells", None)  # a wide step's LayerColumns: read its memory column alone, as
    if cells is not None:  # iterating it would build every host's row (6.4 ms at 2,048 hosts a step)
        counts = sorted(((int(v[1]), h) for h, v in (cells.get("memory") or {}).items()), reverse=True)
    else:
        counts = sorted(
            ((int(((row or {}).get("memory") or {}).get("count", 0)), h) for h, row in layers.items()), reverse=True
        )
    if not counts or lost <= 0:
        return None
    mem = _memory_limited(summary, counts[0][1], 0.0)
    if mem is None:
        return None
    mem["source"] = "memlimit"
    mem["why"] = (
        f"{counts[0][0]} memory records (reclaim at its memory cgroup's limit,"
        f" {int(((layers[counts[0][1]] or {}).get('memory') or {}).get('time_ns', 0)) / 1e6:.1f} ms of reclaim) and none"
        f" like it on its peers, in a step that lost {lost / 1e6:.1f} ms"
    )
    return mem


def _stopped_culprit(summary: dict, lost: int) -> dict | None:
    """``source`` "stopped": the rank whose threads were stopped or traced (state T/t: SIGSTOP, a debugger)
    for the longest part of the step (``summary.stopped``, ns), layer ``process``, when that stop is at
    least ``STOPPED_MIN_NS`` and ``EXPLAIN_REL`` of what the step lost over the job's median step
    (``lost``, ns); None otherwise, or when two hosts were stopped about as long (``AMBIGUOUS_REL``: a job
    stopped whole, e.g. by its scheduler). First-class evidence measured in the kernel: a rank stopped
    while it waited inside a collective is late nowhere (its peers wait for it inside the same collective)
    and its peers' retransmits toward it look like its link, yet it stalled the job."""
    stops = sorted(
        ((int(v.get("ns") or 0), h, v.get("rank")) for h, v in (summary.get("stopped") or {}).items()), reverse=True
    )
    if not stops or stops[0][0] < max(STOPPED_MIN_NS, EXPLAIN_REL * lost):
        return None
    ns, h, rank = stops[0]
    if any(o[0] >= AMBIGUOUS_REL * ns for o in stops[1:]):
        return None
    who = f"rank {rank}" if rank is not None else "a rank"
    why = f"{who} stopped (SIGSTOP or traced) {ns / 1e6:.1f} ms in the step"
    if lost:
        why += f" ({min(1.0, ns / lost):.0%} of the {lost / 1e6:.1f} ms the step lost)"
    return {"host": h, "layer": "process", "rank": rank, "evidence": 0.0, "source": "stopped", "why": why}


def _layer_times(layers: Mapping, layer: str) -> dict[str, int]:
    """``{host: layers[host][layer].time_ns}`` (ns, 0 where a host lacks the layer) of a step's layer table
    ``layers``: a dict of rows, or a wide step's ``LayerColumns``, whose column is read without building a
    row (iterating its rows builds every host's: 65-75 ms at 2,048 hosts x 8 ranks for each reader of the
    sched and memory columns, ``_layer_culprit`` and ``_starved``, whenever a step lost time with no
    straggler)."""
    full = getattr(layers, "full", None)
    if full is not None:
        return dict(zip(layers, full(layer, 0)))
    return {h: ((row or {}).get(layer) or {}).get("time_ns", 0) for h, row in layers.items()}


def _one_node_ranks(summary: dict, layer: str) -> tuple[str, dict[str, int]] | None:
    """A one-node job's ranks as each other's peers: ``(host, {rank: ranks[host][rank].layers[layer].time_ns})``
    when the job has one host (``hosts`` and ``expected_hosts``: not a step of a larger job that only one host
    reached) with at least two rank rows (``ranks``); None otherwise."""
    hosts = sorted(set(summary.get("hosts") or ()) | set(summary.get("expected_hosts") or ()))
    if len(hosts) != 1:
        return None
    rows = (summary.get("ranks") or {}).get(hosts[0]) or {}
    if len(rows) < 2:
        return None
    return hosts[0], {
        str(r): int((((row or {}).get("layers") or {}).get(layer) or {}).get("time_ns", 0)) for r, row in rows.items()
    }


def _job_ranks(summary: dict, layer: str) -> dict[tuple[str, str], int]:
    """Every rank row's time in ``layer`` (ns): ``{(host, rank): ranks[host][rank].layers[layer].time_ns}``
    (0 without the layer; empty without rank rows, e.g. a job of one rank per host)."""
    return {
        (h, str(r)): int((((row or {}).get("layers") or {}).get(layer) or {}).get("time_ns", 0))
        for h, rows in (summary.get("ranks") or {}).items()
        for r, row in (rows or {}).items()
    }


def _wide_median(summary: dict, layer: str, med: int) -> int:
    """``med``, the peers' median time in ``layer`` (ns) read from the step's layer rows; a wide step
    (``layers_omitted``) keeps its outlier rows only, so its median is at most the job-wide one of its
    ``layer_stats`` (``layer_stats[layer].time_p50_ns``, ns; ``med`` where absent)."""
    if not summary.get("layers_omitted"):
        return med
    return min(med, int(((summary.get("layer_stats") or {}).get(layer) or {}).get("time_p50_ns", med)))


def _busiest_rank(times: dict[str, int]) -> str:
    """The rank of ``times`` (``{rank: ns}``, ranks as text) with the most time; the lowest rank of a tie."""
    return max(times, key=lambda r: (times[r], -int(r)))


def _against_peers(times: dict, unit) -> tuple[int, list[int], int] | None:
    """One unit (a host, a rank of a one-node job, a ``(host, rank)`` of the job) against its peers, the
    other keys of ``times`` (ns each): ``(its own ns, the peers' ns sorted, their lower median)``; 0 for a
    unit without a row; None without peers."""
    own = int(times.get(unit, 0))
    peers = sorted(int(t) for u, t in times.items() if u != unit)
    if not peers:
        return None
    return own, peers, peers[(len(peers) - 1) // 2]


def _starves(own: int, peers: list[int], med: int, lost: int) -> bool:
    """Whether run-queue time ``own`` (ns) explains a starved step against its peers' (``peers`` sorted,
    ``med`` their median): over ``med`` by at least ``STARVED_EXPLAIN_REL`` of ``lost`` (ns the step lost
    over the job's median step) and at least ``STARVED_PEER_FACTOR`` times the busiest peer's (1 ms at
    least)."""
    return own - med >= STARVED_EXPLAIN_REL * lost and own >= STARVED_PEER_FACTOR * max(peers[-1], 1_000_000)


def _layer_culprit(summary: dict, lost: int, min_rel: float = EXPLAIN_REL) -> dict | None:
    """``source`` "layers": the host whose own time in one of ``LAYER_CULPRIT`` (sched, memory) exceeds
    the median of its peers by the most, at least ``EXPLAIN_REL`` of what the step lost over the job's
    median step (``lost``, ns), and at least ``min_rel`` of it (``NET_OWN_LAYER_REL`` where it would take a
    ``network`` best's place); None otherwise. A burst that hit a host while its rank waited inside a
    collective (its sends starved) slows every rank alike: nobody arrives late, so neither lateness
    evidence nor a straggler names it, but the host's run-queue or reclaim time does."""
    layers = summary.get("layers") or {}
    found: list[tuple] = []
    node = None
    for layer in LAYER_CULPRIT:
        times = _layer_times(layers, layer)
        if len(times) == 1 and layer == "sched":
            # a one-node job: its ranks are the peers (a burst on one rank inside a collective, nobody late:
            # x4.54, untuned14); sched only, its memory is the node's cgroup
            node = _one_node_ranks(summary, layer)
            times = node[1] if node is not None else times
        if len(times) < 2:
            continue
        ordered = sorted(times.values())  # one sort: each host's peers are these less one of its value
        k = (len(ordered) - 2) // 2  # the peers' lower median: index (peers - 1) // 2 among n - 1 peers
        for h, t in times.items():
            ref = ordered[k] if k < bisect.bisect_left(ordered, t) else ordered[k + 1]
            ref = _wide_median(summary, layer, ref)
            ex = t - ref
            if ex >= EXPLAIN_REL * lost and ex > 0:
                found.append((ex, h, layer, ref))
    found.sort(reverse=True)
    if not found or any(f[1] != found[0][1] and f[0] >= AMBIGUOUS_REL * found[0][0] for f in found[1:]):
        return None
    ex, h, layer, ref = found[0]
    if ex < min_rel * lost:
        return None
    host, who = (node[0], f"rank {h}'s") if node is not None else (h, "its")
    c = {
        "host": host,
        "layer": layer,
        "evidence": 0.0,
        "source": "layers",
        "why": f"no straggler; {who} {layer} time {(ex + ref) / 1e6:.1f} ms, +{ex / 1e6:.1f} ms over its peers' median"
        f" ({ex / lost:.0%} of the {lost / 1e6:.1f} ms the step lost)",
    }
    if layer == "sched":
        starved = _starved(summary, host, None, lost)
        c["starved"] = starved is not None
        if starved is not None:
            c["why"] += "; starved: far above every peer's"
    return c


def persistent_key(c: dict | None) -> tuple[str, str] | None:
    """What a closed step's own culprit ``c`` (``culprit``) counts for ``persistent_culprit``: ``(host,
    layer)`` when per-step evidence named a layer below the framework (not ``process``: lateness is what a
    victim of another host's fault shows too), or a ``starved`` sched culprit of ``source`` "layers" named
    it (its run-queue time far above every peer's, see ``_starved``; not ``starved_rank``: one rank's burst
    against its own steps on a loaded host, whose host stands out from its peers' by no far margin), else None."""
    if c and c.get("source") == "evidence" and c.get("layer") != "process":
        return (c["host"], c["layer"])
    if (
        c
        and c.get("source") == "layers"
        and c.get("layer") == "sched"
        and c.get("starved")
        and not c.get("starved_rank")
    ):
        return (c["host"], "sched")  # run-queue waits far above every peer's: the kernel's word, not lateness
    return None


def persistent_culprit(recent) -> tuple[str, str, int] | None:
    """``(host, layer, count)`` of a persistent fault from ``recent``, the ``persistent_key`` of the job's
    last ``PERSIST_STEPS`` closed steps (None entries for steps without one): the key seen at least
    ``PERSIST_MIN`` times (the most often seen; on a tie the latest), else None."""
    keys = [k for k in list(recent)[-PERSIST_STEPS:] if k is not None]
    counts: dict[tuple[str, str], int] = {}
    for k in keys:
        counts[tuple(k)] = counts.get(tuple(k), 0) + 1
    if not counts:
        return None
    last = {tuple(k): i for i, k in enumerate(keys)}
    (h, layer), n = max(counts.items(), key=lambda kv: (kv[1], last[kv[0]]))
    return (h, layer, n) if n >= PERSIST_MIN else None


def charge_persistent(summary: dict, recent) -> tuple[dict | None, tuple[str, str] | None]:
    """The culprit of a closed step given the job's recent culprits, and what the step adds to them:
    ``(culprit, key)``. ``recent``: the ``key`` of the job's previous closed steps (oldest first; the last
    ``PERSIST_STEPS`` are read), which the caller appends ``key`` to.

    With a persistent fault (``persistent_culprit`` of ``recent``), a step whose own culprit
    (``summary["culprit"]``) is None, the straggler's blame, a layer table without evidence, or lateness
    no layer explains (``process``) is charged to it (``source`` "persistent"): a fault that slows every
    step makes its victims wait and arrive late. Per-step evidence of a layer below the framework, and a
    hang, a stopped rank (``source`` "stopped") or a memory cgroup at its limit ("memlimit") keep their own culprit. A step whose own culprit is
    lateness (``process``, from evidence or blame) of a host whose network was the own culprit of one of
    the job's last ``PERSIST_STEPS`` steps is charged to that host's network at once; one of a host whose
    own ``sched`` was the key of one of the last ``STARVED_NEXT_STEPS`` steps to its sched at once (a CPU
    burst across a step boundary). ``key``: the step's own ``persistent_key``; a step charged to the
    persistent fault keeps it alive only while it is slowed (its longest host step time at least
    ``PERSIST_SLOW`` times the baseline median): once the fault is gone, steps are fast again and it
    fades within ``PERSIST_STEPS`` steps."""
    c = summary.get("culprit")
    key = persistent_key(c)
    persistent = persistent_culprit(recent)
    if (
        persistent is None
        and c is not None
        and c.get("layer") == "process"
        and c.get("source") in ("evidence", "blame")
    ):
        # lateness of a host whose own link was a recent step's culprit: a loss's retransmission back-off
        # (a lossy link's first x12 step had its host late by 629 ms and its retransmits outside the step,
        # one step after the link was named) is its link's, not its process's (PERSIST_MIN does not wait)
        own = sum(1 for k in list(recent)[-PERSIST_STEPS:] if k is not None and tuple(k) == (c["host"], "network"))
        if own:
            persistent = (c["host"], "network", own)
        elif any(k is not None and tuple(k) == (c["host"], "sched") for k in list(recent)[-STARVED_NEXT_STEPS:]):
            # lateness of a host starved in the step before: a CPU burst that spans a step boundary keeps
            # the starved rank in its old step while its peers wait for it in the next one, where its
            # run-queue waits (counted when its threads come back on a CPU) are not (stall7, node-01)
            persistent = (c["host"], "sched", 1)
        elif (carried := carried_stall(summary, recent)) is not None:
            return carried, key
    if persistent is None and c is None and slowed(summary):
        # a slowed step naming nobody right after a step that named a host's link: a loss's retransmission
        # back-off spans the step boundary, and its retransmits stayed in the step before (persistent 8 %
        # loss of node-03, stall9: the episode's second step, x6.2, had no straggler and no directed view,
        # and fired step_stall_unexplained one step after node-03 / network was named)
        nets = [k for k in list(recent)[-STARVED_NEXT_STEPS:] if k is not None and k[1] == "network"]
        if nets:
            persistent = (nets[-1][0], "network", 1)
    if persistent is None or (
        c is not None and (c.get("source") in ("hang", "stopped", "memlimit", "burst") or key is not None)
    ):
        return c, key
    h, layer, n = persistent
    bl = summary.get("baseline") or {}
    keeps = bl.get("n", 0) > 0 and int(summary.get("step_time_max_ns") or 0) >= PERSIST_SLOW * int(
        bl.get("median_ns") or 0
    )
    own = f"its own: {c['host']} / {c['layer']} ({c['why']})" if c else "no culprit of its own"
    strag = summary.get("straggler") or {}
    charged = {
        "host": h,
        "layer": layer,
        # the rank as the step's own culprit names it (summary.culprit_rank): the straggler's, on its host
        "rank": strag.get("rank") if layer != "network" and strag.get("host") == h else None,
        "evidence": 0.0,
        "source": "persistent",
        "why": (
            f"{h} / {layer} was the culprit of {n} of the job's last {PERSIST_STEPS} steps (a persistent fault); {own}"
            if n >= PERSIST_MIN or (layer == "network" and c is not None)
            else f"{h} / network was the culprit of one of the job's last {STARVED_NEXT_STEPS} steps, and this slowed step names nobody; {own}"
            if layer == "network"
            else f"{h} was starved of CPU in one of the job's last {STARVED_NEXT_STEPS} steps and is late in this one; {own}"
        ),
    }
    return charged, ((h, layer) if keeps else None)


def carried_stall(summary: dict, recent) -> dict | None:
    """The culprit of a slowed step whose own culprit is lateness (``process``, ``source`` "evidence" or
    "blame") of ranks that carried a stall of the step before: ``{host, layer, rank, evidence, source
    "persistent", why}`` naming that step's culprit (evidence 0), or None.

    ``recent``: as ``charge_persistent``'s (the ``persistent_key`` of the job's previous closed steps,
    oldest first). A framework whose loop opens each step with a collective (PyTorch Lightning broadcasts
    a SIGTERM check from rank 0 at every batch's start; a barrier, a metric sync) splits one stall across
    two steps by rank: the ranks the stall held stay in the old step, while their peers, done with it,
    wait for them at the new step's first collective, where the held ranks arrive late together with
    nothing of their own to show for it (live, a 800 ms blackout of node-01 under Lightning, frame21:
    step 483 held node-00 and node-01 976 ms and was named node-01 / network by its drops; step 484,
    x6.0, had node-01 +419 ms and node-00 +418 ms late at its broadcast and named the broadcast's root
    node-00 rank 0 / process by 7 spreads of lateness). When the step's late group (``straggler.group``,
    the straggler alone without one) holds the host of the key of one of the job's last
    ``STARVED_NEXT_STEPS`` steps, late by at least ``EXPLAIN_REL`` of what the step lost over the
    baseline median (a bystander 23 ms late in a step that lost 240 ms carries nothing: accum, frame22,
    step 544), and the step's own culprit's host is in that group too, the step is
    charged to that key's host and layer (the latest such key): the late ranks carry that stall. The
    charge keeps no persistent fault alive (``charge_persistent`` returns the step's own key)."""
    c = summary.get("culprit")
    if c is None or c.get("layer") != "process" or c.get("source") not in ("evidence", "blame"):
        return None
    if not slowed(summary):
        return None
    strag = summary.get("straggler") or {}
    late = {g.get("host"): int(g.get("late_ns") or 0) for g in strag.get("group") or []}
    if not late and strag.get("host") is not None:
        late = {strag["host"]: int(strag.get("excess_ns") or 0)}
    if c.get("host") not in late:
        return None
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0))
    # the carrier is late by a part of the loss too: a bystander a few ms late in the group carries nothing
    group = {h for h, ns in late.items() if ns >= EXPLAIN_REL * lost}
    keys = [tuple(k) for k in list(recent)[-STARVED_NEXT_STEPS:] if k is not None and tuple(k)[0] in group]
    if not keys:
        return None
    h, layer = keys[-1]
    carriers = ", ".join(sorted(str(g) for g in group))
    return {
        "host": h,
        "layer": layer,
        # the rank as the step's own culprit names it (summary.culprit_rank): the straggler's, on its host
        "rank": strag.get("rank") if layer != "network" and strag.get("host") == h else None,
        "evidence": 0.0,
        "source": "persistent",  # a victim charged to its cause, as a persistent fault's (core.schema)
        "why": (
            f"{h} / {layer} was the culprit of one of the job's last {STARVED_NEXT_STEPS} steps and this step's late "
            f"ranks ({carriers}) carry that stall into it; its own: {c['host']} / {c['layer']} ({c['why']})"
        ),
    }


def slowed(summary: dict) -> bool:
    """Whether a closed step lost time enough for a culprit charged from outside its own summary
    (``charge_running``): its ``stall`` flag (longer than the baseline's p99), or its longest host step at
    least ``PERSIST_SLOW`` times the baseline median (with a baseline). The flag alone misses the second
    slowed step of a fault: the first one, in the baseline now, raised its p99 (a persistent 100 ms delay
    of node-00's link, 2026-12-05: step 646 took 3,214 ms, step 647 3,173 ms, x14.5, was no ``stall``,
    closed naming nobody though its running record named node-00 / network, and fired
    ``step_stall_unexplained``)."""
    if summary.get("stall"):
        return True
    bl = summary.get("baseline") or {}
    return bool(bl.get("n")) and int(summary.get("step_time_max_ns") or 0) >= PERSIST_SLOW * int(
        bl.get("median_ns") or 0
    )


def running_applies(summary: dict, named: dict) -> bool:
    """Whether a closed step is charged to the network culprit ``named`` by its latest ``running`` record
    (``charge_running``): the step is ``slowed`` and its own culprit (``summary["culprit"]``) is None, or
    is lateness (``process``, ``source`` "evidence" or "blame") of the very host ``named`` names. While the
    step ran, every busy connection of that host was slow or lossy; its lateness at the close is then its
    link's, not its process's (persistent 8 % loss of node-03, 2026-12-05: the episode's first slowed step,
    x7.8, had node-03 late by 877 ms with no retransmit of its own left in the closed step, was named
    ``process`` and fired ``step_stall`` node-03 / process, while its running record 0.13 s earlier named
    node-03 / network)."""
    if not slowed(summary):
        return False
    c = summary.get("culprit")
    if c is None:
        return True
    return (
        c.get("layer") == "process" and c.get("source") in ("evidence", "blame") and c.get("host") == named.get("host")
    )


AMBIGUOUS_HOLD_STEPS = 2
"""``hold_ambiguous``: how many of the job's later closed steps may explain a slowed step that named nobody
because two or more hosts stood out alike, before it is reported unexplained."""


def hold_ambiguous(summary: dict, held: dict | None) -> dict | None:
    """Hold a slowed step that names nobody because several hosts stood out alike until a later step says
    whose it was (docs/ANALYSIS.md "Culprit of a step"); returns the job's new held record (None: nothing
    held). ``summary``: a closed step, its culprit final (after every charge); ``held``: what the job held
    after its previous closed step (None, or ``{step, hosts, stall_ratio, step_time_max_ns, median_ns,
    baseline_n, after}``: ns, ``after`` the later steps seen). Changes ``summary`` in place:

    - a held step is **explained**, and dropped, when this step is slowed too (``slowed``) and its
      culprit names one of its hosts by a layer of its own (not ``process`` lateness, unless the kernel
      saw the rank stopped or a hang named it): the first slowed step of a slowed link had the link's host
      and its neighbour late alike (7.0 and 6.5 spreads, node-03's net-slow of stall10), and its next
      steps named the link. A step that is not slowed explains nothing, whatever its culprit: a fast
      step's own noise (run-queue time of a loaded host, x1.11) named one of the alike hosts two steps
      after a x7.03 cpu burst of 2 ranks per host (newuser18) and hid the stall;
    - it is **unexplained** when this step is not slowed (the stall is over and named nobody) or is the
      ``AMBIGUOUS_HOLD_STEPS``-th after it: this summary then carries ``unexplained_before`` (the held
      record; the rule ``step_stall_ambiguous`` fires on it, so a true stall of two hosts at once is
      reported one or two steps late, not hidden);
    - this step, when slowed with no culprit and ``ambiguous`` hosts (at least two), gets ``ambiguous``
      (those hosts; ``step_stall_unexplained`` does not fire on it) and is held; a step held before it
      and not yet resolved is reported unexplained on this summary, unless they share a host (one episode:
      the held step waits on)."""
    c = summary.get("culprit")
    if held is not None:
        hosts = set(held["hosts"])
        own = c is not None and (c.get("layer") != "process" or c.get("source") in ("stopped", "hang"))
        if own and c is not None and c.get("host") in hosts and slowed(summary):
            held = None
        elif not slowed(summary) or held["after"] + 1 >= AMBIGUOUS_HOLD_STEPS:
            summary["unexplained_before"] = held
            held = None
        else:
            held = {**held, "after": held["after"] + 1}
    if c is not None or not slowed(summary):
        return held
    alike = ambiguous(summary)
    if len(alike) < 2:
        return held
    summary["ambiguous"] = alike
    if held is not None:
        if set(alike) & set(held["hosts"]):
            return held  # the same hosts alike again: one episode, still waiting for a step to name one
        summary["unexplained_before"] = held
    bl = summary.get("baseline") or {}
    return {
        "step": summary.get("step"),
        "hosts": alike,
        "stall_ratio": summary.get("stall_ratio") or 0.0,
        "step_time_max_ns": int(summary.get("step_time_max_ns") or 0),
        "median_ns": int(bl.get("median_ns") or 0),
        "baseline_n": int(bl.get("n") or 0),
        "after": 0,
    }


MEMORY_QUIET_STEPS = 16
"""``memory_episode``: how many of the job's closed steps just before a host's memory charge must hold none of
it for that charge to start an episode (an onset); the job's state must have seen that many closed steps."""

MEMORY_GAP_STEPS = 2
"""``memory_episode``: how many consecutive closed steps neither charged to its host's memory nor with that
host at its memory cgroup's limit an episode goes on through (a step of the squeeze whose reclaim records
fell under ``MEMLIMIT_MIN_RECORDS``, or that a peer's lateness took)."""


def _memory_times(summary: dict, host: str) -> tuple[int, int]:
    """``(host's, busiest other host's)`` memory time in the step (``layers[h]["memory"]["time_ns"]``:
    reclaim and compaction stalls, ns; 0 for a host without a memory row)."""
    rows = (summary.get("layers") or {}).items()
    times = {h: int(((row or {}).get("memory") or {}).get("time_ns") or 0) for h, row in rows}
    return times.get(host, 0), max((t for h, t in times.items() if h != host), default=0)


def memory_episode(summary: dict, state: dict | None) -> dict:
    """Follow a memory stall that slows several steps a little each, as an **episode** with an onset
    (docs/ANALYSIS.md "A memory episode"); returns the job's new state. ``summary``: a closed step, its
    culprit final (after every charge); ``state``: what this returned after the job's previous closed step
    (None at first: ``{seen, last, open}``, ``seen`` the closed steps seen, ``last`` host -> index of its
    latest memory charge, ``open`` the episode in progress or None).

    A step whose culprit's layer is ``memory`` (``memlimit``: its memory cgroup at its limit; or reclaim
    evidence) **starts** an episode of its host when none of the ``MEMORY_QUIET_STEPS`` closed steps just
    before it charged that host's memory (and the state saw that many): an onset. Each later step charged
    to the same host's memory **continues** it, and so does a step charged to no host's memory in which
    the episode's host is still at its memory cgroup's limit (``_memory_limited``: at least
    ``MEMLIMIT_MIN_RECORDS`` memory records, every peer's row at most ``AMBIGUOUS_REL`` of them): the
    squeeze is still on, but the step lost nothing over the median or a peer's lateness took it (it adds
    its host's and peers' memory time, not its loss). At most ``MEMORY_GAP_STEPS`` closed steps in a row
    that are neither may come between (they add nothing); a longer gap, or another host's memory charge,
    ends it. A host charged on (nearly) every step, a job at its memory limit all the time, never has an
    onset. Each step of an episode gets ``memory_episode`` (``{host, rank, first_step, steps, lost_ns,
    reclaim_ns, peer_reclaim_ns}``: its steps so far, charged or at the limit, this one included; what its
    charged steps lost over the baseline median, ns, each step's loss taken as at least 0; the host's own
    memory time in its steps (its rows' ``layers[host]["memory"]["time_ns"]``: reclaim at its cgroup's
    limit, ns) and the busiest other host's in each of them, summed, ns), which the rule
    ``memory_stall_episode`` compares with its floors; absent on every other step. Changes ``summary`` in
    place."""
    st = state or {"seen": 0, "last": {}, "open": None}
    seen, last, ep = int(st["seen"]), dict(st["last"]), st["open"]
    c = summary.get("culprit")
    host = c.get("host") if c is not None and c.get("layer") == "memory" else None
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0))
    # a step charged to no host's memory with the episode's host still at its limit: the squeeze goes on
    limited = ep is not None and host is None and _memory_limited(summary, ep["host"], 0.0) is not None
    if limited:
        lost = 0  # the step lost nothing, or a peer's lateness took it: not the memory's
    whose = ep["host"] if limited else host
    own, peer = _memory_times(summary, whose) if whose is not None else (0, 0)
    if ep is not None and (host == ep["host"] or limited):
        ep = {
            **ep,
            "steps": ep["steps"] + 1,
            "lost_ns": ep["lost_ns"] + lost,
            "reclaim_ns": ep["reclaim_ns"] + own,
            "peer_reclaim_ns": ep["peer_reclaim_ns"] + peer,
            "gap": 0,
        }
    elif ep is not None and host is None and ep["gap"] < MEMORY_GAP_STEPS:
        ep = {**ep, "gap": ep["gap"] + 1}
    elif (
        host is not None
        and seen >= MEMORY_QUIET_STEPS
        and seen - last.get(host, -1 - MEMORY_QUIET_STEPS) > MEMORY_QUIET_STEPS
    ):
        rank = c.get("rank") if c is not None else None
        ep = {
            "host": host,
            "rank": rank,
            "first_step": summary.get("step"),
            "steps": 1,
            "lost_ns": lost,
            "reclaim_ns": own,
            "peer_reclaim_ns": peer,
            "gap": 0,
        }
    else:
        ep = None
    if host is not None:
        last[host] = seen
    if ep is not None and ep["gap"] == 0:
        summary["memory_episode"] = {k: v for k, v in ep.items() if k != "gap"}
    return {"seen": seen + 1, "last": last, "open": ep}


def charge_running(named: dict, own: dict | None = None) -> dict:
    """The culprit of a stalled step charged to the network culprit ``named`` by the step's latest
    ``running`` record (``source`` "running", ``running_applies``): while the step ran, every busy
    connection of that host was slow or lossy against the other hosts' (docs/ANALYSIS.md "Inside a running
    step"). ``own``: the step's own culprit it replaces (None: the closed step named none; else its host's
    lateness), said in ``why``. Keeps ``named``'s host, rank and evidence (spreads)."""
    tail = (
        f"its own: {own['host']} / {own['layer']} ({own.get('why', '')})"
        if own
        else "the closed step names no culprit of its own"
    )
    return {
        "host": named["host"],
        "layer": "network",
        "rank": named.get("rank"),
        "evidence": float(named.get("evidence") or 0.0),
        "source": "running",
        "why": f"named while the step ran: {named.get('why', '')}; {tail}",
    }


RUNNING_PEER_VIEWS = frozenset({"toward", "rx", "rtt", ""})
"""The views of a host's connections (``schema.NET_VIEWS``) that a host late at its own work gives as a
blackout does, read while its step runs (``running_own_work``): its peers' retransmits toward it, its
connections' retransmits or RTT. A host starved of CPU answers late on every connection (its ACKs come
late, so its peers back off toward it), and its run-queue time is recorded only once its threads get back
on a CPU, after the running record. Its own dropped segments (``drops``), a window of lossy steps
(``window``) and its own egress queue (``sender_queue``) are the link's own evidence."""


def running_own_work(host: str, view: str, counts: Mapping[str, tuple[int, int]]) -> bool:
    """Whether the network evidence a ``running`` record has for ``host`` may be the host's own lateness
    (docs/ANALYSIS.md "Inside a running step"): its evidence came from a view a late host gives too
    (``RUNNING_PEER_VIEWS``), and the host is behind its peers at its own work: it ended fewer phases and
    ops of the step per rank than a peer did (``counts``: host -> ``(its pytorch layer's event count in the
    step so far, its ranks)``). A host held up by its link is inside the collective its peers wait in,
    done with the work before it (each of the 68 running records of 2026-12-07's kept runs that named a
    network fault's host had as many phases per rank as its busiest peer); a host held up by its CPU is
    still at that work (an 800 ms CPU burst of node-01, frame22-accum-2 step 505: 8 phases against its
    peers' 10, named node-01 / network by its peers' retransmits toward it 0.1 s before its close named
    node-01 / sched). False when ``host`` has no count."""
    if view not in RUNNING_PEER_VIEWS or host not in counts:
        return False
    mine, n = counts[host]
    return any(c * n > mine * k for h, (c, k) in counts.items() if h != host)


def running_counts(summary: dict) -> dict[str, tuple[int, int]]:
    """``running_own_work``'s counts from a step summary: per host its pytorch layer event ``count``
    (``summary["layers"]``) and its ranks (its rows in ``summary["ranks"]``, 1 without); ``{}`` (nothing
    judged) when the layer table was trimmed (``layers_omitted``: a wide step)."""
    if summary.get("layers_omitted"):
        return {}
    ranks = summary.get("ranks") or {}
    out = {}
    for h, row in (summary.get("layers") or {}).items():
        out[h] = (int(((row or {}).get("pytorch") or {}).get("count") or 0), max(1, len(ranks.get(h) or ())))
    return out


def running_rejudge(summary: dict) -> dict | None:
    """A ``running`` record as the worker sends it since ``running_own_work`` (``bench.stall_replay`` reads
    kept ones through it): the record without the hosts whose network evidence may be their own lateness,
    its culprit recomputed by ``culprit`` over the hosts left (the rank left as it was: a host's link), or
    None when no host is left (the worker sends no record then). Any other record is returned as it is."""
    if summary.get("closed_by") != "running":
        return summary
    ev = summary.get("evidence") or {}
    hosts = ev.get("hosts") or {}
    views = ev.get("net_view") or {}
    counts = running_counts(summary)
    drop = {h for h in hosts if running_own_work(h, views.get(h, ""), counts)}
    if not drop:
        return summary
    left = {h: v for h, v in hosts.items() if h not in drop}
    if not left:
        return None
    out = dict(summary)
    out["evidence"] = {**ev, "hosts": left}
    if "net_view" in ev:
        out["evidence"]["net_view"] = {h: v for h, v in views.items() if h not in drop}
    out["blame"] = [b for b in summary.get("blame") or [] if b.get("host") not in drop]
    c = culprit(out)
    if c is not None:
        c["rank"] = None
    out["culprit"] = c
    return out


def hang_culprit(hosts: list[dict]) -> dict | None:
    """The culprit of a closed step that hung (``source`` "hang"), from the ``hosts`` of its latest hang
    record (``hang.hosts``: ``{host, state, last_phase, ...}``): the first named host, layer ``network``
    when it was ``unreachable`` (its peers retransmitted toward it), else ``process`` (silent, frozen,
    stopped or exited), as the hang rules name them; None without hosts."""
    if not hosts:
        return None
    h = hosts[0]
    state = h.get("state", "silent")
    return {
        "host": h["host"],
        "layer": "network" if state == "unreachable" else "process",
        "evidence": 0.0,
        "source": "hang",
        "why": f"the step hung on it ({state}; {h.get('last_phase', '?')})"
        + (f"; {len(hosts) - 1} more rank(s) named" if len(hosts) > 1 else ""),
    }


def sched_times(summary: dict) -> dict[str, int]:
    """``{host: run-queue time (ns)}`` of a step summary: ``layers[host].sched.time_ns`` of every host with
    a layer row (a wide step's omitted hosts have none), 0 for a row without sched. What
    ``charge_starved`` keeps per closed step."""
    return {
        h: int(((row or {}).get("sched") or {}).get("time_ns", 0)) for h, row in (summary.get("layers") or {}).items()
    }


def charge_starved(summary: dict, recent) -> dict:
    """Mark the step's ``sched`` culprit ``starved`` against its own recent steps; returns what the step
    adds to ``recent``: ``sched_times`` and, for a job of more rank rows than hosts (not a wide step), every
    rank row's run-queue time (``{(host, rank): ns}``; a job of one rank per host keeps its hosts' alone).
    ``recent``: those of the job's previous closed steps (oldest first; the last ``SELF_STEPS`` are read),
    which the caller appends the return value to.

    ``_starved`` compares the culprit host's run-queue time with its peers' in the same step. On a loaded
    machine of few cores a burst on one host takes CPU from every host, so its peers' run-queue times rise
    too and the burst host may stand at 1.7-2.4 times its busiest peer (300 ms bursts of node-02 at load 8,
    2026-12-05, docs/BENCHMARKS.md 8), under ``STARVED_PEER_FACTOR``. What tells a burst on one host from
    load is how much each host's run-queue time **rose over its own recent steps**: a sched culprit of
    ``source`` "evidence" or "layers" that is not ``starved`` becomes ``starved`` (``why`` adds "starved
    against its own recent steps") when (``_starved_self``) its evidence is at least
    ``STARVED_MIN_EVIDENCE`` (``layers``: taken as that), every other host's sched evidence at most
    ``STARVED_PEER_EVIDENCE_REL`` of it, and its rise over the median of its own last ``SELF_STEPS`` steps
    (at least ``SELF_MIN`` of them) exceeds the largest rise of any peer (over its own median; 0 when none
    rose) by at least ``STARVED_EXPLAIN_REL`` of what the step lost over the job's median step. A host of
    several ranks (a job with more rank rows than hosts, not a wide step) that fails this gets its most-risen
    rank compared with every other rank of the job the same way, at ``SELF_RANK_FACTOR``: the culprit then
    also carries ``rank`` (that rank) and ``starved_rank`` True (the rules' ``stall_starved_rank``). Peers
    without ``SELF_MIN`` steps of their own are not compared; without a baseline nothing changes. Changes
    ``summary["culprit"]`` in place (a new dict); run it before ``charge_persistent`` (a ``starved`` culprit
    of ``source`` "layers" is a persistent key).

    After that, the burst test (``_burst``): a unit (a rank in a job of more rank rows than hosts, else a
    host) whose run-queue time rose over its own recent steps far beyond every other unit's rise becomes
    the culprit, ``burst`` True, whatever the step's own culprit was (unless that is specific evidence of
    another kind); a sched culprit of its host keeps what the tests above gave it."""
    part: dict = sched_times(summary)
    ranks = {} if summary.get("layers_omitted") else _job_ranks(summary, "sched")  # a wide step: outliers' only
    if len(ranks) > len(part):  # a job of one rank per host: its rank rows repeat its hosts'
        part.update(ranks)
    _self_starved(summary, recent, part)
    burst = _burst(summary, list(recent)[-SELF_STEPS:], part)
    if burst is not None:
        summary["culprit"] = burst
    else:
        _crowded(summary, list(recent)[-SELF_STEPS:], part)
    _crowded_ranks(summary, list(recent)[-SELF_STEPS:], part)
    _crowded_turn(summary, list(recent)[-SELF_STEPS:], part)
    _loaded_net(summary, list(recent)[-SELF_STEPS:], part)  # a whole machine starved: no link's evidence
    part[STEP_KEY] = int(summary.get("step_time_max_ns") or 0)
    c = summary.get("culprit")
    part[STARVED_KEY] = c["host"] if c and c.get("layer") == "sched" and c.get("starved") else None
    return part


def _loaded_net(summary: dict, recent: list[dict], part: dict) -> None:
    """``charge_starved``'s test of a ``network`` culprit of the step's own evidence (``source`` "evidence")
    against the machine's run queues, with ``recent`` (the job's last ``SELF_STEPS`` parts) and ``part``
    (this step's: ``{host: run-queue ns}``, rank rows besides): when every host of the step (at least two,
    each with ``SELF_MIN`` recent steps of its own; not a wide step's, whose omitted hosts have no row) rose
    over its own recent median by at least ``LOADED_RISE_REL`` of what the step lost over the job's median
    step (ns, > 0), ``summary["culprit"]`` becomes a copy with ``runq_veto`` True and ``why`` saying so: the
    rules' ``stall_net_vetoed`` then pages it through no path below ``stall_sched_k`` (docs/RULES.md).

    A CPU-starved machine delays every rank's receive path alike, so one host's connections look slow or
    lossy by chance (make demo at load 4+, lead23 step 43: node-03 / network at 2 spreads of ``rx``,
    directed, x2.58, while node-00..03 waited 811-956 ms in their run queues, 672-851 ms over their own
    recent steps, and the step lost 370); a blackout or a loss burst leaves the ranks sleeping on their sockets,
    whose run queues stay near their own steps (the real fault's steps of that run: 50-270 ms). Unlike
    ``_runq_veto`` (one host's run queue far above the others') no host is named by this: the step's own
    culprit stays, vetoed. Without a baseline, a step that lost nothing, or ``SELF_MIN`` steps of every host,
    nothing changes."""
    c = summary.get("culprit")
    if not c or c.get("layer") != "network" or c.get("source") != "evidence" or c.get("runq_veto"):
        return
    if summary.get("layers_omitted"):
        return  # a wide step: its omitted hosts have no run-queue row, so "every host" cannot be read
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    hosts = [h for h in part if isinstance(h, str)]
    if lost <= 0 or len(hosts) < 2:
        return
    need = LOADED_RISE_REL * lost
    least = None
    for h in hosts:
        # a rise over a median of run-queue times (never negative) is at most the time itself
        if not _may_pass(part[h], need):
            return
        r = _own_rise(h, part[h], recent)
        if r is None or r < need:
            return
        least = r if least is None else min(least, r)
    summary["culprit"] = dict(
        c,
        runq_veto=True,
        why=c.get("why", "")
        + f"; every host's run queue vetoes it: each of the {len(hosts)} rose +{(least or 0) / 1e6:.0f} ms or more"
        f" over its own recent median, at least the {lost / 1e6:.0f} ms lost (the machine starved of CPU)",
    )


def _crowded(summary: dict, recent: list[dict], part: dict) -> None:
    """``charge_starved``'s test of a host's ``sched`` or ``process`` culprit (not a burst, not ``starved_rank``) against
    the machine's own noise, with ``recent`` (the job's last ``SELF_STEPS`` parts) and ``part`` (this step's):

    - in a job of one rank per host, another host's run queue rose alike (``ALIKE_RISE_REL`` of the culprit
      host's rise over its own recent median, and ``EXPLAIN_REL`` of what the step lost):
      ``summary["culprit"]`` becomes None (nobody's);
    - else, in a job of two hosts (its one peer is one sample of the machine's run queues), a ``starved``
      culprit whose step is under ``RECENT_STALL_K`` times the median of the job's recent
      steps' times (``STEP_KEY``): it stays the culprit, ``starved`` False (``why`` says why), unless its
      host was the starved culprit of one of the job's last ``STARVED_NEXT_STEPS`` steps (``STARVED_KEY``: a
      burst that spans a step boundary; an 800 ms burst of node-01, frame22-accum-2, x7.29 at step 457, was
      starved again at 459, x1.91 of the baseline and x1.21 of the recent steps).

    Without ``SELF_MIN`` recent steps of the job (or of the hosts) nothing changes."""
    c = summary.get("culprit")
    if (
        not c
        or c.get("layer") not in ("sched", "process")
        or c.get("burst")
        or c.get("starved_rank")
        or c.get("source") not in ("evidence", "blame", "layers")
    ):
        return
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    host = c.get("host")
    if lost <= 0 or host not in part:
        return
    # a job of one rank per host (no rank rows in ``part``): a host of several ranks sums its ranks' run
    # queues, which the burst and rank tests compare rank by rank
    mine = None if any(isinstance(k, tuple) for k in part) else _own_rise(host, part[host], recent)
    if mine is not None and mine > 0:
        need = max(ALIKE_RISE_REL * mine, EXPLAIN_REL * lost)
        for h, now in part.items():
            # a rise over a median of run-queue times (never negative) is at most the time itself: only a
            # host whose time reaches ``need`` can have risen alike, so only those read their own steps
            if not isinstance(h, str) or h == host or not _may_pass(now, need):
                continue
            r = _own_rise(h, now, recent)
            if r is not None and r >= need:
                summary["culprit"] = None
                return
    if c.get("layer") != "sched" or not c.get("starved") or sum(isinstance(k, str) for k in part) != 2:
        return  # with two hosts or more besides it, "far above every peer" compares more than one run queue
    times = sorted(r[STEP_KEY] for r in recent if STEP_KEY in r)
    if len(times) < SELF_MIN:
        return
    ref = times[(len(times) - 1) // 2]
    step = int(summary.get("step_time_max_ns") or 0)
    if any(r.get(STARVED_KEY) == host for r in recent[-STARVED_NEXT_STEPS:]):
        return
    if step < RECENT_STALL_K * ref:
        summary["culprit"] = dict(
            c,
            starved=False,
            why=c.get("why", "")
            + f"; not starved beyond the job's own noise: x{step / max(ref, 1):.2f} the median of its last"
            f" {len(times)} steps ({ref / 1e6:.1f} ms)",
        )


def _crowded_ranks(summary: dict, recent: list[dict], part: dict) -> None:
    """``charge_starved``'s test, in a job of several ranks per host (rank rows ``(host, rank)`` in ``part``),
    of a host's ``sched`` or ``process`` culprit (a burst's and a ``starved_rank`` one's too; not a stopped
    rank, a hang, memory or network) against the machine's own noise, with ``recent`` (the job's last
    ``SELF_STEPS`` parts) and ``part`` (this step's). The culprit's rise (``_own_rise``, ns) is its rank's
    (``rank``), else its host's most-risen rank's; ``need`` is ``ALIKE_RISE_REL`` of it and at least
    ``EXPLAIN_REL`` of what the step lost. ``summary["culprit"]`` becomes None (nobody's) when

    - in this step, a rank of another host rose over its own recent median by ``need`` (the run queues of
      the machine grew alike: a clean 4 x 4 step at load 23, burst21-clean44-new-1 step 191, x1.94, had
      node-03's ranks up 433-827 ms and one rank of node-00 926 ms), or
    - in one of the job's recent steps that closed within ``CROWD_WINDOW_NS`` of this one (by the steps' own
      times), every rank of another host of at least two ranks rose by ``need`` over its median in
      ``recent`` (the machine slowed a whole other host as much, a moment before: a slowdown moves from
      host to host, a burst of one rank or host leaves the others' ranks near their own steps).

    The rises of the recent steps are read only for hosts whose every rank's time there reaches ``need`` (a
    rise over a median of run-queue times is at most the time itself). A job of one rank per host is
    ``_crowded``'s; without a baseline, a step that lost nothing or a culprit rise of 0 nothing changes."""
    c = summary.get("culprit")
    if (
        not c
        or c.get("layer") not in ("sched", "process")
        or c.get("source") not in ("evidence", "blame", "layers", "burst")
        or not any(isinstance(k, tuple) for k in part)
    ):
        return
    bl = summary.get("baseline") or {}
    step = int(summary.get("step_time_max_ns") or 0)
    lost = max(0, step - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    host = c.get("host")
    if lost <= 0 or len(recent) < SELF_MIN:
        return
    own = [k for k in part if isinstance(k, tuple) and k[0] == host]
    rank = c.get("rank")
    if rank is not None and (host, str(rank)) in part:
        own = [(host, str(rank))]
    rises = [r for k in own if (r := _own_rise(k, part[k], recent)) is not None]
    if not rises or max(rises) <= 0:
        return
    mine = max(rises)
    need = max(ALIKE_RISE_REL * mine, EXPLAIN_REL * lost)
    for k, now in part.items():
        if isinstance(k, tuple) and k[0] != host and _may_pass(now, need):
            r = _own_rise(k, now, recent)
            if r is not None and r >= need:
                summary["culprit"] = None
                return
    medians: dict = {}
    age = step
    for prev in reversed(recent):
        if age > CROWD_WINDOW_NS:
            return
        ranks: dict[str, list] = {}
        for k, now in prev.items():
            if isinstance(k, tuple) and k[0] != host:
                ranks.setdefault(k[0], []).append((k, now))
        for rows in ranks.values():
            if len(rows) < 2 or not all(_may_pass(now, need) for _k, now in rows):
                continue
            risen = True
            for k, now in rows:
                if k not in medians:
                    own_times = sorted(r[k] for r in recent if k in r)
                    medians[k] = own_times[(len(own_times) - 1) // 2] if len(own_times) >= SELF_MIN else None
                if medians[k] is None or now - medians[k] < need:
                    risen = False
                    break
            if risen:
                summary["culprit"] = None
                return
        age += int(prev.get(STEP_KEY) or 0)


def _crowded_turn(summary: dict, recent: list[dict], part: dict) -> None:
    """``charge_starved``'s test, in a job of one rank per host (no rank rows in ``part``), of a host's
    ``sched`` or ``process`` culprit (a burst's too) against the step before it: ``summary["culprit"]``
    becomes None (nobody's) when in the job's last closed step (``recent[-1]``) another host's run queue
    rose over its median in ``recent`` by ``ALIKE_RISE_REL`` of the culprit host's rise now (and by
    ``EXPLAIN_REL`` of what this step lost) and more than the culprit host's rose in that step: the
    straggler turned from host to host from one step to the next, as a machine slowed as a whole does (a
    clean Lightning stretch under other helpers' unit suites, frame22-lightning-net-new-1: node-01 up 351
    ms at step 379, node-02 220 ms at 380; node-01 265 ms at 391, node-03 295 ms at 392, both wrong
    ``step_stall`` sched alerts). A burst that spans a step boundary leads both steps on its own host. A job
    of two hosts (one peer) is ``_crowded``'s alone; without ``SELF_MIN`` recent steps nothing changes."""
    c = summary.get("culprit")
    if (
        not c
        or c.get("layer") not in ("sched", "process")
        or c.get("source") not in ("evidence", "blame", "layers", "burst")
        or any(isinstance(k, tuple) for k in part)
        or sum(isinstance(k, str) for k in part) < 3
        or not recent
    ):
        return
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    host = c.get("host")
    prev = recent[-1]
    # a rise over a median of run-queue times is at most the time itself: only a host whose time in the step
    # before reaches a quarter of this step's loss can have risen enough; own steps are read only then
    near = [(h, t) for h, t in prev.items() if isinstance(h, str) and h != host and _may_pass(t, EXPLAIN_REL * lost)]
    if lost <= 0 or not near or host not in part:
        return
    mine = _own_rise(host, part[host], recent)
    if mine is None or mine <= 0:
        return
    need = max(ALIKE_RISE_REL * mine, EXPLAIN_REL * lost)

    def then(h) -> int | None:
        own = sorted(r[h] for r in recent if h in r)
        return prev[h] - own[(len(own) - 1) // 2] if h in prev and len(own) >= SELF_MIN else None

    for h, t in near:
        if _may_pass(t, need):
            r = then(h)
            if r is not None and r >= need and ((before := then(host)) is None or r > before):
                summary["culprit"] = None
                return


def _self_starved(summary: dict, recent, part: dict) -> None:
    """``charge_starved``'s test of a sched culprit against its own recent steps (``_starved_self``), which
    marks ``summary["culprit"]`` ``starved`` (a new dict) where it holds."""
    c = summary.get("culprit")
    if not c or c.get("layer") != "sched" or c.get("source") not in ("evidence", "layers") or c.get("starved"):
        return
    bl = summary.get("baseline") or {}
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - int(bl.get("median_ns") or 0)) if bl.get("n") else 0
    z = float(c.get("evidence") or 0.0) if c.get("source") == "evidence" else None
    found = _starved_self(summary, c["host"], z, lost, list(recent)[-SELF_STEPS:], part)
    if found is not None:
        why, rank = found
        extra = {} if rank is None else {"rank": int(rank), "starved_rank": True}
        summary["culprit"] = dict(
            c, starved=True, why=c.get("why", "") + "; starved against its own recent steps: " + why, **extra
        )


def _starved_self(
    summary: dict, host: str, z: float | None, lost: int, recent: list[dict], part: dict
) -> tuple[str, str | None] | None:
    """``charge_starved``'s criterion for ``host`` (its sched evidence ``z``, spreads; None: a ``layers``
    culprit, taken as ``STARVED_MIN_EVIDENCE``), ``lost`` (ns over the job's median step), ``recent`` (the
    job's last ``charge_starved`` parts) and ``part`` (this step's: ``{host: ns}`` and ``{(host, rank):
    ns}``): ``(description, None)`` when the host rose over its own steps far above every other host,
    ``(description, rank)`` when, on a host of several ranks that failed that, its most-risen rank rose by
    ``STARVED_EXPLAIN_REL`` of the loss over every other rank's rise in the job and ``SELF_RANK_FACTOR``
    times it; None otherwise."""
    z = STARVED_MIN_EVIDENCE if z is None else z
    if z < STARVED_MIN_EVIDENCE or lost <= 0 or host not in part:
        return None
    hosts_ev = (summary.get("evidence") or {}).get("hosts") or {}
    if any((zs or {}).get("sched", 0.0) > STARVED_PEER_EVIDENCE_REL * z for h, zs in hosts_ev.items() if h != host):
        return None
    med = int((summary.get("baseline") or {}).get("median_ns") or 0)

    def rise(key) -> int | None:
        return _own_rise(key, part[key], recent)

    def rose(key, rises: dict, factor: float) -> str | None:
        mine = rises.get(key)
        peers = [r for k, r in rises.items() if k != key and r is not None]
        if mine is None or not peers:
            return None
        top = max(0, max(peers))
        if mine - top < STARVED_EXPLAIN_REL * max(lost, med) or mine < factor * max(top, 1_000_000):
            return None
        return (
            f"run-queue {part[key] / 1e6:.0f} ms, +{mine / 1e6:.0f} ms over its own recent median,"
            f" {mine / max(top, 1_000_000):.1f}x and +{(mine - top) / 1e6:.0f} ms over the largest rise of a peer's"
            f" ({(mine - top) / lost:.0%} of the {lost / 1e6:.0f} ms lost)"
        )

    # ``rose`` needs the unit's rise at least ``need`` over every other's (0 at least): the peers' rises (a
    # median of their own steps each, every host of a wide step) are read only when the host's own reaches it
    need = STARVED_EXPLAIN_REL * max(lost, med)
    mine = rise(host)
    if mine is not None and _may_pass(mine, need):
        why = rose(host, {h: rise(h) for h in part if isinstance(h, str)}, STARVED_PEER_FACTOR)
        if why is not None:
            return why, None
    # a host of several ranks: its run queue is the sum of its ranks', and on a machine of few cores every
    # rank's rises with the load, so a burst on one rank rises against its own steps, not its host's peers
    # (``charge_starved`` keeps rank rows only for a job of more rank rows than hosts)
    own_ranks = {k: rise(k) for k in part if isinstance(k, tuple) and k[0] == host}
    risen = [(r, k) for k, r in own_ranks.items() if r is not None]
    if not risen:
        return None
    mine, unit = max(risen, key=lambda rk: rk[0])
    if not _may_pass(mine, need):  # as above: every other rank's rise only when this one can pass
        return None
    rises = {k: own_ranks[k] if k in own_ranks else rise(k) for k in part if isinstance(k, tuple)}
    why = rose(unit, rises, SELF_RANK_FACTOR)
    return None if why is None else (f"rank {unit[1]}: " + why, unit[1])


def _own_rise(key, now: int, recent: list[dict]) -> int | None:
    """A unit's (``key``: a host, or ``(host, rank)``) rise over its own recent steps: ``now`` (its run-queue
    time in this step, ns) less the median of its times in ``recent`` (the job's last ``charge_starved``
    parts); None with fewer than ``SELF_MIN`` of them."""
    own = sorted(r[key] for r in recent if key in r)
    if len(own) < SELF_MIN:
        return None
    return now - own[(len(own) - 1) // 2]


def _may_pass(value: float, need: float) -> bool:
    """``value >= need``: the bound ``_starved_self`` and ``_burst`` test before they read every other
    unit's rise (a median of its own recent steps each). Its own function so the tests can turn the bound
    off (always True) and compare: the culprit is the same either way."""
    return value >= need


def _burst(summary: dict, recent: list[dict], part: dict) -> dict | None:
    """``charge_starved``'s burst test: the step's culprit when one unit's run-queue time (a rank's in a job
    of more rank rows than hosts, ``{(host, rank): ns}`` of ``part``; else a host's, ``{host: ns}``) rose
    over the median of its own last ``SELF_STEPS`` steps (``recent``, at least ``SELF_MIN`` of them) at
    least ``BURST_FACTOR`` times every other unit's rise (0 when none rose; 1 ms at least) and by
    ``BURST_MIN_NS`` and ``STARVED_EXPLAIN_REL`` of what the step lost over the job's median step (or of
    the median, the larger) more than it (``BURST_HOST_MIN_NS`` for a host of one rank): the kernel's own record of
    a CPU burst on that rank, in ms, which a loaded machine's jitter does not give one rank alone. Where no rank
    passes in a job of several ranks per host, the host whose ranks all rose alike (``_burst_alike``) is the
    unit: ``rank`` None, ``burst_ns`` its least-risen rank's rise. None without a baseline, a step that lost nothing, or
    when the step's own culprit is specific evidence of another kind (a stopped rank, a hang, memory, a
    memory cgroup at its limit, a network culprit of ``net_directed`` or ``SPECIFIC_EVIDENCE`` that the
    burst unit's host does not veto, ``runq_veto``) or a ``starved`` sched culprit of another host.

    The culprit is ``{host, layer "sched", rank, starved True, burst True, burst_ns, evidence, source,
    why}``: the step's own sched culprit of that host with these added (its ``source`` kept), else
    ``source`` "burst" (evidence 0; ``why`` says what the step's own culprit was). ``rank``: the unit's
    rank, or in a job of one rank per host the host's one rank row's (else the culprit's own, else the
    straggler's when it is the host's, else None).
    ``burst_ns``: the unit's rise over its own median (ns). The rules' ``stall_burst`` fires on it from
    ``stall_burst_k`` (1.2) times the median and 100 ms lost (docs/RULES.md)."""
    bl = summary.get("baseline") or {}
    med = int(bl.get("median_ns") or 0)
    lost = max(0, int(summary.get("step_time_max_ns") or 0) - med) if bl.get("n") else 0
    if lost <= 0 or len(recent) < SELF_MIN:
        return None
    c = summary.get("culprit")
    by_rank = any(isinstance(k, tuple) for k in part)
    rel = STARVED_EXPLAIN_REL * max(lost, med)
    need = max(BURST_MIN_NS if by_rank else BURST_HOST_MIN_NS, rel)
    # The burst unit's rise is at least ``need`` over every other unit's rise (0 at least), so at least
    # ``need``; a rise over a median of run-queue times (ns, never negative) is at most the time itself. Only
    # the units whose time reaches ``need`` can be it: their rises are read first, and every unit's (one median
    # of 16 steps each: 2,048 of a wide step) only when one of them passes against the others. Same result.
    # A host whose ranks rose alike (``_burst_alike``) has every rank's rise, so its time, at least
    # ``BURST_ALIKE_MIN_NS``: ranks are read from that bound, and every rank's rise only when one rank passes
    # or one host has ``BURST_ALIKE_MIN_RANKS`` ranks over it.
    bound = min(need, BURST_ALIKE_MIN_NS) if by_rank else need
    cands = {}
    for key, now in part.items():
        if isinstance(key, tuple) == by_rank and _may_pass(now, bound):
            r = _own_rise(key, now, recent)
            if r is not None:
                cands[key] = r
    if not cands:
        return None
    first = max(cands, key=lambda k: (cands[k], str(k)))
    top = max(0, max((r for k, r in cands.items() if k != first), default=0))
    if not _may_pass(cands[first] - top, need) or not _may_pass(cands[first], BURST_FACTOR * max(top, 1_000_000)):
        per_host: dict = {}
        for k in cands:
            if by_rank:
                per_host[k[0]] = per_host.get(k[0], 0) + 1
        if not per_host or not _may_pass(max(per_host.values()), BURST_ALIKE_MIN_RANKS):
            return None
    rises: dict = {}
    for key, now in part.items():
        if isinstance(key, tuple) != by_rank:
            continue
        r = cands[key] if key in cands else _own_rise(key, now, recent)
        if r is not None:
            rises[key] = r
    if len(rises) < 2:
        return None
    unit = max(rises, key=lambda k: (rises[k], str(k)))
    mine = rises[unit]
    top = max(0, max(r for k, r in rises.items() if k != unit))
    alike = None
    if mine - top < need or mine < BURST_FACTOR * max(top, 1_000_000):
        alike = _burst_alike(rises, rel) if by_rank else None
        if alike is None:
            return None
        unit, mine, top = alike
        by_rank = False
    host = unit[0] if by_rank else unit
    if c is not None and (
        c.get("source") in ("stopped", "hang", "memlimit")
        or c.get("layer") == "memory"
        or (
            c.get("layer") == "network"
            and (summary.get("net_directed") or float(c.get("evidence") or 0) >= SPECIFIC_EVIDENCE)
            and not (c.get("runq_veto") and (_runq_veto(summary, c["host"], lost) or ("",))[0] == host)
        )
        or (c.get("layer") == "sched" and c.get("starved") and c.get("host") != host)
    ):
        return None
    if by_rank:
        rank: int | None = int(unit[1])
    elif alike is not None:
        rank = None  # every rank of the host rose alike: the host is the unit
    else:
        rows = (summary.get("ranks") or {}).get(host) or {}
        rank = int(next(iter(rows))) if len(rows) == 1 else None
        if rank is None and c is not None and c.get("host") == host and c.get("rank") is not None:
            rank = int(c["rank"])
        strag = summary.get("straggler") or {}
        if rank is None and strag.get("host") == host and strag.get("rank") is not None:
            rank = int(strag["rank"])
    if alike is not None:
        why = (
            f"burst: every rank of {host}: its ranks' run-queue times rose over their own recent medians by"
            f" +{mine / 1e6:.0f} ms at least, {mine / max(top, 1_000_000):.1f}x and +{(mine - top) / 1e6:.0f} ms"
            f" over the largest rise of any rank of another host ({lost / 1e6:.0f} ms lost)"
        )
    else:
        why = (
            f"burst: {'rank ' + str(rank) + ' of ' if by_rank else ''}{host}: run-queue {part[unit] / 1e6:.0f} ms,"
            f" +{mine / 1e6:.0f} ms over its own recent median, {mine / max(top, 1_000_000):.1f}x and"
            f" +{(mine - top) / 1e6:.0f} ms over the largest rise of any other {'rank' if by_rank else 'host'}"
            f" ({(mine - top) / lost:.0%} of the {lost / 1e6:.0f} ms lost)"
        )
    extra = {"starved": True, "burst": True, "burst_ns": int(mine), "rank": rank}
    if c is not None and c.get("host") == host and c.get("layer") == "sched":
        return dict(c, **extra, why=f"{c.get('why', '')}; {why}")
    own = f"{c['host']} / {c['layer']} ({c.get('why', '')})" if c else "none"
    return {
        "host": host,
        "layer": "sched",
        "evidence": 0.0,
        "source": "burst",
        **extra,
        "why": f"{why}; the step's own culprit: {own}",
    }


def _burst_alike(rises: dict, need: float) -> tuple[str, int, int] | None:
    """``_burst``'s test of a host whose ranks all rose together (a job of several ranks per host where no
    one rank stood out): ``rises`` is ``{(host, rank): ns}`` of every rank with its own baseline, ``need``
    the least excess ``STARVED_EXPLAIN_REL`` of the step's loss (or median) asks of the host (ns). A CPU
    burst in a host's cgroup (busy loops beside its ranks, a squeezed CFS quota) delays every rank of it
    alike, so ``_burst``'s comparison of ranks sees several equal ones; the host is the unit then. Returns
    ``(host, least, top)``: ``least`` the smallest rise of its ranks (ns), ``top`` the largest rise of any
    rank of another host (0 when none rose), when every rank of that host (at least ``BURST_ALIKE_MIN_RANKS``)
    rose at least
    ``BURST_FACTOR`` times ``top`` and ``BURST_ALIKE_MIN_NS`` over it, and the host's ranks together rose
    ``need`` over the most another host's ranks rose together; else None. O(ranks)."""
    least: dict[str, int] = {}
    total: dict[str, int] = {}
    count: dict[str, int] = {}
    for (h, _r), v in rises.items():
        least[h] = min(least.get(h, v), v)
        total[h] = total.get(h, 0) + v
        count[h] = count.get(h, 0) + 1
    if len(least) < 2:
        return None
    host = max(least, key=lambda h: (least[h], h))
    if count[host] < BURST_ALIKE_MIN_RANKS:
        return None
    low = least[host]
    top = max(0, max(v for (h, _r), v in rises.items() if h != host))
    excess = total[host] - max(0, max(t for h, t in total.items() if h != host))
    if low - top < BURST_ALIKE_MIN_NS or low < BURST_FACTOR * max(top, 1_000_000) or excess < need:
        return None
    return host, low, top
