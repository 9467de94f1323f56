"""Replay real PyTorch profiler traces through obshub.

``kineto``  streams Kineto / Chrome-trace JSON (plain or .gz) with ijson, bounded memory.
``et``      reads the collectives of PyTorch execution traces (their process-group sequence ids).
``mapping`` turns one rank's trace into :class:`obshub.core.schema.Event`s (steps, ops, CUDA, collectives).
``publish`` sends them to Kafka as ``schema.Batch``es, one agent identity per rank, fast or paced.
``report``  the per-rank step/collective table and straggler computed from the mapped events.
``cli``     ``obshub replay``.
"""
