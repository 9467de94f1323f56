"""obshub: always-on observability for distributed training.

Front door of the project: the CLI (:mod:`obshub.cli`) and the applications on top of the stages (the
local Kafka stack :mod:`obshub.stack`, host checks :mod:`obshub.doctor`, :mod:`obshub.demo`,
:mod:`obshub.replay`, :mod:`obshub.export`). :mod:`obshub.core` is the ground floor every stage imports
(schema, settings, errors, topics, component registry); :mod:`obshub.instrument` is the code that runs
inside the training process.
"""

__version__ = "0.1.0"
