// Extensible structs at the ABI boundary: how large each struct was when
// first released (pinned, never to change), and prefix copies in and out so
// that callers built against an older or newer header both work.
#ifndef KVPAGE_CAPI_STRUCT_IO_H_
#define KVPAGE_CAPI_STRUCT_IO_H_

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "include/kvpage/kvpage.h"

namespace kvpage {
namespace capi {

// Sizes in ABI 1.0 on LP64. A struct may grow (fields appended); these
// numbers never change, and callers passing at least this much are served.
template <typename T> constexpr size_t FirstReleasedSize();
template <> constexpr size_t FirstReleasedSize<kvp_allocator>() { return 32; }
template <> constexpr size_t FirstReleasedSize<kvp_cache_config>() { return 64; }
template <> constexpr size_t FirstReleasedSize<kvp_layer_layout>() { return 176; }
template <> constexpr size_t FirstReleasedSize<kvp_cache_info>() { return 64; }
template <> constexpr size_t FirstReleasedSize<kvp_write_args>() { return 64; }
template <> constexpr size_t FirstReleasedSize<kvp_write_stats>() { return 24; }
template <> constexpr size_t FirstReleasedSize<kvp_decode_config>() { return 48; }
template <> constexpr size_t FirstReleasedSize<kvp_decode_args>() { return 112; }

// The ABI 1.0 structs are exactly the first released ones (except where a
// later minor version appended a field); appending a field changes sizeof
// but must leave these offsets alone.
// ABI 1.1 appended kvp_cache_config.checked.
static_assert(sizeof(kvp_cache_config) == 72);
static_assert(offsetof(kvp_cache_config, allocator) == 56);
static_assert(offsetof(kvp_cache_config, checked) == 64);
static_assert(sizeof(kvp_layer_layout) == FirstReleasedSize<kvp_layer_layout>());
static_assert(offsetof(kvp_layer_layout, v_scale_bytes) == 168);
static_assert(sizeof(kvp_write_args) == FirstReleasedSize<kvp_write_args>());
static_assert(offsetof(kvp_write_args, slot_mapping) == 56);
static_assert(sizeof(kvp_decode_config) == FirstReleasedSize<kvp_decode_config>());
static_assert(offsetof(kvp_decode_config, workspace_bytes) == 40);
static_assert(sizeof(kvp_decode_args) == FirstReleasedSize<kvp_decode_args>());
static_assert(offsetof(kvp_decode_args, lse) == 104);
static_assert(sizeof(kvp_allocator) == FirstReleasedSize<kvp_allocator>());
static_assert(sizeof(kvp_cache_info) == FirstReleasedSize<kvp_cache_info>());
static_assert(sizeof(kvp_write_stats) == FirstReleasedSize<kvp_write_stats>());

// The function table is append-only: these offsets are the ABI.
static_assert(offsetof(kvp_api, version_string) == 16);
static_assert(offsetof(kvp_api, error_code) == 40);
static_assert(offsetof(kvp_api, cache_create) == 96);
static_assert(offsetof(kvp_api, seq_create) == 144);
static_assert(offsetof(kvp_api, cache_write) == 216);
static_assert(offsetof(kvp_api, cache_copy_blocks) == 248);
static_assert(offsetof(kvp_api, decoder_create) == 280);
static_assert(offsetof(kvp_api, decode) == 304);
static_assert(sizeof(kvp_api) == 312);

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
