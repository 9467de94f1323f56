"""Which training job a process belongs to, read from the workload's own environment (standard library
only: the instrumentation resolves it inside the training process, and the register probe carries it to
the node agent, so one agent per node serves every job on it).

Sources, first match wins (:func:`resolve_job`):

==========  ===========================================================  =============================
source      read from                                                    job name
==========  ===========================================================  =============================
env         ``OBSHUB_JOB``                                               the value as given
slurm       ``SLURM_JOB_ID``; an array task: ``SLURM_ARRAY_JOB_ID`` and  ``slurm-<job>[.<step>]``,
            ``SLURM_ARRAY_TASK_ID``; a job step (``srun``):              ``slurm-<array>_<task>[.<step>]``
            ``SLURM_STEP_ID``                                            (Slurm's own notation)
torchrun    ``TORCHELASTIC_RUN_ID`` (``--rdzv-id``); for the default     ``torchrun-<run id>``,
            id ``none``: ``MASTER_ADDR`` and ``MASTER_PORT``             ``torchrun-<addr>-<port>``
pod         ``OBSHUB_POD_JOB`` (a pod label through the downward API's   the label's value
            ``fieldRef``), else the downward API labels file
            ``$OBSHUB_PODINFO_LABELS`` (default ``/etc/podinfo/labels``):
            labels ``obshub.io/job``, ``training.kubeflow.org/job-name``,
            ``batch.kubernetes.io/job-name``, ``job-name``, in this order
default     nothing of the above                                         ``default``
==========  ===========================================================  =============================

The Slurm step is part of the name because steps of one allocation are separate runs (step numbers of a
second ``srun`` start again at 0); the batch script's own step and the special steps (extern,
interactive) add nothing. A name is stripped of white space and cut to :data:`JOB_MAX_BYTES` bytes of
UTF-8 (the register probe's string argument holds 64 bytes with the terminating NUL).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

JOB_MAX_BYTES = 63
#: a job name given on the command line (``obshub run --job``): letters, digits, '.', '_' or '-', starting with
#: a letter or digit, at most ``JOB_MAX_BYTES`` characters, as a host name (``settings.HOST_RE``)
JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,%d}$" % (JOB_MAX_BYTES - 1))
DEFAULT_JOB = "default"
PODINFO_LABELS = "/etc/podinfo/labels"
#: pod labels that name a job, in the order they are tried
POD_JOB_LABELS = ("obshub.io/job", "training.kubeflow.org/job-name", "batch.kubernetes.io/job-name", "job-name")
#: Slurm step ids at or above this are the special steps (batch script, extern, interactive, pending)
_SLURM_SPECIAL_STEPS = 0xFFFF_FFF0


def clean_job(name: str) -> str:
    """``name`` stripped of surrounding white space, with control characters removed, cut to
    :data:`JOB_MAX_BYTES` bytes of UTF-8 on a character boundary ("" when nothing is left)."""
    name = "".join(c for c in name.strip() if c.isprintable())
    raw = name.encode("utf-8")
    if len(raw) <= JOB_MAX_BYTES:
        return name
    return raw[:JOB_MAX_BYTES].decode("utf-8", "ignore")


def _slurm(env: Mapping[str, str]) -> str:
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        return ""
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    name = f"slurm-{array}_{task}" if array and task else f"slurm-{job}"
    step = env.get("SLURM_STEP_ID", "").strip()
    if step.isdigit() and int(step) < _SLURM_SPECIAL_STEPS:
        name += f".{step}"
    return name


def _torchrun(env: Mapping[str, str]) -> str:
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if not run_id:
        return ""
    if run_id != "none":
        return f"torchrun-{run_id}"
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    return f"torchrun-{addr}-{port}" if addr and port else ""


def parse_labels(text: str) -> dict[str, str]:
    """The labels of a downward API labels file: one ``key="value"`` per line, the value quoted and
    escaped as a Go string (``\\"``, ``\\\\``, ``\\n``). Lines that are not ``key=...`` are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
            chars, i = [], 0
            while i < len(value):
                c = value[i]
                if c == "\\" and i + 1 < len(value):
                    nxt = value[i + 1]
                    chars.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
                    i += 2
                    continue
                chars.append(c)
                i += 1
            value = "".join(chars)
        out[key.strip()] = value
    return out


def _pod(env: Mapping[str, str]) -> str:
    direct = env.get("OBSHUB_POD_JOB", "").strip()
    if direct:
        return direct
    path = env.get("OBSHUB_PODINFO_LABELS") or PODINFO_LABELS
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            labels = parse_labels(fh.read(65536))
    except OSError:
        return ""
    for key in POD_JOB_LABELS:
        if labels.get(key, "").strip():
            return labels[key]
    return ""


def resolve_job(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(job, source)`` for a process with environment ``env`` (default ``os.environ``): the first
    source of the module's table that names a job (``source`` is one of ``"env"``, ``"slurm"``,
    ``"torchrun"``, ``"pod"``, ``"default"``), the name passed through :func:`clean_job`. Never raises:
    an unreadable labels file counts as no label."""
    env = os.environ if env is None else env
    for source, find in (
        ("env", lambda e: e.get("OBSHUB_JOB", "")),
        ("slurm", _slurm),
        ("torchrun", _torchrun),
        ("pod", _pod),
    ):
        name = clean_job(find(env))
        if name:
            return name, source
    return DEFAULT_JOB, "default"
