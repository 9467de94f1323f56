"""User-space poller of the hardware counters the kernel only exposes in sysfs.

- NIC: ``<root>/sys/class/infiniband/<dev>/ports/<n>/counters/*`` and ``.../hw_counters/*`` (e.g.
  ``port_xmit_wait``, ``out_of_sequence``, ``np_cnp_sent``, EFA ``retrans_pkts``) -> one ``NIC_COUNTER``
  event per counter that changed since the previous poll: value = delta, duration_ns = interval.
- PCIe link: ``<root>/sys/bus/pci/devices/<BDF>/{current,max}_link_{speed,width}`` -> ``PCIE_LINK`` when
  the link state changes, and at the first poll for a link that is already downtrained (value 1 when
  running below its maximum speed or width).
- PCIe AER counters: ``.../<BDF>/aer_dev_correctable`` -> ``PCIE_AER`` (severity 2 = corrected) when
  counters grew; status has the bit of each counter that grew (RxErr 0, BadTLP 6, BadDLLP 7,
  Rollover 8, Timeout 12, ...), payload ``count`` = total increase.

``root`` may point at a fake tree for tests. Timestamps are CLOCK_MONOTONIC ns, like bpf_ktime_get_ns.

Cost: the directories are listed again every ``rescan_ns`` (60 s: hot-plugged devices), not at every
poll; each attribute file is opened once and re-read with ``pread`` at offset 0 (sysfs regenerates the
text on every read from offset 0), so a poll is one system call per file; a file that was missing is
not looked for again before the next scan. The attribute paths are joined once per scan, and a device
without ``current_link_speed`` (no PCIe link: a virtual device) costs that one check per poll.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from obshub.core.schema import Event, Kind
from obshub.producer.reader import AER_SEVERITY_CORRECTED, aer_payload

# PCIe base spec, Correctable Error Status register bits; names as the kernel prints them
AER_CORRECTABLE_BITS = {
    "RxErr": 0,
    "BadTLP": 6,
    "BadDLLP": 7,
    "Rollover": 8,
    "Timeout": 12,
    "NonFatalErr": 13,
    "CorrIntErr": 14,
    "HeaderOF": 15,
}


def _speed_gts(s: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", s or "")
    return float(m.group(1)) if m else None


class SysfsPoller:
    """Poll the counters under ``root`` at most every ``interval_ns``; :meth:`poll` returns Events."""

    def __init__(self, root: Path = Path("/"), interval_ns: int = 1_000_000_000, rescan_ns: int = 60_000_000_000):
        self.root = Path(root)
        self.interval_ns = interval_ns
        self.rescan_ns = rescan_ns
        self._last_ns = 0
        self._scan_ns = 0
        self._counters: dict[tuple[str, int, str], int] = {}
        self._links: dict[str, tuple] = {}
        self._aer: dict[str, dict[str, int]] = {}
        self._fds: dict[Path, int] = {}
        self._missing: set[Path] = set()
        self._ports: list[Path] = []
        self._nic_files: dict[Path, list[Path]] = {}
        self._devices: list[Path] = []
        # per device: its name and the paths of current_link_speed, max_link_speed, current_link_width,
        # max_link_width and aer_dev_correctable, joined once per scan instead of at every poll
        self._dev_files: list[tuple[str, Path, Path, Path, Path, Path]] = []

    def _text(self, p: Path) -> str | None:
        """The attribute's text now (None when it does not exist or cannot be read)."""
        fd = self._fds.get(p)
        if fd is None:
            if p in self._missing:
                return None  # not there at the last scan (a device without a PCIe link, no AER)
            try:
                fd = self._fds[p] = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._missing.add(p)
                return None
        try:
            return os.pread(fd, 65536, 0).decode(errors="replace")
        except OSError:
            os.close(self._fds.pop(p))
            return None

    def _int(self, p: Path) -> int | None:
        try:
            return int((self._text(p) or "").split()[0], 0)
        except (ValueError, IndexError):
            return None

    def _str(self, p: Path) -> str | None:
        t = self._text(p)
        return None if t is None else t.strip()

    def _rescan(self, now: int) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._missing.clear()
        self._ports = [d for d in sorted((self.root / "sys/class/infiniband").glob("*/ports/*")) if d.name.isdigit()]
        self._nic_files = {
            d: [f for sub in ("counters", "hw_counters") for f in sorted((d / sub).glob("*"))] for d in self._ports
        }
        self._devices = sorted((self.root / "sys/bus/pci/devices").glob("*"))
        self._dev_files = [
            (
                d.name,
                d / "current_link_speed",
                d / "max_link_speed",
                d / "current_link_width",
                d / "max_link_width",
                d / "aer_dev_correctable",
            )
            for d in self._devices
        ]
        self._scan_ns = now

    def close(self) -> None:
        """Close the attribute files held open."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def poll(self, now_ns: int | None = None) -> list[Event]:
        """Read everything when the interval has passed since the last read; [] otherwise."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        if self._last_ns and now - self._last_ns < self.interval_ns:
            return []
        interval = now - self._last_ns if self._last_ns else 0
        self._last_ns = now
        if not self._scan_ns or now - self._scan_ns >= self.rescan_ns:
            self._rescan(now)
        return self._nic(now, interval) + self._pcie(now)

    def _nic(self, now: int, interval: int) -> list[Event]:
        out = []
        for port_dir in self._ports:
            dev, port = port_dir.parent.parent.name, port_dir.name
            for sub_files in (self._nic_files.get(port_dir, ()),):
                for f in sub_files:
                    v = self._int(f)
                    if v is None:
                        continue
                    key = (dev, int(port), f.name)
                    prev = self._counters.get(key)
                    self._counters[key] = v
                    if prev is not None and v != prev:
                        out.append(
                            Event(
                                Kind.NIC_COUNTER,
                                now,
                                interval,
                                value=v - prev,
                                payload={"dev": dev, "port": int(port), "counter": f.name},
                            )
                        )
        return out

    def _pcie(self, now: int) -> list[Event]:
        out = []
        for name, speed_f, max_speed_f, width_f, max_width_f, aer_f in self._dev_files:
            out += self._link(name, speed_f, max_speed_f, width_f, max_width_f, now)
            out += self._aer_counts(name, aer_f, now)
        return out

    def _link(self, name: str, speed_f: Path, max_speed_f: Path, width_f: Path, max_width_f: Path, now: int):
        """PCIE_LINK of device ``name`` when its link state (read from the four attribute files) changed,
        or at the first read of a downtrained link; [] otherwise or when a file is missing."""
        speed = self._str(speed_f)
        if speed is None:
            return []  # no PCIe link attributes (a virtual device): the other files are not read
        max_speed, width, max_width = self._str(max_speed_f), self._int(width_f), self._int(max_width_f)
        if max_speed is None or width is None or max_width is None:
            return []
        cur, top = _speed_gts(speed), _speed_gts(max_speed)
        down = bool((cur is not None and top is not None and cur < top) or (0 < width < max_width))
        state = (speed, max_speed, width, max_width)
        prev = self._links.get(name)
        self._links[name] = state
        if prev == state or (prev is None and not down):
            return []
        return [
            Event(
                Kind.PCIE_LINK,
                now,
                value=int(down),
                payload={"dev": name, "speed": speed, "max_speed": max_speed, "width": width, "max_width": max_width},
            )
        ]

    def _aer_counts(self, dev: str, aer_f: Path, now: int) -> list[Event]:
        text = self._str(aer_f)
        if text is None:
            return []
        counts = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
        prev = self._aer.get(dev)
        self._aer[dev] = counts
        if prev is None:
            return []
        status, total = 0, 0
        for name, v in counts.items():
            delta = v - prev.get(name, 0)
            if delta > 0 and name in AER_CORRECTABLE_BITS:
                status |= 1 << AER_CORRECTABLE_BITS[name]
                total += delta
        if not status:
            return []
        payload = aer_payload(dev, AER_SEVERITY_CORRECTED, status)
        payload["count"] = total
        return [Event(Kind.PCIE_AER, now, value=status, payload=payload)]
