#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The plots of docs/, drawn from the benchmark output they show.

    perf_plots.py [--root SOURCE]           writes docs/img/compare_torch.svg
    perf_plots.py --check [--root SOURCE]   fails where it is not what the data gives

docs/img/compare_torch.svg: kvpage's decode against PyTorch's attention,
from docs/perf/h100-compare-torch.txt (bench/compare_torch.py's table; the
device, date and build are those the file names). Left: time per call
against batch size for the seed shape, every PyTorch path and kvpage's
BF16/FP8/INT8/INT4 caches; right: speed-up over the fastest PyTorch path of
the other shapes. SVG written by hand, standard library only, so that the
figure is remade wherever the data changes (ctest doc_perf_plots checks it).
"""

import argparse
import math
import os
import re
import sys

DATA = os.path.join("docs", "perf", "h100-compare-torch.txt")
OUT = os.path.join("docs", "img", "compare_torch.svg")

KVPAGE = ["kvpage bf16", "kvpage fp8", "kvpage int8", "kvpage int4"]  # FP16 times are BF16's
COLORS = {
    "torch sdpa-cudnn": "#555555", "torch sdpa-flash": "#999999", "torch flex": "#c8c8c8",
    "kvpage bf16": "#1f77b4", "kvpage fp8": "#2ca02c", "kvpage int8": "#ff7f0e",
    "kvpage int4": "#d62728",
}
LABELS = {
    "torch sdpa-cudnn": "PyTorch SDPA (cuDNN)", "torch sdpa-flash": "PyTorch SDPA (flash)",
    "torch flex": "PyTorch FlexAttention", "kvpage bf16": "kvpage BF16",
    "kvpage fp8": "kvpage FP8", "kvpage int8": "kvpage INT8", "kvpage int4": "kvpage INT4",
}


def read_table(path):
    """(meta, rows): the file's header lines and its table rows as dicts."""
    meta, rows, header = {}, [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^# (\w+): (.*)$", line)
            if m:
                meta[m.group(1)] = m.group(2)
                continue
            m = re.match(r"^device: (.*)$", line)
            if m:
                meta["device"] = m.group(1)
                continue
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
                continue
            if set(cells[0]) <= set("- "):
                continue
            rows.append(dict(zip(header, cells)))
    if header is None or not rows:
        raise SystemExit("%s: no table" % path)
    for key in ("shape", "B", "implementation", "time (us)", "speed-up vs fastest PyTorch"):
        if key not in header:
            raise SystemExit("%s: the table has no column %r" % (path, key))
    if "device" not in meta:
        raise SystemExit("%s: no 'device:' line" % path)
    return meta, rows


def number(text):
    m = re.match(r"^([0-9.]+)x?$", text or "")
    return float(m.group(1)) if m else None


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg(object):
    def __init__(self, width, height):
        self.w, self.h, self.parts = width, height, []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=11, anchor="start", weight=None, fill="#222", rotate=None):
        extra = ' font-weight="%s"' % weight if weight else ""
        if rotate is not None:
            extra += ' transform="rotate(%d %.1f %.1f)"' % (rotate, x, y)
        self.add('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" fill="%s"%s>%s</text>'
                 % (x, y, size, anchor, fill, extra, esc(s)))

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        self.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%g"%s/>'
                 % (x1, y1, x2, y2, stroke, width, d))

    def render(self):
        return ('<!-- SPDX-License-Identifier: Apache-2.0 -->\n'
                '<!-- Written by tests/doc/perf_plots.py: edit the data or the script, '
                'not this file. -->\n'
                '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
                'viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">\n'
                '<rect width="%d" height="%d" fill="#ffffff"/>\n%s\n</svg>\n'
                % (self.w, self.h, self.w, self.h, self.w, self.h, "\n".join(self.parts)))


class LogAxis(object):
    """A log-scaled axis mapping [lo, hi] onto pixels [a, b]."""

    def __init__(self, lo, hi, a, b):
        self.lo, self.hi, self.a, self.b = math.log(lo), math.log(hi), a, b

    def __call__(self, v):
        return self.a + (math.log(v) - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def times_panel(svg, rows, x0, y0, w, h):
    seed = [r for r in rows if r["shape"].startswith("seed ")]
    if not seed:
        raise SystemExit("no seed shape in the data")
    shape = seed[0]["shape"][len("seed "):].replace(" D=128", ", D=128")
    impls = [i for i in COLORS if any(r["implementation"] == i for r in seed)]
    batches = sorted({int(r["B"]) for r in seed})
    times = [number(r["time (us)"]) for r in seed if r["implementation"] in impls]
    times = [t for t in times if t]
    lo = 10 ** math.floor(math.log10(min(times)))
    hi = 10 ** math.ceil(math.log10(max(times)))
    px = LogAxis(batches[0] / 1.25, batches[-1] * 1.25, x0, x0 + w)
    py = LogAxis(lo, hi, y0 + h, y0)
    svg.text(x0 + w / 2, y0 - 12, "%s: time per decode call against batch size" % shape,
             size=12, anchor="middle", weight="bold")
    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>'
            % (x0, y0, w, h))
    decade = lo
    while decade <= hi * 1.0001:
        for m in (1, 2, 5):
            v = decade * m
            if lo <= v <= hi:
                y = py(v)
                svg.line(x0, y, x0 + w, y, stroke="#e4e4e4" if m > 1 else "#cfcfcf")
                svg.text(x0 - 6, y + 4, "%g" % v, size=10, anchor="end")
        decade *= 10
    for b in batches:
        x = px(b)
        svg.line(x, y0, x, y0 + h, stroke="#eeeeee")
        svg.text(x, y0 + h + 16, str(b), size=10, anchor="middle")
    svg.text(x0 + w / 2, y0 + h + 34, "batch size B (sequences of 8192 tokens)", size=11,
             anchor="middle")
    svg.text(x0 - 46, y0 + h / 2, "time per call (µs, log scale)", size=11, anchor="middle",
             rotate=-90)
    for impl in impls:
        pts = []
        for b in batches:
            for r in seed:
                if r["implementation"] == impl and int(r["B"]) == b and number(r["time (us)"]):
                    pts.append((px(b), py(number(r["time (us)"]))))
        if not pts:
            continue
        dash = ' stroke-dasharray="6 3"' if impl.startswith("torch") else ""
        svg.add('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>'
                % (" ".join("%.1f,%.1f" % p for p in pts), COLORS[impl], dash))
        for x, y in pts:
            svg.add('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (x, y, COLORS[impl]))
    svg.add('<rect x="%.1f" y="%.1f" width="150" height="%d" fill="#ffffff" fill-opacity="0.85" '
            'stroke="#dddddd"/>' % (x0 + 5, y0 + 3, 15 * len(impls) + 4))
    ly = y0 + 14
    for impl in impls:
        dash = "6 3" if impl.startswith("torch") else None
        svg.line(x0 + 10, ly - 4, x0 + 34, ly - 4, stroke=COLORS[impl], width=2, dash=dash)
        svg.text(x0 + 40, ly, LABELS[impl], size=10)
        ly += 15


def speedup_panel(svg, rows, x0, y0, w, h):
    shapes = []
    for r in rows:
        if not r["shape"].startswith("seed ") and r["shape"] not in [s for s, _ in shapes]:
            shapes.append((r["shape"], r["B"]))
    if not shapes:
        raise SystemExit("no shape but the seed in the data")
    impls = [i for i in KVPAGE if any(r["implementation"] == i for r in rows)]
    values = {}
    fastest = {}
    for shape, b in shapes:
        for r in rows:
            if r["shape"] != shape:
                continue
            s = number(r["speed-up vs fastest PyTorch"])
            if r["implementation"] in impls and s:
                values[(shape, r["implementation"])] = s
            if r["implementation"].startswith("torch") and s == 1.0:
                fastest[shape] = r["implementation"][len("torch "):]
    lo, hi = 0.5, 2 ** math.ceil(math.log2(max(values.values()) * 1.1))
    py = LogAxis(lo, hi, y0 + h, y0)
    svg.text(x0 + w / 2, y0 - 12, "other shapes: speed-up over the fastest PyTorch path",
             size=12, anchor="middle", weight="bold")
    svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>'
            % (x0, y0, w, h))
    v = lo
    while v <= hi:
        y = py(v)
        svg.line(x0, y, x0 + w, y, stroke="#e4e4e4")
        svg.text(x0 - 6, y + 4, "%gx" % v, size=10, anchor="end")
        v *= 2
    svg.line(x0, py(1.0), x0 + w, py(1.0), stroke="#000", dash="3 3")
    svg.text(x0 - 40, y0 + h / 2, "PyTorch time / kvpage time (log scale)", size=11,
             anchor="middle", rotate=-90)
    group_w = w / len(shapes)
    bar_w = group_w * 0.7 / len(impls)
    for g, (shape, b) in enumerate(shapes):
        gx = x0 + g * group_w + group_w * 0.15
        for i, impl in enumerate(impls):
            s = values.get((shape, impl))
            if s is None:
                continue
            x = gx + i * bar_w
            top, base = py(s), py(lo)
            svg.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                    % (x + 1, top, bar_w - 2, base - top, COLORS[impl]))
            svg.text(x + bar_w / 2, top - 3, "%.2f" % s if s < 10 else "%.1f" % s, size=9,
                     anchor="middle")
        name = shape.replace(" D=128", "").replace(" log-uniform", "")
        svg.text(x0 + (g + 0.5) * group_w, y0 + h + 16, name, size=10, anchor="middle")
        svg.text(x0 + (g + 0.5) * group_w, y0 + h + 30, "B=%s%s" % (
            b, ", vs %s" % fastest[shape].replace("sdpa-", "") if shape in fastest else ""),
            size=9, anchor="middle", fill="#555")
    ly = y0 + 14
    for impl in impls:
        svg.add('<rect x="%.1f" y="%.1f" width="12" height="10" fill="%s"/>'
                % (x0 + 10, ly - 9, COLORS[impl]))
        svg.text(x0 + 28, ly, LABELS[impl], size=10)
        ly += 15


def compare_torch_svg(root):
    meta, rows = read_table(os.path.join(root, DATA))
    svg = Svg(1000, 470)
    device = meta["device"].split(",")[0]
    svg.text(500, 24, "kvpage decode vs PyTorch attention on the %s" % device, size=15,
             anchor="middle", weight="bold")
    build = meta.get("build", "?")
    svg.text(500, 42, "%s; %s, build %s; single calls, no CUDA graph, for kvpage as for "
             "PyTorch" % (meta["device"], meta.get("date", "?"), build), size=10,
             anchor="middle", fill="#444")
    times_panel(svg, rows, 80, 80, 390, 320)
    speedup_panel(svg, rows, 580, 80, 400, 320)
    svg.text(500, 462, "data: %s (bench/compare_torch.py); drawn by tests/doc/perf_plots.py"
             % DATA, size=9, anchor="middle", fill="#666")
    return svg.render()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed figure instead of writing it")
    args = ap.parse_args()
    want = compare_torch_svg(args.root)
    path = os.path.join(args.root, OUT)
    if args.check:
        try:
            with open(path, encoding="utf-8") as f:
                have = f.read()
        except OSError as e:
            print("FAIL %s: %s (write it: python3 tests/doc/perf_plots.py)" % (OUT, e))
            return 1
        if have != want:
            print("FAIL %s is not what %s gives: python3 tests/doc/perf_plots.py rewrites it"
                  % (OUT, DATA))
            return 1
        print("ok %s: drawn from %s" % (OUT, DATA))
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(want)
    print("wrote %s from %s" % (OUT, DATA))
    return 0


if __name__ == "__main__":
    sys.exit(main())
