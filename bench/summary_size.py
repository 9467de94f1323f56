"""Bytes of one step summary on the steps topic at 128 to 4,096 hosts, beside the broker's limit.

For each width, the last step of a job built by the load generator (bench/loadgen.py, one host the
straggler) is summarised by ``streams.analysis.summarize``; printed per width: the bytes of the summary as
the worker writes it (compact JSON, ``layers`` kept for the outlier hosts only, ``layer_stats`` over all
hosts: ``streams.compact``), the bytes the same summary would have with every host's layer row and the
spaced JSON of earlier releases, the rows kept in ``layers``, and the share of the broker's default
message limit (``message.max.bytes`` = 1,048,588 bytes). Target: a 4,096-host summary well below that
limit (at most a quarter of it).

    python -m bench.summary_size                   # 128, 512, 2,048, 4,096 hosts
    python -m bench.summary_size --hosts 64 8192   # other widths
"""

from __future__ import annotations

import argparse
import json

from bench import common, rules_width
from obshub.streams import analysis

WIDTHS = (128, 512, 2048, 4096)
BROKER_LIMIT = 1_048_588  # Kafka's default message.max.bytes (bytes)
TARGET_SHARE = 0.25  # "well below": at most a quarter of the limit at 4,096 hosts


def measure(hosts: int) -> dict:
    """Bytes of the last step's summary at ``hosts`` hosts: as written, and with every layer row."""
    summaries, accs, _expected, _history = rules_width.build(hosts, steps=2)
    s = summaries[-1]
    now = len(json.dumps(s, sort_keys=True, separators=(",", ":")).encode())
    full = {k: v for k, v in s.items() if k not in ("layer_stats", "layers_omitted")}
    full["layers"] = analysis.layer_table(accs)
    before = len(json.dumps(full, sort_keys=True).encode())
    return {
        "hosts": hosts,
        "bytes": now,
        "bytes_every_row": before,
        "rows": len(s["layers"]),
        "omitted": s["layers_omitted"],
    }


def run(quick: bool = False, rounds: int | None = None, widths: tuple[int, ...] | None = None) -> dict:
    """Measure, print the table and the verdict, save the JSON. ``rounds`` is ignored (sizes are exact)."""
    from rich.table import Table

    widths = tuple(widths or ((128, 512) if quick else WIDTHS))
    rows = [measure(h) for h in widths]
    t = Table(title="one step summary on the steps topic, bytes", caption=common.describe_machine())
    for col in ("hosts", "bytes (as written)", "every layer row, spaced JSON", "rows in layers", "of 1 MB limit"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            f"{r['hosts']:,}",
            f"{r['bytes']:,}",
            f"{r['bytes_every_row']:,}",
            f"{r['rows']} (+{r['omitted']:,} in layer_stats)",
            f"{r['bytes'] / BROKER_LIMIT:.1%}",
        )
    common.console.print(t)
    at = [r for r in rows if r["hosts"] >= 4096]
    if at:
        common.verdict(
            f"4,096-host summary <= {TARGET_SHARE:.0%} of the broker's message limit",
            at[0]["bytes"] <= TARGET_SHARE * BROKER_LIMIT,
            f"{at[0]['bytes']:,} bytes",
        )
    result = {"rows": rows, "rev": common.git_rev()}
    common.console.print(f"raw results: {common.save('summary_size', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.summary_size [--quick] [--hosts N ...]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.summary_size", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="128 and 512 hosts only")
    p.add_argument(
        "--hosts",
        type=common.positive_int,
        nargs="+",
        metavar="N",
        help="widths, each 1 or more (default: 128 512 2048 4096)",
    )
    a = p.parse_args(argv)
    run(quick=a.quick, widths=tuple(a.hosts) if a.hosts else None)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
