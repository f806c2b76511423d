#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drift tests: the C API and each binding against include/kvpage/kvpage.h.

The header is the single source of the ABI (tests/abi/header_abi.py reads
it). Each target below fails when something the header declares is missing
from, or differs in, what it checks:

  header  the header's own consistency (struct size macros, ABI marks, the
          function table against the exported functions); with --cc, the
          reading against the C compiler
  capi    capi/: every KVP_<NAME>_STRUCT_SIZE_* pinned by a static_assert in
          capi/struct_io.h with the value read here, FirstReleasedSize<> of
          every extensible struct from the size macro of the version that
          first released it (_1_0 for most), every enum constant
          tied to the core's enums in capi/abi_checks.h, every error code
          named by kvp_error_code_name, kvp_get_api's table initialized in
          the header's member order
  rust    bindings/rust/kvpage-sys/src/lib.rs: every struct with the same
          fields in the same order, every function, constant (same value),
          opaque handle and typedef, and nothing the header lacks
          (tests/layout.rs checks types and layouts with the C compiler)
  go      bindings/go: every header struct mirrored by a Go struct with a
          field per header field, and every field passed through the cgo
          code (read or written in Go or kvpage_go.c); every function
          called; every enum constant tied to a Go constant
  python  bindings/python/kvpage/_lib.py: a ctypes Structure per struct with
          the same fields, in order, of compatible ctypes types; the
          function table's prototypes; enum members and values; ABI version
          and first released sizes (FIRST_RELEASED_SIZES)

What a binding leaves out on purpose is listed below with the reason
(GO_NOT_MAPPED, ...); anything else missing fails. After the check, each
target runs a self-test: it deletes a field, a function or a constant from
a copy of the sources and requires the check to fail naming it, so a
check that cannot fail does not pass.

Usage: check_bindings.py TARGET... [--root REPO] [--cc CC]   (TARGET: header,
capi, rust, go, python, or all)
"""

import ctypes
import importlib.util
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import header_abi  # noqa: E402


# Fields no binding sets or reads itself: struct_size is the init
# function's, reserved fields stay the 0 the init function writes.
def _init_owned(field):
    return field == "struct_size" or re.match(r"^reserved\d+$", field) is not None


# ---------------------------------------------------------------------------
# header
# ---------------------------------------------------------------------------

def check_header(header_text, header_path=None, cc=None):
    h = header_abi.read_header(header_text)
    problems = header_abi.check(h)
    if cc and header_path:
        problems += header_abi.check_with_cc(h, header_path, cc)
    return problems


def _first_release(struct):
    """The ABI version (major, minor) that first released a struct: its first
    field's (a struct first released after 1.0 marks its first field)."""
    return tuple(struct["fields"][0]["abi"])


# ---------------------------------------------------------------------------
# capi
# ---------------------------------------------------------------------------

def check_capi(h, struct_io, abi_checks, capi_cc):
    problems = []
    for macro, info in h["struct_sizes"].items():
        m = re.search(r"static_assert\(\s*%s\s*==\s*(\d+)\s*\)" % re.escape(macro), struct_io)
        if not m:
            problems.append("capi/struct_io.h does not pin %s (static_assert(%s == %d))"
                            % (macro, macro, info["value"]))
        elif int(m.group(1)) != info["value"]:
            problems.append("capi/struct_io.h pins %s at %s, the header gives %d"
                            % (macro, m.group(1), info["value"]))
    for name in h["struct_order"]:
        st = h["structs"][name]
        if not (st["extensible"] or name == "kvp_api"):
            continue
        macro = header_abi.struct_size_macro(name, *_first_release(st))
        pat = r"FirstReleasedSize<%s>\(\)\s*\{\s*return\s+%s\s*;" % (name, macro)
        if not re.search(pat, struct_io):
            problems.append("capi/struct_io.h: FirstReleasedSize<%s>() must return %s"
                            % (name, macro))
    for enum, consts in h["enums"].items():
        for const, _ in consts:
            if not re.search(r"==\s*%s\b" % const, abi_checks):
                problems.append("capi/abi_checks.h does not tie %s (%s) to the core's enum"
                                % (const, enum))
    for const, _ in h["enums"].get("kvp_error_code_t", []):
        if not re.search(r"case\s+%s\s*:" % const, capi_cc):
            problems.append("kvp_error_code_name (capi/kvpage_capi.cc) has no case %s" % const)
    m = re.search(r"static const kvp_api table = \{(.*?)\};", capi_cc, re.S)
    if not m:
        problems.append("capi/kvpage_capi.cc: no `static const kvp_api table = {...};`")
    else:
        entries = [e.strip() for e in m.group(1).split(",") if e.strip()]
        want = ["sizeof(kvp_api)", "KVP_ABI_MAJOR", "KVP_ABI_MINOR"] + \
            ["kvp_" + n for n in h["api_members"][3:]]
        if entries != want:
            for i in range(max(len(entries), len(want))):
                got = entries[i] if i < len(entries) else "(nothing)"
                exp = want[i] if i < len(want) else "(nothing)"
                if got != exp:
                    problems.append("kvp_get_api's table entry %d is %s, the header's member "
                                    "is %s" % (i, got, exp))
                    break
    return problems


# ---------------------------------------------------------------------------
# rust
# ---------------------------------------------------------------------------

def _rust_code(src):
    """Comments dropped, whitespace collapsed."""
    src = re.sub(r"//[^\n]*", "", src)
    return re.sub(r"\s+", " ", src)


def _bracketed(s, open_at):
    depth = 0
    for i in range(open_at, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return s[open_at + 1:i], i
    raise ValueError("unbalanced braces")


def read_rust(src):
    s = _rust_code(src)
    d = {"structs": {}, "opaque": [], "fns": [], "consts": {}, "types": []}
    for m in re.finditer(r"pub struct (\w+) \{", s):
        body, _ = _bracketed(s, m.end() - 1)
        fields = re.findall(r"(?:^|,)\s*pub (\w+)\s*:", body)
        if fields:
            d["structs"][m.group(1)] = fields
        else:
            d["opaque"].append(m.group(1))
    for m in re.finditer(r'extern "C" \{', s):
        body, _ = _bracketed(s, m.end() - 1)
        d["fns"] += re.findall(r"pub fn (\w+)\s*\(", body)
    for m in re.finditer(r"pub const (\w+)\s*:\s*[^=]+=\s*([^;]+);", s):
        v = m.group(2).strip()
        if re.match(r"^-?[\d_]+$", v):
            v = int(v.replace("_", ""))
        elif v.startswith('"') and v.endswith('"'):
            v = v[1:-1]
        d["consts"][m.group(1)] = v
    d["types"] = re.findall(r"pub type (\w+)\s*=", s)
    return d


def _both_ways(problems, what, in_header, in_binding, binding):
    for n in sorted(set(in_header) - set(in_binding)):
        problems.append("%s %s is in kvpage.h but not in %s" % (what, n, binding))
    for n in sorted(set(in_binding) - set(in_header)):
        problems.append("%s %s is in %s but not in kvpage.h" % (what, n, binding))


def _same_fields(problems, struct, header_fields, binding_fields, binding):
    for f in header_fields:
        if f not in binding_fields:
            problems.append("field %s.%s is in kvpage.h but not in %s" % (struct, f, binding))
    for f in binding_fields:
        if f not in header_fields:
            problems.append("field %s.%s is in %s but not in kvpage.h" % (struct, f, binding))
    if set(header_fields) == set(binding_fields) and header_fields != binding_fields:
        problems.append("%s: the fields are in another order in %s: %s, kvpage.h: %s"
                        % (struct, binding, ", ".join(binding_fields), ", ".join(header_fields)))


def check_rust(h, lib_rs):
    b = "kvpage-sys"
    r = read_rust(lib_rs)
    problems = []
    _both_ways(problems, "struct", h["structs"], r["structs"], b)
    for name, st in h["structs"].items():
        if name in r["structs"]:
            _same_fields(problems, name, [f["name"] for f in st["fields"]], r["structs"][name], b)
    _both_ways(problems, "function", [f["name"] for f in h["functions"]], r["fns"], b)
    _both_ways(problems, "opaque handle", h["opaque"], r["opaque"], b)
    _both_ways(problems, "typedef", h["typedefs"], r["types"], b)
    consts = header_abi.constants(h)
    _both_ways(problems, "constant", consts, r["consts"], b)
    for name, value in consts.items():
        if name in r["consts"] and r["consts"][name] != value:
            problems.append("constant %s is %r in kvpage.h, %r in %s"
                            % (name, value, r["consts"][name], b))
    if len(r["fns"]) < 38 or len(r["structs"]) < 9:
        problems.append("read too little of kvpage-sys (%d functions, %d structs)"
                        % (len(r["fns"]), len(r["structs"])))
    return problems


# ---------------------------------------------------------------------------
# go
# ---------------------------------------------------------------------------

# The Go struct that mirrors each header struct, or why there is none.
GO_MIRRORS = {
    "kvp_cache_config": "CacheConfig",
    "kvp_cache_info": "CacheInfo",
    "kvp_layer_layout": "LayerLayout",
    "kvp_write_stats": "WriteStats",
    "kvp_write_args": "RawWriteArgs",
    "kvp_decode_config": "DecodeConfig",
    "kvp_decode_args": "RawDecodeArgs",
    "kvp_attend_args": "RawAttendArgs",
    "kvp_pack_args": "RawPackArgs",
}
GO_NOT_MAPPED_STRUCTS = {
    "kvp_allocator": "the Go binding offers no engine allocator: a C callback "
                     "into Go for every cache and workspace allocation is not offered",
    "kvp_api": "the Go binding links libkvpage; the function table is for dlopen users",
}
# Header fields without a Go struct field, and why.
GO_NOT_MAPPED_FIELDS = {
    "kvp_cache_config.allocator": "no engine allocator in Go (see kvp_allocator)",
    "kvp_decode_config.workspace": "an argument of Cache.NewDecoderWithWorkspace",
    "kvp_decode_config.workspace_bytes": "an argument of Cache.NewDecoderWithWorkspace",
}
# Header functions the Go binding does not call, and why.
GO_NOT_CALLED = {
    "kvp_get_api": "the Go binding links libkvpage; the function table is for dlopen users",
    "kvp_allocator_init": "no engine allocator in Go (see kvp_allocator)",
}
# Header constants without a Go constant, and why.
GO_NOT_MAPPED_CONSTANTS = {
    "KVP_OK": "success is a nil error",
}
# Go field names that are not the header's name in CamelCase.
GO_FIELD_NAMES = {
    "kvp_cache_config.device_kind": "Device",
    "kvp_cache_info.device_kind": "Device",
}


def _go_structs(text):
    out = {}
    for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", text, re.S | re.M):
        fields = []
        for line in m.group(2).split("\n"):
            line = re.sub(r"//.*", "", line).strip()
            fm = re.match(r"^([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s+\S", line)
            if fm:
                fields += [f.strip() for f in fm.group(1).split(",")]
        out[m.group(1)] = fields
    return out


def _scopes(text):
    """Top-level functions (and other blocks): text up to a `}` in column 0."""
    return re.split(r"^\}", text, flags=re.M)


def _directions(h):
    """Header struct -> {"in"} (passed as const T* to a function other than an
    init), {"out"} (as T*), or both."""
    out = {}
    for f in h["functions"]:
        if f["name"].endswith("_init"):
            continue
        for p in f["params"]:
            m = re.match(r"^(const )?(kvp_\w+)\*$", p)
            if m and m.group(2) in h["structs"]:
                out.setdefault(m.group(2), set()).add("in" if m.group(1) else "out")
    return out


def _go_field_uses(h, files):
    """header struct -> {"read": fields, "written": fields}, through variables
    of that C type in the Go files and the C glue."""
    struct_names = set(h["structs"])
    used = {}
    for fname, text in files.items():
        is_c = fname.endswith((".c", ".h"))
        for scope in _scopes(text):
            scope = re.sub(r"//[^\n]*", "", scope)
            scope = re.sub(r"/\*.*?\*/", "", scope, flags=re.S)
            types = {}
            if is_c:
                for m in re.finditer(r"\b(kvp_\w+)\s*\*?\s*(\w+)\s*[;,)=]", scope):
                    if m.group(1) in struct_names:
                        types[m.group(2)] = m.group(1)
            else:
                for m in re.finditer(r"\bvar (\w+) C\.(kvp_\w+)\b", scope):
                    types[m.group(1)] = m.group(2)
                for m in re.finditer(r"\b(\w+) \*C\.(kvp_\w+)\b", scope):
                    types[m.group(1)] = m.group(2)
            for var, st in types.items():
                if st not in struct_names:
                    continue
                for m in re.finditer(r"\b%s(?:\.|->)(\w+)(\s*=(?!=))?" % re.escape(var), scope):
                    kind = "written" if m.group(2) else "read"
                    used.setdefault(st, {"read": set(), "written": set()})[kind].add(m.group(1))
    return used


def _camel_key(name):
    return name.replace("_", "").lower()


def check_go(h, files):
    """files: name -> text of the package's .go (tests excluded), .c and .h files."""
    problems = []
    go_structs = {}
    for text in files.values():
        go_structs.update(_go_structs(text))
    used = _go_field_uses(h, files)
    directions = _directions(h)
    for name, st in h["structs"].items():
        if name in GO_NOT_MAPPED_STRUCTS:
            continue
        gname = GO_MIRRORS.get(name)
        if gname is None:
            problems.append("struct %s has no Go mirror: add it to GO_MIRRORS (Go struct) or "
                            "GO_NOT_MAPPED_STRUCTS (reason) in tests/abi/check_bindings.py"
                            % name)
            continue
        gfields = go_structs.get(gname)
        if gfields is None:
            problems.append("Go struct %s (mirror of %s) not found" % (gname, name))
            continue
        gkeys = {f.lower(): f for f in gfields}
        for f in st["fields"]:
            key = "%s.%s" % (name, f["name"])
            if _init_owned(f["name"]) or key in GO_NOT_MAPPED_FIELDS:
                continue
            want = GO_FIELD_NAMES.get(key, f["name"])
            if _camel_key(want) not in gkeys:
                problems.append("field %s has no Go field in %s (%s, up to case and "
                                "underscores; or list it in GO_NOT_MAPPED_FIELDS with the "
                                "reason)" % (key, gname, want))
            # Arguments must be written before the call, results read after.
            u = used.get(name, {"read": set(), "written": set()})
            d = directions.get(name, set())
            if "in" in d and f["name"] not in u["written"]:
                problems.append("field %s (an argument) is never written by the cgo code "
                                "(bindings/go/*.go, kvpage_go.c)" % key)
            if "out" in d and f["name"] not in u["read"]:
                problems.append("field %s (a result) is never read by the cgo code "
                                "(bindings/go/*.go, kvpage_go.c)" % key)
            if not d and f["name"] not in u["read"] | u["written"]:
                problems.append("field %s is never read or written by the cgo code "
                                "(bindings/go/*.go, kvpage_go.c)" % key)
    code = "\n".join(files.values())
    for f in h["functions"]:
        if f["name"] in GO_NOT_CALLED:
            continue
        if not re.search(r"(?<![\w.])(?:C\.)?%s\s*\(" % f["name"], code):
            problems.append("function %s is not called by the Go binding (add it, or list it "
                            "in GO_NOT_CALLED with the reason)" % f["name"])
    for enum, consts in h["enums"].items():
        for const, _ in consts:
            if const in GO_NOT_MAPPED_CONSTANTS:
                continue
            if not re.search(r"\bC\.%s\b" % const, code):
                problems.append("constant %s (%s) is not tied to a Go constant (C.%s)"
                                % (const, enum, const))
    return problems


def go_files(root):
    d = os.path.join(root, "bindings", "go")
    out = {}
    for n in sorted(os.listdir(d)):
        if n.endswith((".go", ".c", ".h")) and not n.endswith("_test.go"):
            with open(os.path.join(d, n)) as f:
                out[n] = f.read()
    return out


# ---------------------------------------------------------------------------
# python
# ---------------------------------------------------------------------------

PY_ENUMS = {
    "kvp_dtype_t": ("DType", ["KVP_DTYPE_"]),
    "kvp_device_kind_t": ("DeviceKind", ["KVP_DEVICE_"]),
    "kvp_error_code_t": ("ErrorCode", ["KVP_ERR_", "KVP_"]),
}
PY_MACROS = {"KVP_ABI_MAJOR": "ABI_MAJOR", "KVP_ABI_MINOR": "ABI_MINOR",
             "KVP_FORMAT_SIGNATURE_BYTES": "FORMAT_SIGNATURE_BYTES"}
PY_NOT_MAPPED_MACROS = {
    "KVP_VERSION_MAJOR": "the package version is the loaded library's (kvpage.version())",
    "KVP_VERSION_MINOR": "the package version is the loaded library's (kvpage.version())",
    "KVP_VERSION_PATCH": "the package version is the loaded library's (kvpage.version())",
    "KVP_VERSION_STRING": "the package version is the loaded library's (kvpage.version())",
}

_INTS = {
    "size_t": (8, False), "int32_t": (4, True), "uint32_t": (4, False),
    "int64_t": (8, True), "uint64_t": (8, False),
}


def _py_class_name(struct):
    return "".join(p.title() for p in struct[len("kvp_"):].split("_"))


def _ctype_ok(ctype, t, classes):
    """Whether ctypes type t can carry C type `ctype` (LP64)."""
    base = re.sub(r"^const ", "", ctype)
    if base in _INTS:
        size, signed = _INTS[base]
        if not (isinstance(t, type) and issubclass(t, ctypes._SimpleCData)):
            return False
        if t._type_ not in "bBhHiIlLqQ":
            return False
        return ctypes.sizeof(t) == size and (t._type_.islower() == signed)
    if base == "float":
        return t is ctypes.c_float
    if base.endswith("*"):
        if t is None:
            return False
        if t in (ctypes.c_void_p,):
            return True
        if t is ctypes.c_char_p:
            return re.sub(r"^const ", "", base[:-1]).strip() == "char"
        if isinstance(t, type) and issubclass(t, ctypes._Pointer):
            pointee = re.sub(r"^const ", "", base[:-1]).strip()
            if pointee.endswith("*"):
                return _ctype_ok(pointee, t._type_, classes)
            if pointee in classes:
                return t._type_ is classes[pointee]
            return _ctype_ok(pointee, t._type_, classes)
        return False
    return False


def _fnptr_problems(what, fn, t, classes):
    if not (isinstance(t, type) and issubclass(t, ctypes._CFuncPtr)):
        return ["%s is not a CFUNCTYPE" % what]
    out = []
    args = list(t._argtypes_ or ())
    if len(args) != len(fn["params"]):
        out.append("%s takes %d arguments in the binding, %d in kvpage.h"
                   % (what, len(args), len(fn["params"])))
    else:
        for i, (c, a) in enumerate(zip(fn["params"], args)):
            if not _ctype_ok(c, a, classes):
                out.append("%s argument %d is %s in kvpage.h, %s in the binding"
                           % (what, i, c, getattr(a, "__name__", a)))
    ret = fn["ret"]
    if ret == "void":
        if t._restype_ is not None:
            out.append("%s returns void in kvpage.h, %s in the binding"
                       % (what, t._restype_.__name__))
    elif not _ctype_ok(ret, t._restype_, classes):
        out.append("%s returns %s in kvpage.h, %s in the binding"
                   % (what, ret, getattr(t._restype_, "__name__", t._restype_)))
    return out


def load_python_lib(path):
    spec = importlib.util.spec_from_file_location("kvpage_lib_under_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_python(h, lib_py_path):
    b = "kvpage/_lib.py"
    problems = []
    mod = load_python_lib(lib_py_path)
    with open(lib_py_path) as f:
        source = f.read()
    classes = {}
    for name in h["struct_order"]:
        cls = getattr(mod, _py_class_name(name), None)
        if not (isinstance(cls, type) and issubclass(cls, ctypes.Structure)):
            problems.append("struct %s has no ctypes Structure %s in %s"
                            % (name, _py_class_name(name), b))
            continue
        classes[name] = cls
    for name, cls in classes.items():
        st = h["structs"][name]
        pyfields = [f[0] for f in cls._fields_]
        _same_fields(problems, name, [f["name"] for f in st["fields"]], pyfields, b)
        types = dict((f[0], f[1]) for f in cls._fields_)
        for f in st["fields"]:
            if f["name"] not in types:
                continue
            t = types[f["name"]]
            what = "%s.%s" % (name, f["name"])
            if "fn" in f:
                problems += _fnptr_problems(what, f["fn"], t, classes)
            elif not _ctype_ok(f["type"], t, classes):
                problems.append("field %s is %s in kvpage.h, %s in %s"
                                % (what, f["type"], getattr(t, "__name__", t), b))
            elif getattr(cls, f["name"]).offset != f["offset"]:
                problems.append("field %s is at offset %d in %s, %d in kvpage.h"
                                % (what, getattr(cls, f["name"]).offset, b, f["offset"]))
    # Functions: everything but kvp_get_api is called through the table.
    api = classes.get("kvp_api")
    members = [f[0] for f in api._fields_] if api is not None else []
    for f in h["functions"]:
        if f["name"] == "kvp_get_api":
            if not re.search(r"\.kvp_get_api\b", source):
                problems.append("function kvp_get_api is not resolved by %s" % b)
        elif f["name"][len("kvp_"):] not in members:
            problems.append("function %s has no entry %s in %s's Api"
                            % (f["name"], f["name"][len("kvp_"):], b))
    # Constants.
    for enum, consts in h["enums"].items():
        if enum not in PY_ENUMS:
            problems.append("enum %s has no Python enum: add it to PY_ENUMS in "
                            "tests/abi/check_bindings.py" % enum)
            continue
        cname, prefixes = PY_ENUMS[enum]
        cls = getattr(mod, cname, None)
        if cls is None:
            problems.append("enum %s has no Python class %s" % (enum, cname))
            continue
        seen = set()
        for const, value in consts:
            member = const
            for p in prefixes:
                if const.startswith(p):
                    member = const[len(p):]
                    break
            seen.add(member)
            if member not in cls.__members__:
                problems.append("constant %s is in kvpage.h but not %s.%s in %s"
                                % (const, cname, member, b))
            elif int(cls.__members__[member]) != value:
                problems.append("constant %s is %d in kvpage.h, %s.%s = %d in %s"
                                % (const, value, cname, member, int(cls.__members__[member]), b))
        for member in cls.__members__:
            if member not in seen:
                problems.append("%s.%s in %s is not in kvpage.h" % (cname, member, b))
    sizes = getattr(mod, "FIRST_RELEASED_SIZES", {})
    for name, m in h["macros"].items():
        if name in PY_NOT_MAPPED_MACROS:
            continue
        if name in PY_MACROS:
            if getattr(mod, PY_MACROS[name], None) != m["value"]:
                problems.append("constant %s is %r in kvpage.h, %s = %r in %s"
                                % (name, m["value"], PY_MACROS[name],
                                   getattr(mod, PY_MACROS[name], None), b))
            continue
        info = h["struct_sizes"].get(name)
        if info is None:
            problems.append("constant %s has no Python counterpart: map it in PY_MACROS or "
                            "list it in PY_NOT_MAPPED_MACROS (tests/abi/check_bindings.py)"
                            % name)
            continue
        cls = classes.get(info["struct"])
        if cls is None:
            continue
        fld = getattr(cls, info["last_field"], None)
        if fld is None:
            continue  # reported with the struct's fields
        if fld.offset + fld.size != info["value"]:
            problems.append("%s is %d in kvpage.h; %s.%s ends at %d in %s"
                            % (name, info["value"], cls.__name__, info["last_field"],
                               fld.offset + fld.size, b))
        first = _first_release(h["structs"][info["struct"]])
        if tuple(info["abi"]) == first and sizes.get(cls) != info["value"]:
            problems.append("FIRST_RELEASED_SIZES[%s] is %r in %s, %s = %d"
                            % (cls.__name__, sizes.get(cls), b, name, info["value"]))
    return problems


# ---------------------------------------------------------------------------
# Self-tests: a check that cannot fail does not pass
# ---------------------------------------------------------------------------

def _delete_line(text, needle):
    lines = text.split("\n")
    hits = [i for i, l in enumerate(lines) if needle in l]
    if len(hits) != 1:
        raise AssertionError("self-test: %r occurs %d times (want once); update the "
                             "self-test in tests/abi/check_bindings.py" % (needle, len(hits)))
    del lines[hits[0]]
    return "\n".join(lines)


def _replace_once(text, old, new):
    if text.count(old) != 1:
        raise AssertionError("self-test: %r occurs %d times (want once); update the "
                             "self-test in tests/abi/check_bindings.py" % (old, text.count(old)))
    return text.replace(old, new)


def _expect(label, problems, *words):
    hit = [p for p in problems if all(w in p for w in words)]
    if not hit:
        raise AssertionError("self-test %s: the check did not report %s; it reported: %s"
                             % (label, " + ".join(words), problems or "nothing"))
    print("  self-test %s: caught (%s)" % (label, hit[0]))


def self_test(target, root, header_text):
    h = header_abi.read_header(header_text)
    if target == "header":
        t = _delete_line(header_text, "#define KVP_CACHE_CONFIG_STRUCT_SIZE_1_1")
        _expect("header: the ABI 1.1 size macro removed", check_header(t),
                "KVP_CACHE_CONFIG_STRUCT_SIZE_1_1")
        t = _replace_once(header_text, "int32_t checked; /* ABI 1.1 */", "int32_t checked;")
        _expect("header: the ABI 1.1 mark removed", check_header(t),
                "KVP_CACHE_CONFIG_STRUCT_SIZE_1_0", "last field")
        past = "ABI %d.%d" % (h["macros"]["KVP_ABI_MAJOR"]["value"],
                              h["macros"]["KVP_ABI_MINOR"]["value"] + 1)
        t = _replace_once(header_text, "  int32_t checked; /* ABI 1.1 */",
                          "  int32_t checked; /* ABI 1.1 */\n  int32_t appended; /* %s */" % past)
        _expect("header: a field marked past the ABI", check_header(t), "appended", "past")
        t = _replace_once(header_text, "KVP_EXPORT const kvp_api* kvp_get_api",
                          "KVP_EXPORT void kvp_new_function(void);\n"
                          "KVP_EXPORT const kvp_api* kvp_get_api")
        _expect("header: a function without a table entry", check_header(t), "kvp_new_function")
    elif target == "capi":
        sio, chk, cc = _capi_sources(root)
        _expect("capi: a size pin removed",
                check_capi(h, _delete_line(sio, "KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0 =="), chk, cc),
                "KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0")
        _expect("capi: an enum tie removed",
                check_capi(h, sio, _delete_line(chk, "KVP_DTYPE_INT4"), cc), "KVP_DTYPE_INT4")
        _expect("capi: a table entry removed",
                check_capi(h, sio, chk, _delete_line(cc, "      kvp_seq_truncate,")),
                "seq_truncate")
        _expect("capi: a struct first released in 1.3 held to its 1.0 size",
                check_capi(h, _replace_once(sio, "return KVP_ATTEND_ARGS_STRUCT_SIZE_1_3;",
                                            "return KVP_ATTEND_ARGS_STRUCT_SIZE_1_0;"), chk, cc),
                "FirstReleasedSize<kvp_attend_args>", "KVP_ATTEND_ARGS_STRUCT_SIZE_1_3")
    elif target == "rust":
        src = _read(root, "bindings/rust/kvpage-sys/src/lib.rs")
        _expect("rust: kvp_cache_config.checked removed",
                check_rust(h, _delete_line(src, "pub checked: i32,")),
                "kvp_cache_config.checked")
        _expect("rust: kvp_seq_free removed",
                check_rust(h, _delete_line(src, "pub fn kvp_seq_free(")), "kvp_seq_free")
        _expect("rust: KVP_DTYPE_INT4 removed",
                check_rust(h, _delete_line(src, "pub const KVP_DTYPE_INT4")), "KVP_DTYPE_INT4")
    elif target == "go":
        files = go_files(root)
        f2 = dict(files)
        f2["cache.go"] = _delete_line(files["cache.go"], "\tChecked bool")
        _expect("go: CacheConfig.Checked removed", check_go(h, f2), "kvp_cache_config.checked",
                "CacheConfig")
        f2 = dict(files)
        f2["kvpage_go.c"] = _delete_line(files["kvpage_go.c"], "c.checked = checked;")
        _expect("go: checked not passed through", check_go(h, f2), "kvp_cache_config.checked",
                "never written")
        f2 = dict(files)
        f2["cache.go"] = _replace_once(files["cache.go"], "Saturated: uint64(s.saturated)",
                                       "Saturated: 0")
        _expect("go: a result field not read", check_go(h, f2), "kvp_write_stats.saturated",
                "never read")
        f2 = dict(files)
        f2["cache.go"] = _replace_once(files["cache.go"], "C.kvp_seq_free(", "C.kvp_seq_length(")
        _expect("go: kvp_seq_free not called", check_go(h, f2), "kvp_seq_free")
    elif target == "python":
        src = _read(root, "bindings/python/kvpage/_lib.py")
        with tempfile.TemporaryDirectory() as d:
            def run(text):
                p = os.path.join(d, "_lib.py")
                with open(p, "w") as f:
                    f.write(text)
                return check_python(h, p)
            _expect("python: CacheConfig.checked removed",
                    run(_delete_line(src, '("checked", ctypes.c_int32)')),
                    "kvp_cache_config.checked")
            _expect("python: the table's decode entry removed",
                    run(_delete_line(src, '("decode", _fn(')), "kvp_decode")
            _expect("python: a prototype's argument retyped",
                    run(_replace_once(src, '("seq_truncate", _fn(c_error_p, c_handle, _i64, _i32))',
                                      '("seq_truncate", _fn(c_error_p, c_handle, _i64, _i64))')),
                    "seq_truncate", "argument 2")
            _expect("python: an enum member removed",
                    run(_delete_line(src, "    INT4 = 5")), "KVP_DTYPE_INT4")
            _expect("python: the first released size of a struct of ABI 1.3 removed",
                    run(_delete_line(src, "    AttendArgs: 120,")),
                    "FIRST_RELEASED_SIZES[AttendArgs]", "KVP_ATTEND_ARGS_STRUCT_SIZE_1_3")


def _read(root, rel):
    with open(os.path.join(root, rel)) as f:
        return f.read()


def _capi_sources(root):
    return (_read(root, "capi/struct_io.h"), _read(root, "capi/abi_checks.h"),
            _read(root, "capi/kvpage_capi.cc"))


# ---------------------------------------------------------------------------

def run(target, root, cc):
    header_path = os.path.join(root, "include", "kvpage", "kvpage.h")
    header_text = _read(root, "include/kvpage/kvpage.h")
    h = header_abi.read_header(header_text)
    if target == "header":
        problems = check_header(header_text, header_path, cc)
    elif target == "capi":
        problems = check_capi(h, *_capi_sources(root))
    elif target == "rust":
        problems = check_rust(h, _read(root, "bindings/rust/kvpage-sys/src/lib.rs"))
    elif target == "go":
        problems = check_go(h, go_files(root))
    elif target == "python":
        problems = check_python(h, os.path.join(root, "bindings/python/kvpage/_lib.py"))
    else:
        raise SystemExit("unknown target %s" % target)
    print("%s against kvpage.h: %s" % (target, "%d problems" % len(problems) if problems
                                       else "no drift"))
    for p in problems:
        print("  DRIFT: " + p)
    try:
        self_test(target, root, header_text)
    except AssertionError as e:
        print("  SELF-TEST FAILED: %s" % e)
        return False
    return not problems


def main(argv):
    args = list(argv)
    root = os.path.dirname(os.path.dirname(HERE))
    cc = None
    for opt in ("--root", "--cc"):
        if opt in args:
            i = args.index(opt)
            if opt == "--root":
                root = args[i + 1]
            else:
                cc = args[i + 1]
            del args[i:i + 2]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    if args == ["all"]:
        args = ["header", "capi", "rust", "go", "python"]
    ok = True
    for t in args:
        ok = run(t, root, cc) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
