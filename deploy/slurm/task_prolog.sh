#!/usr/bin/env bash
# Slurm TaskProlog: instrument every task of the job with obshub without changing the job script.
# Slurm exports the lines printed as `export NAME=VALUE` into the task's environment. The node's agent
# (systemd unit obshub-agent.service, --registered) picks the processes up through their USDT probes.
# Each process names its job itself from Slurm's variables: slurm-<job id>[.<step>] (slurm-<array job>_<task>
# for an array task); export OBSHUB_JOB here to name it otherwise.
OBSHUB=/opt/obshub
echo "export OBSHUB_HOST_ID=${SLURM_NODEID:-0}"
echo "export PYTHONPATH=${OBSHUB}/obshub/instrument/bootstrap${PYTHONPATH:+:$PYTHONPATH}"
