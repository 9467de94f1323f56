"""Build hook for the one C extension, ``producer._usdt`` (USDT probes via sys/sdt.h from
systemtap-sdt-dev). Everything else about the distribution lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "producer._usdt",
            sources=["producer/usdt/_usdt.c"],
            extra_compile_args=["-O2", "-Wall"],
        )
    ],
)
