"""obshub's rule engine and alerting (user guide: docs/RULES.md).

Modules, in the order data flows through them:

=================  ================================================================================
``yamlfile``       strict YAML reading: positions, duplicate keys, YAML 1.1 surprises, JSON Schema
``loader``         rule files -> validated, compiled ``model.RuleSet`` (every problem file:line:col)
``expr``           CEL: macro/list expansion, compile, static field checks, evaluation
``typecheck``      static type check of every expression against the record types of its signal
``fields``         the documented fields per signal and the record builders
``engine``         evaluation: windows, thresholds, correlation -> state changes to a notify callable
``lifecycle``      fingerprint and the pending/firing/resolved transitions; the change record
``dispatch``       grouping, inhibition, silences, per-sink workers, acks for at-least-once
``sinks/``         Slack, PagerDuty, Alertmanager, webhook, console; the shared retry stage; config
``silences``       the silences file and matchers
``testing``        rule unit tests (``obshub rules test``)
``service``        ``obshub rules serve``: the Kafka loops, state files, hot reload, health records
``cli``            ``obshub rules ...`` and ``obshub silence ...``
``builtin/``       the builtin rule pack and its tests
=================  ================================================================================
"""
