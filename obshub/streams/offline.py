"""Offline reference of the stream application: the same per-step join and analysis over an in-memory
list of batches, without Kafka or Faust. The tests compare the workers' summaries with it, and replay or
benchmark code can use it to analyse a recorded run.

Differences from the live application, by design: every step closes as ``complete`` (all data is present
up front), ``closed_at_ns`` is 0, and data-quality counters are left at 0.
"""

from __future__ import annotations

import collections
from typing import Iterable

from obshub.core.schema import Batch
from obshub.streams import accumulate, analysis


def summarize_batches(
    batches: Iterable[Batch], th: analysis.Thresholds = analysis.Thresholds()
) -> dict[tuple[str, int], dict]:
    """``{(job, step): summary}`` for every step in ``batches``. Expected hosts of a job = hosts that
    registered or sent any batch (the live application's rule); the baseline uses every earlier step of
    the job (the live application may see fewer when steps close out of order). The job's directed view
    and its retransmit window (docs/ANALYSIS.md "Network blame by connection", "Loss over a window of
    steps") and its recent culprits (a persistent fault, docs/ANALYSIS.md "Culprit of a step") are carried
    from step to step in step order, as one worker that closes every step does."""
    steps: dict[tuple[str, int], dict[str, dict]] = {}
    hosts: dict[str, set[str]] = {}
    ranks: dict[str, dict[int, tuple[int, int, str | None]]] = {}  # agent -> its host's ranks (as ingest)
    for b in batches:
        hosts.setdefault(b.job, set()).add(b.host)
        ranks[b.agent_id] = accumulate.rank_map(b, ranks.get(b.agent_id))
        for step, part in accumulate.reduce_batch(b, ranks=accumulate.job_ranks(ranks[b.agent_id], b.job)).items():
            accs = steps.setdefault((b.job, step), {})
            if b.host in accs:
                accumulate.merge(accs[b.host], part)
            else:
                accs[b.host] = part
    out: dict[tuple[str, int], dict] = {}
    history: dict[str, list[list[int]]] = {}
    directed: dict[str, int] = {}  # job -> latest step that met the directed view's condition
    recent: dict[str, collections.deque] = {}  # job -> retransmits of its last net_window_steps steps
    culprits: dict[str, collections.deque] = {}  # job -> persistent_key of its last closed steps
    scheds: dict[str, collections.deque] = {}  # job -> sched_times of its last closed steps
    held: dict[str, dict | None] = {}  # job -> its step held for naming several hosts alike
    memory: dict[str, dict] = {}  # job -> its memory episodes' state (analysis.memory_episode)
    for job, step in sorted(steps):
        last = directed.get(job)
        window = recent.setdefault(job, collections.deque(maxlen=max(1, th.net_window_steps)))
        s = analysis.summarize(
            job,
            step,
            steps[(job, step)],
            expected_hosts=sorted(hosts[job]),
            history=history.get(job, []),
            quality={},
            closed_by="complete",
            closed_at_ns=0,
            th=th,
            recent_directed=last is not None and 0 <= step - last <= th.net_directed_keep_steps,
            window=analysis.net_window(window),
        )
        if s["net_directed"]:
            directed[job] = step
        mine = scheds.setdefault(job, collections.deque(maxlen=analysis.SELF_STEPS))
        mine.append(analysis.charge_starved(s, mine))
        own = culprits.setdefault(job, collections.deque(maxlen=analysis.PERSIST_STEPS))
        s["culprit"], key = analysis.charge_persistent(s, own)
        own.append(key)
        s["culprit"] = analysis.one_rank_culprit(s["culprit"], steps[(job, step)])
        held[job] = analysis.hold_ambiguous(s, held.get(job))
        memory[job] = analysis.memory_episode(s, memory.get(job))
        window.append(analysis.net_window_part(steps[(job, step)]))
        history.setdefault(job, []).append(analysis.history_entry(s))
        out[(job, step)] = s
    return out
