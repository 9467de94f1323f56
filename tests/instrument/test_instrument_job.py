"""The job a training process names from its environment (obshub/core/workload.py): the order of the
sources, Slurm's array and step notation, torchrun's default run id, pod labels from the environment and
from a downward API labels file, and the 63-byte bound of the register probe's string."""

from __future__ import annotations

from obshub.core.workload import JOB_MAX_BYTES, clean_job, parse_labels, resolve_job

NO_FILE = {"OBSHUB_PODINFO_LABELS": "/nonexistent/labels"}


def test_sources_in_order():
    env = {
        **NO_FILE,
        "OBSHUB_JOB": "llama",
        "SLURM_JOB_ID": "42",
        "TORCHELASTIC_RUN_ID": "r1",
        "OBSHUB_POD_JOB": "pod",
    }
    assert resolve_job(env) == ("llama", "env")
    del env["OBSHUB_JOB"]
    assert resolve_job(env) == ("slurm-42", "slurm")
    del env["SLURM_JOB_ID"]
    assert resolve_job(env) == ("torchrun-r1", "torchrun")
    del env["TORCHELASTIC_RUN_ID"]
    assert resolve_job(env) == ("pod", "pod")
    assert resolve_job(NO_FILE) == ("default", "default")
    assert resolve_job({**NO_FILE, "OBSHUB_JOB": "   "}) == ("default", "default")  # blank = unset


def test_slurm_array_and_steps():
    base = {**NO_FILE, "SLURM_JOB_ID": "1007"}
    assert resolve_job({**base, "SLURM_STEP_ID": "2"})[0] == "slurm-1007.2"
    array = {**base, "SLURM_ARRAY_JOB_ID": "1000", "SLURM_ARRAY_TASK_ID": "7"}
    assert resolve_job(array)[0] == "slurm-1000_7"
    assert resolve_job({**array, "SLURM_STEP_ID": "0"})[0] == "slurm-1000_7.0"
    for special in ("4294967291", "batch", "extern", ""):  # batch script / extern / interactive steps
        assert resolve_job({**base, "SLURM_STEP_ID": special})[0] == "slurm-1007"


def test_torchrun_default_run_id_uses_the_rendezvous_address():
    env = {**NO_FILE, "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
    assert resolve_job(env) == ("torchrun-node7-29500", "torchrun")
    assert resolve_job({**NO_FILE, "TORCHELASTIC_RUN_ID": "none"}) == ("default", "default")


def test_pod_labels_file(tmp_path):
    labels = tmp_path / "labels"
    labels.write_text(
        'app="trainer"\nbatch.kubernetes.io/job-name="bert-\\"x\\""\ntraining.kubeflow.org/job-name="bert-large"\n'
    )
    env = {"OBSHUB_PODINFO_LABELS": str(labels)}
    assert resolve_job(env) == ("bert-large", "pod")  # the kubeflow label comes before the Job's
    assert parse_labels(labels.read_text())["batch.kubernetes.io/job-name"] == 'bert-"x"'
    labels.write_text('obshub.io/job="resnet"\njob-name="other"\n')
    assert resolve_job(env) == ("resnet", "pod")
    assert resolve_job({**env, "OBSHUB_POD_JOB": "from-env"}) == ("from-env", "pod")
    labels.write_text("garbage without equals\n\x00\x01")
    assert resolve_job(env) == ("default", "default")


def test_names_fit_the_register_probe():
    long = "é" * 40  # 80 bytes of UTF-8
    cut = clean_job(long)
    assert len(cut.encode()) <= JOB_MAX_BYTES and cut == "é" * 31
    assert clean_job(" a\tb\n") == "ab"
    assert resolve_job({**NO_FILE, "OBSHUB_JOB": "x" * 100})[0] == "x" * JOB_MAX_BYTES
