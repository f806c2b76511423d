#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What include/kvpage/kvpage.h declares, read from its text.

The header is the single source of the ABI: the C API, the Rust -sys crate
and the Go and Python mirrors are checked against what this module reads
(tests/abi/check_bindings.py). Standard library only.

It reads this header's style, not C in general: one declaration per
statement, `typedef struct NAME { ... } NAME;`, `typedef enum NAME { A = 0,
... } NAME;`, exported functions as `KVP_EXPORT <ret> <name>(<params>);`,
object-like `#define KVP_*` constants and the function-like
`KVP_STRUCT_SIZE(type, last_field)`. Anything it does not understand inside
a struct, enum or export is an error rather than a silent omission.

Extracted (`read_header`):
  functions   exported functions in order: name, return type, parameter types
  structs     structs with a body, in order: fields (name, type, ABI minor,
              LP64 offset and size), LP64 size and alignment, whether they
              are extensible (begin with struct_size)
  api_members the kvp_api table's members in order (also in structs)
  opaque      handles declared as `typedef struct kvp_x kvp_x;`
  enums       enum typedefs: constants and values in order
  macros      object-like KVP_* macros: their text and, where it is an
              integer, a string or a KVP_STRUCT_SIZE, its value
  fn_macros   function-like KVP_* macros (KVP_STRUCT_SIZE)
  typedefs    enum typedef names and function pointer typedefs
  struct_sizes KVP_<NAME>_STRUCT_SIZE_<major>_<minor>: struct, last field,
              version, value

Field ABI minors: a field appended after a struct's first release ends its
line with a comment holding only its version (`int32_t checked; /* ABI 1.1
*/`); unmarked fields are ABI 1.0, or, in a struct first released later,
whose first field carries that release's mark, of that release.

Command line:
  header_abi.py HEADER               prints the extraction as JSON
  header_abi.py HEADER --check       the header's own consistency (below)
  header_abi.py HEADER --check --cc CC
                                     and the extraction against the C
                                     compiler: a strict C99 program asserts
                                     every offset, size and value read here

--check: every extensible struct has a KVP_<NAME>_STRUCT_SIZE_1_0 naming
its last ABI 1.0 field and one per later minor naming that minor's last
field (and no others); minors never decrease along a struct and never
exceed KVP_ABI_MAJOR.KVP_ABI_MINOR; the function table holds one member
per exported function but kvp_get_api, in the header's order, named
without `kvp_`, with the function's parameter and return types.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

_IDENT = r"[A-Za-z_]\w*"
_ABI_MARK = re.compile(r";[ \t]*/\*\s*ABI\s+(\d+)\.(\d+)\s*\*/")
_ABI_MARK_ANYWHERE = re.compile(r"/\*\s*ABI\s+\d+\.\d+\s*\*/")

# LP64 (Linux x86-64 and aarch64): size and alignment of the scalar types
# this header uses. Pointers, including function pointers, are 8.
_SCALARS = {
    "size_t": 8, "int64_t": 8, "uint64_t": 8, "int32_t": 4, "uint32_t": 4,
    "float": 4, "double": 8, "int16_t": 2, "uint16_t": 2, "int8_t": 1,
    "uint8_t": 1, "char": 1,
}


class HeaderError(ValueError):
    """The header holds something this reader does not understand."""


def _strip_comments(text):
    """Drops comments; an ABI mark after a field's `;` becomes `@ABI1.1@;`."""
    text = _ABI_MARK.sub(lambda m: " @ABI%s.%s@;" % (m.group(1), m.group(2)), text)
    if _ABI_MARK_ANYWHERE.search(text):
        line = text[:_ABI_MARK_ANYWHERE.search(text).start()].count("\n") + 1
        raise HeaderError("line %d: an ABI mark must directly follow a field's ';'" % line)
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"), text,
                  flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def _norm_type(t):
    """One spelling per C type: single spaces, `*` attached, const kept."""
    t = re.sub(r"\s+", " ", t.strip())
    t = re.sub(r"\s*\*\s*", "*", t)
    t = re.sub(r"\*(?=\w)", "* ", t)
    return t


def _split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _param_type(p):
    """The type of a parameter declaration, with or without its name."""
    p = p.strip()
    if p == "void":
        return None
    if "(*" in p:
        raise HeaderError("function pointer parameter not supported: %r" % p)
    m = re.match(r"^(.*?[\s*])(%s)$" % _IDENT, p)
    if m and m.group(1).strip() and m.group(2) not in _SCALARS \
            and not m.group(2).startswith("kvp_") and m.group(2) not in ("void", "const"):
        return _norm_type(m.group(1))
    return _norm_type(p)


def _params(text):
    ps = [_param_type(p) for p in _split_top(text)]
    return [p for p in ps if p is not None]


def _field(decl):
    """(name, type, fnptr) of one field declaration (no ';')."""
    decl = decl.strip()
    m = re.match(r"^(.*?)\(\s*\*\s*(%s)\s*\)\s*\((.*)\)$" % _IDENT, decl, re.S)
    if m:
        ret = _norm_type(m.group(1))
        args = _params(m.group(3))
        return m.group(2), "%s (*)(%s)" % (ret, ", ".join(args) or "void"), (ret, args)
    m = re.match(r"^(.*?[\s*])(%s)$" % _IDENT, decl, re.S)
    if not m or not m.group(1).strip():
        raise HeaderError("cannot read field declaration %r" % decl)
    if "[" in decl:
        raise HeaderError("array fields are not supported: %r" % decl)
    return m.group(2), _norm_type(m.group(1)), None


def _size_align(ctype, structs):
    if ctype.endswith("*") or "(*)" in ctype:
        return 8, 8
    base = re.sub(r"^const ", "", ctype)
    if base in _SCALARS:
        return _SCALARS[base], _SCALARS[base]
    if base in structs:
        return structs[base]["size"], structs[base]["align"]
    raise HeaderError("no LP64 size for type %r" % ctype)


def read_header(path_or_text):
    """The header's declarations as a dict (see the module's doc)."""
    if os.path.exists(path_or_text):
        with open(path_or_text) as f:
            text = f.read()
    else:
        text = path_or_text
    code = _strip_comments(text)
    # Join preprocessor continuation lines.
    code = re.sub(r"\\\n", " ", code)

    h = {"functions": [], "structs": {}, "struct_order": [], "api_members": [], "opaque": [],
         "enums": {}, "macros": {}, "fn_macros": {}, "typedefs": [], "struct_sizes": {}}

    # Preprocessor lines.
    body_lines = []
    for line in code.split("\n"):
        s = line.strip()
        if not s.startswith("#"):
            body_lines.append(line)
            continue
        m = re.match(r"#\s*define\s+(KVP_\w+)(\([^)]*\))?\s*(.*)$", s)
        if not m or m.group(1) == "KVP_EXPORT":
            continue
        name, args, value = m.group(1), m.group(2), m.group(3).strip()
        if args is not None:
            h["fn_macros"][name] = {"params": [a.strip() for a in args[1:-1].split(",")],
                                    "body": value}
        elif value:
            h["macros"][name] = {"text": value}
    code = "\n".join(body_lines)
    # extern "C" braces.
    code = re.sub(r'extern\s+"C"\s*\{', "", code)

    for stmt in _split_top(code, ";"):
        s = re.sub(r"\s+", " ", stmt).strip()
        if not s or s == "}":
            continue
        s = re.sub(r"^\}\s*", "", s)  # the closing brace of extern "C"
        m = re.match(r"^typedef struct (%s) \{(.*)\} (%s)$" % (_IDENT, _IDENT), s, re.S)
        if m:
            _read_struct(h, m.group(1), m.group(2), m.group(3), stmt)
            continue
        m = re.match(r"^typedef struct (%s) (%s)$" % (_IDENT, _IDENT), s)
        if m:
            if m.group(1) != m.group(2):
                raise HeaderError("opaque handle %s declared as %s" % (m.group(1), m.group(2)))
            h["opaque"].append(m.group(1))
            continue
        m = re.match(r"^typedef enum (%s) \{(.*)\} (%s)$" % (_IDENT, _IDENT), s)
        if m:
            if m.group(1) != m.group(3):
                raise HeaderError("enum %s declared as %s" % (m.group(1), m.group(3)))
            consts = []
            for item in _split_top(m.group(2)):
                em = re.match(r"^(KVP_\w+) = (-?\d+)$", item.strip())
                if not em:
                    raise HeaderError("enum %s: cannot read %r" % (m.group(1), item))
                consts.append((em.group(1), int(em.group(2))))
            h["enums"][m.group(1)] = consts
            h["typedefs"].append(m.group(1))
            continue
        m = re.match(r"^typedef (.*?)\(\s*\*\s*(%s)\s*\)\s*\((.*)\)$" % _IDENT, s)
        if m:
            h["typedefs"].append(m.group(2))
            continue
        m = re.match(r"^KVP_EXPORT (.*?)(%s)\s*\((.*)\)$" % _IDENT, s, re.S)
        if m:
            h["functions"].append({"name": m.group(2), "ret": _norm_type(m.group(1)),
                                   "params": _params(m.group(3))})
            continue
        if "KVP_EXPORT" in s or "kvp_" in s:
            raise HeaderError("cannot read declaration %r" % s[:120])
        if s.startswith("#") or s == "":
            continue
        raise HeaderError("cannot read statement %r" % s[:120])

    _evaluate_macros(h)
    return h


def _read_struct(h, tag, body, name, raw):
    if tag != name:
        raise HeaderError("struct %s declared as %s" % (tag, name))
    fields, offset, align = [], 0, 1
    base = (1, 0)  # a struct first released after 1.0 marks its first field
    for decl in _split_top(body, ";"):
        decl = decl.strip()
        if not decl:
            continue
        minor = base
        mm = re.search(r"\s*@ABI(\d+)\.(\d+)@\s*$", decl)
        if mm:
            minor = (int(mm.group(1)), int(mm.group(2)))
            decl = decl[:mm.start()]
            if not fields:
                base = minor
        fname, ftype, fn = _field(decl)
        size, falign = _size_align(ftype, h["structs"])
        offset = (offset + falign - 1) // falign * falign
        f = {"name": fname, "type": ftype, "abi": list(minor), "offset": offset, "size": size}
        if fn is not None:
            f["fn"] = {"ret": fn[0], "params": fn[1]}
        fields.append(f)
        offset += size
        align = max(align, falign)
    size = (offset + align - 1) // align * align
    h["structs"][name] = {"fields": fields, "size": size, "align": align,
                          "extensible": bool(fields) and fields[0]["name"] == "struct_size"}
    h["struct_order"].append(name)
    if name == "kvp_api":
        h["api_members"] = [f["name"] for f in fields]


def _evaluate_macros(h):
    for name, m in h["macros"].items():
        text = m["text"]
        if re.match(r"^-?\d+[uUlL]*$", text):
            m["value"] = int(re.sub(r"[uUlL]+$", "", text))
        elif re.match(r'^"[^"]*"$', text):
            m["value"] = text[1:-1]
        else:
            sm = re.match(r"^KVP_STRUCT_SIZE\(\s*(%s)\s*,\s*(%s)\s*\)$" % (_IDENT, _IDENT), text)
            if sm:
                sname, last = sm.group(1), sm.group(2)
                st = h["structs"].get(sname)
                if st is None:
                    raise HeaderError("%s: no struct %s" % (name, sname))
                f = [x for x in st["fields"] if x["name"] == last]
                if not f:
                    raise HeaderError("%s: struct %s has no field %s" % (name, sname, last))
                m["value"] = f[0]["offset"] + f[0]["size"]
                vm = re.match(r"^(KVP_\w+)_STRUCT_SIZE_(\d+)_(\d+)$", name)
                if not vm:
                    raise HeaderError("%s: a struct size macro is named "
                                      "KVP_<NAME>_STRUCT_SIZE_<major>_<minor>" % name)
                h["struct_sizes"][name] = {"struct": sname, "last_field": last,
                                           "abi": [int(vm.group(2)), int(vm.group(3))],
                                           "value": m["value"]}
            else:
                raise HeaderError("%s: cannot read the value %r" % (name, text))


def constants(h):
    """Every KVP_* constant with a value: enum constants and object macros."""
    out = {}
    for consts in h["enums"].values():
        out.update(dict(consts))
    for name, m in h["macros"].items():
        out[name] = m["value"]
    return out


def struct_size_macro(struct_name, major, minor):
    return "%s_STRUCT_SIZE_%d_%d" % (struct_name.upper(), major, minor)


def check(h):
    """Problems in the header's own consistency (a list of strings)."""
    problems = []
    abi = (h["macros"]["KVP_ABI_MAJOR"]["value"], h["macros"]["KVP_ABI_MINOR"]["value"])
    expected = {}
    for name in h["struct_order"]:
        st = h["structs"][name]
        if not (st["extensible"] or name == "kvp_api"):
            continue
        last_by_minor, prev = {}, (1, 0)
        for f in st["fields"]:
            v = tuple(f["abi"])
            if v < prev:
                problems.append("%s.%s is marked ABI %d.%d after a field of ABI %d.%d"
                                % (name, f["name"], v[0], v[1], prev[0], prev[1]))
            if v > abi:
                problems.append("%s.%s is marked ABI %d.%d, past the header's ABI %d.%d"
                                % (name, f["name"], v[0], v[1], abi[0], abi[1]))
            prev = max(prev, v)
            last_by_minor[v] = f["name"]
        for v, last in last_by_minor.items():
            expected[struct_size_macro(name, *v)] = (name, last)
    for macro, (sname, last) in expected.items():
        got = h["struct_sizes"].get(macro)
        if got is None:
            problems.append("%s is missing: #define %s KVP_STRUCT_SIZE(%s, %s)"
                            % (macro, macro, sname, last))
        elif (got["struct"], got["last_field"]) != (sname, last):
            problems.append("%s names %s.%s, the version's last field is %s.%s"
                            % (macro, got["struct"], got["last_field"], sname, last))
    for macro in h["struct_sizes"]:
        if macro not in expected:
            problems.append("%s names no version of a struct (no field carries that ABI mark)"
                            % macro)

    # The function table against the exported functions.
    exported = [f for f in h["functions"] if f["name"] != "kvp_get_api"]
    api = h["structs"].get("kvp_api")
    if api is None:
        problems.append("no kvp_api struct")
        return problems
    head = [f["name"] for f in api["fields"][:3]]
    if head != ["struct_size", "abi_major", "abi_minor"]:
        problems.append("kvp_api begins with %s, not struct_size, abi_major, abi_minor" % head)
    members = api["fields"][3:]
    for i in range(max(len(members), len(exported))):
        m = members[i] if i < len(members) else None
        f = exported[i] if i < len(exported) else None
        if m is None:
            problems.append("kvp_api has no member for %s (entry %d)" % (f["name"], i))
            continue
        if f is None:
            problems.append("kvp_api.%s has no exported function kvp_%s" % (m["name"], m["name"]))
            continue
        if "kvp_" + m["name"] != f["name"]:
            problems.append("kvp_api entry %d is %s, the header's function %d is %s"
                            % (i, m["name"], i, f["name"]))
            continue
        if "fn" not in m:
            problems.append("kvp_api.%s is not a function pointer" % m["name"])
        elif (m["fn"]["ret"], m["fn"]["params"]) != (f["ret"], f["params"]):
            problems.append("kvp_api.%s is %s(%s), %s is %s(%s)"
                            % (m["name"], m["fn"]["ret"], ", ".join(m["fn"]["params"]),
                               f["name"], f["ret"], ", ".join(f["params"])))
    return problems


def c_program(h):
    """A strict C99 program that fails to compile where this reading is wrong."""
    out = ["/* Generated by tests/abi/header_abi.py: what it read, asserted. */",
           "#include <stddef.h>", '#include "kvpage/kvpage.h"', "",
           "#define KVP_READ_CHECK(n, cond) typedef char kvp_read_check_##n[(cond) ? 1 : -1]"]
    n = [0]

    def check(cond):
        n[0] += 1
        out.append("KVP_READ_CHECK(%d, %s);" % (n[0], cond))

    for name in h["struct_order"]:
        st = h["structs"][name]
        check("sizeof(%s) == %d" % (name, st["size"]))
        for f in st["fields"]:
            check("offsetof(%s, %s) == %d" % (name, f["name"], f["offset"]))
            check("sizeof(((%s*)0)->%s) == %d" % (name, f["name"], f["size"]))
    for name, value in sorted(constants(h).items()):
        if isinstance(value, int):
            check("%s == %d" % (name, value))
    out.append("")
    out.append("int main(void) {")
    for name, value in sorted(constants(h).items()):
        if isinstance(value, str):
            out.append('  if (sizeof(%s) != %d) return 1;' % (name, len(value) + 1))
    for name in h["opaque"]:
        out.append("  { %s* p = NULL; (void)p; }" % name)
    # Field types: a pointer to each field initialized with its address
    # (an incompatible pointer type is an error under -Werror).
    for name in h["struct_order"]:
        st = h["structs"][name]
        out.append("  { %s s;" % name)
        for i, f in enumerate(st["fields"]):
            if "fn" in f:
                decl = "%s (**p%d)(%s)" % (f["fn"]["ret"], i, ", ".join(f["fn"]["params"]) or "void")
            else:
                decl = "%s* p%d" % (f["type"], i)
            out.append("    %s = &s.%s; (void)p%d;" % (decl, f["name"], i))
        out.append("  }")
    for f in h["functions"]:
        out.append("  { %s (*p)(%s) = %s; (void)p; }"
                   % (f["ret"], ", ".join(f["params"]) or "void", f["name"]))
    out.append("  return 0;")
    out.append("}")
    return "\n".join(out) + "\n"


def check_with_cc(h, header_path, cc):
    """Compiles c_program(h) as strict C99 against the header; problems or []."""
    include = os.path.dirname(os.path.dirname(os.path.abspath(header_path)))
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "header_read.c")
        with open(src, "w") as f:
            f.write(c_program(h))
        cmd = cc.split() + ["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror",
                            "-Wno-unused-local-typedefs", "-fsyntax-only", "-I", include, src]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        if r.returncode != 0:
            return ["the C compiler disagrees with this reading of the header:\n" + r.stdout]
    return []


def main(argv):
    args = list(argv)
    do_check = "--check" in args
    if do_check:
        args.remove("--check")
    cc = None
    if "--cc" in args:
        i = args.index("--cc")
        cc = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        print(__doc__)
        return 2
    h = read_header(args[0])
    if not do_check:
        json.dump(h, sys.stdout, indent=1)
        print()
        return 0
    problems = check(h)
    if cc:
        problems += check_with_cc(h, args[0], cc)
    n_fields = sum(len(s["fields"]) for s in h["structs"].values())
    print("read %d functions, %d structs (%d fields), %d table entries, %d constants, "
          "%d struct size macros" % (len(h["functions"]), len(h["structs"]), n_fields,
                                     len(h["api_members"]), len(constants(h)),
                                     len(h["struct_sizes"])))
    # A reader that found nothing would pass vacuously.
    if len(h["functions"]) < 38 or len(h["structs"]) < 9 or n_fields < 130:
        problems.append("the reader found too little: is the header's style still the one "
                        "tests/abi/header_abi.py reads?")
    for p in problems:
        print("PROBLEM: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
