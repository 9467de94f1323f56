"""Build hook for the C extensions: ``obshub.instrument._usdt`` (USDT probes via sys/sdt.h from
systemtap-sdt-dev) and ``obshub.producer._ring`` (the agent's batch reader of the BPF ring buffer). Everything
else about the distribution lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "obshub.instrument._usdt",
            sources=["obshub/instrument/_usdt.c"],
            # no data below the stack pointer: an optimized uprobe (Linux 6.18+, x86-64) enters through a
            # call at the probe site, which writes its return address there
            extra_compile_args=["-O2", "-Wall", "-mno-red-zone"],
        ),
        Extension(
            "obshub.producer._ring",
            sources=["obshub/producer/_ring.c"],
            depends=["obshub/bpf/record.h"],  # struct obs_event, generated from obshub/producer/record.py
            extra_compile_args=["-O2", "-Wall"],
        ),
    ],
)
