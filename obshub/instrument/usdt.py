"""USDT probes of obshub's in-process PyTorch instrumentation (provider ``obshub``).

The probes live in the C extension ``obshub.instrument._usdt`` (source: ``obshub/instrument/_usdt.c``, built by
``pip install -e .`` through setup.py). A tracer attaches to the shared object returned by
:func:`library_path`; with none attached each probe site is one NOP instruction.

The probe names and their arguments are the contract of :mod:`obshub.core.usdt`.

The wrappers re-exported here are the C functions themselves (no Python layer in between): they raise
``TypeError`` for a wrong type or argument count and ``OverflowError`` for an integer that does not fit
the probe argument.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from obshub.core.errors import ObshubError

try:
    from obshub.instrument import _usdt
except ImportError as exc:  # pragma: no cover - only when the package was not built
    raise ObshubError(
        f"the USDT extension obshub.instrument._usdt is not built ({exc})",
        hint="run `make setup` (or `.venv/bin/pip install -e .`) in the checkout; it needs gcc and "
        "sys/sdt.h from the Debian package systemtap-sdt-dev",
    ) from exc

from obshub.core.usdt import PROBES, PROVIDER  # noqa: E402  (the contract, after the extension check)

__all__ = [
    "PROBES",
    "PROVIDER",
    "caught",
    "coll",
    "coll_begin",
    "coll_late",
    "coll_end",
    "library_path",
    "phase_begin",
    "probe_site",
    "phase_end",
    "phase_next",
    "register",
    "site_traced",
    "step_begin",
    "step_end",
    "step_next",
    "tracekey",
]

register = _usdt.register
tracekey = _usdt.tracekey
step_begin = _usdt.step_begin
step_end = _usdt.step_end
phase_begin = _usdt.phase_begin
phase_end = _usdt.phase_end
coll_begin = _usdt.coll_begin
coll_end = _usdt.coll_end
phase_next = _usdt.phase_next
step_next = _usdt.step_next
coll = _usdt.coll
coll_late = _usdt.coll_late
caught = _usdt.caught


def library_path() -> str:
    """Absolute path of the built ``obshub.instrument._usdt`` shared object: the file a tracer attaches the
    ``obshub:*`` USDT probes to (e.g. ``bcc.USDT(path=library_path())``)."""
    return str(Path(_usdt.__file__).resolve())


def probe_site(name: str) -> int | None:
    """Run-time address (in this process) of the first site of probe ``obshub:<name>`` in the loaded
    extension, from its ELF ``.note.stapsdt`` (the SystemTap SDT note format: ``pc``, ``base``,
    ``semaphore`` as 64-bit words, then provider, name and argument strings) and the extension's mapping in
    ``/proc/self/maps``. None when it cannot be found (not a 64-bit little-endian ELF, no such probe, not
    mapped). Never raises."""
    try:
        path = library_path()
        with open(path, "rb") as fh:
            elf = fh.read()
        if elf[:6] != b"\x7fELF\x02\x01":
            return None
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
        sections = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
        strtab_off = sections[shstrndx][4]

        def sname(sec) -> bytes:
            start = strtab_off + sec[0]
            return elf[start : elf.index(b"\0", start)]

        by_name = {sname(sec): sec for sec in sections}
        note, base_sec = by_name.get(b".note.stapsdt"), by_name.get(b".stapsdt.base")
        if note is None:
            return None
        pos, end = note[4], note[4] + note[5]
        pc = None
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            owner = elf[pos + 12 : pos + 12 + namesz]
            desc_at = pos + 12 + (namesz + 3) // 4 * 4
            pos = desc_at + (descsz + 3) // 4 * 4
            if owner != b"stapsdt\0" or ntype != 3:
                continue
            site, base, _sem = struct.unpack_from("<QQQ", elf, desc_at)
            provider, probe, _args = elf[desc_at + 24 : desc_at + descsz].split(b"\0")[:3]
            if provider == PROVIDER.encode() and probe == name.encode():
                pc = site + (base_sec[3] - base if base_sec is not None else 0)
                break
        if pc is None:
            return None
        real = os.path.realpath(path)
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].strip() == real and int(parts[2], 16) == 0:
                    return int(parts[0].split("-")[0], 16) + pc
    except (OSError, ValueError, struct.error, IndexError):
        return None
    return None


#: Is a tracer attached at probe site ``address`` (from :func:`probe_site`) now? ``site_traced(address) ->
#: bool``. A uprobe replaces the site's NOP by a breakpoint instruction (int3, 0xCC) in every process that
#: maps the file, and Linux 6.18+ (x86-64) turns that breakpoint into a call (0xE8) or jump (0xE9) of its
#: uprobe trampoline after the first hit; an untraced site starts with 0x0F (the 5-byte NOP). The process
#: sees either in its own memory: one byte read, in C (``_usdt.site_traced``, ~40 ns; ``ctypes`` took ~400
#: ns). Always False on architectures other than x86-64.
site_traced = _usdt.site_traced
