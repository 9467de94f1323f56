"""obshub streams stage: the Faust application that joins every node's events per training step.

Modules (one job each):

- ``accumulate``  pure: one batch -> per-(step, host) partial accumulators; merging them
- ``analysis``    pure: a closed step's accumulators -> the step summary (straggler, blame, baseline)
- ``synthetic``   documented generator of realistic batches with a known straggler (tests, demo, bench)
- ``app``         the Faust application: ingest, repartition by (job, step), fold, close, emit
- ``metrics``     Prometheus metrics of the worker
- ``cli``         ``obshub streams worker`` and ``obshub tail steps``
"""
