"""Build hook for the one C extension, ``obshub.instrument._usdt`` (USDT probes via sys/sdt.h from
systemtap-sdt-dev). Everything else about the distribution lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "obshub.instrument._usdt",
            sources=["obshub/instrument/_usdt.c"],
            extra_compile_args=["-O2", "-Wall"],
        )
    ],
)
