"""The raw ring-buffer record has one definition (obshub/producer/record.py): the generated C header that
the BPF programs and the agent's C reader include must match it byte for byte, the C compiler must lay
the struct out at the offsets the Python decoder unpacks, and the built reader must agree on its size."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from obshub.producer import reader, record
from tests.conftest import REPO


def test_generated_header_is_up_to_date():
    r = subprocess.run([sys.executable, "-m", "obshub.producer.record", "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (REPO / "obshub" / "bpf" / "record.h").read_text() == record.render_header()
    assert '#include "record.h"' in (REPO / "obshub" / "bpf" / "common.h").read_text()
    assert '#include "../bpf/record.h"' in (REPO / "obshub" / "producer" / "_ring.c").read_text()
    assert "struct obs_event {" not in (REPO / "obshub" / "producer" / "_ring.c").read_text()  # no second copy


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_c_compiler_lays_the_record_out_at_the_python_offsets(tmp_path):
    fields = "\n".join(f'    printf("{f.name} %zu\\n", offsetof(struct obs_event, {f.name}));' for f in record.FIELDS)
    src = tmp_path / "layout.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <linux/types.h>\n"
        f'#include "{REPO / "obshub" / "bpf" / "record.h"}"\n'
        f'int main(void) {{\n{fields}\n    printf("size %zu\\n", sizeof(struct obs_event));\n    return 0;\n}}\n'
    )
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True).stdout.splitlines())
    assert {k: int(v) for k, v in got.items()} == {**record.offsets(), "size": record.RECORD_SIZE}


def test_the_readers_follow_the_one_definition():
    from obshub.producer import _ring

    assert _ring.EVENT_SIZE == record.RECORD_SIZE == reader.EVENT_SIZE == 176
    assert reader.EVENT_STRUCT is record.RECORD_STRUCT
    raw = record.RECORD_STRUCT.pack(*[i + 1 for i in range(len(record.FIELDS) - 2)], b"a" * 3, b"b")
    assert dict(zip(record.FIELD_NAMES, record.RECORD_STRUCT.unpack(raw)))["kind"] == 11


def test_a_table_that_would_need_padding_is_refused():
    bad = (*record.FIELDS[:8], record.Field("odd", "__u16", "x"), *record.FIELDS[8:])
    with pytest.raises(ValueError, match="odd.*aligned|pad"):
        record.render_header(bad)
    with pytest.raises(ValueError, match="pad"):
        record.offsets((record.Field("a", "__u64", "x"), record.Field("b", "__u32", "y")))


def test_a_new_field_is_one_row(tmp_path):
    """What adding a field means: one row; the header, the sizes and the Python struct follow."""
    more = (*record.FIELDS[:8], record.Field("arg4", "__u64", "per kind"), *record.FIELDS[8:])
    text = record.render_header(more)
    assert "__u64 arg4;" in text and "#define OBS_EVENT_SIZE 184" in text
    assert record.offsets(more)["str0"] == record.offsets()["str0"] + 8


def test_the_generator_refuses_an_unknown_argument_and_writes_nothing():
    before = (REPO / "obshub" / "bpf" / "record.h").stat().st_mtime_ns
    r = subprocess.run([sys.executable, "-m", "obshub.producer.record", "--chek"], capture_output=True, text=True)
    assert r.returncode == 2 and "unrecognized arguments: --chek" in r.stderr
    assert (REPO / "obshub" / "bpf" / "record.h").stat().st_mtime_ns == before
