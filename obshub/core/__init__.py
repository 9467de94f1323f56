"""The ground floor of obshub: what every stage and application shares, importing no stage.

:mod:`obshub.core.errors` (the error root), :mod:`obshub.core.schema` (the wire format),
:mod:`obshub.core.settings` (typed settings), :mod:`obshub.core.topics` (the topics obshub creates),
:mod:`obshub.core.registry` (which components run), :mod:`obshub.core.log` (small logging helpers),
:mod:`obshub.core.usdt` (the USDT probe contract between the instrumentation and the agent).
"""
