// SPDX-License-Identifier: Apache-2.0
//! The declarations of `kvpage-sys` against the C header itself.
//!
//! A C program is generated from this crate's source (`src/lib.rs`), compiled
//! against `kvpage/kvpage.h` and run:
//!
//! - every struct: size, alignment, and each field's offset and size, as the
//!   C compiler lays them out, compared with what rustc made of the
//!   `#[repr(C)]` declaration here;
//! - every field's type and every function's signature: the Rust types are
//!   translated to C and checked at compile time (`__builtin_types_compatible_p`
//!   for fields, a redeclaration of each function, which is a "conflicting
//!   types" error when they differ);
//! - every constant's value;
//! - completeness both ways: each function, struct, enum constant,
//!   object-like macro (the `KVP_*_STRUCT_SIZE_*` sizes included) and
//!   typedef of the header is declared here, and nothing here is missing
//!   from the header. `tests/abi/check_bindings.py rust` (ctest
//!   `abi_drift_rust`) also compares the fields' names and order.
//!
//! Needs a C compiler (`$CC`, else `cc`) and the header directory found by
//! the build script (`KVPAGE_INCLUDE_DIR`, `KVPAGE_DIR`, pkg-config, or the
//! checkout).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::mem::{align_of, size_of, MaybeUninit};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::addr_of;

use kvpage_sys::*;

const SOURCE: &str = include_str!("../src/lib.rs");

struct RustLayout {
    name: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize, usize)>, // name, offset, size
}

fn pointee_size<T>(_: *const T) -> usize {
    size_of::<T>()
}

/// Layout of a struct as rustc made it. The pattern in `_exhaustive` does not
/// compile unless every field of the struct is listed.
macro_rules! layout {
    ($t:ident { $($f:ident),* $(,)? }) => {{
        #[allow(dead_code)]
        fn _exhaustive(x: $t) {
            let $t { $($f: _),* } = x;
        }
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        let mut fields = Vec::new();
        $(
            // SAFETY: addr_of! computes a field address without reading it.
            let p = unsafe { addr_of!((*base).$f) };
            fields.push((stringify!($f), p as usize - base as usize, pointee_size(p)));
        )*
        RustLayout { name: stringify!($t), size: size_of::<$t>(), align: align_of::<$t>(), fields }
    }};
}

fn rust_layouts() -> Vec<RustLayout> {
    vec![
        layout!(kvp_allocator {
            struct_size,
            user_data,
            alloc,
            free
        }),
        layout!(kvp_cache_config {
            struct_size,
            device_kind,
            device_ordinal,
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_size,
            k_dtype,
            v_dtype,
            reserved0,
            key_smoothing,
            allocator,
            checked,
        }),
        layout!(kvp_layer_layout {
            struct_size,
            k_data,
            v_data,
            k_scales,
            v_scales,
            k_block_stride,
            k_head_stride,
            k_chunk_stride,
            k_x,
            k_chunks,
            v_block_stride,
            v_head_stride,
            v_channel_stride,
            k_bits,
            v_bits,
            k_scale_block_stride,
            k_scale_head_stride,
            v_scale_block_stride,
            v_scale_head_stride,
            k_scale_entry_bytes,
            v_scale_entry_bytes,
            k_data_bytes,
            v_data_bytes,
            k_scale_bytes,
            v_scale_bytes,
        }),
        layout!(kvp_cache_info {
            struct_size,
            device_kind,
            device_ordinal,
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_size,
            k_dtype,
            v_dtype,
            has_key_smoothing,
            bytes_per_token_per_layer,
            total_bytes,
        }),
        layout!(kvp_write_args {
            struct_size,
            layer,
            num_tokens,
            input_dtype,
            reserved0,
            key,
            value,
            key_token_stride,
            value_token_stride,
            slot_mapping,
        }),
        layout!(kvp_write_stats {
            struct_size,
            non_finite,
            saturated
        }),
        layout!(kvp_decode_config {
            struct_size,
            num_query_heads,
            max_num_seqs,
            max_context_len,
            max_query_len,
            q_dtype,
            out_dtype,
            workspace,
            workspace_bytes,
            precise,
            max_query_tokens,
        }),
        layout!(kvp_decode_args {
            struct_size,
            layer,
            num_seqs,
            query_len,
            sliding_window,
            sm_scale,
            logits_soft_cap,
            q,
            q_token_stride,
            block_table,
            block_table_stride,
            block_table_width,
            reserved0,
            seq_lens,
            alibi_slopes,
            out,
            out_token_stride,
            lse,
        }),
        layout!(kvp_attend_args {
            struct_size,
            layer,
            num_seqs,
            sliding_window,
            sm_scale,
            logits_soft_cap,
            reserved0,
            query_starts,
            q,
            q_token_stride,
            block_table,
            block_table_stride,
            block_table_width,
            reserved1,
            seq_lens,
            alibi_slopes,
            out,
            out_token_stride,
            lse,
        }),
        layout!(kvp_pack_args {
            struct_size,
            block_ids,
            num_blocks,
            first_layer,
            num_layers,
            reserved0,
            buffer,
            buffer_bytes,
            signature,
        }),
        layout!(kvp_api {
            struct_size,
            abi_major,
            abi_minor,
            version_string,
            abi_version,
            build_info,
            error_code,
            error_message,
            error_free,
            error_code_name,
            device_count,
            allocator_init,
            cache_config_init,
            cache_create,
            cache_destroy,
            layer_layout_init,
            cache_get_layout,
            cache_info_init,
            cache_get_info,
            seq_create,
            seq_fork,
            seq_append,
            seq_truncate,
            seq_free,
            seq_length,
            cache_num_free_blocks,
            cache_export_block_table,
            write_args_init,
            cache_write,
            write_stats_init,
            cache_get_write_stats,
            cache_reset_write_stats,
            cache_copy_blocks,
            cache_transfer_blocks,
            decode_config_init,
            decode_workspace_size,
            decoder_create,
            decoder_destroy,
            decode_args_init,
            decode,
            attend_args_init,
            attend,
            pack_args_init,
            cache_pack_size,
            cache_pack,
            cache_unpack,
            cache_format_signature,
            cache_check_signature,
        }),
    ]
}

/// Sizes of the type aliases (the C enums and the function pointer typedef).
fn rust_alias_sizes() -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    m.insert("kvp_error_code_t", size_of::<kvp_error_code_t>());
    m.insert("kvp_dtype_t", size_of::<kvp_dtype_t>());
    m.insert("kvp_device_kind_t", size_of::<kvp_device_kind_t>());
    m.insert("kvp_get_api_fn", size_of::<kvp_get_api_fn>());
    m
}

// ---------------------------------------------------------------------------
// A small reader of this crate's own source
// ---------------------------------------------------------------------------

#[derive(Default)]
struct RustDecls {
    structs: BTreeMap<String, Vec<(String, String)>>, // name -> [(field, type)]
    opaque: BTreeSet<String>,
    fns: BTreeMap<String, (Vec<String>, Option<String>)>, // name -> (arg types, ret)
    consts: BTreeMap<String, String>,                     // name -> value text
    aliases: BTreeMap<String, String>,                    // name -> type
}

/// Whitespace collapsed, comments dropped.
fn normalize(src: &str) -> String {
    let mut out = String::new();
    for line in src.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push(' ');
    }
    let mut s = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for (a, b) in [
        ("( ", "("),
        (" )", ")"),
        (",)", ")"),
        ("< ", "<"),
        (" >", ">"),
        (",>", ">"),
    ] {
        while s.contains(a) {
            s = s.replace(a, b);
        }
    }
    s
}

/// Splits at commas outside (), <> and [] ("->" is not a bracket).
fn split_top(s: &str) -> Vec<String> {
    let s = s.replace("->", "\u{1}");
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(cur.trim().replace('\u{1}', "->"));
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        parts.push(cur.trim().replace('\u{1}', "->"));
    }
    parts
}

/// The text between the bracket at `open` and its match.
fn bracketed(s: &str, open: usize) -> (&str, usize) {
    let bytes = s.as_bytes();
    let (o, c) = (bytes[open], if bytes[open] == b'(' { b')' } else { b'}' });
    let mut depth = 0;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return (&s[open + 1..i], i);
            }
        }
    }
    panic!("unbalanced bracket in source");
}

fn parse_rust(src: &str) -> RustDecls {
    let s = normalize(src);
    let mut d = RustDecls::default();
    let mut at = 0;
    while let Some(i) = s[at..].find("pub struct ") {
        let start = at + i + "pub struct ".len();
        let name_end = start
            + s[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap();
        let name = s[start..name_end].to_string();
        let open = name_end + s[name_end..].find('{').unwrap();
        let (body, close) = bracketed(&s, open);
        at = close;
        let fields: Vec<(String, String)> = split_top(body)
            .into_iter()
            .filter_map(|f| {
                let f = f.strip_prefix("pub ")?; // private fields: opaque markers
                let (n, t) = f.split_once(':').unwrap();
                Some((n.trim().to_string(), t.trim().to_string()))
            })
            .collect();
        if fields.is_empty() {
            d.opaque.insert(name);
        } else {
            d.structs.insert(name, fields);
        }
    }
    at = 0;
    while let Some(i) = s[at..].find("pub fn ") {
        let start = at + i + "pub fn ".len();
        let open = start + s[start..].find('(').unwrap();
        let name = s[start..open].trim().to_string();
        let (args, close) = bracketed(&s, open);
        let semi = close + s[close..].find(';').unwrap();
        let rest = s[close + 1..semi].trim();
        let ret = rest.strip_prefix("->").map(|r| r.trim().to_string());
        let args = split_top(args)
            .into_iter()
            .map(|a| a.split_once(':').unwrap().1.trim().to_string())
            .collect();
        d.fns.insert(name, (args, ret));
        at = semi;
    }
    for (kw, map) in [("pub const ", &mut d.consts), ("pub type ", &mut d.aliases)] {
        at = 0;
        while let Some(i) = s[at..].find(kw) {
            let start = at + i + kw.len();
            let semi = start + s[start..].find(';').unwrap();
            let item = &s[start..semi];
            let (name, value) = if kw == "pub const " {
                let (n, rest) = item.split_once(':').unwrap();
                (n, rest.split_once('=').unwrap().1)
            } else {
                item.split_once('=').unwrap()
            };
            map.insert(name.trim().to_string(), value.trim().to_string());
            at = semi;
        }
    }
    d
}

/// The C spelling of a Rust FFI type.
fn c_type(t: &str) -> String {
    let t = t.trim();
    if let Some(rest) = t.strip_prefix("*const ") {
        return format!("{} const *", c_type(rest));
    }
    if let Some(rest) = t.strip_prefix("*mut ") {
        return format!("{} *", c_type(rest));
    }
    if let Some(inner) = t.strip_prefix("Option<").and_then(|x| x.strip_suffix('>')) {
        let f = inner
            .trim()
            .strip_prefix("unsafe extern \"C\" fn")
            .unwrap_or_else(|| panic!("unexpected Option type {}", t));
        let open = f.find('(').unwrap();
        let (args, close) = bracketed(f, open);
        let ret = f[close + 1..]
            .trim()
            .strip_prefix("->")
            .map(c_type)
            .unwrap_or("void".into());
        return format!("{} (*)({})", ret, c_args(&split_top(args)));
    }
    match t {
        "i8" => "int8_t",
        "u8" => "uint8_t",
        "i16" => "int16_t",
        "u16" => "uint16_t",
        "i32" => "int32_t",
        "u32" => "uint32_t",
        "i64" => "int64_t",
        "u64" => "uint64_t",
        "usize" => "size_t",
        "isize" => "ptrdiff_t",
        "f32" => "float",
        "f64" => "double",
        "c_void" => "void",
        "c_char" => "char",
        other if other.starts_with("kvp_") => other,
        other => panic!("no C spelling for Rust type `{}`", other),
    }
    .to_string()
}

fn c_args(args: &[String]) -> String {
    if args.is_empty() {
        "void".to_string()
    } else {
        args.iter()
            .map(|a| c_type(a))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// ---------------------------------------------------------------------------
// What the header declares (a scan of its text)
// ---------------------------------------------------------------------------

#[derive(Default, Debug)]
struct HeaderDecls {
    fns: BTreeSet<String>,
    structs: BTreeSet<String>,
    opaque: BTreeSet<String>,
    enum_consts: BTreeSet<String>,
    macros: BTreeSet<String>,
    typedefs: BTreeSet<String>,
}

fn ident_at_end(s: &str) -> &str {
    let s = s.trim_end();
    let start = s
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    &s[start..]
}

fn ident_at_start(s: &str) -> &str {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

fn scan_header(text: &str) -> HeaderDecls {
    // Drop comments first (block and line).
    let mut code = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    code.push_str(rest);

    let mut h = HeaderDecls::default();
    let mut in_enum = false;
    for raw in code.lines() {
        let line = raw.trim();
        if let Some(d) = line.strip_prefix("#define ") {
            let name = ident_at_start(d);
            let value = d[name.len()..].trim();
            // Function-like macros (KVP_STRUCT_SIZE) have no Rust constant;
            // their uses (KVP_*_STRUCT_SIZE_*) do.
            let function_like = d[name.len()..].starts_with('(');
            if name.starts_with("KVP_")
                && name != "KVP_EXPORT"
                && !value.is_empty()
                && !function_like
            {
                h.macros.insert(name.to_string());
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if let Some(after) = line.strip_prefix("KVP_EXPORT ") {
            let open = after.find('(').expect("KVP_EXPORT declaration without (");
            h.fns.insert(ident_at_end(&after[..open]).to_string());
        } else if let Some(after) = line.strip_prefix("typedef struct ") {
            let name = ident_at_start(after).to_string();
            if after.trim_end().ends_with('{') {
                h.structs.insert(name);
            } else {
                h.opaque.insert(name);
            }
        } else if line.starts_with("typedef enum ") {
            in_enum = true;
        } else if in_enum && line.starts_with('}') {
            in_enum = false;
            h.typedefs
                .insert(ident_at_end(line.trim_end_matches(';')).to_string());
        } else if in_enum && line.starts_with("KVP_") {
            h.enum_consts.insert(ident_at_start(line).to_string());
        } else if line.starts_with("typedef ") && line.contains("(*") {
            let after = &line[line.find("(*").unwrap() + 2..];
            h.typedefs.insert(ident_at_start(after).to_string());
        }
    }
    h
}

// ---------------------------------------------------------------------------
// The generated C program
// ---------------------------------------------------------------------------

fn c_program(d: &RustDecls) -> String {
    let mut c = String::new();
    c.push_str(
        "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n\
         #include \"kvpage/kvpage.h\"\n\
         #define SAME_TYPE(expr, T) _Static_assert(__builtin_types_compatible_p(__typeof__(expr), T), \
         #expr \" is not \" #T)\n\n/* Every function as kvpage-sys declares it. */\n",
    );
    for (name, (args, ret)) in &d.fns {
        let ret = ret.as_deref().map(c_type).unwrap_or_else(|| "void".into());
        writeln!(c, "{} {}({});", ret, name, c_args(args)).unwrap();
    }
    c.push_str("\n/* Every field's type. */\n");
    for (s, fields) in &d.structs {
        for (f, t) in fields {
            writeln!(c, "SAME_TYPE((({} *)0)->{}, {});", s, f, c_type(t)).unwrap();
        }
    }
    c.push_str("\n/* Constants and aliases. */\n");
    for (name, value) in &d.consts {
        if !value.starts_with('"') {
            writeln!(
                c,
                "_Static_assert({} == {}, \"{} = {}\");",
                name, value, name, value
            )
            .unwrap();
        }
    }
    for (name, t) in &d.aliases {
        if !name.ends_with("_t") {
            // Enums (the *_t aliases) are compared by size only.
            writeln!(c, "SAME_TYPE(({})0, {});", name, c_type(t)).unwrap();
        }
    }
    c.push_str("\nint main(void) {\n");
    for (s, fields) in &d.structs {
        writeln!(
            c,
            "  printf(\"struct {} %zu %zu\\n\", sizeof({}), _Alignof({}));",
            s, s, s
        )
        .unwrap();
        for (f, _) in fields {
            writeln!(
                c,
                "  printf(\"field {}.{} %zu %zu\\n\", offsetof({}, {}), sizeof((({} *)0)->{}));",
                s, f, s, f, s, f
            )
            .unwrap();
        }
    }
    for name in d.aliases.keys() {
        writeln!(c, "  printf(\"alias {} %zu\\n\", sizeof({}));", name, name).unwrap();
    }
    for (name, value) in &d.consts {
        if value.starts_with('"') {
            writeln!(c, "  printf(\"string {} %s\\n\", {});", name, name).unwrap();
        }
    }
    c.push_str("  return 0;\n}\n");
    c
}

fn include_dir() -> PathBuf {
    let dir = env!("KVPAGE_SYS_INCLUDE_DIR");
    assert!(
        !dir.is_empty(),
        "the build script found no kvpage/kvpage.h: set KVPAGE_INCLUDE_DIR or KVPAGE_DIR"
    );
    PathBuf::from(dir)
}

#[test]
fn declarations_match_the_header() {
    let decls = parse_rust(SOURCE);
    let inc = include_dir();
    let header_text = std::fs::read_to_string(inc.join("kvpage/kvpage.h")).unwrap();
    let header = scan_header(&header_text);
    let mut problems = Vec::new();

    // Completeness, both ways.
    let pairs: [(&str, BTreeSet<String>, BTreeSet<String>); 5] = [
        (
            "function",
            header.fns.clone(),
            decls.fns.keys().cloned().collect(),
        ),
        (
            "struct",
            header.structs.clone(),
            decls.structs.keys().cloned().collect(),
        ),
        ("opaque handle", header.opaque.clone(), decls.opaque.clone()),
        (
            "constant",
            header.enum_consts.union(&header.macros).cloned().collect(),
            decls.consts.keys().cloned().collect(),
        ),
        (
            "typedef",
            header.typedefs.clone(),
            decls.aliases.keys().cloned().collect(),
        ),
    ];
    for (what, in_header, in_rust) in &pairs {
        for n in in_header.difference(in_rust) {
            problems.push(format!(
                "{} {} is in kvpage.h but not in kvpage-sys",
                what, n
            ));
        }
        for n in in_rust.difference(in_header) {
            problems.push(format!(
                "{} {} is in kvpage-sys but not in kvpage.h",
                what, n
            ));
        }
    }
    let layouts = rust_layouts();
    let listed: BTreeSet<String> = layouts.iter().map(|l| l.name.to_string()).collect();
    let declared: BTreeSet<String> = decls.structs.keys().cloned().collect();
    assert_eq!(
        listed, declared,
        "rust_layouts() must list every struct of src/lib.rs"
    );

    // Compile and run the C side.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join("kvpage_layout.c");
    let exe = dir.join("kvpage_layout");
    std::fs::write(&src, c_program(&decls)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cc_words = cc.split_whitespace();
    let out = Command::new(cc_words.next().unwrap())
        .args(cc_words)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("running the C compiler ($CC or cc)");
    assert!(
        out.status.success(),
        "the C program generated from kvpage-sys ({}) does not compile against {}: a type, \
         signature or constant differs:\n{}",
        src.display(),
        inc.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();

    let mut c_structs = BTreeMap::new();
    let mut c_fields = BTreeMap::new();
    let mut c_aliases = BTreeMap::new();
    let mut c_strings = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split(' ').collect();
        match w[0] {
            "struct" => {
                c_structs.insert(
                    w[1].to_string(),
                    (
                        w[2].parse::<usize>().unwrap(),
                        w[3].parse::<usize>().unwrap(),
                    ),
                );
            }
            "field" => {
                c_fields.insert(
                    w[1].to_string(),
                    (
                        w[2].parse::<usize>().unwrap(),
                        w[3].parse::<usize>().unwrap(),
                    ),
                );
            }
            "alias" => {
                c_aliases.insert(w[1].to_string(), w[2].parse::<usize>().unwrap());
            }
            "string" => {
                c_strings.insert(w[1].to_string(), w[2..].join(" "));
            }
            _ => panic!("unexpected line {}", line),
        }
    }
    let mut checked_fields = 0;
    for l in &layouts {
        let (size, align) = c_structs[l.name];
        if (size, align) != (l.size, l.align) {
            problems.push(format!(
                "{}: C has size {} align {}, Rust size {} align {}",
                l.name, size, align, l.size, l.align
            ));
        }
        for &(f, off, sz) in &l.fields {
            let key = format!("{}.{}", l.name, f);
            let (c_off, c_sz) = c_fields[&key];
            if (c_off, c_sz) != (off, sz) {
                problems.push(format!(
                    "{}: C has offset {} size {}, Rust offset {} size {}",
                    key, c_off, c_sz, off, sz
                ));
            }
            checked_fields += 1;
        }
    }
    let alias_sizes = rust_alias_sizes();
    for (name, c_size) in &c_aliases {
        match alias_sizes.get(name.as_str()) {
            Some(&s) if s == *c_size => {}
            other => problems.push(format!(
                "{}: C size {}, Rust size {:?}",
                name, c_size, other
            )),
        }
    }
    for (name, value) in &decls.consts {
        if let Some(v) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            if c_strings.get(name).map(String::as_str) != Some(v) {
                problems.push(format!(
                    "{}: C {:?}, Rust {:?}",
                    name,
                    c_strings.get(name),
                    v
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "kvpage-sys differs from kvpage.h:\n  {}",
        problems.join("\n  ")
    );
    // A parser that found nothing would pass vacuously.
    assert!(decls.fns.len() >= 38 && layouts.len() >= 9 && checked_fields >= 135);
    assert_eq!(KVP_VERSION_STRING, unsafe {
        std::ffi::CStr::from_ptr(kvp_version_string())
            .to_str()
            .unwrap()
    });
}

#[test]
fn the_reader_catches_a_mismatch() {
    // The checks above only mean something if a wrong declaration fails:
    // feed the generator a wrong signature and a wrong field type.
    let mut d = parse_rust(SOURCE);
    d.fns.get_mut("kvp_seq_truncate").unwrap().0[2] = "i64".to_string();
    d.structs.get_mut("kvp_write_args").unwrap()[1].1 = "i64".to_string();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join("kvpage_layout_wrong.c");
    std::fs::write(&src, c_program(&d)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cc_words = cc.split_whitespace();
    let out = Command::new(cc_words.next().unwrap())
        .args(cc_words)
        .args(["-std=c11", "-fsyntax-only", "-I"])
        .arg(include_dir())
        .arg(&src)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a wrong declaration compiled");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kvp_seq_truncate"), "{}", err);
    assert!(err.contains("layer"), "{}", err);
}
