"""Build hook for the C extensions: ``obshub.instrument._usdt`` (USDT probes via sys/sdt.h from
systemtap-sdt-dev) and ``producer._ring`` (the agent's batch reader of the BPF ring buffer). Everything
else about the distribution lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "obshub.instrument._usdt",
            sources=["obshub/instrument/_usdt.c"],
            extra_compile_args=["-O2", "-Wall"],
        ),
        Extension(
            "producer._ring",
            sources=["producer/_ring.c"],
            extra_compile_args=["-O2", "-Wall"],
        ),
    ],
)
