#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The wheel as an engine installs it, offline (ctest: python_wheel).

    check_wheel.py /path/to/libkvpage.so

Copies bindings/python to a temporary folder; builds the wheel there with
`pip wheel --no-build-isolation --no-index` from that libkvpage.so; checks its
contents (py.typed, libkvpage.so, every non-system library ldd lists, in
dependency order, and nothing of glibc or the C++ runtime), tag and metadata;
installs it with `pip install --target`; then, in a clean environment (no
KVPAGE_LIBRARY, no LD_LIBRARY_PATH, PYTHONPATH only the target), imports
kvpage, checks through /proc/self/maps that libkvpage and every Abseil
library come from the package folder, and runs a CPU decode and attend
against a float64 reference. Also: KVPAGE_LIBRARY still overrides, `pip
install` of the source folder works, and a build without a library names
what to set.

Exit 77 (ctest's skip) where no Python here has pip, setuptools and wheel
(the interpreter running this, $KVPAGE_WHEEL_PYTHON, python3 on PATH and
/usr/bin/python3 are tried), or for a sanitizer build.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)

TOOLING = """
import importlib.util, sys, setuptools
assert importlib.util.find_spec("pip"), "no pip"
try:
    import setuptools.command.bdist_wheel
except ImportError:
    import wheel.bdist_wheel
print(sys.executable)
"""

# Runs in the clean environment; prints a JSON report.
CHILD = r"""
import array, json, math, os, sys, typing
site = os.path.realpath(sys.argv[1])
import kvpage
pkg = os.path.realpath(os.path.dirname(kvpage.__file__))
lib = kvpage.library()
maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            maps.add(parts[5].strip())
absl = sorted(m for m in maps if os.path.basename(m).startswith("libabsl_"))
report = {
    "pkg": pkg, "library": os.path.realpath(lib.path), "version": kvpage.version(),
    "absl": absl, "kvpage_maps": sorted(m for m in maps if "libkvpage" in m),
    "unmapped": [p for p in kvpage._lib.bundled_libraries(pkg) if os.path.realpath(p) not in maps],
    "py_typed": os.path.isfile(os.path.join(pkg, "py.typed")),
    "hint": typing.get_type_hints(kvpage.Cache.decoder)["return"] is kvpage.Decoder,
}
if sys.argv[2] == "full":
    H, HQ, D, n = 2, 4, 64, 20
    val = lambda i: ((i * 37) % 29 - 14) / 16.0  # exact in FP16
    cache = kvpage.Cache(num_blocks=4, num_kv_heads=H, head_size=D, block_size=16, dtype="fp16")
    seq = cache.create_sequence()
    k = [val(i) for i in range(n * H * D)]
    v = [val(i + 5) for i in range(n * H * D)]
    cache.write(0, array.array("f", k), array.array("f", v), seq.append(n))
    table, lens = cache.export_block_table([seq], 2)
    dec = cache.decoder(HQ, 1, 64, 3, q_dtype="fp32", out_dtype="fp32")
    q = [val(i + 11) / 4 for i in range(3 * HQ * D)]

    def ref(tok, ctx):  # query token tok (q row) over keys 0..ctx-1, float64
        out = []
        for h in range(HQ):
            g = h // (HQ // H)
            qs = q[(tok * HQ + h) * D:(tok * HQ + h + 1) * D]
            logits = [sum(a * b for a, b in zip(qs, k[(j * H + g) * D:(j * H + g + 1) * D]))
                      / math.sqrt(D) for j in range(ctx)]
            m = max(logits)
            w = [math.exp(x - m) for x in logits]
            s = sum(w)
            out += [sum(w[j] * v[(j * H + g) * D + d] for j in range(ctx)) / s for d in range(D)]
        return out

    out = dec(array.array("f", q[:HQ * D]), [list(table)], lens)
    err = max(abs(a - b) for a, b in zip(out, ref(0, n)))
    out3 = dec.attend(array.array("f", q), [0, 3], [list(table)], lens)
    want = ref(0, n - 2) + ref(1, n - 1) + ref(2, n)
    err3 = max(abs(a - b) for a, b in zip(out3, want))
    report.update(decode_err=err, attend_err=err3, n_out=len(out), n_out3=len(out3))
    cache.close()
print(json.dumps(report))
"""


def log(msg):
    print("check_wheel: %s" % msg, flush=True)


def find_python():
    """A Python with pip, setuptools and wheel (its real executable), or None."""
    candidates = [sys.executable, os.environ.get("KVPAGE_WHEEL_PYTHON"),
                  shutil.which("python3"), "/usr/bin/python3"]
    seen = set()
    for py in candidates:
        if not py or py in seen or not os.path.exists(py):
            continue
        seen.add(py)
        r = subprocess.run([py, "-c", TOOLING], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        if r.returncode == 0:
            return r.stdout.strip().splitlines()[-1]
        log("%s lacks the tooling: %s" % (py, (r.stderr.strip().splitlines() or ["?"])[-1]))
    return None


def run(label, cmd, env, expect_ok=True):
    t0 = time.time()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    log("%s (%.1f s): exit %d" % (label, time.time() - t0, r.returncode))
    if expect_ok and r.returncode != 0:
        raise AssertionError("failed: %s\n%s" % (" ".join(cmd), r.stdout))
    return r


def load_setup(src):
    spec = importlib.util.spec_from_file_location("kvpage_setup", os.path.join(src, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    log("ok: %s" % what)


def clean_env(site, **extra):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": site,
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "LC_ALL": "C.UTF-8"}
    env.update(extra)
    return env


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    library = os.path.realpath(sys.argv[1])
    sys.dont_write_bytecode = True  # nothing written into the source folder
    setup = load_setup(SOURCE)
    deps = setup.ldd(library)
    if any(n.startswith(("libasan", "libtsan", "libubsan")) for n in deps):
        log("skipped: a sanitizer build (its runtime must come first, not from a wheel)")
        return SKIP
    py = find_python()
    if py is None:
        log("skipped: no Python with pip, setuptools and wheel (set KVPAGE_WHEEL_PYTHON)")
        return SKIP
    log("using %s and %s" % (py, library))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="kvpage-wheel-") as tmp:
        src = os.path.join(tmp, "src")
        shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", "*.pyc", "tests"))
        build_env = {k: v for k, v in os.environ.items()
                     if k not in ("KVPAGE_LIBRARY", "KVPAGE_BUILD_DIR")}
        build_env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
                         PIP_DISABLE_PIP_VERSION_CHECK="1",
                         PIP_NO_CACHE_DIR="1", PIP_ROOT_USER_ACTION="ignore",
                         PYTHONDONTWRITEBYTECODE="1")
        pip = [py, "-m", "pip"]

        # No library: the error names what to set.
        r = run("pip wheel without a library",
                pip + ["wheel", "--no-build-isolation", "--no-deps", "-w",
                       os.path.join(tmp, "none"), src],
                dict(build_env, KVPAGE_BUILD_DIR=os.path.join(tmp, "nowhere")), expect_ok=False)
        check(r.returncode != 0 and "KVPAGE_LIBRARY" in r.stdout
              and "KVPAGE_BUILD_DIR" in r.stdout, "a build without a library says what to set")

        # The wheel.
        dist = os.path.join(tmp, "dist")
        run("pip wheel", pip + ["wheel", "--no-build-isolation", "--no-deps", "-w", dist, src],
            dict(build_env, KVPAGE_LIBRARY=library))
        wheels = [w for w in os.listdir(dist) if w.endswith(".whl")]
        check(len(wheels) == 1, "one wheel built: %s" % wheels)
        wheel = os.path.join(dist, wheels[0])
        version = setup.library_version(library)
        check(wheels[0].startswith("kvpage-%s-py3-none-linux_" % version),
              "wheel name and tag: %s" % wheels[0])
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            meta = z.read("kvpage-%s.dist-info/METADATA" % version).decode()
            wheel_info = z.read("kvpage-%s.dist-info/WHEEL" % version).decode()
            order = [n for n in z.read("kvpage/_bundled_libs.txt").decode().splitlines()
                     if n and not n.startswith("#")]
        for f in ("kvpage/__init__.py", "kvpage/py.typed", "kvpage/libkvpage.so",
                  "kvpage/_bundled_libs.txt"):
            check(f in names, "the wheel holds %s" % f)
        check("Root-Is-Purelib: false" in wheel_info, "a platform wheel (platlib)")
        check("Name: kvpage" in meta and "Version: %s" % version in meta
              and ("License: Apache-2.0" in meta or "License-Expression: Apache-2.0" in meta),
              "metadata: name, version %s, license Apache-2.0" % version)
        expected = [n for n, _ in setup.bundle_plan(library)]
        check(sorted(order) == sorted(expected) and sorted(expected) == sorted(
            n for n in deps if not setup.SYSTEM_LIBS.match(n)),
              "bundled: every non-system library ldd lists (%d)" % len(expected))
        check(all("kvpage/" + n in names for n in order), "every listed library is in the wheel")
        libs_in_wheel = sorted(os.path.basename(n) for n in names if ".so" in n)
        check(not [n for n in libs_in_wheel if setup.SYSTEM_LIBS.match(n)],
              "no glibc, C++ runtime or driver library in the wheel")

        # Installed.
        site = os.path.join(tmp, "site")
        run("pip install --target (the wheel)",
            pip + ["install", "--no-deps", "--target", site, wheel], build_env)
        pkg = os.path.realpath(os.path.join(site, "kvpage"))
        early = [(n, d) for i, n in enumerate(order)
                 for d in setup.elf_needed(os.path.join(pkg, n)) if d in order[i:]]
        check(not early, "each bundled library is listed after its bundled dependencies")
        outside = [(n, d) for n in order + ["libkvpage.so"]
                   for d in setup.elf_needed(os.path.join(pkg, n))
                   if d not in order and not setup.SYSTEM_LIBS.match(d)]
        check(not outside, "the installed libraries need nothing outside the package folder "
              "and the base system")

        def child(site, mode, **env):
            r = run("import kvpage (%s, %s)" % (os.path.basename(site), mode),
                    [py, "-c", CHILD, site, mode], clean_env(site, **env))
            return json.loads(r.stdout.strip().splitlines()[-1])

        rep = child(site, "full")
        check(rep["pkg"] == pkg, "kvpage imported from the target")
        check(rep["library"] == os.path.join(pkg, "libkvpage.so")
              and rep["kvpage_maps"] == [os.path.join(pkg, "libkvpage.so")],
              "libkvpage.so loaded from the package folder, and no other")
        check(rep["absl"] and all(os.path.dirname(m) == pkg for m in rep["absl"]),
              "all %d Abseil libraries mapped come from the package folder" % len(rep["absl"]))
        check(not rep["unmapped"], "every bundled library is loaded")
        check(rep["version"] == version and rep["py_typed"] and rep["hint"],
              "version %s, py.typed and type hints installed" % version)
        check(rep["n_out"] == 4 * 64 and rep["decode_err"] < 1e-5,
              "CPU decode matches float64 (max error %.2g)" % rep["decode_err"])
        check(rep["n_out3"] == 3 * 4 * 64 and rep["attend_err"] < 1e-5,
              "CPU attend matches float64 (max error %.2g)" % rep["attend_err"])

        rep = child(site, "light", KVPAGE_LIBRARY=library)
        check(rep["library"] == library and rep["kvpage_maps"] == [library],
              "KVPAGE_LIBRARY still overrides the bundled library")

        # pip install of the source folder (builds the wheel on the way).
        site2 = os.path.join(tmp, "site2")
        run("pip install --target (the source folder)",
            pip + ["install", "--no-build-isolation", "--no-deps", "--target", site2, src],
            dict(build_env, KVPAGE_LIBRARY=library))
        rep = child(site2, "light")
        pkg2 = os.path.realpath(os.path.join(site2, "kvpage"))
        check(rep["library"] == os.path.join(pkg2, "libkvpage.so") and rep["absl"]
              and all(os.path.dirname(m) == pkg2 for m in rep["absl"]),
              "pip install of the source folder bundles and loads the same way")
    log("passed in %.1f s" % (time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
