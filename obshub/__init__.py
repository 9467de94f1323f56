"""obshub: always-on observability for distributed training.

Front door of the project: the CLI (:mod:`obshub.cli`), settings (:mod:`obshub.config`), the wire schema
(:mod:`obshub.schema`), the local Kafka stack (:mod:`obshub.stack`), host checks (:mod:`obshub.doctor`).
"""

__version__ = "0.1.0"
