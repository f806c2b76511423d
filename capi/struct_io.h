// SPDX-License-Identifier: Apache-2.0
// Extensible structs at the ABI boundary: how large each struct was when
// first released (from the header's KVP_*_STRUCT_SIZE_* macros, pinned here
// so that they never change), and prefix copies in and out so that callers
// built against an older or newer header both work.
#ifndef KVPAGE_CAPI_STRUCT_IO_H_
#define KVPAGE_CAPI_STRUCT_IO_H_

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "include/kvpage/kvpage.h"

namespace kvpage {
namespace capi {

// How large each struct was when first released: the header's
// KVP_<NAME>_STRUCT_SIZE_1_0 (the bytes through its last ABI 1.0 field), or
// the size of the later release that introduced it.
// A struct may grow (fields appended); callers passing at least this much
// are served, and fields past their struct_size keep their defaults.
template <typename T>
constexpr size_t FirstReleasedSize();
template <>
constexpr size_t FirstReleasedSize<kvp_allocator>() {
  return KVP_ALLOCATOR_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_cache_config>() {
  return KVP_CACHE_CONFIG_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_layer_layout>() {
  return KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_cache_info>() {
  return KVP_CACHE_INFO_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_write_args>() {
  return KVP_WRITE_ARGS_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_write_stats>() {
  return KVP_WRITE_STATS_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_decode_config>() {
  return KVP_DECODE_CONFIG_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_decode_args>() {
  return KVP_DECODE_ARGS_STRUCT_SIZE_1_0;
}
template <>
constexpr size_t FirstReleasedSize<kvp_attend_args>() {
  return KVP_ATTEND_ARGS_STRUCT_SIZE_1_3;
}
template <>
constexpr size_t FirstReleasedSize<kvp_pack_args>() {
  return KVP_PACK_ARGS_STRUCT_SIZE_1_4;
}
template <>
constexpr size_t FirstReleasedSize<kvp_api>() {
  return KVP_API_STRUCT_SIZE_1_0;
}

// The released sizes on LP64, pinned: a field inserted or retyped before a
// version's last field moves that version's size and fails here. Appending
// a field adds a KVP_<NAME>_STRUCT_SIZE_<major>_<minor> and a line here;
// the lines already here never change.
static_assert(KVP_ALLOCATOR_STRUCT_SIZE_1_0 == 32);
static_assert(KVP_CACHE_CONFIG_STRUCT_SIZE_1_0 == 64);
static_assert(KVP_CACHE_CONFIG_STRUCT_SIZE_1_1 == 68);
static_assert(KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0 == 176);
static_assert(KVP_CACHE_INFO_STRUCT_SIZE_1_0 == 64);
static_assert(KVP_WRITE_ARGS_STRUCT_SIZE_1_0 == 64);
static_assert(KVP_WRITE_STATS_STRUCT_SIZE_1_0 == 24);
static_assert(KVP_DECODE_CONFIG_STRUCT_SIZE_1_0 == 48);
static_assert(KVP_DECODE_CONFIG_STRUCT_SIZE_1_2 == 52);
static_assert(KVP_DECODE_CONFIG_STRUCT_SIZE_1_3 == 56);
static_assert(KVP_DECODE_ARGS_STRUCT_SIZE_1_0 == 112);
static_assert(KVP_ATTEND_ARGS_STRUCT_SIZE_1_3 == 120);
static_assert(KVP_API_STRUCT_SIZE_1_0 == 312);
static_assert(KVP_API_STRUCT_SIZE_1_3 == 328);
static_assert(KVP_PACK_ARGS_STRUCT_SIZE_1_4 == 56);
static_assert(KVP_API_STRUCT_SIZE_1_4 == 376);

// Today's structs end at their latest version's last field (plus the
// alignment padding sizeof adds): nothing sits past the newest mark.
template <typename T>
constexpr bool EndsAt(size_t latest_size) {
  return sizeof(T) == (latest_size + alignof(T) - 1) / alignof(T) * alignof(T);
}
static_assert(EndsAt<kvp_allocator>(KVP_ALLOCATOR_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_cache_config>(KVP_CACHE_CONFIG_STRUCT_SIZE_1_1));
static_assert(EndsAt<kvp_layer_layout>(KVP_LAYER_LAYOUT_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_cache_info>(KVP_CACHE_INFO_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_write_args>(KVP_WRITE_ARGS_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_write_stats>(KVP_WRITE_STATS_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_decode_config>(KVP_DECODE_CONFIG_STRUCT_SIZE_1_3));
static_assert(EndsAt<kvp_decode_args>(KVP_DECODE_ARGS_STRUCT_SIZE_1_0));
static_assert(EndsAt<kvp_attend_args>(KVP_ATTEND_ARGS_STRUCT_SIZE_1_3));
static_assert(EndsAt<kvp_pack_args>(KVP_PACK_ARGS_STRUCT_SIZE_1_4));
static_assert(EndsAt<kvp_api>(KVP_API_STRUCT_SIZE_1_4));

// Offsets callers compiled against ABI 1.0 rely on.
static_assert(offsetof(kvp_cache_config, allocator) == 56);
static_assert(offsetof(kvp_cache_config, checked) == 64);
static_assert(offsetof(kvp_layer_layout, v_scale_bytes) == 168);
static_assert(offsetof(kvp_write_args, slot_mapping) == 56);
static_assert(offsetof(kvp_decode_config, workspace_bytes) == 40);
static_assert(offsetof(kvp_decode_config, precise) == 48);
static_assert(offsetof(kvp_decode_config, max_query_tokens) == 52);
static_assert(offsetof(kvp_decode_args, lse) == 104);
static_assert(offsetof(kvp_attend_args, query_starts) == 32);
static_assert(offsetof(kvp_attend_args, lse) == 112);
static_assert(offsetof(kvp_pack_args, buffer) == 32);
static_assert(offsetof(kvp_pack_args, signature) == 48);

// The function table is append-only: these offsets are the ABI (with
// KVP_API_STRUCT_SIZE_1_0 above, which pins the last ABI 1.0 entry).
static_assert(offsetof(kvp_api, version_string) == 16);
static_assert(offsetof(kvp_api, error_code) == 40);
static_assert(offsetof(kvp_api, cache_create) == 96);
static_assert(offsetof(kvp_api, seq_create) == 144);
static_assert(offsetof(kvp_api, cache_write) == 216);
static_assert(offsetof(kvp_api, cache_copy_blocks) == 248);
static_assert(offsetof(kvp_api, decoder_create) == 280);
static_assert(offsetof(kvp_api, decode) == 304);
static_assert(offsetof(kvp_api, attend) == 320);
static_assert(offsetof(kvp_api, cache_pack) == 344);
static_assert(offsetof(kvp_api, cache_check_signature) == 368);

// Copies the caller's struct over `out` (already holding defaults): the
// bytes both sides know, i.e. min(user->struct_size, sizeof(T)).
template <typename T>
void CopyPrefix(const T* user, T* out) {
  std::memcpy(out, user, std::min(user->struct_size, sizeof(T)));
}

// Writes `value` into the caller's struct, no more bytes than it declares;
// the caller's struct_size is kept.
template <typename T>
void CopyOut(const T& value, T* user) {
  const size_t size = user->struct_size;
  std::memcpy(reinterpret_cast<char*>(user) + sizeof(size_t),
              reinterpret_cast<const char*>(&value) + sizeof(size_t),
              std::min(size, sizeof(T)) - sizeof(size_t));
}

}  // namespace capi
}  // namespace kvpage

#endif  // KVPAGE_CAPI_STRUCT_IO_H_
