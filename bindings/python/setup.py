#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds the kvpage wheel: the ctypes package, libkvpage.so and every shared
library it loads that a base system lacks (Debian's Abseil libabsl_*.so),
into the package folder. Offline, with the system's setuptools and wheel:

    KVPAGE_BUILD_DIR=$PWD/build pip install --no-build-isolation ./bindings/python
    KVPAGE_BUILD_DIR=$PWD/build python3 -m pip wheel --no-build-isolation --no-deps \\
        -w dist ./bindings/python

libkvpage.so comes from KVPAGE_LIBRARY (a built libkvpage.so), else
KVPAGE_BUILD_DIR (the CMake build directory holding it), else the checkout's
build/. ldd lists what it loads; glibc, the C++ runtime and the CUDA driver
stay out. kvpage/_bundled_libs.txt names the bundled libraries in dependency
order, and kvpage/_lib.py loads them from there before libkvpage.so.
"""

import os
import re
import shutil
import stat
import struct
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "kvpage"
BUNDLE_LIST = "_bundled_libs.txt"  # the name kvpage/_lib.py reads

# Libraries of every Linux system (glibc, the C++ runtime, the CUDA driver),
# by soname: never bundled.
SYSTEM_LIBS = re.compile(
    r"^(ld-linux[-\w]*|ld64|linux-vdso|linux-gate|libc|libm|libdl|librt|libpthread|libutil|"
    r"libresolv|libmvec|libanl|libnsl|libstdc\+\+|libgcc_s|libcuda|libnvidia-[-\w]*)\.so(\.|$)")


class BundleError(Exception):
    """The library or one of its dependencies cannot be bundled."""


def find_library():
    """The real path of the libkvpage.so to bundle."""
    env = os.environ.get("KVPAGE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise BundleError("KVPAGE_LIBRARY=%s is not a file" % env)
        return os.path.realpath(env)
    build_dir = os.environ.get("KVPAGE_BUILD_DIR")
    where = build_dir or os.path.join(os.path.dirname(os.path.dirname(HERE)), "build")
    path = os.path.join(where, "libkvpage.so")
    if os.path.isfile(path):
        return os.path.realpath(path)
    raise BundleError(
        "no libkvpage.so in %s: set KVPAGE_LIBRARY to a built libkvpage.so, or "
        "KVPAGE_BUILD_DIR to the CMake build directory holding it (cmake -S . -B build "
        "&& cmake --build build)" % where)


def elf_needed(path):
    """The DT_NEEDED names of an ELF shared library (its .dynamic section)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise BundleError("%s is not an ELF file" % path)
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff = struct.unpack_from(end + "Q", data, 0x28)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        shfmt, dynfmt = end + "IIQQQQIIQQ", end + "qQ"
    else:
        shoff = struct.unpack_from(end + "I", data, 0x20)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        shfmt, dynfmt = end + "IIIIIIIIII", end + "iI"
    sections = [struct.unpack_from(shfmt, data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for sec in sections:
        if sec[1] != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[sec[6]][4]  # sh_link: the string table's offset
        size = struct.calcsize(dynfmt)
        for off in range(sec[4], sec[4] + sec[5], size):
            tag, val = struct.unpack_from(dynfmt, data, off)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                start = strtab + val
                needed.append(data[start:data.index(b"\0", start)].decode())
    return needed


def ldd(path):
    """soname -> path of every library the loader loads for path, recursively."""
    try:
        out = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, check=False)
    except OSError as e:
        raise BundleError("cannot run ldd (libc-bin) on %s: %s" % (path, e))
    if out.returncode:
        raise BundleError("ldd %s failed: %s" % (path, out.stderr.strip() or out.stdout.strip()))
    deps, missing = {}, []
    for line in out.stdout.splitlines():
        if "=>" not in line:
            continue  # the vDSO and the dynamic loader
        name, rest = (x.strip() for x in line.split("=>", 1))
        if rest.startswith("not found"):
            missing.append(name)
        elif rest:
            deps[name] = rest.rsplit(" (", 1)[0].strip()
    if missing:
        raise BundleError("%s needs %s, which the loader does not find"
                          % (path, ", ".join(missing)))
    return deps


def bundle_plan(lib):
    """[(soname, path)] of the libraries to bundle with lib, dependencies first."""
    deps = {n: p for n, p in ldd(lib).items() if not SYSTEM_LIBS.match(n)}
    order, state = [], {}

    def visit(name, chain):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise BundleError("dependency cycle: %s" % " -> ".join(chain + [name]))
        state[name] = "visiting"
        for dep in sorted(elf_needed(deps[name])):
            if dep in deps:
                visit(dep, chain + [name])
        state[name] = "done"
        order.append(name)

    for name in sorted(elf_needed(lib)):
        if name in deps:
            visit(name, [])
    for name in sorted(deps):  # only reachable through a system library: kept too
        visit(name, [])
    return [(n, deps[n]) for n in order]


def library_version(lib):
    """kvp_version_string() of lib, else KVP_VERSION_STRING of the checkout's
    header, else the package's __version__."""
    if lib:
        try:
            import ctypes
            fn = ctypes.CDLL(lib).kvp_version_string
            fn.restype = ctypes.c_char_p
            return fn().decode()
        except (OSError, AttributeError):
            pass
    for path, pattern in (
            (os.path.join(HERE, "..", "..", "include", "kvpage", "kvpage.h"),
             r'#define\s+KVP_VERSION_STRING\s+"([^"]+)"'),
            (os.path.join(HERE, PACKAGE, "__init__.py"), r'__version__\s*=\s*"([^"]+)"')):
        try:
            with open(path) as f:
                m = re.search(pattern, f.read())
        except OSError:
            continue
        if m:
            return m.group(1)
    raise BundleError("cannot tell kvpage's version: no library, header or __version__")


def bundle(dest, log=print):
    """Copies libkvpage.so and its bundled libraries into the package folder
    dest and writes the load order list; returns the copied paths."""
    lib = find_library()
    plan = bundle_plan(lib)
    for name in os.listdir(dest):  # a previous build's libraries
        if name == BUNDLE_LIST or re.match(r"^lib.*\.so(\.|$)", name):
            os.remove(os.path.join(dest, name))
    copied = []
    for name, src in plan + [("libkvpage.so", lib)]:
        target = os.path.join(dest, name)
        shutil.copyfile(src, target)
        os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        copied.append(target)
        log("kvpage: bundling %s (%s)" % (name, src))
    with open(os.path.join(dest, BUNDLE_LIST), "w") as f:
        f.write("# Loaded in this order before libkvpage.so (written by setup.py).\n")
        for name, _ in plan:
            f.write(name + "\n")
    return copied


def main():
    from setuptools import Distribution, setup
    from setuptools.command.build_py import build_py

    class BinaryDistribution(Distribution):
        """Native libraries inside: a platform wheel, installed to platlib."""

        def has_ext_modules(self):
            return True

    class BuildPy(build_py):
        """build_py, then libkvpage.so and its libraries into the package."""

        def run(self):
            super().run()
            if not self.dry_run:
                try:
                    bundle(os.path.join(self.build_lib, PACKAGE), log=self.announce_info)
                except BundleError as e:
                    raise SystemExit("error: kvpage: %s" % e)

        def announce_info(self, msg):
            self.announce(msg, level=2)

    cmdclass = {"build_py": BuildPy}
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
    except ImportError:
        try:
            from wheel.bdist_wheel import bdist_wheel
        except ImportError:
            bdist_wheel = None
    if bdist_wheel is not None:
        class BdistWheel(bdist_wheel):
            """py3-none-<platform>: native libraries, but no extension module."""

            def get_tag(self):
                return "py3", "none", super().get_tag()[2]

        cmdclass["bdist_wheel"] = BdistWheel

    try:
        lib = find_library()
    except BundleError:
        lib = None  # build_py reports it
    setup(version=library_version(lib), cmdclass=cmdclass, distclass=BinaryDistribution)


if __name__ == "__main__":
    main()
