"""Export obshub events as a timeline: ``perfetto`` builds Chrome-trace / Perfetto JSON from events and
step summaries, ``source`` reads them back from Kafka, ``cli`` is ``obshub trace export``."""
