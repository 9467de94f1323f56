"""Bounded on-disk spool of encoded batches: where batches wait while Kafka cannot take them, in order, and
across agent restarts.

Layout of ``$OBSHUB_HOME/spool/<host>/``::

    lock                    flock()ed by the running agent (holds its pid): one agent per spool
    cursor                  JSON {"segment": id, "offset": bytes}: where the oldest unacknowledged record
                            starts (written atomically: temp file + rename)
    0000000000000001.seg    segment files, append-only, oldest first
    ...

A segment is a sequence of records ``header | key | value`` with the 12-byte little-endian header
``magic u16 = 0x0B5B, key_len u16, value_len u32, crc32(key + value) u32`` (zlib.crc32). A torn record at
the end of a segment (agent killed mid-write) fails its length or CRC check and is cut off on open.

Order: records are read back (:meth:`Spool.read_next`) in the order they were appended; the transport
acknowledges them (:meth:`Spool.ack`) in that order once Kafka has them; :meth:`Spool.rewind` goes back
to the oldest unacknowledged record after a failed replay (so delivery is at-least-once: records sent
during a replay that failed part-way may be sent twice; consumers deduplicate on ``(agent_id, seq)``).

Bound: the segment files never exceed ``max_bytes`` together. When an append would pass it, whole
segments are dropped oldest first, and their unacknowledged records are counted in ``dropped_batches`` /
``dropped_bytes``. Durability: every append is flushed to the OS (survives an agent crash); segments are
fsync()ed when they are rolled and on close (a power loss may lose the unsynced tail).

Errors: :class:`producer.errors.SpoolError` when the folder cannot be created or written, or another
running agent holds its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from obshub.core.settings import SPOOL_MAX_BYTES, SPOOL_SEGMENT_BYTES
from obshub.producer.errors import SpoolError

_HEADER = struct.Struct("<HHII")
_MAGIC = 0x0B5B
_CURSOR_EVERY_S = 0.2

log = logging.getLogger(__name__)


class SpoolPos(NamedTuple):
    """Where a record lies: ``segment`` id, ``end`` byte offset (the next record starts there) and
    ``start`` byte offset in that segment."""

    segment: int
    end: int
    start: int = 0


@dataclass
class _Segment:
    id: int
    path: Path
    size: int = 0  # bytes in the file (valid records only)
    count: int = 0  # records in the file


class Spool:
    """A bounded, ordered, restart-safe queue of ``(key, value)`` records in ``directory``.

    ``max_bytes``: bound on all segment files together, bytes. ``segment_bytes``: a segment is rolled
    when the next record would pass this size. Opening takes the folder's lock, cuts a torn tail, and
    resumes from the saved cursor. The lock file holds the holder's pid, and ``"<pid> stopping"`` once
    it stops (:meth:`mark_stopping`): opening waits up to ``stopping_wait_s`` for a holder that stops
    (an agent restarted at once: its predecessor still delivers), and raises SpoolError at once for a
    holder that runs (two agents on one spool).
    """

    def __init__(
        self,
        directory: Path,
        max_bytes: int = SPOOL_MAX_BYTES,
        segment_bytes: int = SPOOL_SEGMENT_BYTES,
        stopping_wait_s: float = 60.0,
    ):
        if segment_bytes > max_bytes:
            raise ValueError(f"segment_bytes {segment_bytes} exceeds max_bytes {max_bytes}")
        self.dir = Path(directory)
        self.max_bytes, self.segment_bytes = max_bytes, segment_bytes
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / "lock", "a+")
        except OSError as exc:
            raise SpoolError(
                f"Failed to open the spool folder {self.dir}: {exc}",
                "check that $OBSHUB_HOME is writable by the agent's user",
            ) from exc
        deadline, said = time.monotonic() + stopping_wait_s, False
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                self._lock.seek(0)
                holder = self._lock.read().strip() or "?"
                if holder.endswith(" stopping") and time.monotonic() < deadline:
                    if not said:
                        log.warning(
                            "the spool %s is held by an agent that stops (pid %s): waiting up to %.0f s for it",
                            self.dir,
                            holder.split()[0],
                            stopping_wait_s,
                        )
                        said = True
                    time.sleep(0.2)
                    continue
                self._lock.close()
                raise SpoolError(
                    f"the spool {self.dir} is in use by another running agent (pid {holder})",
                    "run each agent with its own --host, or stop the other agent first",
                ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self.dropped_batches = 0
        self.dropped_bytes = 0
        self.appended = 0
        self._segs: list[_Segment] = []
        self._writer = None
        self._reader = None
        self._reader_seg = -1
        self._cursor_saved_at = 0.0
        self._max_id = 0
        self._load()

    # -- open ----------------------------------------------------------------------------------------
    def _load(self) -> None:
        for path in sorted(self.dir.glob("*.seg")):
            try:
                seg = _Segment(int(path.stem), path)
            except ValueError:
                continue
            self._scan(seg)
            self._max_id = max(self._max_id, seg.id)
            if seg.count:
                self._segs.append(seg)
            else:
                path.unlink(missing_ok=True)
        seg_id, offset = 0, 0
        try:
            cur = json.loads((self.dir / "cursor").read_text())
            seg_id, offset = int(cur["segment"]), int(cur["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        while self._segs and (
            self._segs[0].id < seg_id or (self._segs[0].id == seg_id and offset >= self._segs[0].size)
        ):
            self._segs.pop(0).path.unlink(missing_ok=True)
        self._cur_off, self._cur_acked = 0, 0
        if self._segs and self._segs[0].id == seg_id and offset > 0:
            self._cur_off, self._cur_acked = self._count_to(self._segs[0], offset)
        self._read = SpoolPos(self._segs[0].id, self._cur_off) if self._segs else None

    def _scan(self, seg: _Segment) -> None:
        """Count the valid records of a segment; cut off anything after the first invalid one."""
        with open(seg.path, "rb") as f:
            data = f.read()
        off = 0
        while off + _HEADER.size <= len(data):
            magic, klen, vlen, crc = _HEADER.unpack_from(data, off)
            end = off + _HEADER.size + klen + vlen
            if magic != _MAGIC or end > len(data) or zlib.crc32(data[off + _HEADER.size : end]) != crc:
                break
            off = end
            seg.count += 1
        seg.size = off
        if off < len(data):
            os.truncate(seg.path, off)

    def _count_to(self, seg: _Segment, offset: int) -> tuple[int, int]:
        """(record boundary at or before ``offset``, records before it) in ``seg``."""
        off = n = 0
        with open(seg.path, "rb") as f:
            while off < offset:
                f.seek(off)
                head = f.read(_HEADER.size)
                if len(head) < _HEADER.size:
                    break
                _m, klen, vlen, _c = _HEADER.unpack(head)
                if off + _HEADER.size + klen + vlen > offset:
                    break
                off += _HEADER.size + klen + vlen
                n += 1
        return off, n

    # -- state ---------------------------------------------------------------------------------------
    @property
    def pending_batches(self) -> int:
        """Records appended and not yet acknowledged."""
        return sum(s.count for s in self._segs) - self._cur_acked

    @property
    def pending_bytes(self) -> int:
        """Bytes of the records not yet acknowledged (headers included)."""
        return sum(s.size for s in self._segs) - self._cur_off

    @property
    def disk_bytes(self) -> int:
        """Bytes of segment files on disk (what ``max_bytes`` bounds)."""
        return sum(s.size for s in self._segs)

    def __len__(self) -> int:
        return self.pending_batches

    # -- append --------------------------------------------------------------------------------------
    def append(self, key: bytes, value: bytes) -> None:
        """Append one record (flushed to the OS before returning). Drops oldest segments when the spool
        would pass ``max_bytes``; a record larger than ``max_bytes`` itself is dropped and counted."""
        rec_len = _HEADER.size + len(key) + len(value)
        if rec_len > self.max_bytes:
            self.dropped_batches += 1
            self.dropped_bytes += rec_len
            return
        while self._segs and self.disk_bytes + rec_len > self.max_bytes:
            self._drop_oldest()
        seg = self._segs[-1] if self._segs else None
        if seg is None or (seg.size + rec_len > self.segment_bytes and seg.size > 0):
            seg = self._roll()
        elif self._writer is None:  # reopened spool: continue its newest segment
            self._writer = self._open_append(seg)
        head = _HEADER.pack(_MAGIC, len(key), len(value), zlib.crc32(value, zlib.crc32(key)))
        try:
            self._writer.write(head + key + value)
            self._writer.flush()
        except OSError as exc:
            raise SpoolError(
                f"Failed to write to the spool segment {seg.path}: {exc}", "free disk space or lower --spool-max-bytes"
            ) from exc
        seg.size += rec_len
        seg.count += 1
        self.appended += 1
        if self._read is None:
            self._read = SpoolPos(seg.id, 0)

    def _roll(self) -> _Segment:
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self._writer.close()
        next_id = max(self._max_id, self._last_id()) + 1
        self._max_id = next_id
        seg = _Segment(next_id, self.dir / f"{next_id:016d}.seg")
        self._writer = self._open_append(seg)
        self._segs.append(seg)
        return seg

    @staticmethod
    def _open_append(seg: _Segment):
        try:
            return open(seg.path, "ab")
        except OSError as exc:
            raise SpoolError(
                f"Failed to open the spool segment {seg.path} for writing: {exc}",
                "check free space and permissions of $OBSHUB_HOME/spool",
            ) from exc

    def _last_id(self) -> int:
        try:
            return int(json.loads((self.dir / "cursor").read_text())["segment"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _drop_oldest(self) -> None:
        seg = self._segs.pop(0)
        self.dropped_batches += seg.count - self._cur_acked
        self.dropped_bytes += seg.size - self._cur_off
        self._close_segment_files(seg)
        seg.path.unlink(missing_ok=True)
        self._advance_cursor_to_head()

    def _close_segment_files(self, seg: _Segment) -> None:
        if self._reader is not None and self._reader_seg == seg.id:
            self._reader.close()
            self._reader, self._reader_seg = None, -1
        if self._writer is not None and not self._segs:
            self._writer.close()
            self._writer = None

    def _advance_cursor_to_head(self) -> None:
        self._cur_off = self._cur_acked = 0
        head = SpoolPos(self._segs[0].id, 0) if self._segs else None
        if self._read is None or head is None or self._read.segment < head.segment:
            self._read = head
        self._save_cursor(force=True)

    # -- read / ack ----------------------------------------------------------------------------------
    def read_next(self) -> tuple[SpoolPos, bytes, bytes] | None:
        """The next record after the last one read (not acknowledged: it stays in the spool), as
        ``(pos, key, value)``; None when every record has been read."""
        while self._read is not None:
            seg = next((s for s in self._segs if s.id == self._read.segment), None)
            if seg is None:
                self._read = None
                return None
            if self._read.end >= seg.size:
                later = [s for s in self._segs if s.id > seg.id]
                if not later:
                    return None
                self._read = SpoolPos(later[0].id, 0)
                continue
            if self._reader_seg != seg.id:
                if self._reader is not None:
                    self._reader.close()
                self._reader, self._reader_seg = open(seg.path, "rb"), seg.id
            self._reader.seek(self._read.end)
            _m, klen, vlen, _c = _HEADER.unpack(self._reader.read(_HEADER.size))
            key = self._reader.read(klen)
            value = self._reader.read(vlen)
            pos = SpoolPos(seg.id, self._read.end + _HEADER.size + klen + vlen, self._read.end)
            self._read = pos
            return pos, key, value
        return None

    def ack(self, pos: SpoolPos) -> None:
        """Acknowledge the oldest unacknowledged record, which must end at ``pos`` (the transport acks in
        order). A position in a segment already dropped is ignored. Raises ValueError for a position out
        of order."""
        if not self._segs or pos.segment < self._segs[0].id:
            return
        head = self._segs[0]
        if pos.segment != head.id or pos.start != self._cur_off:
            raise ValueError(
                f"spool ack {pos} out of order (oldest unacknowledged record is in segment "
                f"{head.id} at offset {self._cur_off})"
            )
        self._cur_off, self._cur_acked = pos.end, self._cur_acked + 1
        if self._cur_off >= head.size:
            self._segs.pop(0)
            self._close_segment_files(head)
            head.path.unlink(missing_ok=True)
            if not self._segs:
                self._read = None
            self._advance_cursor_to_head()
            if not self._segs:
                self._save_last(head.id)
        else:
            self._save_cursor()

    def rewind(self) -> None:
        """Read again from the oldest unacknowledged record (after a replay failed part-way)."""
        self._read = SpoolPos(self._segs[0].id, self._cur_off) if self._segs else None

    # -- cursor --------------------------------------------------------------------------------------
    def _save_last(self, seg_id: int) -> None:
        self._write_cursor(seg_id, 1 << 62)

    def _save_cursor(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._cursor_saved_at < _CURSOR_EVERY_S:
            return
        if self._segs:
            self._write_cursor(self._segs[0].id, self._cur_off)
        self._cursor_saved_at = now

    def _write_cursor(self, seg_id: int, offset: int) -> None:
        tmp = self.dir / "cursor.tmp"
        tmp.write_text(json.dumps({"segment": seg_id, "offset": offset}))
        os.replace(tmp, self.dir / "cursor")

    def mark_stopping(self) -> None:
        """Say in the lock file that this holder stops (``"<pid> stopping"``): a spool opened meanwhile
        waits for the lock instead of failing (an agent restarted while this one still delivers)."""
        if self._lock is None or self._lock.closed:
            return
        with contextlib.suppress(OSError):
            self._lock.seek(0)
            self._lock.truncate()
            self._lock.write(f"{os.getpid()} stopping")
            self._lock.flush()

    def close(self) -> None:
        """Flush and fsync, save the cursor, release the lock. The spool can be opened again."""
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._save_cursor(force=True)
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None
