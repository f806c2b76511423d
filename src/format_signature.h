// SPDX-License-Identifier: Apache-2.0
// The format signature of a cache (kvp_cache_format_signature): everything
// that decides what the bytes of a packed buffer mean, as a fixed-size
// blob an engine exchanges once per connection, and the check a receiver
// runs on a peer's blob (docs/FORMATS.md, "Format signature").
#ifndef KVPAGE_SRC_FORMAT_SIGNATURE_H_
#define KVPAGE_SRC_FORMAT_SIGNATURE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "src/geometry.h"

namespace kvpage {

// Bytes of a signature (KVP_FORMAT_SIGNATURE_BYTES).
constexpr size_t kFormatSignatureBytes = 64;
// The blob's own version, and the packed buffer layout it describes
// (CacheGeometry::packed_block_bytes; a new layout is a new number).
constexpr uint32_t kFormatSignatureVersion = 1;
constexpr uint32_t kPackedLayoutVersion = 1;

using FormatSignature = std::array<uint8_t, kFormatSignatureBytes>;

// The signature of a cache of geometry `g` (num_blocks does not enter it)
// and key smoothing vector `key_smoothing` (empty: none).
FormatSignature MakeFormatSignature(const CacheGeometry& g,
                                    const std::vector<float>& key_smoothing);

// OK when the `bytes` bytes at `peer` are a signature equal to `mine`;
// else INVALID_ARGUMENT naming `name` (the argument) and the first field
// that differs, with the peer's value and this cache's.
absl::Status CheckFormatSignature(const char* name, const void* peer, size_t bytes,
                                  const FormatSignature& mine);

}  // namespace kvpage

#endif  // KVPAGE_SRC_FORMAT_SIGNATURE_H_
