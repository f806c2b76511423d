#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes docs/PERFORMANCE.md from raw kvpage-bench output.

usage: python3 scripts/perf_page.py RUN.txt [RUN.txt ...]
           [--peers COMPARE_TORCH.txt ...] [--attend ATTEND_RUN.txt ...]
           [--attend-peers COMPARE_TORCH_ATTEND.txt ...] [--pack PACK_RUN.txt ...]
           [--transfer DISAGGREGATED.txt ...] [-o docs/PERFORMANCE.md]

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

`--attend` takes what `kvpage-bench --attend` prints (the kvp_attend cases
alone, with the same metadata lines), `--attend-peers` what
`bench/compare_torch.py --attend` prints (its stdout, or the
compare_torch_attend.md it writes); each device then gets a section
"Attention over query chunks (kvp_attend)": time and TFLOP/s per case and
KV dtype, the mixed batch (d) against its parts, and TFLOP/s against the
fastest PyTorch path. At most one of each per device; without them the
page has no such section and its method no attend paragraph.

`--pack` takes what `kvpage-bench --pack` prints (kvp_cache_pack and
kvp_cache_unpack of one sequence, with the same metadata lines),
`--transfer` what `kvpage-disaggregated --bench` prints
(examples/disaggregated: the sequence moved between two GPUs through NCCL,
against NCCL alone). The transfer names no device: its `# command:` line
must name the machine kind, e.g. "(nvidia-h100-x2)", whose GPU model
(H100) picks the device. Each device then gets a section "Moving KV
between caches (kvp_cache_pack / kvp_cache_unpack)" after the query-chunk
one, with each table's targets beside its numbers. At most one of each per
device.

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


def is_rule(c):
    """The cells of a table's |---| line."""
    return all(re.fullmatch(r":?-+:?", x) for x in c)


TRUNCATED = " (a truncated row?)"


def check_width(path, lineno, c, header, hint=""):
    """Row cells c have the header's columns."""
    if len(c) != len(header):
        fail(path, lineno, "%d columns where the header has %d%s" % (len(c), len(header), hint))


def take_meta(out, line):
    """A metadata line ("# key: value") into out.meta; True if it is one."""
    m = META_RE.match(line)
    if m:
        out.meta[m.group("key").lower()] = m.group("value").strip()
    return m is not None


def check_once(path, lineno, rows, row, keys):
    """No earlier row has row's values of `keys` (strings)."""
    k = tuple(row[x] for x in keys)
    for r in rows:
        if tuple(r[x] for x in keys) == k:
            fail(path, lineno, "%s appears twice (line %d)" % (" ".join(k), r["lineno"]))


def check_derived(path, lineno, got, got_err, expect, rel_err, msg):
    """A printed figure `got`, rounded to within got_err, is `expect`,
    computed from other printed figures whose rounding makes up to rel_err
    of it (relative errors add up through products and quotients): a row
    that disagrees belongs to another run or is garbled; fail with msg."""
    if abs(expect - got) > got_err + abs(expect) * rel_err + 1e-9:
        fail(path, lineno, msg)


class Output(object):
    """A parsed file: its path, metadata lines, device and table rows."""

    def __init__(self, path):
        self.path = path
        self.meta = OrderedDict()
        self.device = None
        self.rows = []


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


class BenchOutput(Output):
    """What kvpage-bench prints above its tables (device, build, switches)."""

    def __init__(self, path):
        Output.__init__(self, path)
        self.sms = None
        self.l2_mib = None
        self.version = None
        self.build_info = None
        self.linear_blocks = False
        self.fp16_write_input = False
        self.precise = False  # kvpage-bench --precise: decoders in precise mode


def check_no_device(path, lineno, line):
    if line.startswith(NO_DEVICE_PREFIX):
        fail(path, lineno, "kvpage-bench found no CUDA device: nothing was measured")


def take_device(run, lineno, line):
    """kvpage-bench's device line into run; its match, or None."""
    m = DEVICE_RE.match(line)
    if m:
        if run.device is not None:
            fail(run.path, lineno, "a second device line: one kvpage-bench run per file")
        run.device = m.group("name")
        run.sms = int(m.group("sms"))
        run.l2_mib = int(m.group("l2"))
    return m


def take_bench_header(run, line, repeat_version=False):
    """A line kvpage-bench prints after its device line, above its tables
    (version and build, the measurement switches) into run; True if it is
    one. repeat_version: a second version line replaces the first (decode
    runs take it; --attend runs do not)."""
    m = KVPAGE_RE.match(line)
    if m and run.device is not None and (run.version is None or repeat_version):
        run.version = m.group("version")
        run.build_info = m.group("build_info")
        return True
    flags = {LINEAR_LINE: "linear_blocks", FP16_LINE: "fp16_write_input",
             PRECISE_LINE: "precise"}
    if line in flags:
        setattr(run, flags[line], True)
        return True
    return False


class Run(BenchOutput):
    def __init__(self, path):
        BenchOutput.__init__(self, path)
        self.copy_gbs = None
        self.graph_timed = True
        # rows: dicts: shape, batch, dtype, us, gbs, frac, write_gbs, eager_us

    def label(self):
        parts = []
        if "date" in self.meta:
            parts.append(self.meta["date"])
        if "build" in self.meta:
            parts.append("build " + self.meta["build"])
        return ", ".join(parts) if parts else self.path


def check_copy_frac(path, lineno, frac, gbs, gbs_err, copy_gbs, what="of copy BW",
                    gbs_what=None):
    """A fraction of the copy bandwidth (printed %.1f%%) is GB/s over the
    run's copy bandwidth (printed %.0f): GB/s as printed (gbs_err 0.5) or
    as computed from the printed bytes and time (gbs_err its rounding,
    gbs_what how it was computed)."""
    expect = 100.0 * gbs / copy_gbs
    check_derived(path, lineno, frac, 0.051, expect, gbs_err / gbs + 0.5 / copy_gbs,
                  "%s %.1f%% does not match %s / copy bandwidth %.0f (%.2f%%)"
                  % (what, frac, gbs_what or "GB/s %.0f" % gbs, copy_gbs, expect))


def check_row(run, lineno, row):
    if row["dtype"] not in DTYPES:
        fail(run.path, lineno, "unknown KV dtype %r" % row["dtype"])
    if row["batch"] < 1 or row["us"] <= 0 or row["gbs"] <= 0:
        fail(run.path, lineno, "a time, batch or GB/s that is not positive")
    check_copy_frac(run.path, lineno, row["frac"], row["gbs"], 0.5, run.copy_gbs)
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
        if header is None and run.device is None and take_meta(run, line):
            continue
        check_no_device(path, lineno, line)
        m = take_device(run, lineno, line)
        if m:
            run.copy_gbs = float(m.group("copy"))
            if run.copy_gbs <= 0:
                fail(path, lineno, "copy bandwidth is not positive")
            continue
        if header is None and take_bench_header(run, line, repeat_version=True):
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
            if is_rule(c):
                continue
            check_width(path, lineno, c, header, TRUNCATED)
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
        if line.startswith(ATTEND_INTRO_PREFIX):
            fail(path, lineno, "kvp_attend cases (kvpage-bench --attend or --all): pass a "
                 "--attend run with --attend, its decode cases as RUN")
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
            take_meta(run, l)
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


class PeersOutput(Output):
    """compare_torch.py's: the environment lines above the table (torch,
    kvpage) and, --attend only, how kvpage reached kvp_attend."""

    def __init__(self, path):
        Output.__init__(self, path)
        self.env = []
        self.via = None


def check_mixed_ratio(path, lineno, mixed, chunk, dec, ratio):
    """A mixed batch's printed ratio is its time over the chunk's and the
    decode's: within the ratio's own rounding (0.005) and that of the three
    times (0.05 us each) it was computed from before they were printed."""
    expect = mixed / (chunk + dec)
    if abs(expect - ratio) > 0.005 + 0.05 / mixed + 0.1 * expect / (chunk + dec) + 1e-9:
        fail(path, lineno, "ratio %.2f does not match the times (%.4f)" % (ratio, expect))


def check_speedups(path, groups):
    """The printed speed-ups are the fastest PyTorch time of the group over
    the row's: a row that disagrees belongs to another table or is garbled."""
    for rs in groups:
        torch_us = [r["us"] for r in rs if r["torch"] and r["us"] is not None]
        for r in rs:
            if r["speedup"] is None or r["us"] is None:
                continue
            if not torch_us:
                fail(path, r["lineno"], "a speed-up without a PyTorch time to compare with")
            expect = min(torch_us) / r["us"]
            if abs(expect - r["speedup"]) > 0.006 + 0.0006 * expect:
                fail(path, r["lineno"], "speed-up %.2fx does not match the times (%.3fx)"
                     % (r["speedup"], expect))


class Peers(PeersOutput):
    def __init__(self, path):
        PeersOutput.__init__(self, path)
        self.copy_gbs = None


def parse_peers(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    p = Peers(path)
    tables = []  # (env lines, rows) of each table; compare_torch prints its last one in full
    env, rows, in_table = [], None, False
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not tables and rows is None and not env and take_meta(p, line):
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
            if is_rule(c):
                continue
            check_width(path, lineno, c, PEER_HEADER)
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
        if line.startswith(APEER_INTRO_PREFIX) or APEER_VIA_RE.match(line):
            fail(path, lineno, "kvp_attend cases (compare_torch.py --attend or --all): pass "
                 "a --attend run with --attend-peers, its decode shapes with --peers")
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
               "torch": impl.startswith("torch "), "check": c[8]}
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
    groups = OrderedDict()
    for r in p.rows:
        groups.setdefault((r["shape"], r["batch"]), []).append(r)
    check_speedups(path, groups.values())
    return p


# ---------------------------------------------------------------------------
# kvpage-bench --attend output
# ---------------------------------------------------------------------------

ATTEND_INTRO_RE = re.compile(
    r"^kvp_attend over query chunks: TFLOP/s = 4 \* Hq \* D \* \(keys visible to every query "
    r"token, causal\) / time; peak = (?P<peak>[\d.]+) TFLOP/s \((?P<peak_what>[^)]+)\); the "
    r"K/V writes are not timed$")
ATTEND_INTRO_PREFIX = "kvp_attend over query chunks:"
ATTEND_HEADER = ["case", "heads q/kv", "seqs", "query tokens", "context", "KV", "time (us)",
                 "TFLOP/s", "of peak", "eager time (us)", "outputs"]
ATTEND_MIXED_LINE = "mixed batch (d): time(mixed) / (time(chunk alone) + time(decode alone))"
ATTEND_MIXED_HEADER = ["shape", "KV", "mixed (us)", "chunk alone (us)",
                       "decode alone, kvp_attend (us)", "decode alone, kvp_decode (us)",
                       "ratio, kvp_attend decode", "ratio, kvp_decode decode"]
ATTEND_CSV_RE = re.compile(r"^attend rows: \S.*$")
ATTEND_SKIPPED_PREFIX = "attend cases skipped:"
HEADS_RE = re.compile(r"^(?P<hq>\d+)/(?P<hkv>\d+)$")
SHAPE_HEADS_RE = re.compile(r"(?P<hq>\d+)/(?P<hkv>\d+)")
# The (d) cases, by kvpage-bench's names (AttendCases in bench/kvpage_bench.cc).
MIXED_PREFIX = "d mixed "
CHUNK_PREFIX = "d chunk alone "
DECODE_PREFIX = "d decode alone "


class AttendRun(BenchOutput):
    def __init__(self, path):
        BenchOutput.__init__(self, path)
        self.peak = None
        self.peak_what = None
        # rows: dicts: case, heads, hq, hkv, seqs, q_tokens, context, dtype, us, ...
        self.mixed = []  # dicts: shape, heads, dtype, mixed, chunk, dec_attend, dec_decode, ...


def flops_consistent(path, rows, key, what):
    """TFLOP/s x time is the case's FLOP count: the same for every row of one
    key (e.g. a case's KV dtypes), within the rounding of the printed
    figures. A row that disagrees belongs to another case or is garbled."""
    lo, hi, first = OrderedDict(), OrderedDict(), OrderedDict()
    for r in rows:
        if r.get("us") is None or r.get("tflops") is None:
            continue
        k = key(r)
        f = r["tflops"] * r["us"]
        slack = 0.05 / r["tflops"] + 0.05 / r["us"] + 1e-9
        a, b = f * (1 - slack), f * (1 + slack)
        if k not in lo:
            lo[k], hi[k], first[k] = a, b, r
            continue
        lo[k], hi[k] = max(lo[k], a), min(hi[k], b)
        if lo[k] > hi[k]:
            fail(path, r["lineno"], "TFLOP/s x time does not match line %d's: a different %s"
                 % (first[k]["lineno"], what))


def take_peak(out, lineno, m):
    """The peak of an attend table's introduction (its match m) into out."""
    out.peak = num(out.path, lineno, m.group("peak"), "peak")
    out.peak_what = m.group("peak_what")
    if out.peak <= 0:
        fail(out.path, lineno, "peak is not positive")


class AttendTables(object):
    """The two tables of an attend output, the main one and the mixed batch
    (d): who prints them (for messages), their headers and row parsers, and
    the decode table headers that mean a decode run (and what to say)."""

    def __init__(self, who, headers, row_parsers, decode_headers, decode_msg):
        self.who, self.headers, self.row_parsers = who, headers, row_parsers
        self.decode_headers, self.decode_msg = decode_headers, decode_msg


def attend_table_line(out, lineno, line, part, tables):
    """A "|" line of an attend output in part `part`: the header of the
    main table ("intro") or of the mixed batch table ("mixed line"), or a
    row of either. Returns the part after it."""
    path = out.path
    c = cells(line)
    if c in tables.decode_headers:
        fail(path, lineno, tables.decode_msg)
    if part == "intro":
        if c != tables.headers[0]:
            fail(path, lineno, "not %s attend table header: %r" % (tables.who, line))
        return "table"
    if part == "mixed line":
        if c != tables.headers[1]:
            fail(path, lineno, "not %s mixed batch header: %r" % (tables.who, line))
        return "mixed"
    if part not in ("table", "mixed"):
        fail(path, lineno, "a table row out of place: %r" % line)
    if not is_rule(c):
        tables.row_parsers[part == "mixed"](out, lineno, c)
    return part


def parse_heads(path, lineno, text):
    """(hq, hkv) of a "heads q/kv" cell."""
    m = HEADS_RE.match(text)
    if not m:
        fail(path, lineno, "heads q/kv is not N/M: %r" % text)
    return int(m.group("hq")), int(m.group("hkv"))


def shape_heads(path, lineno, shape):
    """"N/M" (query / KV heads) of a mixed batch row's shape."""
    m = SHAPE_HEADS_RE.search(shape)
    if not m:
        fail(path, lineno, "no heads N/M in the shape %r" % shape)
    return "%s/%s" % (m.group("hq"), m.group("hkv"))


def attend_pct_check(path, lineno, tflops, frac, peak):
    expect = 100.0 * tflops / peak
    if abs(expect - frac) > 100.0 * 0.05 / peak + 0.051:
        fail(path, lineno, "of peak %.1f%% does not match TFLOP/s %.1f / peak %.0f (%.2f%%)"
             % (frac, tflops, peak, expect))


def parse_attend(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    run = AttendRun(path)
    part = None  # None, "intro", "table", "mixed line", "mixed", "done"
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        if run.device is None and take_meta(run, line):
            continue
        check_no_device(path, lineno, line)
        if line.startswith(ATTEND_SKIPPED_PREFIX):
            fail(path, lineno, "kvpage-bench skipped the attend cases: %r" % line)
        if take_device(run, lineno, line):
            continue
        if run.device is None:
            fail(path, lineno, "not kvpage-bench --attend output before its device line: %r"
                 % line)
        # The FP16 write input line is taken, not shown: the attend cases
        # write BF16, untimed.
        if part is None and take_bench_header(run, line):
            continue
        m = ATTEND_INTRO_RE.match(line)
        if m and part is None:
            take_peak(run, lineno, m)
            part = "intro"
            continue
        if line == ATTEND_MIXED_LINE and part == "table":
            part = "mixed line"
            continue
        if ATTEND_CSV_RE.match(line) and part in ("table", "mixed"):
            part = "done"  # the CSV kvpage-bench wrote: the same rows
            continue
        if line.startswith("|"):
            part = attend_table_line(run, lineno, line, part, ATTEND_TABLES)
            continue
        fail(path, lineno, "not kvpage-bench --attend output: %r" % line)
    if run.device is None:
        fail(path, 0, "no device line (\"device: ..., N SMs, L2 M MiB | copy bandwidth ...\")")
    if run.peak is None:
        fail(path, 0, "no \"kvp_attend over query chunks: ...\" line: not a --attend run")
    if not run.rows:
        fail(path, 0, "no measurements (no attend table rows)")
    if part == "mixed line":
        fail(path, 0, "the mixed batch line without its table (a truncated run?)")
    flops_consistent(path, run.rows, lambda r: (r["case"], r["heads"]), "case")
    # A run cut short: a case without every KV dtype of the run, or (d)'s
    # parts without the mixed batch table kvpage-bench prints after them.
    dts = set(r["dtype"] for r in run.rows)
    for (case, heads), rows in attend_groups(run.rows).items():
        if set(r["dtype"] for r in rows) != dts:
            fail(path, rows[-1]["lineno"], "%s %s lacks KV dtypes %s of the run (a truncated "
                 "run?)" % (case, heads, ", ".join(sorted(dts - set(r["dtype"] for r in rows)))))
    expect = set()
    for heads in set(r["heads"] for r in run.rows):
        for d in dts:
            names = [r["case"] for r in run.rows if r["heads"] == heads and r["dtype"] == d]
            if (any(n.startswith(MIXED_PREFIX) for n in names)
                    and any(n.startswith(CHUNK_PREFIX) for n in names)
                    and any(n.startswith(DECODE_PREFIX) for n in names)):
                expect.add((heads, d))
    got = set((m["heads"], m["dtype"]) for m in run.mixed)
    mixed_rows_check(path, got, expect, "run")
    return run


def mixed_rows_check(path, got, expect, what):
    """The mixed batch table has a row for each mix whose parts the main
    table has, and no other."""
    if got - expect:
        fail(path, 0, "mixed batch rows without their (d) cases in the table: %s"
             % "; ".join(" ".join(k) for k in sorted(got - expect)))
    if expect - got:
        fail(path, 0, "no mixed batch rows for %s, whose (d) cases the table has (a truncated "
             "%s?)" % ("; ".join(" ".join(k) for k in sorted(expect - got)), what))


def parse_attend_row(run, lineno, c):
    path = run.path
    check_width(path, lineno, c, ATTEND_HEADER, TRUNCATED)
    hq, hkv = parse_heads(path, lineno, c[1])
    row = {
        "case": c[0], "heads": c[1], "hq": hq, "hkv": hkv,
        "seqs": int(num(path, lineno, c[2], "seqs")),
        "q_tokens": int(num(path, lineno, c[3], "query tokens")),
        "context": int(num(path, lineno, c[4], "context")),
        "dtype": c[5],
        "us": num(path, lineno, c[6], "time"),
        "tflops": num(path, lineno, c[7], "TFLOP/s"),
        "frac": pct(path, lineno, c[8], "of peak"),
        "eager_us": num(path, lineno, c[9], "eager time"),
        "lineno": lineno,
    }
    if not row["case"]:
        fail(path, lineno, "an empty case")
    if row["dtype"] not in DTYPES:
        fail(path, lineno, "unknown KV dtype %r" % row["dtype"])
    if min(row["seqs"], row["q_tokens"], row["context"]) < 1:
        fail(path, lineno, "seqs, query tokens or context not positive")
    if row["us"] <= 0 or row["tflops"] <= 0 or row["eager_us"] <= 0:
        fail(path, lineno, "a time or TFLOP/s that is not positive")
    if c[10] != "finite":
        fail(path, lineno, "outputs %r: kvpage-bench failed this case (exit status 1)" % c[10])
    attend_pct_check(path, lineno, row["tflops"], row["frac"], run.peak)
    check_once(path, lineno, run.rows, row, ("case", "heads", "dtype"))
    run.rows.append(row)


def attend_row_us(run, lineno, heads, dtype, match, what):
    hits = [r for r in run.rows if r["heads"] == heads and r["dtype"] == dtype and match(r["case"])]
    if len(hits) != 1:
        fail(run.path, lineno, "%d rows of the %s for %s %s in the table above, not 1"
             % (len(hits), what, heads, dtype))
    return hits[0]["us"]


def parse_attend_mixed_row(run, lineno, c):
    path = run.path
    check_width(path, lineno, c, ATTEND_MIXED_HEADER, TRUNCATED)
    heads = shape_heads(path, lineno, c[0])

    def opt(text, what):
        return None if text == "-" else num(path, lineno, text, what)
    row = {"shape": c[0], "heads": heads, "dtype": c[1],
           "mixed": num(path, lineno, c[2], "mixed"),
           "chunk": num(path, lineno, c[3], "chunk alone"),
           "dec_attend": opt(c[4], "decode alone, kvp_attend"),
           "dec_decode": opt(c[5], "decode alone, kvp_decode"),
           "ratio_attend": opt(c[6], "ratio, kvp_attend decode"),
           "ratio_decode": opt(c[7], "ratio, kvp_decode decode"), "lineno": lineno}
    if row["dtype"] not in DTYPES:
        fail(path, lineno, "unknown KV dtype %r" % row["dtype"])
    # The times are the table's (d) rows, printed the same way; the ratios
    # follow from them.
    checks = [("mixed", lambda n: n.startswith(MIXED_PREFIX), "mixed batch"),
              ("chunk", lambda n: n.startswith(CHUNK_PREFIX), "chunk alone"),
              ("dec_attend", lambda n: n.startswith(DECODE_PREFIX) and n.endswith(" kvp_attend"),
               "decode alone through kvp_attend"),
              ("dec_decode", lambda n: n.startswith(DECODE_PREFIX) and n.endswith(" kvp_decode"),
               "decode alone through kvp_decode")]
    for key, match, what in checks:
        if row[key] is None:
            continue
        us = attend_row_us(run, lineno, heads, row["dtype"], match, what)
        if us != row[key]:
            fail(path, lineno, "%s %.1f us where the table above has %.1f" % (what, row[key], us))
    for dec, ratio in (("dec_attend", "ratio_attend"), ("dec_decode", "ratio_decode")):
        if (row[dec] is None) != (row[ratio] is None):
            fail(path, lineno, "a decode time without its ratio, or a ratio without its time")
        if row[dec] is None:
            continue
        check_mixed_ratio(path, lineno, row["mixed"], row["chunk"], row[dec], row[ratio])
    if row["dec_attend"] is None and row["dec_decode"] is None:
        fail(path, lineno, "no decode alone time")
    check_once(path, lineno, run.mixed, row, ("heads", "dtype"))
    run.mixed.append(row)


ATTEND_TABLES = AttendTables(
    "kvpage-bench's", (ATTEND_HEADER, ATTEND_MIXED_HEADER),
    (parse_attend_row, parse_attend_mixed_row), (HEADER_NOW, HEADER_EAGER_ONLY),
    "a decode table: a kvpage-bench run with decode cases (the default or --all); pass decode "
    "runs as RUN, --attend runs alone")


# ---------------------------------------------------------------------------
# bench/compare_torch.py --attend output
# ---------------------------------------------------------------------------

APEER_INTRO_RE = re.compile(
    r"^kvp_attend cases \(kvpage-bench --attend\): TFLOP/s = 4 \* HQ \* D \* \(keys visible to "
    r"every query token, causal\) / time; peak (?P<peak>[\d.]+) TFLOP/s \((?P<peak_what>[^)]+)\)"
    r"\. .*$")
APEER_INTRO_PREFIX = "kvp_attend cases (kvpage-bench --attend):"
APEER_HEADER = ["case", "heads q/kv", "seqs", "query tokens", "implementation", "time (us)",
                "TFLOP/s", "of peak", "speed-up vs fastest PyTorch",
                "max rel-L2 (sampled tokens)", "check", "note"]
APEER_MIXED_HEADER = ["shape", "implementation", "decode alone by", "mixed (us)",
                      "chunk alone (us)", "decode alone (us)", "ratio"]
# How kvpage reached kvp_attend (stdout only).
APEER_VIA_RE = re.compile(r"^kvpage kvp_attend (through the binding's Decoder\.attend|"
                          r"through ctypes \(the binding has no attend\)|rows: n/a \(.*\))$")
APEER_NOISE_RE = re.compile(r"^no FlexAttention: .*$")
APEER_IMPL_RE = re.compile(r"^(torch \S+|kvpage (?P<dtype>\S+)(?P<dec> \(kvp_decode\))?)$")
APEER_STATUS = ("ok", "n/a", "error", "FAILED check")


class AttendPeers(PeersOutput):
    def __init__(self, path):
        PeersOutput.__init__(self, path)
        self.peak = None
        self.peak_what = None
        self.mixed = []


def parse_attend_peers(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    p = AttendPeers(path)
    env, table_env = [], None
    part = None  # None, "intro", "table", "mixed line", "mixed"
    started = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not started and take_meta(p, line):
            continue
        if not line.strip():
            if part == "table" or part == "mixed":
                part = "after " + part
            continue
        started = True
        if line.startswith("|"):
            part = attend_table_line(p, lineno, line, part, APEER_TABLES)
            continue
        if part in ("table", "mixed"):
            fail(path, lineno, "a table ends without a blank line: %r" % line)
        m = APEER_INTRO_RE.match(line)
        if m:
            if part is not None:
                fail(path, lineno, "a second attend table: one compare_torch.py run per file")
            take_peak(p, lineno, m)
            table_env = env
            part = "intro"
            continue
        if line.startswith(APEER_INTRO_PREFIX):
            fail(path, lineno, "not the attend table's introduction as compare_torch.py "
                 "prints it: %r" % line)
        if line == ATTEND_MIXED_LINE and part == "after table":
            part = "mixed line"
            continue
        if (PEER_DEVICE_RE.match(line) or PEER_COPY_RE.match(line) or PEER_TORCH_RE.match(line)
                or PEER_KVPAGE_RE.match(line)):
            if part is not None:
                fail(path, lineno, "an environment line after the table: %r" % line)
            if PEER_DEVICE_RE.match(line):
                env = []
            env.append((lineno, line))
            continue
        m = APEER_VIA_RE.match(line)
        if m and part is None:
            p.via = line
            continue
        if (PEER_NOISE_RE.match(line) or APEER_NOISE_RE.match(line)) and part is None:
            continue
        fail(path, lineno, "not compare_torch.py --attend output: %r" % line)
    if part is None:
        fail(path, 0, "no compare_torch.py attend table")
    if not p.rows:
        fail(path, 0, "an empty compare_torch.py attend table")
    if part == "mixed line":
        fail(path, 0, "the mixed batch line without its table (a truncated output?)")
    for lineno, line in table_env or env:
        m = PEER_DEVICE_RE.match(line)
        if m:
            p.device = m.group("name")
        if PEER_TORCH_RE.match(line) or PEER_KVPAGE_RE.match(line):
            p.env.append(line)
    if p.device is None:
        fail(path, 0, "no device line above the table")
    check_speedups(path, attend_groups(p.rows).values())
    flops_consistent(path, p.rows, lambda r: (r["case"], r["heads"]), "case")
    # compare_torch.py prints a mixed batch row per implementation whose
    # mix, chunk and decoding part all have times (kvpage's also with its
    # kvp_decode part): a table without them is cut short.
    expect = set()
    for heads in set(r["heads"] for r in p.rows):
        timed = [r for r in p.rows if r["heads"] == heads and r["us"] is not None]

        def has(prefix, impl):
            return any(r["case"].startswith(prefix) and r["impl"] == impl for r in timed)
        for r in timed:
            if not r["case"].startswith(MIXED_PREFIX) or not has(CHUNK_PREFIX, r["impl"]):
                continue
            decs = [r["impl"]] + ([r["impl"] + " (kvp_decode)"] if not r["torch"] else [])
            for dec in decs:
                if has(DECODE_PREFIX, dec):
                    expect.add((heads, r["impl"], dec))
    got = set((m["heads"], m["impl"], m["dec_impl"]) for m in p.mixed)
    mixed_rows_check(path, got, expect, "output")
    return p


def attend_groups(rows):
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["case"], r["heads"]), []).append(r)
    return groups


def parse_attend_peer_row(p, lineno, c):
    path = p.path
    check_width(path, lineno, c, APEER_HEADER)
    hq, hkv = parse_heads(path, lineno, c[1])
    mi = APEER_IMPL_RE.match(c[4])
    if not mi:
        fail(path, lineno, "unknown implementation %r" % c[4])
    if mi.group("dtype") is not None and mi.group("dtype") not in DTYPES:
        fail(path, lineno, "unknown kvpage dtype in %r" % c[4])
    row = {"case": c[0], "heads": c[1], "hq": hq, "hkv": hkv,
           "seqs": int(num(path, lineno, c[2], "seqs")),
           "q_tokens": int(num(path, lineno, c[3], "query tokens")),
           "impl": c[4], "torch": mi.group("dtype") is None, "dtype": mi.group("dtype"),
           "via_decode": mi.group("dec") is not None, "check": c[10], "note": c[11],
           "lineno": lineno}
    if row["check"] not in APEER_STATUS:
        fail(path, lineno, "unknown check status %r" % row["check"])
    timed = [x != "-" for x in (c[5], c[6], c[7])]
    if any(timed) and not all(timed):
        fail(path, lineno, "time, TFLOP/s and of peak: some given, some not")
    if all(timed):
        if row["check"] != "ok":
            fail(path, lineno, "a time with check %r" % row["check"])
        row["us"] = num(path, lineno, c[5], "time")
        row["tflops"] = num(path, lineno, c[6], "TFLOP/s")
        row["frac"] = pct(path, lineno, c[7], "of peak")
        if row["us"] <= 0 or row["tflops"] <= 0:
            fail(path, lineno, "a time or TFLOP/s that is not positive")
        attend_pct_check(path, lineno, row["tflops"], row["frac"], p.peak)
    else:
        if row["check"] == "ok":
            fail(path, lineno, "no time and check ok")
        row["us"] = row["tflops"] = row["frac"] = None
    row["speedup"] = None if c[8] == "-" else num(path, lineno, c[8].rstrip("x"), "speed-up")
    row["err"] = None if c[9] == "-" else num(path, lineno, c[9], "max rel-L2")
    check_once(path, lineno, p.rows, row, ("case", "heads", "impl"))
    p.rows.append(row)


def parse_attend_peer_mixed_row(p, lineno, c):
    path = p.path
    check_width(path, lineno, c, APEER_MIXED_HEADER)
    heads = shape_heads(path, lineno, c[0])
    row = {"shape": c[0], "heads": heads, "impl": c[1], "dec_impl": c[2],
           "mixed": num(path, lineno, c[3], "mixed"), "chunk": num(path, lineno, c[4], "chunk"),
           "dec": num(path, lineno, c[5], "decode alone"),
           "ratio": num(path, lineno, c[6], "ratio"),
           "lineno": lineno}
    for key, prefix, impl in (("mixed", MIXED_PREFIX, c[1]), ("chunk", CHUNK_PREFIX, c[1]),
                              ("dec", DECODE_PREFIX, c[2])):
        hits = [r for r in p.rows if r["heads"] == heads and r["impl"] == impl
                and r["case"].startswith(prefix) and r["us"] is not None]
        if len(hits) != 1:
            fail(path, lineno, "%d timed rows of %r for %s %s in the table above, not 1"
                 % (len(hits), prefix.strip(), heads, impl))
        if abs(hits[0]["us"] - row[key]) > 0.051:
            fail(path, lineno, "%.1f us where the table above has %.1f (line %d)"
                 % (row[key], hits[0]["us"], hits[0]["lineno"]))
    check_mixed_ratio(path, lineno, row["mixed"], row["chunk"], row["dec"], row["ratio"])
    p.mixed.append(row)


APEER_TABLES = AttendTables(
    "compare_torch.py's", (APEER_HEADER, APEER_MIXED_HEADER),
    (parse_attend_peer_row, parse_attend_peer_mixed_row), (PEER_HEADER,),
    "a decode table: compare_torch.py without --attend (or --all); pass decode runs with "
    "--peers, --attend runs alone")


# ---------------------------------------------------------------------------
# kvpage-bench --pack and kvpage-disaggregated --bench output
# ---------------------------------------------------------------------------

PACK_INTRO_RE = re.compile(
    r"^kvp_cache_pack / kvp_cache_unpack of a (?P<tokens>\d+)-token sequence \((?P<blocks>\d+) "
    r"blocks of (?P<block_size>\d+) tokens, shuffled in a pool of (?P<pool>\d+)\), "
    r"(?P<layers>\d+) layers, GQA (?P<hq>\d+)/(?P<hkv>\d+) D=(?P<d>\d+); GB/s = 2 x bytes / "
    r"time \(read \+ write, as the copy bandwidth\); graph times; by layer = (?P<calls>\d+) "
    r"calls of one layer$")
PACK_INTRO_PREFIX = "kvp_cache_pack / kvp_cache_unpack of"
PACK_HEADER = ["KV", "bytes", "pack all (us)", "GB/s", "of copy BW", "unpack all (us)", "GB/s",
               "of copy BW", "pack by layer (us)", "of copy BW", "unpack by layer (us)",
               "of copy BW"]
PACK_SKIPPED_PREFIX = "pack cases skipped:"
# The four times of a pack row: (key, what), in the table's order.
PACK_TIMES = [("pack_all", "pack all"), ("unpack_all", "unpack all"),
              ("pack_layer", "pack by layer"), ("unpack_layer", "unpack by layer")]

TRANSFER_INTRO_RE = re.compile(
    r"^one (?P<tokens>\d+)-token sequence, (?P<layers>\d+) layers, GQA (?P<hq>\d+)/(?P<hkv>\d+), "
    r"head size (?P<d>\d+), block size (?P<block_size>\d+), GPU (?P<src>\d+) -> GPU "
    r"(?P<dst>\d+); times on the decode rank, median of (?P<iters>\d+); NCCL alone: the same "
    r"bytes in the same per-layer messages$")
TRANSFER_HEADER = ["KV", "bytes", "NCCL alone (ms)", "GB/s", "end to end (ms)", "GB/s",
                   "of NCCL"]
# The machine kind a command line names in brackets: "(nvidia-h100-x2, GPU 0)".
KIND_RE = re.compile(r"\((?P<kind>nvidia-(?P<model>[a-z]\d+)(?:-x\d+)?)[,)]")

# The targets the section sets its numbers against.
PACK_TARGET = 80.0      # pack and unpack, % of the copy bandwidth
TRANSFER_TARGET = 85.0  # end to end, % of NCCL alone's bandwidth for the same bytes
INT4_TARGET = 3.0       # INT4 end to end this many times faster than BF16, at least


class PackRun(BenchOutput):
    def __init__(self, path):
        BenchOutput.__init__(self, path)
        self.copy_gbs = None
        self.seq = None  # the caption's sequence: tokens, blocks, block_size, pool, layers, ...
        # rows: dicts: dtype, bytes, pack_all, unpack_all, pack_layer, unpack_layer (us),
        # *_gbs (the printed GB/s, all only), *_frac (% of copy BW), lineno


class Transfer(Output):
    """kvpage-disaggregated --bench's output: no device line; the machine
    kind is its command line's."""

    def __init__(self, path):
        Output.__init__(self, path)
        self.version = None
        self.kind = None
        self.model = None
        self.seq = None  # the caption's sequence: tokens, layers, hq, hkv, d, block_size, ...
        # rows: dicts: dtype, bytes, nccl_ms, nccl_gbs, e2e_ms, e2e_gbs, frac, lineno


def int_cell(path, lineno, text, what):
    """A whole, positive number (a byte count)."""
    v = num(path, lineno, text, what)
    if v != int(v) or v < 1:
        fail(path, lineno, "%s is not a positive whole number: %r" % (what, text))
    return int(v)


def seq_ints(m, keys):
    return OrderedDict((k, int(m.group(k))) for k in keys)


def check_packed_bytes(path, lineno, nbytes, seq):
    """A packed sequence is layers x blocks x one block's bytes
    (docs/FORMATS.md, "Packed blocks")."""
    n = seq["layers"] * seq["tokens"] // seq["block_size"]
    if nbytes % n:
        fail(path, lineno, "bytes %d is not a whole number of blocks' bytes for %d layers x %d "
             "blocks" % (nbytes, seq["layers"], seq["tokens"] // seq["block_size"]))


def parse_pack(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    run = PackRun(path)
    part = None  # None, "intro", "table"
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        if run.device is None and take_meta(run, line):
            continue
        check_no_device(path, lineno, line)
        if line.startswith(PACK_SKIPPED_PREFIX):
            fail(path, lineno, "kvpage-bench skipped the pack cases: %r" % line)
        m = take_device(run, lineno, line)
        if m:
            run.copy_gbs = float(m.group("copy"))
            if run.copy_gbs <= 0:
                fail(path, lineno, "copy bandwidth is not positive")
            continue
        if run.device is None:
            fail(path, lineno, "not kvpage-bench --pack output before its device line: %r"
                 % line)
        if part is None and take_bench_header(run, line):
            continue
        m = PACK_INTRO_RE.match(line)
        if m and part is None:
            run.seq = seq_ints(m, ("tokens", "blocks", "block_size", "pool", "layers", "hq",
                                   "hkv", "d", "calls"))
            s = run.seq
            if min(s.values()) < 1 or s["blocks"] * s["block_size"] != s["tokens"]:
                fail(path, lineno, "%d blocks of %d tokens are not a %d-token sequence"
                     % (s["blocks"], s["block_size"], s["tokens"]))
            if s["calls"] != s["layers"]:
                fail(path, lineno, "by layer = %d calls for %d layers" % (s["calls"], s["layers"]))
            part = "intro"
            continue
        if line.startswith(PACK_INTRO_PREFIX):
            fail(path, lineno, "not the pack table's introduction as kvpage-bench prints it: %r"
                 % line)
        if line.startswith("|"):
            c = cells(line)
            if part == "intro":
                if c != PACK_HEADER:
                    fail(path, lineno, "not kvpage-bench's pack table header: %r" % line)
                part = "table"
                continue
            if part != "table":
                fail(path, lineno, "a table before the pack table's introduction: %r" % line)
            if not is_rule(c):
                parse_pack_row(run, lineno, c)
            continue
        if line.startswith(ATTEND_INTRO_PREFIX):
            fail(path, lineno, "kvp_attend cases (kvpage-bench --attend or --all): pass a "
                 "--pack run with --pack, its attend cases with --attend")
        fail(path, lineno, "not kvpage-bench --pack output: %r" % line)
    if run.device is None:
        fail(path, 0, "no device line (\"device: ..., N SMs, L2 M MiB | copy bandwidth ...\")")
    if run.seq is None:
        fail(path, 0, "no \"kvp_cache_pack / kvp_cache_unpack of ...\" line: not a --pack run")
    if not run.rows:
        fail(path, 0, "no measurements (no pack table rows)")
    return run


def parse_pack_row(run, lineno, c):
    path = run.path
    check_width(path, lineno, c, PACK_HEADER, TRUNCATED)
    row = {"dtype": c[0], "bytes": int_cell(path, lineno, c[1], "bytes"), "lineno": lineno}
    # Columns: time, then GB/s (the one-call times only), then of copy BW.
    col = 2
    for key, what in PACK_TIMES:
        row[key] = num(path, lineno, c[col], what + " time")
        col += 1
        if key.endswith("_all"):
            row[key + "_gbs"] = num(path, lineno, c[col], what + " GB/s")
            col += 1
        row[key + "_frac"] = pct(path, lineno, c[col], what + " of copy BW")
        col += 1
        if row[key] <= 0:
            fail(path, lineno, "%s time is not positive" % what)
    if row["dtype"] not in DTYPES:
        fail(path, lineno, "unknown KV dtype %r" % row["dtype"])
    check_packed_bytes(path, lineno, row["bytes"], run.seq)
    for key, what in PACK_TIMES:
        # GB/s = 2 x bytes / time (read + write); the time is printed %.1f us.
        us = row[key]
        gbs = 2.0 * row["bytes"] / (us * 1e3)
        rel = 0.05 / us
        if key.endswith("_all"):
            check_derived(path, lineno, row[key + "_gbs"], 0.5, gbs, rel,
                          "%s GB/s %.0f does not match 2 x bytes %d / time %.1f us (%.1f)"
                          % (what, row[key + "_gbs"], row["bytes"], us, gbs))
            check_copy_frac(path, lineno, row[key + "_frac"], row[key + "_gbs"], 0.5,
                            run.copy_gbs, what + " of copy BW")
        else:
            check_copy_frac(path, lineno, row[key + "_frac"], gbs, gbs * rel, run.copy_gbs,
                            what + " of copy BW",
                            "2 x bytes %d / time %.1f us" % (row["bytes"], us))
    check_once(path, lineno, run.rows, row, ("dtype",))
    run.rows.append(row)


def parse_transfer(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    t = Transfer(path)
    part = None  # None, "intro", "table"
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if not line.strip():
            continue
        if part is None and t.seq is None and take_meta(t, line):
            continue
        m = TRANSFER_INTRO_RE.match(line)
        if m and part is None:
            t.seq = seq_ints(m, ("tokens", "layers", "hq", "hkv", "d", "block_size", "src", "dst",
                                 "iters"))
            s = t.seq
            if min(s["tokens"], s["layers"], s["hq"], s["hkv"], s["d"], s["block_size"],
                   s["iters"]) < 1 or s["tokens"] % s["block_size"]:
                fail(path, lineno, "a sequence that is not whole blocks, or a size that is not "
                     "positive")
            if s["src"] == s["dst"]:
                fail(path, lineno, "GPU %d -> GPU %d: one GPU, not a move between two"
                     % (s["src"], s["dst"]))
            part = "intro"
            continue
        if line.startswith("|"):
            c = cells(line)
            if part == "intro":
                if c != TRANSFER_HEADER:
                    fail(path, lineno, "not kvpage-disaggregated's bench table header: %r" % line)
                part = "table"
                continue
            if part != "table":
                fail(path, lineno, "a table before the bench table's introduction: %r" % line)
            if not is_rule(c):
                parse_transfer_row(t, lineno, c)
            continue
        fail(path, lineno, "not kvpage-disaggregated --bench output: %r" % line)
    if t.seq is None:
        fail(path, 0, "no \"one N-token sequence, ...\" line: not a --bench run")
    if not t.rows:
        fail(path, 0, "no measurements (no bench table rows)")
    m = KIND_RE.search(t.meta.get("command", ""))
    if not m:
        fail(path, 0, "no machine kind in the command line (e.g. \"# command: ... "
             "(nvidia-h100-x2)\"): the output names no device")
    t.kind, t.model = m.group("kind"), m.group("model")
    return t


def parse_transfer_row(t, lineno, c):
    path = t.path
    check_width(path, lineno, c, TRANSFER_HEADER, TRUNCATED)
    row = {"dtype": c[0], "bytes": int_cell(path, lineno, c[1], "bytes"),
           "nccl_ms": num(path, lineno, c[2], "NCCL alone time"),
           "nccl_gbs": num(path, lineno, c[3], "NCCL alone GB/s"),
           "e2e_ms": num(path, lineno, c[4], "end to end time"),
           "e2e_gbs": num(path, lineno, c[5], "end to end GB/s"),
           "frac": pct(path, lineno, c[6], "of NCCL"), "lineno": lineno}
    if row["dtype"] not in DTYPES:
        fail(path, lineno, "unknown KV dtype %r" % row["dtype"])
    if row["nccl_ms"] <= 0 or row["e2e_ms"] <= 0:
        fail(path, lineno, "a time that is not positive")
    check_packed_bytes(path, lineno, row["bytes"], t.seq)
    # GB/s = bytes / time (printed %.3f ms, GB/s %.1f); of NCCL = NCCL
    # alone's time / end to end's.
    for key, what in (("nccl", "NCCL alone"), ("e2e", "end to end")):
        ms = row[key + "_ms"]
        gbs = row["bytes"] / (ms * 1e6)
        check_derived(path, lineno, row[key + "_gbs"], 0.05, gbs, 0.0005 / ms,
                      "%s GB/s %.1f does not match bytes %d / time %.3f ms (%.2f)"
                      % (what, row[key + "_gbs"], row["bytes"], ms, gbs))
    expect = 100.0 * row["nccl_ms"] / row["e2e_ms"]
    check_derived(path, lineno, row["frac"], 0.051, expect,
                  0.0005 / row["nccl_ms"] + 0.0005 / row["e2e_ms"],
                  "of NCCL %.1f%% does not match NCCL alone %.3f ms / end to end %.3f ms (%.2f%%)"
                  % (row["frac"], row["nccl_ms"], row["e2e_ms"], expect))
    check_once(path, lineno, t.rows, row, ("dtype",))
    t.rows.append(row)


def check_same_bytes(pack, transfer):
    """Where the pack run and the transfer move the same sequence (tokens,
    layers, heads, head size, block size), a KV dtype's bytes are the same
    in both."""
    keys = ("tokens", "layers", "hq", "hkv", "d", "block_size")
    if any(pack.seq[k] != transfer.seq[k] for k in keys):
        return
    packed = {r["dtype"]: r for r in pack.rows}
    for r in transfer.rows:
        p = packed.get(r["dtype"])
        if p is not None and p["bytes"] != r["bytes"]:
            fail(transfer.path, r["lineno"], "%s: %d bytes where %s:%d packs the same sequence "
                 "in %d" % (r["dtype"], r["bytes"], pack.path, p["lineno"], p["bytes"]))


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

def fmt_us(us):
    return "%.1f" % us


def shape_key(shape, batch, order):
    return (order.setdefault(shape, len(order)), batch)


def table_head(head, out):
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + " --- |" * len(head))


def raw_link(x):
    """A link to a parsed file, named by its file name."""
    return "raw output: [%s](%s)" % (x.path.split("/")[-1], rel_link(x.path))


def measured(meta):
    """"measured DATE" and "build BUILD", where the metadata has them."""
    return ((["measured %s" % meta["date"]] if "date" in meta else [])
            + (["build %s" % meta["build"]] if "build" in meta else []))


def note_quote(x, out):
    if "note" in x.meta:
        out.append("")
        out.append("> %s" % x.meta["note"])


def run_desc(r):
    """A kvpage-bench run's date (or that it has none), build and version."""
    desc = measured(r.meta)
    if "date" not in r.meta:
        desc.insert(0, "date not recorded in %s" % r.path)
    if r.version:
        desc.append("kvpage %s" % r.version)
    return desc


def run_lines(r, extra, out):
    """The lines under a kvpage-bench run's bullet: its build, command and
    block order, the `extra` lines, then its note."""
    if r.build_info:
        out.append("  Build: `%s`." % r.build_info)
    if "command" in r.meta:
        out.append("  Command: `%s`." % r.meta["command"])
    if r.linear_blocks:
        out.append("  **Block tables: each sequence's blocks adjacent** "
                   "(`KVPAGE_BENCH_BLOCK_ORDER=linear`), not a shuffled pool.")
    out.extend(extra)
    note_quote(r, out)


def peers_lines(p, out):
    """The lines under a compare_torch.py run's first: its command, its
    environment (and how kvpage reached kvp_attend), then its note."""
    if "command" in p.meta:
        out.append("Command: `%s`." % p.meta["command"])
    for e in p.env + ([p.via] if p.via else []):
        out.append("`%s`." % e)
    note_quote(p, out)


def device_section(device, runs, out):
    out.append("## %s" % device)
    out.append("")
    for r in runs:
        hw = []
        if r.sms is not None:
            hw.append("%d SMs, L2 %d MiB" % (r.sms, r.l2_mib))
        hw.append("copy bandwidth %.0f GB/s (1 GiB device-to-device, read + write, same run)"
                  % r.copy_gbs)
        out.append("- %s; %s; %s." % (", ".join(run_desc(r)), ", ".join(hw), raw_link(r)))
        extra = []
        if r.fp16_write_input:
            extra.append("  Cache write input: FP16 (`KVPAGE_BENCH_WRITE_INPUT=fp16`).")
        if not r.graph_timed:
            extra.append("  **Times are eager** (one call between two events, host launch "
                         "included): this run predates the graph timing.")
        run_lines(r, extra, out)
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
    table_head(["shape", "B"] + [d.upper() for d in dts], out)
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
    table_head(head, out)
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
        out.append("- %s; %s." % (r.label(), raw_link(r)))
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
    desc = measured(p.meta) + ["copy bandwidth %.0f GB/s (same run)" % p.copy_gbs]
    out.append("`bench/compare_torch.py`, %s; %s." % (", ".join(desc), raw_link(p)))
    peers_lines(p, out)
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
        torch_rows = [r for r in rs if r["torch"] and r["us"] is not None]
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
                 if r["torch"] and r["us"] is None})
    if na:
        out.append("PyTorch paths that could not run a shape: " + "; ".join(na) + ".")
        out.append("")
    if failed:
        out.append("**kvpage rows that failed their accuracy check:** " + "; ".join(failed) + ".")
        out.append("")


def attend_section(device, run, peers, out):
    """kvp_attend: a kvpage-bench --attend run and a compare_torch.py --attend
    run of one device (either may be None)."""
    out.append("### Attention over query chunks (kvp_attend)")
    out.append("")
    if run is not None:
        attend_run_part(run, out)
    if peers is not None:
        attend_peers_part(peers, out)


def attend_run_part(r, out):
    out.append("- `kvpage-bench --attend`, %s; %d SMs, L2 %d MiB; %s." % (
        ", ".join(run_desc(r)), r.sms, r.l2_mib, raw_link(r)))
    run_lines(r, ["  **Decoders in precise mode** (`--precise`)."] if r.precise else [], out)
    out.append("")
    out.append("TFLOP/s: 4 x query heads x head size x the keys visible to each query token "
               "(causal: the token at position p sees p + 1 keys), summed over the call's query "
               "tokens, over the call's time; the peak they are set against is %.0f TFLOP/s "
               "(%s), for every KV dtype." % (r.peak, r.peak_what))
    out.append("")
    dts = [d for d in DTYPES if any(x["dtype"] == d for x in r.rows)]
    out.append("Time per call (us) and, in brackets, TFLOP/s:")
    out.append("")
    table_head(["case", "heads q/kv"] + [d.upper() for d in dts], out)
    for (case, heads), rows in attend_groups(r.rows).items():
        by = {x["dtype"]: x for x in rows}
        c = ["%s (%.1f)" % (fmt_us(by[d]["us"]), by[d]["tflops"]) if d in by else "—"
             for d in dts]
        out.append("| %s | %s | %s |" % (case, heads, " | ".join(c)))
    out.append("")
    if r.mixed:
        out.append("Mixed batch (d): the 2048-token chunk and the 255 decoding sequences in one "
                   "`kvp_attend` call, against the chunk alone plus the decoding sequences alone, "
                   "these through `kvp_attend` or through `kvp_decode`; ratio = time(mixed) / "
                   "(time(chunk alone) + time(decode alone)), below 1: the mix costs less than "
                   "its parts run one after the other. Times in us:")
        out.append("")
        out.append("| heads q/kv | KV | mixed | chunk alone | decode alone, kvp_attend | "
                   "decode alone, kvp_decode | ratio, kvp_attend decode | "
                   "ratio, kvp_decode decode |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")

        def opt(v, f):
            return "—" if v is None else f % v
        for m in r.mixed:
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                m["heads"], m["dtype"], fmt_us(m["mixed"]), fmt_us(m["chunk"]),
                opt(m["dec_attend"], "%.1f"), opt(m["dec_decode"], "%.1f"),
                opt(m["ratio_attend"], "%.2f"), opt(m["ratio_decode"], "%.2f")))
        out.append("")


def attend_peers_part(p, out):
    out.append("#### Against PyTorch (kvp_attend)")
    out.append("")
    desc = measured(p.meta)
    out.append("`bench/compare_torch.py --attend`%s; %s." % (
        ", " + ", ".join(desc) if desc else "", raw_link(p)))
    peers_lines(p, out)
    out.append("")
    paths = []
    for r in p.rows:
        if r["torch"] and r["impl"][len("torch "):] not in paths:
            paths.append(r["impl"][len("torch "):])
    out.append("PyTorch (%s) runs SDPA over dense, contiguous BF16 K/V, each group of sequences "
               "with equal (query tokens, context) as one dense batch timed on its own, and a "
               "mix's time is the sum of its groups'; kvpage runs one `kvp_attend` call over the "
               "whole batch and its paged cache (blocks shuffled in the pool). Each output is "
               "checked on sampled query tokens against float64 attention before it is timed. "
               "Times are single calls after a GPU spin (no graph), for both; kvpage's graph "
               "times are in the table above. TFLOP/s as above (peak %.0f TFLOP/s); the ratio is "
               "kvpage's TFLOP/s over the fastest PyTorch path's, which is the PyTorch time "
               "over kvpage's: above 1, kvpage is faster; below 1, PyTorch is."
               % (", ".join(paths) if paths else "no path", p.peak))
    out.append("")
    dts = [d for d in DTYPES if any(r["dtype"] == d for r in p.rows)]
    head = ["case", "heads q/kv", "fastest PyTorch, TFLOP/s"]
    for d in dts:
        head += ["kvpage %s, TFLOP/s" % d.upper(), "kvpage %s / PyTorch" % d.upper()]
    table_head(head, out)
    failed = []
    for (case, heads), rs in attend_groups(p.rows).items():
        torch_rows = [r for r in rs if r["torch"] and r["us"] is not None]
        fastest = min(torch_rows, key=lambda r: r["us"]) if torch_rows else None
        first = ("%.1f (%s)" % (fastest["tflops"], fastest["impl"][len("torch "):])
                 if fastest else "—")
        for via_decode in (False, True):
            ks = [r for r in rs if not r["torch"] and r["via_decode"] == via_decode]
            if not ks:
                continue
            c = [case + (", through kvp_decode" if via_decode else ""), heads, first]
            for d in dts:
                k = next((r for r in ks if r["dtype"] == d), None)
                if k is not None and k["check"] != "ok":
                    failed.append("%s %s %s: %s" % (case, heads, k["impl"], k["check"]))
                if k is None or k["us"] is None:
                    c += ["—", "—"]
                    continue
                c += ["%.1f" % k["tflops"],
                      "%.2fx" % (fastest["us"] / k["us"]) if fastest else "—"]
            out.append("| " + " | ".join(c) + " |")
    out.append("")
    na = sorted({r["impl"][len("torch "):] + ": " + r["check"]
                 + (" (%s)" % r["note"] if r["note"] else "")
                 for r in p.rows if r["torch"] and r["us"] is None})
    if na:
        out.append("PyTorch paths that could not run a case: " + "; ".join(na) + ".")
        out.append("")
    if failed:
        out.append("**kvpage rows that failed their accuracy check or did not run:** "
                   + "; ".join(failed) + ".")
        out.append("")


def fmt_mib(nbytes):
    mib = nbytes / 2.0 ** 20
    return "%.0f" % mib if mib == int(mib) else "%.1f" % mib


def and_list(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def fmt_range(values):
    """"a%" or "lo–hi%" of printed percentages."""
    lo, hi = min(values), max(values)
    return "%.1f%%" % lo if lo == hi else "%.1f–%.1f%%" % (lo, hi)


def move_section(device, pack, transfer, out):
    """kvp_cache_pack / kvp_cache_unpack: a kvpage-bench --pack run and a
    kvpage-disaggregated --bench output of one device (either may be None)."""
    out.append("### Moving KV between caches (kvp_cache_pack / kvp_cache_unpack)")
    out.append("")
    if pack is not None:
        out.append("- `kvpage-bench --pack`, %s; %d SMs, L2 %d MiB, copy bandwidth %.0f GB/s "
                   "(1 GiB device-to-device, read + write, same run); %s." % (
                       ", ".join(run_desc(pack)), pack.sms, pack.l2_mib, pack.copy_gbs,
                       raw_link(pack)))
        run_lines(pack, [], out)
    if transfer is not None:
        s = transfer.seq
        out.append("- `kvpage-disaggregated --bench`, %s; machine %s (from the command line: the "
                   "output names no device), "
                   "GPU %d -> GPU %d; %s." % (", ".join(run_desc(transfer)), transfer.kind,
                                              s["src"], s["dst"], raw_link(transfer)))
        out.append("  Command: `%s`." % transfer.meta["command"])
        note_quote(transfer, out)
    out.append("")
    if pack is not None:
        pack_part(pack, out)
    if transfer is not None:
        transfer_part(transfer, out)


def pack_part(r, out):
    s = r.seq
    out.append("`kvp_cache_pack` of a %d-token sequence (%d blocks of %d tokens, shuffled in a "
               "pool of %d), %d layers, GQA %d/%d, head size %d, into one buffer, and "
               "`kvp_cache_unpack` of it into other blocks of the pool: every layer in one call "
               "(all) and one call per layer (by layer, %d calls); graph times in us. MiB: the "
               "packed sequence, every layer; GB/s = 2 x bytes / time (read + write, as the copy "
               "bandwidth); of copy BW: against %.0f GB/s:"
               % (s["tokens"], s["blocks"], s["block_size"], s["pool"], s["layers"], s["hq"],
                  s["hkv"], s["d"], s["calls"], r.copy_gbs))
    out.append("")
    table_head(["KV", "MiB", "pack all (us)", "GB/s", "of copy BW", "unpack all (us)", "GB/s",
                "of copy BW", "pack by layer (us)", "of copy BW", "unpack by layer (us)",
                "of copy BW"], out)
    for x in r.rows:
        c = [x["dtype"], fmt_mib(x["bytes"])]
        for key, _ in PACK_TIMES:
            c.append(fmt_us(x[key]))
            if key.endswith("_all"):
                c.append("%.0f" % x[key + "_gbs"])
            c.append("%.1f%%" % x[key + "_frac"])
        out.append("| " + " | ".join(c) + " |")
    out.append("")
    below = ["%s %s (%.1f%%)" % (x["dtype"].upper(), what, x[key + "_frac"])
             for key, what in PACK_TIMES for x in r.rows if x[key + "_frac"] < PACK_TARGET]
    ranges = ["%s %s" % (what, fmt_range([x[key + "_frac"] for x in r.rows]))
              for key, what in PACK_TIMES]
    out.append("Target: pack and unpack at %.0f%% of the copy bandwidth or more; here %s and %s "
               "of it; %s." % (PACK_TARGET, ", ".join(ranges[:-1]), ranges[-1],
                               "below the target: " + and_list(below) if below
                               else "every row at or above the target"))
    out.append("")


def transfer_part(t, out):
    s = t.seq
    out.append("`kvpage-disaggregated` (examples/disaggregated/README.md) moves one %d-token "
               "sequence (%d layers, GQA %d/%d, head size %d, block size %d) from GPU %d to GPU "
               "%d: end to end, from the first `kvp_cache_pack` to the last `kvp_cache_unpack`, "
               "layer by layer through `ncclSend` / `ncclRecv`; NCCL alone, the same bytes in "
               "the same per-layer messages. Times in ms on the decode rank, median of %d; MiB: "
               "the packed sequence; GB/s = bytes / time; of NCCL = NCCL alone's time / end to "
               "end's:"
               % (s["tokens"], s["layers"], s["hq"], s["hkv"], s["d"], s["block_size"], s["src"],
                  s["dst"], s["iters"]))
    out.append("")
    table_head(["KV", "MiB", "NCCL alone (ms)", "GB/s", "end to end (ms)", "GB/s", "of NCCL"],
               out)
    for x in t.rows:
        out.append("| %s | %s | %.3f | %.1f | %.3f | %.1f | %.1f%% |" % (
            x["dtype"], fmt_mib(x["bytes"]), x["nccl_ms"], x["nccl_gbs"], x["e2e_ms"],
            x["e2e_gbs"], x["frac"]))
    out.append("")
    by = {x["dtype"]: x for x in t.rows}
    fracs = ", ".join("%s %.1f%%%s" % (x["dtype"].upper(), x["frac"],
                                       " (below the target)" if x["frac"] < TRANSFER_TARGET
                                       else "")
                      for x in t.rows)
    if "bf16" in by and "int4" in by:
        ratio = by["bf16"]["e2e_ms"] / by["int4"]["e2e_ms"]
        speed = "here %.2fx (BF16 %.3f ms / INT4 %.3f ms)%s" % (
            ratio, by["bf16"]["e2e_ms"], by["int4"]["e2e_ms"],
            ", below the target" if ratio < INT4_TARGET else "")
    else:
        speed = "not measured here (the table lacks BF16 or INT4)"
    out.append("Targets: end to end at %.0f%% of NCCL's bandwidth for the same bytes or more, "
               "here %s; and INT4 at least %.0fx faster than BF16 end to end, %s."
               % (TRANSFER_TARGET, fracs, INT4_TARGET, speed))
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
draw, the same in every run). "latency GQA 32/8" and "latency GQA 8/1"
at T=32768 and T=131072: 1, 2, 4 or 8 sequences over long contexts, the
latency-bound steps (a run older than these shapes has no such rows).
"""

METHOD_REPRODUCE = """\
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
"""

METHOD_PAGE = """\
python3 scripts/perf_page.py docs/perf/h100-kvpage-bench.txt \\
"""

METHOD_PAGE_END = """\
  --peers docs/perf/h100-compare-torch.txt -o docs/PERFORMANCE.md
```

In a normal build the benchmark is `build/bench/kvpage-bench`. Its options
(`--shapes`, `--dtypes`, `--quick`, `--csv`) and the measurement switches
(`KVPAGE_BENCH_*`) are in bench/README.md; a run made with a switch says
so in its header, and this page repeats it. Figures move by about 1%
between runs of one build on one machine and by up to 3% between machines
of the same kind: compare builds only within one device call.
"""

ATTEND_METHOD = """\
**Attention over query chunks.** `kvpage-bench --attend` (`--all`: after
the decode cases) times `kvp_attend` with BF16 queries and outputs over a
cache of block size 16 and head size 128 whose K and V have the same
dtype, for GQA 32/8 and 8/1 (query / KV heads), causal: a sequence's query
tokens are the last of its context, and each sees the keys up to its own
position. The cases: (a) prefill from an empty cache, 8 sequences whose
4096 query tokens are their whole context; (b) one 2048-token chunk over
an 8192- and over a 32768-token context; (c) 16 sequences, each a
256-token chunk over 4096; (d) one 2048-token chunk over 8192 and 255
decoding sequences (one query token over 8192 each) in one call, then the
chunk alone, and the 255 decoding sequences alone through `kvp_attend` and
through `kvp_decode`; (e) short chunks: 4 sequences of 16 and of 64 query
tokens over 8192, and one of 16 over 32768. One decoder per case, sized to
it; K/V (random normal, written with `kvp_cache_write`, not timed) and q
are the same for every KV dtype, and each sequence's blocks come from a
shuffled pool. **time (us)** is a call's share of a CUDA graph replay, as
for the decode (layers spanning > 4x the L2, or one layer where it alone
does; fewer samples, at least 5, where a call is long). Every output
element must come back finite, or the run fails (exit status 1).
"""

ATTEND_REPRODUCE = """\
# attention over query chunks (kvp_attend), and against PyTorch:
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  echo "# command: LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench --attend"
  LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench --attend; } > docs/perf/h100-kvpage-attend.txt
KVPAGE_LIBRARY=.gpu/libkvpage.so PYTHONPATH=bindings/python \\
  python3 bench/compare_torch.py --attend --dtypes bf16 --skip flex --out out/compare_torch
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  cat out/compare_torch/compare_torch_attend.md; } > docs/perf/h100-compare-torch-attend.txt
"""

ATTEND_PAGE = """\
  --attend docs/perf/h100-kvpage-attend.txt \\
  --attend-peers docs/perf/h100-compare-torch-attend.txt \\
"""

PACK_REPRODUCE = """\
# moving KV between caches: pack and unpack on one GPU
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  echo "# command: LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench --pack"
  LD_LIBRARY_PATH=.gpu .gpu/kvpage-bench --pack; } > docs/perf/h100-kvpage-pack.txt
"""

TRANSFER_REPRODUCE = """\
# and GPU 0 -> GPU 1 through NCCL on a two-GPU machine (a build with
# -DKVPAGE_BUILD_NCCL_EXAMPLE=ON; examples/disaggregated/README.md):
{ echo "# date: $(date -u +%F)"; echo "# build: $(git rev-parse --short HEAD)"
  echo "# command: build/examples/kvpage-disaggregated --bench --gpus 0,1 (nvidia-h100-x2)"
  build/examples/kvpage-disaggregated --bench --gpus 0,1; } > docs/perf/h100-disaggregated.txt
"""

PACK_PAGE = """\
  --pack docs/perf/h100-kvpage-pack.txt \\
"""

TRANSFER_PAGE = """\
  --transfer docs/perf/h100-disaggregated.txt \\
"""


def method_text(attend, pack=False, transfer=False):
    """The method section; its attend parts only where the page has attend
    sections, so that a page without them is what it was before them (and
    the same for the pack and transfer options of the page's command)."""
    parts = [METHOD, "\n"]
    if attend:
        parts += [ATTEND_METHOD, "\n"]
    parts.append(METHOD_REPRODUCE)
    if attend:
        parts.append(ATTEND_REPRODUCE)
    if pack:
        parts.append(PACK_REPRODUCE)
    if transfer:
        parts.append(TRANSFER_REPRODUCE)
    parts.append(METHOD_PAGE)
    if attend:
        parts.append(ATTEND_PAGE)
    if pack:
        parts.append(PACK_PAGE)
    if transfer:
        parts.append(TRANSFER_PAGE)
    parts.append(METHOD_PAGE_END)
    return "".join(parts)


def one_per_device(items, what):
    by = OrderedDict()
    for x in items:
        if x.device in by:
            raise ParseError("%s and %s: two %s for %s; pass one"
                             % (by[x.device].path, x.path, what, x.device))
        by[x.device] = x
    return by


def transfers_by_device(transfers, devices):
    """Each transfer's device: the one of the page whose name has the GPU
    model of the transfer's machine kind (nvidia-h100-x2: H100)."""
    by = OrderedDict()
    for t in transfers:
        hits = [d for d in devices if re.search(r"\b%s\b" % re.escape(t.model), d, re.I)]
        if len(hits) != 1:
            raise ParseError("%s: machine kind %s: %s on the page (%s); pass a --pack or "
                             "decode run of its device" % (
                                 t.path, t.kind, "no %s device" % t.model.upper() if not hits
                                 else "%d %s devices" % (len(hits), t.model.upper()),
                                 ", ".join(devices) or "none"))
        if hits[0] in by:
            raise ParseError("%s and %s: two --transfer outputs for %s; pass one"
                             % (by[hits[0]].path, t.path, hits[0]))
        by[hits[0]] = t
    return by


def render(runs, peers, attend_runs=(), attend_peers=(), packs=(), transfers=()):
    out = ["# Performance", ""]
    out.append("<!-- Generated by scripts/perf_page.py from %s; do not edit by hand. -->"
               % ", ".join(r.path for r in list(runs) + list(peers) + list(attend_runs)
                           + list(attend_peers) + list(packs) + list(transfers)))
    out.append("")
    out.append("What kvpage's CUDA decode and cache write measure today: the numbers of the "
               "latest `kvpage-bench` run on each device, with the method below. How the "
               "kernels got here, and what was tried and not kept: [archive.md](archive.md). "
               "Which kernel runs where, and why: [DESIGN.md](DESIGN.md).")
    out.append("")
    attend = attend_runs or attend_peers
    if attend:
        out.append("Attention over query chunks (`kvp_attend`: prefill, chunked prefill, a chunk "
                   "batched with decoding sequences, short chunks) has a section of its own per "
                   "device, in time and TFLOP/s.")
        out.append("")
    by_device = OrderedDict()
    precise_by_device = OrderedDict()
    for r in runs:
        (precise_by_device if r.precise else by_device).setdefault(r.device, []).append(r)
    peers_by_device = OrderedDict()
    for p in peers:
        peers_by_device.setdefault(p.device, []).append(p)
    attend_by_device = one_per_device(attend_runs, "--attend runs")
    attend_peers_by_device = one_per_device(attend_peers, "--attend-peers outputs")
    devices = list(by_device) + [d for d in peers_by_device if d not in by_device]
    pack_by_device = one_per_device(packs, "--pack runs")
    for d in list(attend_by_device) + list(attend_peers_by_device) + list(pack_by_device):
        if d not in devices:
            devices.append(d)
    transfer_by_device = transfers_by_device(transfers, devices)
    for device, t in transfer_by_device.items():
        if device in pack_by_device:
            check_same_bytes(pack_by_device[device], t)
    for device in devices:
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
        if device in attend_by_device or device in attend_peers_by_device:
            attend_section(device, attend_by_device.get(device),
                           attend_peers_by_device.get(device), out)
        if device in pack_by_device or device in transfer_by_device:
            move_section(device, pack_by_device.get(device), transfer_by_device.get(device), out)
    out.append(method_text(bool(attend), bool(packs), bool(transfers)))
    return "\n".join(out).rstrip() + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="raw kvpage-bench output files (text or --csv)")
    ap.add_argument("--peers", action="append", default=[],
                    help="bench/compare_torch.py output (stdout or compare_torch.md)")
    ap.add_argument("--attend", action="append", default=[], metavar="ATTEND_RUN",
                    help="raw kvpage-bench --attend output (text), one per device")
    ap.add_argument("--attend-peers", action="append", default=[], metavar="COMPARE",
                    help="bench/compare_torch.py --attend output (stdout or "
                    "compare_torch_attend.md), one per device")
    ap.add_argument("--pack", action="append", default=[], metavar="PACK_RUN",
                    help="raw kvpage-bench --pack output (text), one per device")
    ap.add_argument("--transfer", action="append", default=[], metavar="TRANSFER",
                    help="raw kvpage-disaggregated --bench output, its machine kind in its "
                    "\"# command:\" line, one per device")
    ap.add_argument("-o", "--output", help="write the page here instead of stdout")
    args = ap.parse_args(argv)
    try:
        runs = [parse_bench(p) for p in args.runs]
        peers = [parse_peers(p) for p in args.peers]
        attend_runs = [parse_attend(p) for p in args.attend]
        attend_peers = [parse_attend_peers(p) for p in args.attend_peers]
        packs = [parse_pack(p) for p in args.pack]
        transfers = [parse_transfer(p) for p in args.transfer]
        page = render(runs, peers, attend_runs, attend_peers, packs, transfers)
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
