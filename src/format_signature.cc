// SPDX-License-Identifier: Apache-2.0
#include "src/format_signature.h"

#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "src/status.h"

namespace kvpage {
namespace {

// The blob, little-endian (docs/FORMATS.md, "Format signature"):
//   0  magic "KVPS"         4  signature version    8  packed layout version
//   12 num_layers           16 block_size           20 num_kv_heads
//   24 head_size            28 k_dtype              32 v_dtype
//   36 scale dtype (FP16)   40 key smoothing (0/1)  44 reserved (0)
//   48 key smoothing hash (u64, FNV-1a over the floats' bytes; 0 without)
//   56 packed block bytes   60 checksum (FNV-1a 32 of bytes 0..59)
constexpr uint8_t kMagic[4] = {'K', 'V', 'P', 'S'};
constexpr size_t kVersionAt = 4, kChecksumAt = 60;

enum class Shown { kNumber, kDtype, kPresence, kHex };
struct Field {
  const char* name;
  size_t at;
  size_t bytes;
  Shown shown;
};
constexpr Field kFields[] = {
    {"packed layout version", 8, 4, Shown::kNumber},
    {"num_layers", 12, 4, Shown::kNumber},
    {"block_size", 16, 4, Shown::kNumber},
    {"num_kv_heads", 20, 4, Shown::kNumber},
    {"head_size", 24, 4, Shown::kNumber},
    {"k_dtype", 28, 4, Shown::kDtype},
    {"v_dtype", 32, 4, Shown::kDtype},
    {"scale dtype", 36, 4, Shown::kDtype},
    {"key smoothing", 40, 4, Shown::kPresence},
    {"reserved bytes 44..47", 44, 4, Shown::kNumber},
    {"key smoothing hash", 48, 8, Shown::kHex},
    {"packed block bytes", 56, 4, Shown::kNumber},
};

void Put(uint8_t* at, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t Get(const uint8_t* at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t{at[i]} << (8 * i);
  return v;
}

// FNV-1a 64 over the vector's IEEE bits, four little-endian bytes a value.
uint64_t HashFloats(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    for (int i = 0; i < 4; ++i) h = (h ^ ((bits >> (8 * i)) & 0xFF)) * 0x100000001b3ull;
  }
  return h;
}
uint32_t Fnv1a32(const uint8_t* p, size_t n) {
  uint32_t h = 0x811c9dc5u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x01000193u;
  return h;
}

std::string Show(const Field& f, uint64_t v) {
  switch (f.shown) {
    case Shown::kDtype: {
      const auto t = static_cast<DType>(static_cast<int32_t>(v));
      return kvpage::StrFormat("%s (%d)", DTypeName(t), static_cast<int32_t>(v));
    }
    case Shown::kPresence:
      return v != 0 ? "present" : "absent";
    case Shown::kHex:
      return kvpage::StrFormat("0x%016x", v);
    default:
      return kvpage::StrFormat("%d", static_cast<int64_t>(v));
  }
}

}  // namespace

FormatSignature MakeFormatSignature(const CacheGeometry& g,
                                    const std::vector<float>& key_smoothing) {
  FormatSignature s{};
  std::memcpy(s.data(), kMagic, sizeof(kMagic));
  Put(&s[kVersionAt], kFormatSignatureVersion, 4);
  const uint64_t values[] = {
      kPackedLayoutVersion,
      static_cast<uint32_t>(g.num_layers),
      static_cast<uint32_t>(g.block_size),
      static_cast<uint32_t>(g.num_kv_heads),
      static_cast<uint32_t>(g.head_size),
      static_cast<uint32_t>(g.k_dtype),
      static_cast<uint32_t>(g.v_dtype),
      static_cast<uint32_t>(DType::kFP16),  // every scale entry holds FP16 values
      key_smoothing.empty() ? 0u : 1u,
      0,
      key_smoothing.empty() ? 0 : HashFloats(key_smoothing),
      static_cast<uint64_t>(g.packed_block_bytes()),
  };
  static_assert(sizeof(values) / sizeof(values[0]) == sizeof(kFields) / sizeof(kFields[0]));
  for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); ++i) {
    Put(&s[kFields[i].at], values[i], kFields[i].bytes);
  }
  Put(&s[kChecksumAt], Fnv1a32(s.data(), kChecksumAt), 4);
  return s;
}

absl::Status CheckFormatSignature(const char* name, const void* peer, size_t bytes,
                                  const FormatSignature& mine) {
  const auto* p = static_cast<const uint8_t*>(peer);
  if (bytes < kVersionAt + 4 || std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    if (bytes < kVersionAt + 4) {
      return InvalidArgument(
          kvpage::StrFormat("%s_bytes = %d, must be %d (KVP_FORMAT_SIGNATURE_BYTES)", name, bytes,
                            kFormatSignatureBytes));
    }
    return InvalidArgument(kvpage::StrFormat(
        "%s is not a kvpage format signature: it starts with bytes %02x %02x %02x %02x, not the "
        "magic \"KVPS\" (write it with kvp_cache_format_signature)",
        name, p[0], p[1], p[2], p[3]));
  }
  const uint64_t version = Get(p + kVersionAt, 4);
  if (version != kFormatSignatureVersion) {
    return InvalidArgument(
        kvpage::StrFormat("%s is a format signature of version %d; this library reads version %d",
                          name, version, kFormatSignatureVersion));
  }
  if (bytes != kFormatSignatureBytes) {
    return InvalidArgument(
        kvpage::StrFormat("%s_bytes = %d, must be %d (KVP_FORMAT_SIGNATURE_BYTES)", name, bytes,
                          kFormatSignatureBytes));
  }
  const uint32_t checksum = static_cast<uint32_t>(Get(p + kChecksumAt, 4));
  if (checksum != Fnv1a32(p, kChecksumAt)) {
    return InvalidArgument(kvpage::StrFormat(
        "%s: its checksum 0x%08x does not match its bytes (0x%08x): the signature was altered "
        "on its way",
        name, checksum, Fnv1a32(p, kChecksumAt)));
  }
  for (const Field& f : kFields) {
    const uint64_t theirs = Get(p + f.at, f.bytes), ours = Get(&mine[f.at], f.bytes);
    if (theirs != ours) {
      return InvalidArgument(kvpage::StrFormat(
          "%s is of another cache format: %s is %s in the signature, %s in this cache (packed "
          "blocks of that cache would mean other values here)",
          name, f.name, Show(f, theirs), Show(f, ours)));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
