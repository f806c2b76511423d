#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes docs/PERFORMANCE.md from raw kvpage-bench output.

usage: python3 scripts/perf_page.py RUN.txt [RUN.txt ...]
           [--peers COMPARE_TORCH.txt ...] [-o docs/PERFORMANCE.md]

Each RUN is what `kvpage-bench` (bench/kvpage_bench.cc) prints, saved as is,
or the CSV it writes with --csv. The page gets one table per device (the
device name as kvpage-bench prints it), each row a shape and KV dtype: the
decode's time per call inside a CUDA graph, its GB/s, its fraction of the
device-to-device copy bandwidth measured in the same run, and the cache
write's GB/s. kvpage-bench prints no date and no commit, so a saved run may
start with metadata lines of its own, which this script reads:

    # date: 2026-11-23
    # build: f598864 (kvpage 0.1.0, Release, sm_90a)
    # command: LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench
    # note: any sentence to print under the device's heading

`--peers` takes what bench/compare_torch.py prints (its stdout, or the
compare_torch.md it writes) and adds a table against PyTorch per device.

Anything the script does not recognise is an error: it exits with status 1
and names the file and line, so a truncated or garbled run never becomes a
page. Standard library only.

The method section below describes kvpage-bench as bench/kvpage_bench.cc
measures today; change it here when the benchmark's method changes.
"""

import argparse
import csv
import io
import re
import sys
from collections import OrderedDict

DTYPES = ["bf16", "fp16", "fp8", "int8", "int4"]


class ParseError(Exception):
    pass


def fail(path, lineno, msg):
    where = "%s:%d" % (path, lineno) if lineno else path
    raise ParseError("%s: %s" % (where, msg))


def num(path, lineno, text, what):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        fail(path, lineno, "%s is not a number: %r" % (what, text))


def pct(path, lineno, text, what):
    if not text.endswith("%"):
        fail(path, lineno, "%s is not a percentage: %r" % (what, text))
    return num(path, lineno, text[:-1], what)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


# ---------------------------------------------------------------------------
# kvpage-bench output
# ---------------------------------------------------------------------------

DEVICE_RE = re.compile(
    r"^device: (?P<name>.+), (?P<sms>\d+) SMs, L2 (?P<l2>\d+) MiB \| "
    r"copy bandwidth \(D2D, read\+write\): (?P<copy>[\d.]+) GB/s$")
KVPAGE_RE = re.compile(r"^kvpage (?P<version>\S+) \| (?P<build_info>.*)$")
META_RE = re.compile(r"^#\s*(?P<key>[A-Za-z_]+)\s*:\s*(?P<value>.*)$")
LINEAR_LINE = "block tables: each sequence's blocks adjacent (KVPAGE_BENCH_BLOCK_ORDER=linear)"
FP16_LINE = "cache write input: FP16 (KVPAGE_BENCH_WRITE_INPUT=fp16)"
PRECISE_LINE = "decoders in precise mode (--precise)"
NO_DEVICE_PREFIX = "kvpage-bench: no CUDA device"

# The table headers kvpage-bench has printed: today's, and the one before the
# eager columns were added (its figures are eager times).
HEADER_NOW = ["shape", "B", "KV", "time (us)", "GB/s", "of copy BW", "write GB/s",
              "eager time (us)", "eager write GB/s"]
HEADER_EAGER_ONLY = ["shape", "B", "KV", "time (us)", "GB/s", "of copy BW", "write GB/s"]
CSV_HEADER = ["device", "copy_gbs", "shape", "batch", "kv_dtype", "time_us", "gbs", "fraction",
              "write_gbs", "eager_time_us", "eager_write_gbs"]


class Run:
    def __init__(self, path):
        self.path = path
        self.meta = OrderedDict()
        self.device = None
        self.sms = None
        self.l2_mib = None
        self.copy_gbs = None
        self.version = None
        self.build_info = None
        self.linear_blocks = False
        self.fp16_write_input = False
        self.precise = False  # kvpage-bench --precise: decoders in precise mode
        self.graph_timed = True
        self.rows = []  # dicts: shape, batch, dtype, us, gbs, frac, write_gbs, eager_us

    def label(self):
        parts = []
        if "date" in self.meta:
            parts.append(self.meta["date"])
        if "build" in self.meta:
            parts.append("build " + self.meta["build"])
        return ", ".join(parts) if parts else self.path


def check_row(run, lineno, row):
    if row["dtype"] not in DTYPES:
        fail(run.path, lineno, "unknown KV dtype %r" % row["dtype"])
    if row["batch"] < 1 or row["us"] <= 0 or row["gbs"] <= 0:
        fail(run.path, lineno, "a time, batch or GB/s that is not positive")
    # The fraction is GB/s over the run's copy bandwidth, both rounded when
    # printed: a row that disagrees belongs to another run or is garbled.
    expect = 100.0 * row["gbs"] / run.copy_gbs
    slack = 100.0 * 0.5 / run.copy_gbs + 100.0 * row["gbs"] * 0.5 / run.copy_gbs ** 2 + 0.051
    if abs(expect - row["frac"]) > slack:
        fail(run.path, lineno, "of copy BW %.1f%% does not match GB/s %.0f / copy bandwidth %.0f"
             " (%.2f%%)" % (row["frac"], row["gbs"], run.copy_gbs, expect))
    for r in run.rows:
        if (r["shape"], r["batch"], r["dtype"]) == (row["shape"], row["batch"], row["dtype"]):
            fail(run.path, lineno, "%s B=%d %s appears twice" % (row["shape"], row["batch"],
                                                                row["dtype"]))


def parse_bench_text(path, text):
    run = Run(path)
    header = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        m = META_RE.match(line)
        if m and header is None and run.device is None:
            run.meta[m.group("key").lower()] = m.group("value").strip()
            continue
        if line.startswith(NO_DEVICE_PREFIX):
            fail(path, lineno, "kvpage-bench found no CUDA device: nothing was measured")
        m = DEVICE_RE.match(line)
        if m:
            if run.device is not None:
                fail(path, lineno, "a second device line: one kvpage-bench run per file")
            run.device = m.group("name")
            run.sms = int(m.group("sms"))
            run.l2_mib = int(m.group("l2"))
            run.copy_gbs = float(m.group("copy"))
            if run.copy_gbs <= 0:
                fail(path, lineno, "copy bandwidth is not positive")
            continue
        m = KVPAGE_RE.match(line)
        if m and run.device is not None and header is None:
            run.version = m.group("version")
            run.build_info = m.group("build_info")
            continue
        if line == LINEAR_LINE and header is None:
            run.linear_blocks = True
            continue
        if line == FP16_LINE and header is None:
            run.fp16_write_input = True
            continue
        if line == PRECISE_LINE and header is None:
            run.precise = True
            continue
        if line.startswith("|"):
            c = cells(line)
            if header is None:
                if run.device is None:
                    fail(path, lineno, "a table before the device line")
                if c == HEADER_NOW:
                    header = HEADER_NOW
                elif c == HEADER_EAGER_ONLY:
                    header = HEADER_EAGER_ONLY
                    run.graph_timed = False
                else:
                    fail(path, lineno, "not a kvpage-bench table header: %r" % line)
                continue
            if all(re.fullmatch(r":?-+:?", x) for x in c):
                continue
            if len(c) != len(header):
                fail(path, lineno, "%d columns where the header has %d (a truncated row?)"
                     % (len(c), len(header)))
            row = {
                "shape": c[0],
                "batch": int(num(path, lineno, c[1], "B")),
                "dtype": c[2],
                "us": num(path, lineno, c[3], "time"),
                "gbs": num(path, lineno, c[4], "GB/s"),
                "frac": pct(path, lineno, c[5], "of copy BW"),
                "write_gbs": num(path, lineno, c[6], "write GB/s"),
                "eager_us": num(path, lineno, c[7], "eager time") if len(c) > 7 else None,
            }
            check_row(run, lineno, row)
            run.rows.append(row)
            continue
        fail(path, lineno, "not kvpage-bench output: %r" % line)
    if run.device is None:
        fail(path, 0, "no device line (\"device: ..., N SMs, L2 M MiB | copy bandwidth ...\")")
    if not run.rows:
        fail(path, 0, "no measurements (no table rows)")
    return run


def parse_bench_csv(path, text):
    run = Run(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header != CSV_HEADER:
        fail(path, 1, "not kvpage-bench's CSV header")
    for lineno, c in enumerate(reader, 2):
        if not c:
            continue
        if len(c) != len(CSV_HEADER):
            fail(path, lineno, "%d fields where the header has %d" % (len(c), len(CSV_HEADER)))
        device, copy_gbs = c[0], num(path, lineno, c[1], "copy_gbs")
        if run.device is None:
            run.device, run.copy_gbs = device, copy_gbs
        elif (device, copy_gbs) != (run.device, run.copy_gbs):
            fail(path, lineno, "a second device or copy bandwidth: one run per file")
        row = {
            "shape": c[2],
            "batch": int(num(path, lineno, c[3], "batch")),
            "dtype": c[4],
            "us": num(path, lineno, c[5], "time_us"),
            "gbs": num(path, lineno, c[6], "gbs"),
            "frac": 100.0 * num(path, lineno, c[7], "fraction"),
            "write_gbs": num(path, lineno, c[8], "write_gbs"),
            "eager_us": num(path, lineno, c[9], "eager_time_us"),
        }
        check_row(run, lineno, row)
        run.rows.append(row)
    if not run.rows:
        fail(path, 0, "no measurements")
    return run


def parse_bench(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    first = next((l for l in text.splitlines() if l.strip() and not l.startswith("#")), "")
    if first.startswith("device,copy_gbs,"):
        body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
        run = parse_bench_csv(path, body)
        for l in text.splitlines():
            m = META_RE.match(l)
            if m:
                run.meta[m.group("key").lower()] = m.group("value").strip()
        return run
    return parse_bench_text(path, text)


# ---------------------------------------------------------------------------
# bench/compare_torch.py output
# ---------------------------------------------------------------------------

PEER_HEADER = ["shape", "B", "implementation", "time (us)", "GB/s", "of copy BW",
               "speed-up vs fastest PyTorch", "rel-L2 error", "check"]
PEER_DEVICE_RE = re.compile(r"^device: (?P<name>.+), (?P<sms>\d+) SMs, L2 (?P<l2>\d+) MiB$")
PEER_COPY_RE = re.compile(r"^copy bandwidth \(D2D 1 GiB, read\+write\): (?P<copy>[\d.]+) GB/s$")
PEER_TORCH_RE = re.compile(r"^torch \S+, CUDA .*$")
PEER_KVPAGE_RE = re.compile(r"^kvpage \S+ \(.*\) \| .*$")
# Lines compare_torch.py prints to stdout besides its table.
PEER_NOISE_RE = re.compile(r"^(  \S.*|total [\d.]+ s|plot: .*|no plot: .*|note: .*|"
                           r"compare_torch: .*)$")


class Peers:
    def __init__(self, path):
        self.path = path
        self.meta = OrderedDict()
        self.device = None
        self.env = []
        self.copy_gbs = None
        self.rows = []


def parse_peers(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    p = Peers(path)
    tables = []  # (env lines, rows) of each table; compare_torch prints its last one in full
    env, rows, in_table = [], None, False
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        m = META_RE.match(line)
        if m and not tables and rows is None and not env:
            p.meta[m.group("key").lower()] = m.group("value").strip()
            continue
        if not line.strip():
            if in_table:
                tables.append((env, rows))
                env, rows, in_table = [], None, False
            continue
        if line.startswith("|"):
            c = cells(line)
            if not in_table:
                if c != PEER_HEADER:
                    fail(path, lineno, "not a compare_torch.py table header: %r" % line)
                in_table, rows = True, []
                continue
            if all(re.fullmatch(r":?-+:?", x) for x in c):
                continue
            if len(c) != len(PEER_HEADER):
                fail(path, lineno, "%d columns where the header has %d" % (len(c), len(PEER_HEADER)))
            rows.append((lineno, c))
            continue
        if in_table:
            tables.append((env, rows))
            env, rows, in_table = [], None, False
        if (PEER_DEVICE_RE.match(line) or PEER_COPY_RE.match(line) or PEER_TORCH_RE.match(line)
                or PEER_KVPAGE_RE.match(line)):
            if PEER_DEVICE_RE.match(line):
                env = []
            env.append((lineno, line))
            continue
        if PEER_NOISE_RE.match(line):
            continue
        fail(path, lineno, "not compare_torch.py output: %r" % line)
    if in_table:
        tables.append((env, rows))
    if not tables:
        fail(path, 0, "no compare_torch.py table")
    env, rows = tables[-1]
    if not env:
        # compare_torch.md and stdout print the environment above the table;
        # take the latest one printed before it.
        for e, _ in reversed(tables):
            if e:
                env = e
                break
    for lineno, line in env:
        m = PEER_DEVICE_RE.match(line)
        if m:
            p.device = m.group("name")
        m = PEER_COPY_RE.match(line)
        if m:
            p.copy_gbs = float(m.group("copy"))
        if PEER_TORCH_RE.match(line) or PEER_KVPAGE_RE.match(line):
            p.env.append(line)
    if p.device is None:
        fail(path, 0, "no device line above the table")
    if p.copy_gbs is None:
        fail(path, 0, "no copy bandwidth line above the table")
    for lineno, c in rows:
        impl = c[2]
        if not (impl.startswith("torch ") or impl.startswith("kvpage ")):
            fail(path, lineno, "unknown implementation %r" % impl)
        row = {"shape": c[0], "batch": int(num(path, lineno, c[1], "B")), "impl": impl,
               "check": c[8]}
        if c[3] == "-":
            if not (c[8].startswith("n/a") or c[8] in ("error", "FAILED check")):
                fail(path, lineno, "no time and no n/a, error or FAILED check status")
            row["us"] = None
        else:
            row["us"] = num(path, lineno, c[3], "time")
            if row["us"] <= 0:
                fail(path, lineno, "time is not positive")
        row["err"] = None if c[7] == "-" else num(path, lineno, c[7], "rel-L2 error")
        row["speedup"] = None if c[6] == "-" else num(path, lineno, c[6].rstrip("x"), "speed-up")
        row["lineno"] = lineno
        if impl.startswith("kvpage ") and impl.split()[1] not in DTYPES:
            fail(path, lineno, "unknown kvpage dtype in %r" % impl)
        p.rows.append(row)
    if not p.rows:
        fail(path, 0, "an empty compare_torch.py table")
    # The printed speed-ups are the fastest PyTorch time of the shape over
    # the row's: a row that disagrees belongs to another table or is garbled.
    groups = OrderedDict()
    for r in p.rows:
        groups.setdefault((r["shape"], r["batch"]), []).append(r)
    for rs in groups.values():
        torch_us = [r["us"] for r in rs if r["impl"].startswith("torch ") and r["us"] is not None]
        for r in rs:
            if r["speedup"] is None or r["us"] is None:
                continue
            if not torch_us:
                fail(path, r["lineno"], "a speed-up without a PyTorch time to compare with")
            expect = min(torch_us) / r["us"]
            if abs(expect - r["speedup"]) > 0.006 + 0.0006 * expect:
                fail(path, r["lineno"], "speed-up %.2fx does not match the times (%.3fx)"
                     % (r["speedup"], expect))
    return p


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

def fmt_us(us):
    return "%.1f" % us


def shape_key(shape, batch, order):
    return (order.setdefault(shape, len(order)), batch)


def device_section(device, runs, out):
    out.append("## %s" % device)
    out.append("")
    for r in runs:
        desc = []
        if "date" in r.meta:
            desc.append("measured %s" % r.meta["date"])
        else:
            desc.append("date not recorded in %s" % r.path)
        if "build" in r.meta:
            desc.append("build %s" % r.meta["build"])
        if r.version:
            desc.append("kvpage %s" % r.version)
        hw = []
        if r.sms is not None:
            hw.append("%d SMs, L2 %d MiB" % (r.sms, r.l2_mib))
        hw.append("copy bandwidth %.0f GB/s (1 GiB device-to-device, read + write, same run)"
                  % r.copy_gbs)
        out.append("- %s; %s; raw output: [%s](%s)." % (
            ", ".join(desc), ", ".join(hw), r.path.split("/")[-1], rel_link(r.path)))
        if r.build_info:
            out.append("  Build: `%s`." % r.build_info)
        if "command" in r.meta:
            out.append("  Command: `%s`." % r.meta["command"])
        if r.linear_blocks:
            out.append("  **Block tables: each sequence's blocks adjacent** "
                       "(`KVPAGE_BENCH_BLOCK_ORDER=linear`), not a shuffled pool.")
        if r.fp16_write_input:
            out.append("  Cache write input: FP16 (`KVPAGE_BENCH_WRITE_INPUT=fp16`).")
        if not r.graph_timed:
            out.append("  **Times are eager** (one call between two events, host launch "
                       "included): this run predates the graph timing.")
        if "note" in r.meta:
            out.append("")
            out.append("> %s" % r.meta["note"])
    out.append("")
    many = len(runs) > 1
    order = OrderedDict()
    rows = []
    for i, r in enumerate(runs):
        for row in r.rows:
            rows.append((shape_key(row["shape"], row["batch"], order), i, row))
    rows.sort(key=lambda t: (t[0], DTYPES.index(t[2]["dtype"])))

    # At a glance: one row a shape and batch, one column a dtype.
    dts = [d for d in DTYPES if any(t[2]["dtype"] == d for t in rows)]
    out.append("Decode, time per call (us) and fraction of the copy bandwidth:")
    out.append("")
    out.append("| shape | B | " + " | ".join(d.upper() for d in dts) + " |")
    out.append("| --- | --- | " + " | ".join("---" for _ in dts) + " |")
    seen = OrderedDict()
    for key, i, row in rows:
        seen.setdefault((row["shape"], row["batch"]), {})[row["dtype"]] = row
    for (shape, batch), by in seen.items():
        cells_ = []
        for d in dts:
            r = by.get(d)
            cells_.append("%s (%.1f%%)" % (fmt_us(r["us"]), r["frac"]) if r else "—")
        out.append("| %s | %d | %s |" % (shape, batch, " | ".join(cells_)))
    out.append("")

    out.append("Every case:")
    out.append("")
    head = ["shape", "B", "KV", "time (us)", "GB/s", "of copy BW", "eager time (us)",
            "write GB/s", "write, of copy BW"]
    if many:
        head.append("run")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + " --- |" * len(head))
    for key, i, row in rows:
        run = runs[i]
        c = [row["shape"], "%d" % row["batch"], row["dtype"], fmt_us(row["us"]),
             "%.0f" % row["gbs"], "%.1f%%" % row["frac"],
             "—" if row["eager_us"] is None else fmt_us(row["eager_us"]),
             "%.0f" % row["write_gbs"], "%.1f%%" % (100.0 * row["write_gbs"] / run.copy_gbs)]
        if many:
            c.append("%d" % (i + 1))
        out.append("| " + " | ".join(c) + " |")
    if many:
        out.append("")
        for i, r in enumerate(runs):
            out.append("Run %d: %s (copy bandwidth %.0f GB/s)." % (i + 1, r.label(), r.copy_gbs))
    out.append("")


def precise_section(device, runs, precise_runs, out):
    """Precise mode's cost: its time beside the default decoder's, per case."""
    default = {}
    for r in runs:
        for row in r.rows:
            default[(row["shape"], row["batch"], row["dtype"])] = row
    out.append("### Precise mode")
    out.append("")
    out.append("Decoders with `kvp_decode_config.precise = 1` (FP32 from end to end, the "
               "CUDA-core kernel; include/kvpage/kvpage.h), `kvpage-bench --precise`, "
               "against the default decoders above:")
    out.append("")
    for r in precise_runs:
        out.append("- %s; raw output: [%s](%s)." % (r.label(), r.path.split("/")[-1],
                                                   rel_link(r.path)))
    out.append("")
    out.append("| shape | B | KV | precise (us) | default (us) | precise / default |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for r in precise_runs:
        for row in r.rows:
            d = default.get((row["shape"], row["batch"], row["dtype"]))
            out.append("| %s | %d | %s | %s | %s | %s |" % (
                row["shape"], row["batch"], row["dtype"], fmt_us(row["us"]),
                "—" if d is None else fmt_us(d["us"]),
                "—" if d is None else "%.2fx" % (row["us"] / d["us"])))
    out.append("")


def peers_section(p, out):
    out.append("### Against PyTorch on the %s" % p.device)
    out.append("")
    desc = []
    if "date" in p.meta:
        desc.append("measured %s" % p.meta["date"])
    if "build" in p.meta:
        desc.append("build %s" % p.meta["build"])
    desc.append("copy bandwidth %.0f GB/s (same run)" % p.copy_gbs)
    out.append("`bench/compare_torch.py`, %s; raw output: [%s](%s)." % (
        ", ".join(desc), p.path.split("/")[-1], rel_link(p.path)))
    if "command" in p.meta:
        out.append("Command: `%s`." % p.meta["command"])
    for e in p.env:
        out.append("`%s`." % e)
    if "note" in p.meta:
        out.append("")
        out.append("> %s" % p.meta["note"])
    out.append("")
    out.append("PyTorch reads dense, contiguous BF16 K/V; kvpage reads its paged cache "
               "(blocks shuffled in the pool). Each implementation's output is checked "
               "against float64 attention before it is timed. Time in us; in brackets, the "
               "fastest PyTorch path's time over kvpage's (above 1: kvpage is faster).")
    out.append("")
    order = OrderedDict()
    groups = OrderedDict()
    for r in p.rows:
        groups.setdefault((r["shape"], r["batch"]), []).append(r)
        order.setdefault(r["shape"], len(order))
    dts = [d for d in DTYPES if any(r["impl"] == "kvpage " + d for r in p.rows)]
    out.append("| shape | B | fastest PyTorch (us) | " +
               " | ".join("kvpage %s" % d.upper() for d in dts) + " |")
    out.append("| --- | --- | --- | " + " | ".join("---" for _ in dts) + " |")
    failed = []
    for (shape, batch), rs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        torch_rows = [r for r in rs if r["impl"].startswith("torch ") and r["us"] is not None]
        fastest = min(torch_rows, key=lambda r: r["us"]) if torch_rows else None
        c = ["%s %s" % (fmt_us(fastest["us"]), "(%s)" % fastest["impl"][len("torch "):])
             if fastest else "—"]
        for d in dts:
            k = next((r for r in rs if r["impl"] == "kvpage " + d), None)
            if k is not None and k["check"] != "ok":
                failed.append("%s B=%d kvpage %s: %s" % (shape, batch, d, k["check"]))
            if k is None or k["us"] is None:
                c.append("—")
                continue
            c.append("%s (%.2fx)" % (fmt_us(k["us"]), fastest["us"] / k["us"]) if fastest
                     else fmt_us(k["us"]))
        out.append("| %s | %d | %s |" % (shape, batch, " | ".join(c)))
    out.append("")
    na = sorted({r["impl"][len("torch "):] + ": " + r["check"] for r in p.rows
                 if r["impl"].startswith("torch ") and r["us"] is None})
    if na:
        out.append("PyTorch paths that could not run a shape: " + "; ".join(na) + ".")
        out.append("")
    if failed:
        out.append("**kvpage rows that failed their accuracy check:** " + "; ".join(failed) + ".")
        out.append("")


def rel_link(path):
    # The page lives in docs/; inputs usually in docs/perf/.
    p = path.replace("\\", "/")
    if p.startswith("./"):
        p = p[2:]
    if p.startswith("docs/"):
        return p[len("docs/"):]
    return "../" + p if not p.startswith("/") else p


METHOD = """\
## Method

**What is timed.** `kvpage-bench` (bench/kvpage_bench.cc) decodes with BF16
queries and outputs over a cache of block size 16 whose K and V have the
same dtype, for the shapes below. Each sequence's blocks are drawn from a
shuffled pool, as an engine's pool looks after a while. The cache has
enough layers that consecutive calls rotate through more than 4x the L2,
so no call finds its K/V in L2.

- **time (us)**: a call's share of a CUDA graph replay. The graph holds at
  least 16 calls, cycling through the layers; each sample replays it back
  to back until at least 32 calls have run; the median of 15 samples
  (11 with `--quick`). This is how an engine replays its decode step: no host launch
  latency between calls. The GB/s and fraction columns use this time.
- **eager time (us)**: one call between two CUDA events, the host's launch
  of its kernels included; median of 60 calls (20 with `--quick`) after
  10 warm-ups.
- **write GB/s**: one `kvp_cache_write` of 65,536 tokens (every KV head;
  fewer where the shape has fewer tokens) from BF16 K/V, timed in a graph
  the same way. The timed writes rotate their destinations through (layer,
  chunk) pairs and their inputs through copies of the chunk, each set
  larger than 4x the L2 where the cache allows, so each write reads its
  input from memory and writes lines no recent call left in L2.

**What bytes count.** A decode: K, V and scales of every attended token,
read once (`bytes_per_token_per_layer` x tokens; at head size 128 a token
and KV head is 512 bytes in BF16/FP16, 260 in FP8/INT8, 136 in INT4). The
queries, outputs, block tables and the split-K partials are not counted.
A write: the 16-bit input read plus the cache bytes written (codes and
scales). **Copy bandwidth**: a 1 GiB device-to-device `cudaMemcpyAsync`,
read + write bytes, median of 50, measured at the start of the same run;
every fraction is against it, so a fraction above 100% means the decode
reads faster than the copy engine moves data (a read-only kernel can).

**Shapes.** "seed GQA 8/1 T=8192 D=128": 8 query heads on 1 KV head, every
sequence 8192 tokens, head size 128, B sequences. "MHA 32/32 T=4096":
32 query and 32 KV heads. "GQA 32/8", "GQA 8/4", "GQA 8/2": query / KV
heads at 8192 tokens. "ragged 32/8 log-uniform 16..32768": 256 sequences
whose lengths are drawn log-uniformly from 16 to 32768 tokens (a fixed
draw, the same in every run).

**Reproduce.** On a GPU machine, from the repository root:

```sh
bash scripts/stage_gpu.sh        # Release build for sm_90a (KVPAGE_CUDA_ARCHS=...), staged in .gpu/
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  echo "# command: LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench"
  LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench; } > docs/perf/h100-kvpage-bench.txt
# against PyTorch (needs torch with CUDA):
KVPAGE_LIBRARY=.gpu/libkvpage.so PYTHONPATH=bindings/python \\
  python3 bench/compare_torch.py --out out/compare_torch
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  cat out/compare_torch/compare_torch.md; } > docs/perf/h100-compare-torch.txt
python3 scripts/perf_page.py docs/perf/h100-kvpage-bench.txt \\
  --peers docs/perf/h100-compare-torch.txt -o docs/PERFORMANCE.md
```

In a normal build the benchmark is `build/bench/kvpage-bench`. Its options
(`--shapes`, `--dtypes`, `--quick`, `--csv`) and the measurement switches
(`KVPAGE_BENCH_*`) are in bench/README.md; a run made with a switch says
so in its header, and this page repeats it. Figures move by about 1%
between runs of one build on one machine and by up to 3% between machines
of the same kind: compare builds only within one device call.
"""


def render(runs, peers):
    out = ["# Performance", ""]
    out.append("<!-- Generated by scripts/perf_page.py from %s; do not edit by hand. -->"
               % ", ".join(r.path for r in runs + peers))
    out.append("")
    out.append("What kvpage's CUDA decode and cache write measure today: the numbers of the "
               "latest `kvpage-bench` run on each device, with the method below. How the "
               "kernels got here, and what was tried and not kept: [archive.md](archive.md). "
               "Which kernel runs where, and why: [DESIGN.md](DESIGN.md).")
    out.append("")
    by_device = OrderedDict()
    precise_by_device = OrderedDict()
    for r in runs:
        (precise_by_device if r.precise else by_device).setdefault(r.device, []).append(r)
    peers_by_device = OrderedDict()
    for p in peers:
        peers_by_device.setdefault(p.device, []).append(p)
    for device in list(by_device) + [d for d in peers_by_device if d not in by_device]:
        if device in by_device:
            dup = {}
            for r in by_device[device]:
                for row in r.rows:
                    k = (row["shape"], row["batch"], row["dtype"])
                    if k in dup:
                        raise ParseError("%s and %s: %s B=%d %s measured in both for %s; pass one"
                                         % (dup[k], r.path, k[0], k[1], k[2], device))
                    dup[k] = r.path
            device_section(device, by_device[device], out)
            if device in precise_by_device:
                precise_section(device, by_device[device], precise_by_device[device], out)
        else:
            out.append("## %s" % device)
            out.append("")
        for p in peers_by_device.get(device, []):
            peers_section(p, out)
    out.append(METHOD)
    return "\n".join(out).rstrip() + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="raw kvpage-bench output files (text or --csv)")
    ap.add_argument("--peers", action="append", default=[],
                    help="bench/compare_torch.py output (stdout or compare_torch.md)")
    ap.add_argument("-o", "--output", help="write the page here instead of stdout")
    args = ap.parse_args(argv)
    try:
        runs = [parse_bench(p) for p in args.runs]
        peers = [parse_peers(p) for p in args.peers]
        page = render(runs, peers)
    except (ParseError, OSError, UnicodeDecodeError) as e:
        print("perf_page.py: %s" % e, file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
