#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tests of bench/accuracy.py's pure parts, with fake measurements: the plan's
rules, the kernel check's verdicts, the bounds, the page and the exit status.
Standard library only (no torch, no GPU):

    python3 bench/test_accuracy.py        # or: python3 bench/accuracy.py --selftest

KVPAGE_ACCURACY_CPU=1 (with torch and KVPAGE_LIBRARY set) also runs the
whole script on the CPU backend (--device cpu --quick, about a minute).
"""

import contextlib
import copy
import io
import json
import math
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import accuracy as A  # noqa: E402

TG, REG, RING, STAGED = A.THREAD_GROUP, A.REGISTERS, A.RING, A.STAGED


def fake_run(backend="CUDA", cc_major=9):
    """A run's data as measure() returns it, every value well within bounds."""
    contract = []
    for mode in ("default", "precise"):
        for p in A.PATHS:
            for d in A.DATA:
                kern = A.expected_kernel(p.k_dtype, p.v_dtype, A.HEAD, p.block_size, p.rows,
                                         cc_major, precise=mode == "precise")
                ob, lb = ((p.out_bound, p.lse_bound) if mode == "default"
                          else (A.PRECISE_OUT_BOUND, A.PRECISE_LSE_BOUND))
                contract.append(dict(
                    path=p.id, cache=A.dtype_label(p.k_dtype, p.v_dtype),
                    shape=A.shape_label(p, d), data=d, mode=mode, kernel=kern,
                    kernel_name=A.KERNEL_NAMES[kern], out_bound=ob, lse_bound=lb,
                    out_err=ob / 10, row_err=ob / 5, lse_err=lb / 10,
                    lse_max=106.3 if d == "large logits" else 8.0,
                    check="verified", check_detail="identical to ..."))
    e2e = []
    fmt_err = {"bf16": 1.7e-3, "fp16": 1.7e-3, "fp8": 3.7e-2, "int8": 9.4e-3, "int4": 0.14,
               "int8/int4": 0.10}
    for cond in ("gaussian", "outlier keys"):
        for smooth in (False, True):
            for kd, vd in A.E2E_DTYPES:
                label = kd if kd == vd else "%s/%s" % (kd, vd)
                kern = A.expected_kernel(kd, vd, A.HEAD, A.E2E_BLOCK, A.E2E_HQ // A.E2E_HKV,
                                         cc_major)
                ex = fmt_err[label] * (3.0 if cond == "outlier keys" and not smooth else 1.0)
                e2e.append(dict(cond=cond, smooth=smooth, dtype=label, kernel_id=kern,
                                kernel_name=A.KERNEL_NAMES[kern], exact=ex, kernel=1.66e-3,
                                rounding=1.66e-3, kernel_fp32=5e-7, exact_fp32=ex,
                                saturated=0, ok=True))
    meta = {"device": "NVIDIA H100 80GB HBM3", "cc": "9.0", "backend": backend,
            "torch": "2.11.0+cu130", "torch_cuda": "13.0", "kvpage": "0.1.0", "abi": "1.2",
            "build": "built for 90a-real", "commit": "abc1234", "seed": 42,
            "date": "2026-01-01", "seconds": 57, "e2e_B": 16, "e2e_T": 2048,
            "kernel_check": True, "argv": "bench/accuracy.py"}
    return {"meta": meta, "contract": contract, "e2e": e2e}


def table_rows(md, first_header_cell):
    """The rows of the markdown table whose header starts with the cell."""
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| " + first_header_cell + " |"):
            out = [line]
            for nxt in lines[i + 1:]:
                if not nxt.startswith("|"):
                    break
                out.append(nxt)
            return out
    raise AssertionError("no table with header %r" % first_header_cell)


def cells(line):
    return [c for c in re.split(r"(?<!\\)\|", line)[1:-1]]


@contextlib.contextmanager
def quiet():
    buf = io.StringIO()
    old = sys.stdout
    sys.stdout = buf
    try:
        yield buf
    finally:
        sys.stdout = old


class PlanRules(unittest.TestCase):
    def test_paths_get_their_kernels_on_sm90(self):
        got = [A.expected_kernel(p.k_dtype, p.v_dtype, A.HEAD, p.block_size, p.rows, 9)
               for p in A.PATHS]
        self.assertEqual(got, [TG, STAGED, REG, REG, REG, RING, TG])

    def test_every_kernel_is_covered_in_default_mode(self):
        got = {A.expected_kernel(p.k_dtype, p.v_dtype, A.HEAD, p.block_size, p.rows, 9)
               for p in A.PATHS}
        self.assertEqual(got, {TG, REG, RING, STAGED})

    def test_before_sm90_no_staged(self):
        self.assertEqual(A.expected_kernel("bf16", "bf16", 128, 16, 8, 8), REG)

    def test_precise_is_thread_group(self):
        for p in A.PATHS:
            self.assertEqual(A.expected_kernel(p.k_dtype, p.v_dtype, A.HEAD, p.block_size,
                                               p.rows, 9, precise=True), TG)

    def test_rules(self):
        E = A.expected_kernel
        self.assertEqual(E("fp8", "fp8", 128, 16, 1, 9), REG)      # quantized: TC at 1 row
        self.assertEqual(E("int4", "int4", 128, 16, 1, 9), RING)
        self.assertEqual(E("int4", "int4", 256, 16, 8, 9), REG)    # INT4 at 256: registers
        self.assertEqual(E("bf16", "bf16", 128, 16, 2, 9), STAGED)  # from 2 rows
        self.assertEqual(E("bf16", "bf16", 128, 16, 16, 9), REG)   # staged: <= 8 rows
        self.assertEqual(E("fp16", "fp16", 128, 32, 8, 9), REG)    # staged: block 16 only
        self.assertEqual(E("bf16", "bf16", 64, 16, 8, 9), REG)     # staged: head 128 only
        self.assertEqual(E("int8", "int4", 128, 16, 8, 9), TG)     # K != V
        self.assertEqual(E("int4", "int4", 64, 16, 8, 9), TG)      # INT4 needs D % 128
        self.assertEqual(E("fp8", "fp8", 96, 16, 8, 9), TG)        # 8-bit needs D % 64

    def test_forced_families(self):
        E = A.expected_kernel
        self.assertEqual(E("bf16", "bf16", 128, 16, 1, 9, family="tensor_core"), STAGED)
        self.assertEqual(E("bf16", "bf16", 128, 16, 1, 9, family="tensor_core", staged=False),
                         REG)
        self.assertEqual(E("bf16", "bf16", 128, 16, 8, 9, staged=False), REG)
        self.assertEqual(E("int8", "int8", 128, 16, 8, 9, family="thread_group"), TG)
        self.assertEqual(E("int8", "int4", 128, 16, 8, 9, family="tensor_core"), TG)

    def test_config_kernels(self):
        mha = A.PATHS[0]
        self.assertEqual(list(A.config_kernels(mha, 9).values()), [TG, TG, STAGED, REG])
        ring = A.PATHS[5]
        self.assertEqual(list(A.config_kernels(ring, 9).values()), [RING, TG, RING, RING])
        self.assertEqual(list(A.config_kernels(ring, 9, precise=True).values()),
                         [TG, TG, RING, RING])


class Verdicts(unittest.TestCase):
    def test_verified(self):
        v, d = A.kernel_verdict(STAGED, [("tg", TG, False), ("tc", STAGED, True),
                                         ("reg", REG, False)])
        self.assertEqual(v, "verified")
        self.assertIn("differs from", d)

    def test_mismatch(self):
        v, _ = A.kernel_verdict(STAGED, [("tg", TG, False), ("tc", STAGED, False),
                                         ("reg", REG, True)])
        self.assertEqual(v, "MISMATCH")

    def test_ambiguous(self):
        v, _ = A.kernel_verdict(TG, [("tg", TG, True), ("tc", STAGED, True)])
        self.assertEqual(v, "ambiguous")

    def test_unverified(self):
        v, _ = A.kernel_verdict(TG, [("tg", TG, False), ("tc", STAGED, False)])
        self.assertEqual(v, "unverified")
        v, _ = A.kernel_verdict(REG, [("tc", REG, True), ("reg", REG, False)])
        self.assertEqual(v, "unverified")

    def test_consistent_and_na(self):
        self.assertEqual(A.kernel_verdict(TG, [("tg", TG, True), ("tc", TG, True)])[0],
                         "consistent")
        self.assertEqual(A.kernel_verdict(TG, [])[0], "n/a")


class Bounds(unittest.TestCase):
    def test_bound_table_matches_gpu_test(self):
        # The bounds of tests/capi/gpu_test.cc GpuDecode.PrecisionContract,
        # read from its source: the two tables state one contract.
        import os
        import re
        src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "capi", "gpu_test.cc")).read()
        names = {"BF16": "bf16", "FP16": "fp16", "FP8_E4M3": "fp8", "INT8": "int8", "INT4": "int4"}
        want = {}
        for m in re.finditer(r'\{"[^"]*", KVP_DTYPE_(\w+), (\d+), (\d+), ([0-9.e-]+), '
                             r'([0-9.e-]+)\}', src):
            want[(names[m.group(1)], int(m.group(2)), int(m.group(3)))] = (
                float(m.group(4)), float(m.group(5)))
        self.assertEqual(len(want), 6, "the C++ test's path table was not found")
        for p in A.PATHS:
            if p.k_dtype == p.v_dtype:
                self.assertEqual((p.out_bound, p.lse_bound),
                                 want[(p.k_dtype, p.block_size, p.rows)], p.id)
        m = re.search(r"kPreciseOut = ([0-9.e-]+), kPreciseLse = ([0-9.e-]+);", src)
        self.assertIsNotNone(m, "the C++ test's precise bounds were not found")
        self.assertEqual((A.PRECISE_OUT_BOUND, A.PRECISE_LSE_BOUND),
                         (float(m.group(1)), float(m.group(2))))

    def test_passing_run(self):
        self.assertEqual(A.failures(fake_run()), [])

    def test_each_kind_of_failure(self):
        base = fake_run()
        cases = [
            ("out_err", 2.0, "output rel-L2"),
            ("lse_err", 2.0, "LSE error"),
            ("out_err", float("inf"), "output rel-L2"),
            ("lse_err", float("nan"), "LSE error"),
        ]
        for field, factor, text in cases:
            data = copy.deepcopy(base)
            r = data["contract"][9]
            r[field] = (r["out_bound"] if field == "out_err" else r["lse_bound"]) * factor
            bad = A.failures(data)
            self.assertEqual(len(bad), 1, (field, bad))
            self.assertIn(text, bad[0])
            self.assertIn(r["path"], bad[0])
        data = copy.deepcopy(base)
        data["contract"][3]["check"] = "MISMATCH"
        self.assertIn("another kernel ran", A.failures(data)[0])
        data = copy.deepcopy(base)
        data["contract"][0] = {k: v for k, v in data["contract"][0].items()
                               if k not in ("out_err", "lse_err", "row_err", "lse_max")}
        data["contract"][0]["error"] = "UnsupportedError: not built"
        self.assertIn("not built", A.failures(data)[0])
        data = copy.deepcopy(base)
        data["e2e"][2]["ok"] = False
        self.assertIn("end to end", A.failures(data)[0])
        data = copy.deepcopy(base)
        data["contract"] = []
        self.assertEqual(A.failures(data), ["contract: no rows measured"])

    def test_bound_is_inclusive(self):
        data = fake_run()
        r = data["contract"][0]
        r["out_err"], r["lse_err"] = r["out_bound"], r["lse_bound"]
        self.assertEqual(A.failures(data), [])

    def test_other_verdicts_do_not_fail(self):
        data = fake_run()
        for i, v in enumerate(("ambiguous", "unverified", "consistent", "n/a")):
            data["contract"][i]["check"] = v
        self.assertEqual(A.failures(data), [])


class Page(unittest.TestCase):
    def setUp(self):
        self.data = fake_run()
        self.md = A.render_doc(self.data, "img/accuracy.png")

    def test_generated_header_and_command(self):
        lines = self.md.splitlines()
        self.assertEqual(lines[0], "# Accuracy")
        self.assertTrue(lines[2].startswith("<!-- Generated by bench/accuracy.py"))
        self.assertIn("do not edit by hand", lines[2])
        self.assertIn(A.COMMAND, lines[2])
        self.assertIn("```sh\n%s\n```" % A.COMMAND, self.md)

    def test_sections(self):
        heads = [l for l in self.md.splitlines() if l.startswith("## ")]
        self.assertEqual(heads, ["## What each path rounds", "## Bounds",
                                 "## Measured against the bounds", "## Method",
                                 "## End to end: each format's error"])
        for anchor in re.findall(r"\]\(#([^)]+)\)", self.md):
            self.assertIn(anchor, [A_slug(h[3:]) for h in heads], anchor)

    def test_versions(self):
        for s in ("NVIDIA H100 80GB HBM3", "compute capability 9.0", "kvpage 0.1.0",
                  "ABI 1.2", "torch 2.11.0+cu130", "CUDA 13.0", "seed 42", "abc1234"):
            self.assertIn(s, self.md)

    def test_rounding_table(self):
        rows = table_rows(self.md, "kernel | runs for")
        self.assertEqual(cells(rows[0])[2:], [" q ", " K / V ", " logits ", " P ",
                                               " accumulators ", " LSE ", " output "])
        self.assertEqual(len(rows), 2 + len(A.ROUNDING_ROWS))
        text = "\n".join(rows)
        for s in ("thread-group", "staged", "registers", "ring", "FP16", "hi + lo",
                  "FP32 q stays FP32"):
            self.assertIn(s, text)

    def test_bounds_table(self):
        rows = table_rows(self.md, "path")
        self.assertEqual(len(rows), 2 + len(A.PATHS) + 1)
        self.assertIn("tensor-core staged", rows[3])
        self.assertIn("precise mode", rows[-1])
        self.assertIn("%g" % A.PRECISE_LSE_BOUND, rows[-1])

    def test_measured_table(self):
        rows = table_rows(self.md, "kernel | cache")
        n = 2 * len(A.PATHS) * len(A.DATA)
        self.assertEqual(len(rows), 2 + n)
        head = cells(rows[0])
        self.assertEqual([h.strip() for h in head],
                         ["kernel", "cache", "shape", "data", "FP32-out rel-L2", "worst row",
                          "LSE error", "max \\|LSE\\|", "bounds (out / LSE)", "kernel check",
                          "result"])
        for r in rows[2:]:
            self.assertEqual(len(cells(r)), len(head), r)
            self.assertTrue(r.endswith("| pass |"), r)
        precise = [r for r in rows[2:] if "(precise mode)" in r]
        self.assertEqual(len(precise), n // 2)
        for d in A.DATA:
            self.assertEqual(sum(1 for r in rows[2:] if "| %s |" % d in r), n // len(A.DATA))
        ring = [p for p in A.PATHS if p.k_dtype == "int4" and p.v_dtype == "int4"][0]
        self.assertIn("| tensor-core ring | INT4 | GQA 16/2, D 128, block 16, T 32768 | "
                      "long context | %.2e |" % (ring.out_bound / 10), self.md)

    def test_e2e_table_and_summary(self):
        rows = table_rows(self.md, "keys")
        self.assertEqual(len(rows), 2 + 24)
        for r in rows[2:]:
            self.assertEqual(len(cells(r)), len(cells(rows[0])), r)
        self.assertIn("![rel-L2 error by KV dtype](img/accuracy.png)", self.md)
        self.assertIn("INT8 0.94%", self.md)
        self.assertIn("24 of 24", self.md)

    def test_no_plot_no_image(self):
        self.assertNotIn("![", A.render_doc(self.data, None))

    def test_no_nan_or_python_reprs(self):
        text = re.sub(r"`[^`]*`", "", self.md)  # code spans may name Python values
        for bad in ("nan", "None", "True", "False", "{", "}"):
            self.assertIsNone(re.search(r"\b%s\b" % re.escape(bad) if bad.isalpha()
                                        else re.escape(bad), text), bad)

    def test_failed_rows_render(self):
        data = copy.deepcopy(self.data)
        data["contract"][1]["out_err"] = float("inf")
        r = data["contract"][2]
        for k in ("out_err", "lse_err", "row_err", "lse_max"):
            del r[k]
        r["error"] = "UnsupportedError: no FP8 in this build"
        data["e2e"][0] = {"error": "UnsupportedError: x", "cond": "gaussian", "smooth": False,
                          "dtype": "bf16", "kernel_name": "thread-group"}
        md = A.render_doc(data)
        self.assertIn("**FAIL**: UnsupportedError: no FP8 in this build", md)
        self.assertIn("| inf |", md)
        for table in ("kernel | cache", "keys"):
            rows = table_rows(md, table)
            for r in rows:
                self.assertEqual(len(cells(r)), len(cells(rows[0])), r)


def A_slug(heading):
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


class Publish(unittest.TestCase):
    def test_passing_run_writes_the_page(self):
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "docs", "ACCURACY.md")
            os.makedirs(os.path.dirname(doc))
            with quiet():
                rc = A.publish(fake_run(), os.path.join(d, "out"), doc)
            self.assertEqual(rc, 0)
            with open(doc) as f:
                self.assertIn("## Measured against the bounds", f.read())
            self.assertTrue(os.path.exists(os.path.join(d, "out", "ACCURACY.md")))

    def test_failing_run_keeps_the_page(self):
        data = fake_run()
        data["contract"][5]["lse_err"] = 1.0
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "ACCURACY.md")
            with open(doc, "w") as f:
                f.write("old\n")
            with quiet() as out:
                rc = A.publish(data, os.path.join(d, "out"), doc)
            self.assertEqual(rc, 1)
            self.assertIn("FAILED (1)", out.getvalue())
            self.assertIn("not written", out.getvalue())
            with open(doc) as f:
                self.assertEqual(f.read(), "old\n")
            with open(os.path.join(d, "out", "ACCURACY.md")) as f:
                self.assertIn("**FAIL**", f.read())

    def test_from_json_round_trip(self):
        data = fake_run()
        data["contract"][0]["row_err"] = float("inf")  # not bounded: still passes
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "accuracy.json")
            with quiet():
                A.write_outputs(data, d)
            with open(path) as f:
                self.assertEqual(json.load(f)["meta"]["seed"], 42)
            doc = os.path.join(d, "page.md")
            with quiet():
                rc = A.main(["--from-json", path, "--doc", doc])
            self.assertEqual(rc, 0)
            with open(doc) as f, open(path) as j:
                page = f.read()
                self.assertIn("## Measured against the bounds", page)
                self.assertIn("| inf |", page)  # the worst row, read back from JSON
            with open(os.path.join(d, "accuracy.csv")) as f:
                self.assertEqual(len(f.read().strip().splitlines()), 1 + len(data["contract"]))

    def test_cpu_run_never_becomes_the_page_by_default(self):
        data = fake_run(backend="CPU")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "accuracy.json")
            with open(path, "w") as f:
                json.dump(data, f)
            saved = A.DEFAULT_DOC
            A.DEFAULT_DOC = os.path.join(d, "page.md")  # never the real page
            try:
                args = A.parse_args(["--from-json", path])
                self.assertEqual(args.doc, A.DEFAULT_DOC)  # until main() sees the backend
                with quiet():
                    rc = A.main(["--from-json", path])
                self.assertEqual(rc, 0)
                self.assertFalse(os.path.exists(A.DEFAULT_DOC))
                with quiet():
                    rc = A.main(["--from-json", path, "--doc", A.DEFAULT_DOC])
                self.assertTrue(os.path.exists(A.DEFAULT_DOC))  # when asked, it is
            finally:
                A.DEFAULT_DOC = saved


class Args(unittest.TestCase):
    def test_defaults(self):
        a = A.parse_args([])
        self.assertEqual((a.device, a.doc, a.out, a.quick, a.seed, a.kernel_check),
                         ("cuda", A.DEFAULT_DOC, "out/accuracy", False, None, True))

    def test_options(self):
        self.assertIsNone(A.parse_args(["--no-doc"]).doc)
        self.assertIsNone(A.parse_args(["--device", "cpu"]).doc)
        self.assertEqual(A.parse_args(["--device", "cpu", "--doc", "x.md"]).doc, "x.md")
        a = A.parse_args(["--quick", "--seed", "7", "--no-kernel-check", "--out", "o"])
        self.assertEqual((a.quick, a.seed, a.kernel_check, a.out), (True, 7, False, "o"))
        with quiet(), contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(SystemExit):
                A.parse_args(["--device", "tpu"])

    def test_imports_without_torch(self):
        self.assertNotIn("torch", A.__dict__)


@unittest.skipUnless(os.environ.get("KVPAGE_ACCURACY_CPU") == "1",
                     "KVPAGE_ACCURACY_CPU=1 runs the script on the CPU backend")
class CpuBackendRun(unittest.TestCase):
    def test_whole_script_on_cpu(self):
        sys.path.insert(0, os.path.join(A.REPO, "bindings", "python"))
        with tempfile.TemporaryDirectory() as d:
            with quiet():
                rc = A.main(["--device", "cpu", "--quick", "--seed", "3", "--out", d])
            self.assertEqual(rc, 0)
            with open(os.path.join(d, "accuracy.json")) as f:
                data = json.load(f)
            self.assertEqual(len(data["contract"]), 2 * len(A.PATHS) * len(A.DATA))
            self.assertEqual(len(data["e2e"]), 24)
            for r in data["contract"]:
                # The CPU backend computes in FP32 at least: the precise bounds hold.
                self.assertLessEqual(r["out_err"], A.PRECISE_OUT_BOUND, r)
                self.assertLessEqual(r["lse_err"], A.PRECISE_LSE_BOUND, r)
                self.assertTrue(math.isfinite(r["row_err"]))
            ll = [r for r in data["contract"] if r["data"] == "large logits"]
            self.assertTrue(all(r["lse_max"] > 90 for r in ll))


if __name__ == "__main__":
    unittest.main()
