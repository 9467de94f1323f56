"""The ceiling for Python on this machine: a plain confluent-kafka consumer loop doing the stream worker's
work with the stream application's own code, without Faust: decode and validate every batch
(``schema.decode_batch``), drop duplicate ``(agent_id, seq)``, take registrations as the job's hosts,
reduce each batch to per-(step, host) accumulators (``streams.accumulate``), close a step when every
host reported its end, summarise it (``streams.analysis.summarize``) and publish the JSON summary.

What it leaves out compared with the Faust worker, and why it is a ceiling: no repartition topic (one
process sees every partition), no changelog-backed tables, no window timers, no offset commits.

    loop = PlainLoop(bootstrap, "in-topic", "out-topic")
    stats = loop.run(expect_steps=400, timeout_s=120)   # {"events", "steps", "seconds", "events_per_s", ...}
"""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Consumer, Producer

from obshub.core import kafka, schema
from obshub.streams import accumulate, analysis


class PlainLoop:
    """One consumer loop over ``input_topic`` (from the beginning) publishing summaries to ``output_topic``."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str):
        self.input_topic, self.output_topic = input_topic, output_topic
        conn = kafka.KafkaConnection(bootstrap=bootstrap)
        self.consumer = Consumer(
            kafka.consumer_config(
                conn,
                f"bench-plain-{uuid.uuid4().hex}",
                {"auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.message.max.bytes": 16 << 20},
            )
        )
        self.producer = Producer(kafka.producer_config(conn, {"linger.ms": 20}))
        self.th = analysis.Thresholds()

    def run(self, expect_steps: int, timeout_s: float = 300.0) -> dict:
        """Consume until ``expect_steps`` summaries were published (or ``timeout_s``). Time runs from the
        first message received to the last summary. Returns events, steps, seconds, events_per_s."""
        c, p = self.consumer, self.producer
        c.subscribe([self.input_topic])
        hosts: dict[str, set[str]] = {}
        open_steps: dict[tuple[str, int], dict[str, dict]] = {}
        history: dict[str, list[list[int]]] = {}
        seen: dict[str, int] = {}
        events = steps = 0
        t_first = cpu0 = None
        deadline = time.monotonic() + timeout_s
        try:
            while steps < expect_steps and time.monotonic() < deadline:
                msgs = c.consume(500, 0.5)
                for m in msgs:
                    if m.error():
                        continue
                    if t_first is None:
                        t_first, cpu0 = time.monotonic(), time.process_time()
                    try:
                        b = schema.decode_batch(m.value())
                    except schema.SchemaError:
                        continue
                    if seen.get(b.agent_id, -1) >= b.seq:
                        continue
                    seen[b.agent_id] = b.seq
                    events += len(b.events)
                    job_hosts = hosts.setdefault(b.job, set())
                    job_hosts.add(b.host)
                    for r in accumulate.registrations(b):
                        job_hosts.add(r["host"])
                    for step, part in accumulate.reduce_batch(b).items():
                        accs = open_steps.setdefault((b.job, step), {})
                        if b.host in accs:
                            accumulate.merge(accs[b.host], part)
                        else:
                            accs[b.host] = part
                        if job_hosts <= accs.keys() and all(a["end_rt"] is not None for a in accs.values()):
                            s = analysis.summarize(
                                b.job,
                                step,
                                open_steps.pop((b.job, step)),
                                expected_hosts=sorted(job_hosts),
                                history=history.get(b.job, []),
                                quality={},
                                closed_by="complete",
                                closed_at_ns=time.time_ns(),
                                th=self.th,
                            )
                            history.setdefault(b.job, []).append([step, s["step_time_max_ns"]])
                            p.produce(self.output_topic, key=b.job.encode(), value=json.dumps(s).encode())
                            p.poll(0)
                            steps += 1
            p.flush(30)
        finally:
            c.close()
        seconds = (time.monotonic() - t_first) if t_first else float("nan")
        cpu = time.process_time() - cpu0 if cpu0 is not None else float("nan")
        return {
            "events": events,
            "steps": steps,
            "seconds": seconds,
            "cpu_s": cpu,
            "events_per_s": events / seconds if t_first and seconds > 0 else 0.0,
            "events_per_cpu_s": events / cpu if cpu and cpu > 0 else float("nan"),
        }
