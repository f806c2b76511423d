#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every fenced code block of README.md and bindings/README.md, tested.

    readme_blocks.py GROUP --root SOURCE --build BUILD [--library LIB] [--cc CC]
                     [--cmake CMAKE] [--work DIR]

A block is tested by the group its language (or its directive) names:

  blocks  accounts for every block: its language is one this script tests,
          or its directive says why not; shell blocks pass `bash -n`;
          fragments name a file of the checkout that exists.
  c       installs the build into a prefix of its own, compiles each C block
          (a whole program) through the README's `run c` shell lines
          (pkg-config), also with -std=c99 -Wall -Wextra -pedantic -Werror,
          and runs it with LD_LIBRARY_PATH unset; configures, builds and runs
          each `run c` CMake block as a project around the first C program.
  python  runs each Python block (PYTHONPATH=bindings/python,
          KVPAGE_LIBRARY=the build's library), a block that needs torch with
          the first interpreter that has it (this one, python3 on PATH,
          /usr/bin/python3, $KVPAGE_DOC_PYTHON), and the `run python` shell
          blocks in a folder whose bindings/ and build/ are the checkout's
          and the build's.
  rust    builds each Rust program with the `cargo manifest` TOML block as
          its dependencies and the `build.rs` Rust block as its build script,
          against an install of the build, and runs it with LD_LIBRARY_PATH
          unset (exit 77 without cargo).
  go      puts each Go program in a module of its own, runs the `run go`
          shell lines there (go mod edit, go build), builds and runs it with
          LD_LIBRARY_PATH unset (exit 77 without go or pkg-config).

Defaults by language: c, python, rust and go blocks are programs of their
group; sh blocks get `bash -n` only. A directive is an HTML comment on the
last non-blank line before the fence, `<!-- doctest: WHAT -->`:

  needs torch | needs torch>=2.4 | needs cuda   (python; skipped where no
                                   interpreter has it, said so in the log)
  run c | run python | run go      (sh, cmake: run by that group; placeholders
                                   /opt/kvpage and /path/to/kvpage become the
                                   group's install prefix and the checkout)
  cargo manifest                   (toml: the Rust programs' dependencies)
  build.rs                         (rust: the Rust programs' build script)
  fragment of PATH ...             (not run; PATH, relative to the checkout,
                                   holds the whole of it, and must exist)
  skip: REASON                     (not run, the reason is required; a
                                   shell block still passes bash -n)

Text after the WHAT (in parentheses, say) is a note for readers. Every
program must be complete: includes or imports, main, error handling.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
FILES = ["README.md", "bindings/README.md"]
SHELL = ("sh", "bash", "shell")
GROUPS = ("blocks", "c", "python", "rust", "go")
DIRECTIVE = re.compile(r"^\s*<!--\s*doctest:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^ {0,3}(```+)\s*([^`\s]*)\s*(.*)$")


class Block(object):
    def __init__(self, path, line, lang, info, directive, text):
        self.path, self.line, self.lang, self.info = path, line, lang, info
        self.directive, self.text = directive, text
        self.kind, self.arg = parse_directive(directive) if directive else (None, None)

    @property
    def where(self):
        return "%s:%d" % (self.path, self.line)

    def __repr__(self):
        return "%s (```%s%s)" % (self.where, self.lang,
                                 ", doctest: %s" % self.directive if self.directive else "")


def parse_directive(text):
    """(kind, argument) of a directive's text; kind None where it is not one."""
    m = re.match(r"needs\s+(.+)$", text)
    if m:
        return "needs", m.group(1).split()
    m = re.match(r"run\s+(c|python|go)\b", text)
    if m:
        return "run", m.group(1)
    m = re.match(r"fragment of\s+(\S+)", text)
    if m:
        return "fragment", m.group(1).rstrip(",;:")
    m = re.match(r"skip:\s*(\S.*)$", text)
    if m:
        return "skip", m.group(1)
    if re.match(r"cargo manifest\b", text):
        return "manifest", None
    if re.match(r"build\.rs\b", text):
        return "build_rs", None
    return None, text


def read_blocks(root):
    blocks = []
    for rel in FILES:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            fence, lang, info = m.group(1), m.group(2).lower(), m.group(3)
            start = i
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            d = DIRECTIVE.match(lines[j]) if j >= 0 else None
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^ {0,3}%s\s*$" % fence, lines[i]):
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise SystemExit("%s:%d: code fence never closed" % (rel, start + 1))
            blocks.append(Block(rel, start + 1, lang, info, d.group(1) if d else None,
                                "\n".join(body) + "\n"))
            i += 1
    return blocks


def group_of(b):
    """The group that runs a block, or None (fragments, skips, syntax only)."""
    if b.kind in ("fragment", "skip"):
        return None
    if b.kind == "run":
        return b.arg
    if b.lang in ("c", "python", "rust", "go"):
        return b.lang
    if b.lang == "toml" and b.kind == "manifest":
        return "rust"
    return None


# ---------------------------------------------------------------------------


class Runner(object):
    def __init__(self, args):
        self.args = args
        self.root = os.path.abspath(args.root)
        self.build = os.path.abspath(args.build)
        self.library = os.path.abspath(args.library or os.path.join(self.build, "libkvpage.so"))
        self.work = os.path.abspath(args.work or os.path.join(self.build, "doc-blocks"))
        self.blocks = read_blocks(self.root)
        self.passed, self.failed, self.skipped = [], [], []

    # -- helpers --------------------------------------------------------------

    def ok(self, b, what):
        self.passed.append(b)
        print("ok    %s: %s" % (b.where, what))

    def fail(self, b, what, output=""):
        self.failed.append(b)
        print("FAIL  %s: %s" % (b.where, what))
        if output:
            print("      " + output.rstrip().replace("\n", "\n      "))

    def skip(self, b, why):
        self.skipped.append(b)
        print("skip  %s: %s" % (b.where, why))

    def run(self, cmd, cwd=None, env=None, timeout=300):
        """(returncode, output) of a command; LD_LIBRARY_PATH is never passed."""
        e = dict(os.environ if env is None else env)
        e.pop("LD_LIBRARY_PATH", None)
        try:
            p = subprocess.run(cmd, cwd=cwd, env=e, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, timeout=timeout)
        except subprocess.TimeoutExpired as ex:
            return 124, "timed out after %d s: %s\n%s" % (timeout, cmd, ex.output or "")
        except OSError as ex:
            return 127, "cannot run %s: %s" % (cmd[0], ex)
        return p.returncode, p.stdout

    def fresh(self, *parts):
        d = os.path.join(self.work, *parts)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    def install(self, group):
        """Installs the build into <work>/<group>/prefix (the same path every
        run: Go's build cache does not see pkg-config's output change)."""
        prefix = os.path.join(self.work, group, "prefix")
        shutil.rmtree(prefix, ignore_errors=True)
        rc, out = self.run([self.args.cmake, "--install", self.build, "--prefix", prefix])
        if rc:
            raise SystemExit("cmake --install %s failed:\n%s" % (self.build, out))
        pcs = [os.path.join(d, f) for d, _, fs in os.walk(prefix) for f in fs if f == "kvpage.pc"]
        if not pcs:
            raise SystemExit("no kvpage.pc under %s" % prefix)
        return prefix, os.path.dirname(pcs[0])

    def substitute(self, text, prefix=None, pcdir=None):
        """The placeholders of the READMEs made real."""
        if pcdir:
            text = text.replace("/opt/kvpage/lib/pkgconfig", pcdir)
        if prefix:
            text = text.replace("/opt/kvpage", prefix)
        return text.replace("/path/to/kvpage", self.root)

    def of(self, group, lang=None, kind=None):
        return [b for b in self.blocks if group_of(b) == group
                and (lang is None or b.lang == lang) and (kind is None or b.kind == kind)]

    def finish(self, group):
        print("%s: %d passed, %d failed, %d skipped"
              % (group, len(self.passed), len(self.failed), len(self.skipped)))
        if self.failed:
            return 1
        return 0 if self.passed else SKIP

    # -- blocks: every block accounted for --------------------------------------

    def check_blocks(self):
        langs = {"c", "python", "rust", "go", "toml", "cmake"} | set(SHELL)
        for b in self.blocks:
            if b.directive is not None and b.kind is None:
                self.fail(b, "unknown doctest directive %r" % b.directive)
                continue
            if not b.lang:
                self.fail(b, "a code block without a language")
                continue
            if b.lang in SHELL:
                rc, out = self.run(["bash", "-n", "-c", b.text])
                if rc:
                    self.fail(b, "bash -n", out)
                    continue
            if b.kind == "fragment":
                path = os.path.join(self.root, b.arg)
                if os.path.exists(path):
                    self.ok(b, "fragment of %s (exists)" % b.arg)
                else:
                    self.fail(b, "fragment of %s, which does not exist" % b.arg)
                continue
            if b.kind == "skip":
                self.ok(b, "%snot run: %s" % ("bash -n; " if b.lang in SHELL else "", b.arg))
                continue
            if b.lang not in langs:
                self.fail(b, "language %r: no group tests it; mark it "
                          "<!-- doctest: fragment of PATH --> or <!-- doctest: skip: REASON -->"
                          % b.lang)
                continue
            if b.kind == "needs" and b.lang != "python":
                self.fail(b, "'needs' applies to python blocks")
                continue
            if b.kind in ("manifest", "build_rs") and b.lang != {"manifest": "toml",
                                                                  "build_rs": "rust"}[b.kind]:
                self.fail(b, "%r does not apply to a %s block" % (b.directive, b.lang))
                continue
            g = group_of(b)
            if g is None and b.lang in SHELL:
                self.ok(b, "bash -n (syntax only)")
            elif g is None:
                self.fail(b, "a %s block is run only with <!-- doctest: run GROUP -->, else "
                          "mark it as a fragment or skip it with the reason" % b.lang)
            elif b.lang in SHELL:
                self.ok(b, "bash -n; run by group %s" % g)
            else:
                self.ok(b, "run by group %s" % g)
        return self.finish("blocks")

    # -- c ------------------------------------------------------------------------

    def check_c(self):
        programs = self.of("c", lang="c")
        prefix, pcdir = self.install("c")
        include = os.path.join(prefix, "include")
        cc = self.args.cc
        for b in programs:
            rc, out = self._syntax(cc, include, b)
            if rc:
                self.fail(b, "%s -std=c99 -Wall -Wextra -pedantic -Werror" % cc, out)
        shells = self.of("c", kind="run")
        lines = [s for s in shells if s.lang in SHELL]
        cmakes = [s for s in shells if s.lang == "cmake"]
        if not lines:
            lines = [None]  # no README line: compile as pkg-config says
        for i, b in enumerate(programs):
            if b in self.failed:
                continue
            d = self.fresh("c", "program%d" % i)
            with open(os.path.join(d, "engine.c"), "w") as f:
                f.write(b.text)
            good = True
            for s in lines:
                for stale in ("a.out",):
                    if os.path.exists(os.path.join(d, stale)):
                        os.remove(os.path.join(d, stale))
                if s is None:
                    cmd = ["bash", "-c", "cc engine.c $(PKG_CONFIG_PATH=%s pkg-config --cflags "
                           "--libs kvpage)" % pcdir]
                    how = "cc + pkg-config"
                else:
                    cmd = ["bash", "-euo", "pipefail", "-c",
                           self.substitute(s.text, prefix, pcdir)]
                    how = "the line of %s" % s.where
                rc, out = self.run(cmd, cwd=d)
                if rc or not os.path.exists(os.path.join(d, "a.out")):
                    self.fail(b, "compiled by %s" % how, out)
                    good = False
                    break
                rc, out = self.run([os.path.join(d, "a.out")], cwd=d)
                if rc:
                    self.fail(b, "run (compiled by %s, LD_LIBRARY_PATH unset): exit %d"
                              % (how, rc), out)
                    good = False
                    break
            if good:
                self.ok(b, "compiled by %s and run: %s"
                        % (", ".join(s.where for s in lines if s) or "pkg-config",
                           out.strip().splitlines()[-1] if out.strip() else "exit 0"))
        if programs and not any(p in self.failed for p in programs[:1]):
            for j, s in enumerate(cmakes):
                self._cmake_project(s, j, programs[0], prefix)
        else:
            for s in cmakes:
                self.skip(s, "no C program compiled to build it with")
        if programs and not any(p in self.failed for p in programs):
            for s in lines:
                if s is not None:
                    self.ok(s, "compiled every C program")
        return self.finish("c")

    def _syntax(self, cc, include, b):
        src = os.path.join(self.fresh("c", "syntax"), "engine.c")
        with open(src, "w") as f:
            f.write(b.text)
        return self.run([cc, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror",
                         "-fsyntax-only", "-I" + include, src])

    def _cmake_project(self, s, j, program, prefix):
        d = self.fresh("c", "cmake%d" % j)
        with open(os.path.join(d, "engine.c"), "w") as f:
            f.write(program.text)
        with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.24)\nproject(doc_engine LANGUAGES C)\n"
                    + self.substitute(s.text, prefix))
        targets = re.findall(r"add_executable\(\s*([\w-]+)", s.text)
        build = os.path.join(d, "build")
        for cmd in ([self.args.cmake, "-S", d, "-B", build, "-DCMAKE_PREFIX_PATH=" + prefix,
                     "-DCMAKE_C_COMPILER=" + self.args.cc],
                    [self.args.cmake, "--build", build]):
            rc, out = self.run(cmd)
            if rc:
                self.fail(s, " ".join(cmd[:2]), out)
                return
        if not targets:
            self.fail(s, "no add_executable: nothing to run")
            return
        for t in targets:
            rc, out = self.run([os.path.join(build, t)], cwd=d)
            if rc:
                self.fail(s, "%s run from its build folder (LD_LIBRARY_PATH unset): exit %d"
                          % (t, rc), out)
                return
        self.ok(s, "configured against the install, built %s with %s and ran it"
                % (", ".join(targets), program.where))

    # -- python -------------------------------------------------------------------

    def _interpreters(self):
        seen, out = set(), []
        for p in (sys.executable, shutil.which("python3"), "/usr/bin/python3",
                  os.environ.get("KVPAGE_DOC_PYTHON")):
            if p and os.path.exists(p) and os.path.realpath(p) not in seen:
                seen.add(os.path.realpath(p))
                out.append(p)
        return out

    def _probe(self, python):
        code = ("import sys\ntry:\n import torch\nexcept Exception:\n print('none')\n"
                " sys.exit(0)\nprint(torch.__version__, int(torch.cuda.is_available()))\n")
        rc, out = self.run([python, "-c", code], timeout=120)
        words = out.split() if rc == 0 else ["none"]
        if words[:1] == ["none"] or len(words) < 2:
            return None
        m = re.match(r"(\d+)\.(\d+)", words[0])
        return ((int(m.group(1)), int(m.group(2))) if m else (0, 0), words[1] == "1")

    def check_python(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(self.root, "bindings", "python"),
                   KVPAGE_LIBRARY=self.library, PYTHONDONTWRITEBYTECODE="1")
        probes = {}
        for i, b in enumerate(self.of("python", lang="python")):
            python, why = sys.executable, None
            if b.kind == "needs":
                want_cuda, min_version = False, (0, 0)  # every need is torch's
                for need in b.arg:
                    m = re.match(r"torch(?:>=(\d+)\.(\d+))?$", need)
                    if m:
                        if m.group(1):
                            min_version = (int(m.group(1)), int(m.group(2)))
                    elif need == "cuda":
                        want_cuda = True
                    else:
                        self.fail(b, "unknown need %r" % need)
                        break
                else:
                    python = None
                    for p in self._interpreters():
                        if p not in probes:
                            probes[p] = self._probe(p)
                        t = probes[p]
                        if t and t[0] >= min_version and (t[1] or not want_cuda):
                            python = p
                            break
                    if python is None:
                        why = "needs %s: no interpreter here has it (%s)" % (
                            " ".join(b.arg), ", ".join(
                                "%s: %s" % (p, "torch %d.%d%s" % (t[0] + (" cuda" if t[1]
                                                                          else "",))
                                            if t else "no torch")
                                for p, t in probes.items()))
                if b in self.failed:
                    continue
            if why:
                self.skip(b, why)
                continue
            d = self.fresh("python", "block%d" % i)
            script = os.path.join(d, "block.py")
            with open(script, "w") as f:
                f.write(b.text)
            rc, out = self.run([python, script], cwd=d, env=env, timeout=600)
            if rc:
                self.fail(b, "%s block.py: exit %d" % (python, rc), out)
            else:
                last = out.strip().splitlines()[-1] if out.strip() else "exit 0"
                self.ok(b, "ran with %s: %s" % (python, last))
        for i, s in enumerate(self.of("python", kind="run")):
            d = self.fresh("python", "shell%d" % i)
            os.symlink(os.path.join(self.root, "bindings"), os.path.join(d, "bindings"))
            os.symlink(os.path.dirname(self.library), os.path.join(d, "build"))
            e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            e.pop("PYTHONPATH", None)
            e.pop("KVPAGE_LIBRARY", None)
            rc, out = self.run(["bash", "-euo", "pipefail", "-c", self.substitute(s.text)],
                               cwd=d, env=e)
            if rc:
                self.fail(s, "bash in a folder with the checkout's bindings/ and the "
                          "build as build/: exit %d" % rc, out)
            else:
                self.ok(s, "ran: %s" % (out.strip().splitlines()[-1] if out.strip() else "exit 0"))
        return self.finish("python")

    # -- rust -------------------------------------------------------------------

    def check_rust(self):
        cargo = self.args.cargo or shutil.which("cargo")
        programs = [b for b in self.of("rust", lang="rust") if b.kind is None]
        manifests = self.of("rust", lang="toml")
        build_rs = [b for b in self.blocks if b.kind == "build_rs"]
        if not cargo:
            for b in programs + manifests + build_rs:
                self.skip(b, "no cargo")
            self.finish("rust")
            return SKIP
        if len(manifests) != 1 or len(build_rs) > 1:
            for b in programs:
                self.fail(b, "expected one <!-- doctest: cargo manifest --> TOML block and at "
                          "most one <!-- doctest: build.rs --> Rust block; found %d and %d"
                          % (len(manifests), len(build_rs)))
            return self.finish("rust")
        prefix, _ = self.install("rust")
        env = dict(os.environ, KVPAGE_DIR=prefix, CARGO_HOME=os.path.join(self.work, "rust",
                                                                          "cargo-home"),
                   CARGO_TARGET_DIR=os.path.join(self.work, "rust", "target"),
                   CARGO_NET_OFFLINE="true", CC=self.args.cc)
        for k in ("KVPAGE_INCLUDE_DIR", "PKG_CONFIG_PATH", "RUSTFLAGS"):
            env.pop(k, None)
        deps = self.substitute(manifests[0].text, prefix)
        for i, b in enumerate(programs):
            name = "kvpage-doc-program%d" % i
            d = self.fresh("rust", name)
            os.makedirs(os.path.join(d, "src"))
            with open(os.path.join(d, "Cargo.toml"), "w") as f:
                f.write('[package]\nname = "%s"\nversion = "0.1.0"\nedition = "2021"\n'
                        'publish = false\n\n%s\n[workspace]\n' % (name, deps))
            if build_rs:
                with open(os.path.join(d, "build.rs"), "w") as f:
                    f.write(build_rs[0].text)
            with open(os.path.join(d, "src", "main.rs"), "w") as f:
                f.write(b.text)
            rc, out = self.run([cargo, "build", "--offline", "--quiet", "--manifest-path",
                                os.path.join(d, "Cargo.toml")], env=env, timeout=600)
            if rc:
                self.fail(b, "cargo build (Cargo.toml from %s, build.rs from %s)"
                          % (manifests[0].where, build_rs[0].where if build_rs else "none"), out)
                continue
            exe = os.path.join(env["CARGO_TARGET_DIR"], "debug", name)
            rc, out = self.run([exe], cwd=d, env=env)
            if rc:
                self.fail(b, "run (LD_LIBRARY_PATH unset): exit %d" % rc, out)
            else:
                self.ok(b, "built with %s%s and ran: %s" % (
                    manifests[0].where, " and " + build_rs[0].where if build_rs else "",
                    out.strip().splitlines()[-1] if out.strip() else "exit 0"))
        if programs and not any(b in self.failed for b in programs):
            for b in manifests + build_rs:
                self.ok(b, "used by every Rust program")
        return self.finish("rust")

    # -- go -----------------------------------------------------------------------

    def check_go(self):
        go = self.args.go or shutil.which("go")
        programs = self.of("go", lang="go")
        lines = [b for b in self.of("go", kind="run") if b.lang in SHELL]
        if not go or not shutil.which("pkg-config"):
            for b in programs + lines:
                self.skip(b, "no go or no pkg-config")
            self.finish("go")
            return SKIP
        prefix, pcdir = self.install("go")
        base = os.path.join(self.work, "go")
        env = dict(os.environ, GOCACHE=os.path.join(base, "gocache"),
                   GOPATH=os.path.join(base, "gopath"), GOENV="off", GOPROXY="off",
                   GOTOOLCHAIN="local", GOFLAGS="", CGO_ENABLED="1", CC=self.args.cc,
                   PKG_CONFIG_PATH=pcdir)
        for i, b in enumerate(programs):
            d = self.fresh("go", "program%d" % i)
            with open(os.path.join(d, "go.mod"), "w") as f:
                f.write("module engine\n\ngo 1.19\n")
            with open(os.path.join(d, "main.go"), "w") as f:
                f.write(b.text)
            good = True
            for s in lines:
                rc, out = self.run(["bash", "-euo", "pipefail", "-c",
                                    self.substitute(s.text, prefix, pcdir)], cwd=d, env=env)
                if rc:
                    self.fail(b, "the lines of %s in its module: exit %d" % (s.where, rc), out)
                    good = False
            if not good:
                continue
            if not lines:  # no README lines: the module needs the binding all the same
                rc, out = self.run([go, "mod", "edit", "-require=kvpage@v0.0.0",
                                    "-replace=kvpage=" + os.path.join(self.root, "bindings",
                                                                      "go")], cwd=d, env=env)
            exe = os.path.join(d, "engine")
            rc, out = self.run([go, "build", "-o", exe, "."], cwd=d, env=env, timeout=600)
            if rc:
                self.fail(b, "go build", out)
                continue
            rc, out = self.run([exe], cwd=d, env=env)
            if rc:
                self.fail(b, "run (LD_LIBRARY_PATH unset): exit %d" % rc, out)
                continue
            self.ok(b, "built%s and ran: %s" % (
                " after " + ", ".join(s.where for s in lines) if lines else "",
                out.strip().splitlines()[-1] if out.strip() else "exit 0"))
        if programs and not any(b in self.failed for b in programs):
            for s in lines:
                self.ok(s, "ran in each Go program's module")
        return self.finish("go")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("group", choices=GROUPS)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    ap.add_argument("--build", default=None, help="the CMake build folder")
    ap.add_argument("--library", default=None, help="libkvpage.so (default: BUILD's)")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--cargo", default=None)
    ap.add_argument("--go", default=None)
    ap.add_argument("--work", default=None, help="scratch folder (default: BUILD/doc-blocks)")
    args = ap.parse_args()
    if args.group != "blocks" and not args.build:
        ap.error("--build is needed for group %s" % args.group)
    if not args.build:  # blocks: nothing is built or written
        args.build = args.root
    r = Runner(args)
    return getattr(r, "check_" + args.group)()


if __name__ == "__main__":
    sys.exit(main())
