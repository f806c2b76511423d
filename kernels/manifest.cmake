# SPDX-License-Identifier: Apache-2.0
# The kernel manifest: the one list of what the library is built for. From
# it, kvpage_generate_kernels() below writes
#   - the instantiation units of every kernel family (one per family and KV
#     dtype, so that nvcc builds them in parallel),
#   - kvpage_manifest.h: X-macros of the instantiated sets, which generate
#     the dispatch cases (kernels/decode_dispatch.cu), the plan's "does this
#     kernel exist" test (src/decode_plan.cc), the cache's validation
#     (src/cache.cc), kvp_build_info() and the test matrices (src/manifest.h).
# Adding a head size or a KV dtype is one entry here (plus, for a dtype, its
# format code in src/formats.cc and kernels/common/). docs/DESIGN.md,
# "Kernel manifest", says what each entry costs in library size.

# What the library holds, on every backend (the CPU backend serves the same
# set, so that a cache behaves alike wherever it lives). A reduced build
# names subsets: -DKVPAGE_KV_DTYPES="BF16;INT8" -DKVPAGE_HEAD_SIZES=128.
set(KVPAGE_ALL_KV_DTYPES FP16 BF16 FP8_E4M3 INT8 INT4)
set(KVPAGE_ALL_HEAD_SIZES 64 80 96 112 128 256)
set(KVPAGE_ALL_TC_BLOCK_SIZES 8 16 32)
set(KVPAGE_KV_DTYPES "${KVPAGE_ALL_KV_DTYPES}" CACHE STRING
    "KV-cache dtypes the library is built for (a subset of ${KVPAGE_ALL_KV_DTYPES})")
set(KVPAGE_HEAD_SIZES "${KVPAGE_ALL_HEAD_SIZES}" CACHE STRING
    "Head sizes the library is built for (a subset of ${KVPAGE_ALL_HEAD_SIZES})")
# Block sizes with tensor-core decode kernels (block size is a template
# argument there: addresses become base + immediate); others run the
# thread-group kernel, which takes any block size at run time.
set(KVPAGE_TC_BLOCK_SIZES "${KVPAGE_ALL_TC_BLOCK_SIZES}" CACHE STRING
    "Block sizes with tensor-core decode kernels (a subset of ${KVPAGE_ALL_TC_BLOCK_SIZES})")

# Kernel families: the head sizes each is instantiated for (intersected with
# KVPAGE_HEAD_SIZES) and, where not every KV dtype, its dtypes.
#   thread-group decode (kernels/paged_decode.cuh): every dtype and head
#     size, the fallback of every other family (no list of its own);
#   tensor-core decode (kernels/tc_decode.cuh): K = V dtype; four lanes
#     share a token's 16-byte K chunks, so head size must be a multiple of
#     4 chunks (32 channels at 16 bits, 64 at 8, 128 at 4);
#   staged decode (kernels/tc_staged_decode.cuh): 16-bit caches, head 128.
set(KVPAGE_DECODE_TENSOR_CORE_HEAD_SIZES 64 128 256)
set(KVPAGE_DECODE_STAGED_HEAD_SIZES 128)
set(KVPAGE_DECODE_STAGED_DTYPES FP16 BF16)
#   query-chunk attention (kernels/varlen_attention.cuh): every head size,
#     one kernel per (K side, V side) of the operand kinds the dtypes need
#     (BF16 -> bf16, FP16 -> fp16, FP8/INT8/INT4 -> codes; attend_traits.h),
#     so mixed K/V dtypes are served too.

# Per dtype: the C++ enumerator (src/geometry.h), bits, and the name
# kvp_build_info() reports.
set(_kvp_FP16_enum kFP16)
set(_kvp_BF16_enum kBF16)
set(_kvp_FP8_E4M3_enum kFP8E4M3)
set(_kvp_INT8_enum kINT8)
set(_kvp_INT4_enum kINT4)
set(_kvp_FP16_bits 16)
set(_kvp_BF16_bits 16)
set(_kvp_FP8_E4M3_bits 8)
set(_kvp_INT8_bits 8)
set(_kvp_INT4_bits 4)
set(_kvp_FP16_operand kFp16)
set(_kvp_BF16_operand kBf16)
set(_kvp_FP8_E4M3_operand kCodes)
set(_kvp_INT8_operand kCodes)
set(_kvp_INT4_operand kCodes)

function(_kvp_check_subset name all)
  if("${${name}}" STREQUAL "")
    message(FATAL_ERROR "${name} is empty: name at least one of ${all}")
  endif()
  foreach(v IN LISTS ${name})
    if(NOT v IN_LIST all)
      message(FATAL_ERROR "${name}: '${v}' is not one of ${all}")
    endif()
  endforeach()
endfunction()

# The entries of `all` that `named` holds, in `all`'s order, into `out`.
function(_kvp_in_order out all named)
  set(kept "")
  foreach(v IN LISTS all)
    if(v IN_LIST named)
      list(APPEND kept ${v})
    endif()
  endforeach()
  set(${out} "${kept}" PARENT_SCOPE)
endfunction()

# Writes `content` to `path` only when it changed (no needless rebuilds).
function(_kvp_write path content)
  file(CONFIGURE OUTPUT "${path}" CONTENT "${content}" @ONLY)
endfunction()

# Generates the manifest header and instantiation units under `out_dir`;
# sets KVPAGE_GENERATED_KERNEL_SOURCES in the caller's scope.
function(kvpage_generate_kernels out_dir)
  _kvp_check_subset(KVPAGE_KV_DTYPES "${KVPAGE_ALL_KV_DTYPES}")
  _kvp_check_subset(KVPAGE_HEAD_SIZES "${KVPAGE_ALL_HEAD_SIZES}")
  if(KVPAGE_TC_BLOCK_SIZES)  # empty: no tensor-core decode kernels at all
    _kvp_check_subset(KVPAGE_TC_BLOCK_SIZES "${KVPAGE_ALL_TC_BLOCK_SIZES}")
  endif()
  # Keep the canonical order whatever order the caller named.
  _kvp_in_order(dtypes "${KVPAGE_ALL_KV_DTYPES}" "${KVPAGE_KV_DTYPES}")
  _kvp_in_order(heads "${KVPAGE_ALL_HEAD_SIZES}" "${KVPAGE_HEAD_SIZES}")
  _kvp_in_order(tc_block_sizes "${KVPAGE_ALL_TC_BLOCK_SIZES}" "${KVPAGE_TC_BLOCK_SIZES}")

  set(x_dtypes "")
  set(x_heads "")
  set(x_tg "")
  set(x_tc "")
  set(x_staged "")
  set(x_tc_bs "")
  set(names "")
  set(sources "")
  foreach(d IN LISTS heads)
    string(APPEND x_heads " X(${d})")
  endforeach()
  foreach(bs IN LISTS tc_block_sizes)
    string(APPEND x_tc_bs " X(${bs})")
  endforeach()
  foreach(t IN LISTS dtypes)
    set(e ${_kvp_${t}_enum})
    string(TOLOWER ${t} lower)
    list(APPEND names ${lower})
    string(APPEND x_dtypes " X(${e})")
    set(tg "")
    set(tc "")
    set(st "")
    foreach(d IN LISTS heads)
      string(APPEND x_tg " X(${e}, ${d})")
      string(APPEND tg "KVPAGE_DECODE_INSTANTIATE(DType::${e}, ${d})\n")
      math(EXPR tc_multiple "4 * (128 / ${_kvp_${t}_bits})")
      math(EXPR tc_rest "${d} % ${tc_multiple}")
      if(d IN_LIST KVPAGE_DECODE_TENSOR_CORE_HEAD_SIZES AND tc_rest EQUAL 0 AND tc_block_sizes)
        string(APPEND x_tc " X(${e}, ${d})")
        string(APPEND tc "KVPAGE_TC_DECODE_INSTANTIATE(DType::${e}, ${d})\n")
      endif()
      if(d IN_LIST KVPAGE_DECODE_STAGED_HEAD_SIZES AND t IN_LIST KVPAGE_DECODE_STAGED_DTYPES
         AND 16 IN_LIST tc_block_sizes)
        string(APPEND x_staged " X(${e}, ${d})")
        string(APPEND st "KVPAGE_TC_STAGED_DECODE_INSTANTIATE(DType::${e}, ${d})\n")
      endif()
    endforeach()
    foreach(family_header IN ITEMS "thread_group;paged_decode;${tg}" "tensor_core;tc_decode;${tc}"
                                   "staged;tc_staged_decode;${st}")
      list(GET family_header 0 family)
      list(GET family_header 1 header)
      list(GET family_header 2 body)
      if(body STREQUAL "")
        continue()  # nothing of this family for this dtype
      endif()
      set(path "${out_dir}/kernels/decode_${family}_${lower}.cu")
      _kvp_write("${path}" "// Generated from kernels/manifest.cmake: do not edit.
#include \"kernels/${header}.cuh\"

namespace kvpage {
namespace kernels {
namespace decode {

${body}
}  // namespace decode
}  // namespace kernels
}  // namespace kvpage
")
      list(APPEND sources "${path}")
    endforeach()
  endforeach()
  # Query-chunk attention: the operand kinds of the dtypes, in a fixed order.
  set(kinds "")
  foreach(kind IN ITEMS kBf16 kFp16 kCodes)
    foreach(t IN LISTS dtypes)
      if(_kvp_${t}_operand STREQUAL kind AND NOT kind IN_LIST kinds)
        list(APPEND kinds ${kind})
      endif()
    endforeach()
  endforeach()
  set(x_attend "")
  foreach(kk IN LISTS kinds)
    foreach(vk IN LISTS kinds)
      set(body "")
      foreach(d IN LISTS heads)
        string(APPEND x_attend " X(${kk}, ${vk}, ${d})")
        string(APPEND body "KVPAGE_ATTEND_INSTANTIATE(${kk}, ${vk}, ${d})\n")
      endforeach()
      string(TOLOWER "${kk}_${vk}" unit)
      string(REPLACE "k" "" unit "${unit}")
      set(path "${out_dir}/kernels/attend_${unit}.cu")
      _kvp_write("${path}" "// Generated from kernels/manifest.cmake: do not edit.
#include \"kernels/varlen_attention.cuh\"

namespace kvpage {
namespace kernels {
namespace attend {

${body}
}  // namespace attend
}  // namespace kernels
}  // namespace kvpage
")
      list(APPEND sources "${path}")
    endforeach()
  endforeach()
  set(full 0)
  if(dtypes STREQUAL KVPAGE_ALL_KV_DTYPES AND heads STREQUAL KVPAGE_ALL_HEAD_SIZES
     AND tc_block_sizes STREQUAL KVPAGE_ALL_TC_BLOCK_SIZES)
    set(full 1)
  endif()
  string(REPLACE ";" "," dtype_names "${names}")
  string(REPLACE ";" "," head_names "${heads}")
  string(REPLACE ";" "," tc_bs_names "${tc_block_sizes}")
  _kvp_write("${out_dir}/kvpage_manifest.h" "// Generated from kernels/manifest.cmake: do not edit.
// The instantiated sets, as X-macros (src/manifest.h reads them for C++).
#ifndef KVPAGE_MANIFEST_H_
#define KVPAGE_MANIFEST_H_

// KV-cache dtypes and head sizes the library holds (X(DType enumerator),
// X(head size)).
#define KVPAGE_MANIFEST_KV_DTYPES(X)${x_dtypes}
#define KVPAGE_MANIFEST_HEAD_SIZES(X)${x_heads}
// Block sizes with tensor-core decode kernels.
#define KVPAGE_MANIFEST_TC_BLOCK_SIZES(X)${x_tc_bs}
// Decode kernel families, X(K dtype enumerator, head size) each.
#define KVPAGE_MANIFEST_DECODE_THREAD_GROUP(X)${x_tg}
#define KVPAGE_MANIFEST_DECODE_TENSOR_CORE(X)${x_tc}
#define KVPAGE_MANIFEST_DECODE_STAGED(X)${x_staged}
// Query-chunk attention kernels, X(K side, V side, head size) each
// (kernels::OperandKind enumerators).
#define KVPAGE_MANIFEST_ATTEND(X)${x_attend}
// The same sets as kvp_build_info() reports them.
#define KVPAGE_MANIFEST_KV_DTYPE_NAMES \"${dtype_names}\"
#define KVPAGE_MANIFEST_HEAD_SIZE_NAMES \"${head_names}\"
#define KVPAGE_MANIFEST_TC_BLOCK_SIZE_NAMES \"${tc_bs_names}\"
// 1 where the manifest is the full one (every dtype, head size and
// tensor-core block size): tests pinned to the full set skip otherwise.
#define KVPAGE_MANIFEST_FULL ${full}

#endif  // KVPAGE_MANIFEST_H_
")
  set(KVPAGE_GENERATED_KERNEL_SOURCES "${sources}" PARENT_SCOPE)
  # Whether this is the full manifest (every dtype, head size and
  # tensor-core block size): the C API and binding suites assume it.
  if(full)
    set(KVPAGE_FULL_MANIFEST ON PARENT_SCOPE)
  else()
    set(KVPAGE_FULL_MANIFEST OFF PARENT_SCOPE)
  endif()
endfunction()
