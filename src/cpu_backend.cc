// SPDX-License-Identifier: Apache-2.0
// The CPU backend: the oracle the CUDA backend is checked against, and a
// working backend for machines without a GPU. Straightforward loops over
// the layouts of src/geometry.h, quantizing through src/formats.h, decoding
// in double precision and rounding each output once to its dtype.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_format.h"
#include "src/backend.h"
#include "src/formats.h"
#include "src/parallel.h"
#include "src/status.h"

namespace kvpage {
namespace {

// One code of `bits` bits at byte `byte` (low bit `shift`), little-endian.
void PutCode(uint8_t* base, int64_t byte, int shift, int bits, uint16_t code) {
  switch (bits) {
    case 16:
      base[byte] = static_cast<uint8_t>(code & 0xFF);
      base[byte + 1] = static_cast<uint8_t>(code >> 8);
      break;
    case 8:
      base[byte] = static_cast<uint8_t>(code);
      break;
    default: {  // 4
      const uint8_t mask = static_cast<uint8_t>(0xF << shift);
      base[byte] = static_cast<uint8_t>((base[byte] & ~mask) | ((code & 0xF) << shift));
    }
  }
}

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

uint16_t GetCode(const uint8_t* base, int64_t byte, int shift, int bits) {
  switch (bits) {
    case 16:
      return Load16(base + byte);
    case 8:
      return base[byte];
    default:
      return (base[byte] >> shift) & 0xF;
  }
}

// The codes of one token's D elements; rel[d] is element d's byte relative to
// element 0, and INT4's nibble is shifts[d] (K) or one shift for the token (V).
// One switch per token rather than per element: this gather is the CPU
// decode's inner loop.
void GatherCodes(const uint8_t* row, const int64_t* rel, const int* shifts, int token_shift,
                 int bits, int n, uint16_t* codes) {
  switch (bits) {
    case 16:
      for (int d = 0; d < n; ++d) codes[d] = Load16(row + rel[d]);
      break;
    case 8:
      for (int d = 0; d < n; ++d) codes[d] = row[rel[d]];
      break;
    default:
      for (int d = 0; d < n; ++d) {
        codes[d] = (row[rel[d]] >> (shifts ? shifts[d] : token_shift)) & 0xF;
      }
  }
}

void PutScale(uint8_t* base, int64_t byte, int entry_bytes, ScaleEntry s) {
  if (entry_bytes == 0) return;
  PutCode(base, byte, 0, 16, s.scale);
  if (entry_bytes == 4) PutCode(base, byte + 2, 0, 16, s.min);
}

ScaleEntry GetScale(const uint8_t* base, int64_t byte, int entry_bytes) {
  ScaleEntry s;
  if (entry_bytes == 0) return s;
  s.scale = GetCode(base, byte, 0, 16);
  if (entry_bytes == 4) s.min = GetCode(base, byte + 2, 0, 16);
  return s;
}

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  int32_t ordinal() const override { return 0; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded =
        static_cast<size_t>(AlignUp(static_cast<int64_t>(bytes), kRegionAlignment));
    void* p = std::aligned_alloc(kRegionAlignment, rounded);
    if (p == nullptr) {
      return OutOfMemory(kvpage::StrFormat("could not allocate %d bytes of host memory", bytes));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  absl::StatusOr<DeviceErrorRecord*> AllocateErrorRecord() override {
    // Never written here: the CPU backend validates on the host.
    return new (std::nothrow) DeviceErrorRecord{};
  }
  void FreeErrorRecord(DeviceErrorRecord* record) override { delete record; }
  absl::Status Memset(void* ptr, int value, size_t bytes) override {
    std::memset(ptr, value, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void*) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status Write(const WriteParams& p, void* /*stream*/) override;
  size_t DecodeWorkspaceBytes(const CacheGeometry&, const DecodeCapacity&) const override {
    return 0;  // scratch lives on the worker threads' stacks and heaps
  }
  absl::Status Decode(const DecodeParams& p, const DecodeCapacity& cap, void* workspace,
                      void* stream) override;
  absl::Status MoveBlocks(const BlockMoveParams& p, void* stream) override;
};

absl::Status CpuBackend::Write(const WriteParams& p, void*) {
  const CacheGeometry& g = p.geo;
  const int64_t num_slots = int64_t{g.num_blocks} * g.block_size;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < -1 || slot >= num_slots) {
      return InvalidArgument(
          kvpage::StrFormat("slot_mapping[%d] = %d is out of range: slots are -1 (skip) or in "
                            "[0, %d) (num_blocks * block_size)",
                            t, slot, num_slots));
    }
  }
  const int D = g.head_size;
  uint8_t* k_data = p.layer + g.k_data_offset();
  uint8_t* v_data = p.layer + g.v_data_offset();
  uint8_t* k_scales = p.layer + g.k_scale_offset();
  uint8_t* v_scales = p.layer + g.v_scale_offset();
  std::vector<float> x(D);
  std::vector<uint16_t> codes(D);
  QuantStats stats;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    const int64_t b = slot / g.block_size;
    const int off = static_cast<int>(slot % g.block_size);
    for (int h = 0; h < g.num_kv_heads; ++h) {
      ScaleEntry scale;
      // K: [chunk][token][x]; INT4 tails past head_size are zero bits.
      for (int d = 0; d < D; ++d) {
        x[d] = LoadAsFloat(p.input_dtype, p.key, t * p.key_stride + int64_t{h} * D + d);
      }
      QuantizeVector(g.k_dtype, x.data(),
                     p.key_smoothing ? p.key_smoothing + int64_t{h} * D : nullptr, D, codes.data(),
                     &scale, &stats);
      for (int d = 0; d < g.k_chunks() * g.k_x(); ++d) {
        PutCode(k_data, g.k_byte(b, h, off, d), g.k_shift(d), g.k_bits(), d < D ? codes[d] : 0);
      }
      PutScale(k_scales, g.k_scale_byte(b, h, off), g.k_scale_entry_bytes(), scale);
      // V: [channel][token]; INT4 pairs tokens within a byte.
      for (int d = 0; d < D; ++d) {
        x[d] = LoadAsFloat(p.input_dtype, p.value, t * p.value_stride + int64_t{h} * D + d);
      }
      QuantizeVector(g.v_dtype, x.data(), nullptr, D, codes.data(), &scale, &stats);
      for (int d = 0; d < D; ++d) {
        PutCode(v_data, g.v_byte(b, h, off, d), g.v_shift(off), g.v_bits(), codes[d]);
      }
      PutScale(v_scales, g.v_scale_byte(b, h, off), g.v_scale_entry_bytes(), scale);
    }
  }
  // Writes to different layers may run concurrently.
  __atomic_fetch_add(&p.counters->non_finite, stats.non_finite, __ATOMIC_RELAXED);
  __atomic_fetch_add(&p.counters->saturated, stats.saturated, __ATOMIC_RELAXED);
  return absl::OkStatus();
}

// Sequence s's first query token and number of query tokens.
struct QueryChunk {
  int64_t start;
  int32_t count;
};
QueryChunk ChunkOf(const DecodeParams& p, int32_t s) {
  if (p.query_starts == nullptr) return {int64_t{s} * p.query_len, p.query_len};
  return {p.query_starts[s], p.query_starts[s + 1] - p.query_starts[s]};
}

// Checks the query offsets, the lengths and every block id a decode will
// read, so that a bad table is an error rather than an out-of-bounds read.
absl::Status ValidateDecodeInputs(const DecodeParams& p) {
  const CacheGeometry& g = p.geo;
  if (p.query_starts != nullptr) {
    if (p.query_starts[0] != 0) {
      return InvalidArgument(
          kvpage::StrFormat("query_starts[0] = %d, must be 0", p.query_starts[0]));
    }
    for (int32_t s = 1; s <= p.num_seqs; ++s) {
      const int32_t v = p.query_starts[s];
      if (v < p.query_starts[s - 1] || v > p.max_query_tokens) {
        return InvalidArgument(kvpage::StrFormat(
            "query_starts[%d] = %d is out of range [query_starts[%d] = %d, max_query_tokens = %d]",
            s, v, s - 1, p.query_starts[s - 1], p.max_query_tokens));
      }
    }
  }
  const int64_t table_tokens = int64_t{p.block_table_width} * g.block_size;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int32_t len = p.seq_lens[s];
    if (len < 0 || len > p.max_context_len || len > table_tokens) {
      return InvalidArgument(
          kvpage::StrFormat("seq_lens[%d] = %d is out of range [0, %d] (max_context_len %d, "
                            "block_table_width %d * block_size %d)",
                            s, len, std::min<int64_t>(p.max_context_len, table_tokens),
                            p.max_context_len, p.block_table_width, g.block_size));
    }
    if (p.query_starts != nullptr && ChunkOf(p, s).count > len) {
      return InvalidArgument(kvpage::StrFormat(
          "sequence %d brings %d query tokens (query_starts[%d] - query_starts[%d]) but "
          "seq_lens[%d] = %d: the query tokens are the last ones of the context",
          s, ChunkOf(p, s).count, s + 1, s, s, len));
    }
    const int32_t blocks = (len + g.block_size - 1) / g.block_size;
    for (int32_t j = 0; j < blocks; ++j) {
      const int32_t id = p.block_table[s * p.block_table_stride + j];
      if (id < 0 || id >= g.num_blocks) {
        return InvalidArgument(kvpage::StrFormat("block_table[%d][%d] = %d is out of range [0, %d)",
                                                 s, j, id, g.num_blocks));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Decode(const DecodeParams& p, const DecodeCapacity&, void*, void*) {
  KVP_RETURN_IF_ERROR(ValidateDecodeInputs(p));
  const CacheGeometry& g = p.geo;
  const int D = g.head_size;
  const int group = p.num_q_heads / g.num_kv_heads;
  const uint8_t* k_data = p.layer + g.k_data_offset();
  const uint8_t* v_data = p.layer + g.v_data_offset();
  const uint8_t* k_scales = p.layer + g.k_scale_offset();
  const uint8_t* v_scales = p.layer + g.v_scale_offset();

  // Results are gathered here and stored once every work item is done, so
  // that a failure (std::bad_alloc in a worker) leaves out and lse untouched.
  // They stay double until the store, which rounds each once to the output
  // dtype (through FP32 first, FP16/BF16 would round twice).
  const int64_t num_rows = p.query_starts != nullptr ? int64_t{p.query_starts[p.num_seqs]}
                                                     : int64_t{p.num_seqs} * p.query_len;
  std::vector<double> results(static_cast<size_t>(num_rows * p.num_q_heads * D));
  std::vector<float> lses(p.lse ? static_cast<size_t>(num_rows * p.num_q_heads) : 0);

  // Where element d of a token lies relative to the token's element 0 depends
  // on d only: computed once here rather than per element and token.
  std::vector<int64_t> k_rel(D), v_rel(D);
  std::vector<int> k_shift(D);  // INT4 K: nibble of element d (V's depends on the token)
  for (int d = 0; d < D; ++d) {
    k_rel[d] = g.k_byte(0, 0, 0, d);
    v_rel[d] = g.v_byte(0, 0, 0, d);
    k_shift[d] = g.k_shift(d);
  }

  // One work item per (sequence, KV head): dequantize its K and V once,
  // then serve every query head of the group and every query token.
  KVP_RETURN_IF_ERROR(ParallelFor(int64_t{p.num_seqs} * g.num_kv_heads, [&](int64_t item) {
    const int32_t s = static_cast<int32_t>(item / g.num_kv_heads);
    const int kvh = static_cast<int>(item % g.num_kv_heads);
    const QueryChunk chunk = ChunkOf(p, s);
    if (chunk.count == 0) return;  // nothing to attend, nothing to write
    const int32_t len = p.seq_lens[s];
    std::vector<double> k(static_cast<size_t>(len) * D), v(k.size());
    std::vector<uint16_t> codes(D);
    for (int32_t j = 0; j < len; ++j) {
      const int64_t b = p.block_table[s * p.block_table_stride + j / g.block_size];
      const int off = j % g.block_size;
      const ScaleEntry ks =
          GetScale(k_scales, g.k_scale_byte(b, kvh, off), g.k_scale_entry_bytes());
      const ScaleEntry vs =
          GetScale(v_scales, g.v_scale_byte(b, kvh, off), g.v_scale_entry_bytes());
      const uint8_t* k_row = k_data + g.k_byte(b, kvh, off, 0);
      const uint8_t* v_row = v_data + g.v_byte(b, kvh, off, 0);
      const int v_shift = g.v_shift(off);
      GatherCodes(k_row, k_rel.data(), k_shift.data(), 0, g.k_bits(), D, codes.data());
      DequantizeCodes(g.k_dtype, codes.data(), D, ks, &k[j * D]);
      GatherCodes(v_row, v_rel.data(), nullptr, v_shift, g.v_bits(), D, codes.data());
      DequantizeCodes(g.v_dtype, codes.data(), D, vs, &v[j * D]);
    }
    std::vector<double> q(D), logits(std::max(len, 1)), acc(D);
    for (int gi = 0; gi < group; ++gi) {
      const int h = kvh * group + gi;
      for (int32_t i = 0; i < chunk.count; ++i) {
        const int64_t row = chunk.start + i;
        const int32_t pos = len - chunk.count + i;  // the query's position
        const int32_t lo = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        double lse = -std::numeric_limits<double>::infinity();
        if (pos >= 0 && lo <= pos) {
          for (int d = 0; d < D; ++d) {
            q[d] = LoadAsFloat(p.q_dtype, p.q, row * p.q_stride + int64_t{h} * D + d);
            if (p.key_smoothing) q[d] *= p.key_smoothing[int64_t{kvh} * D + d];
          }
          double m = -std::numeric_limits<double>::infinity();
          for (int32_t j = lo; j <= pos; ++j) {
            // Four partial sums (D is a multiple of 16): a single chain of
            // dependent double adds would bound the loop by add latency.
            const double* kj = &k[static_cast<size_t>(j) * D];
            double dot4[4] = {0, 0, 0, 0};
            for (int d = 0; d < D; d += 4) {
              for (int u = 0; u < 4; ++u) dot4[u] += q[d + u] * kj[d + u];
            }
            double l = p.sm_scale * ((dot4[0] + dot4[1]) + (dot4[2] + dot4[3]));
            if (p.logits_soft_cap > 0) l = p.logits_soft_cap * std::tanh(l / p.logits_soft_cap);
            if (p.alibi_slopes) l += double{p.alibi_slopes[h]} * (j - pos);
            logits[j] = l;
            m = std::max(m, l);
          }
          double sum = 0;
          for (int32_t j = lo; j <= pos; ++j) {
            const double w = std::exp(logits[j] - m);
            sum += w;
            const double* vj = &v[static_cast<size_t>(j) * D];
            for (int d = 0; d < D; ++d) acc[d] += w * vj[d];
          }
          for (int d = 0; d < D; ++d) acc[d] /= sum;
          lse = m + std::log(sum);
        }
        double* result = results.data() + (row * p.num_q_heads + h) * D;
        for (int d = 0; d < D; ++d) result[d] = acc[d];
        // The LSE is FP32: one rounding of the double.
        if (p.lse) lses[row * p.num_q_heads + h] = static_cast<float>(lse);
      }
    }
  }));
  for (int64_t row = 0; row < num_rows; ++row) {
    for (int h = 0; h < p.num_q_heads; ++h) {
      const double* result = results.data() + (row * p.num_q_heads + h) * D;
      for (int d = 0; d < D; ++d) {
        StoreFromDouble(p.out_dtype, p.out, row * p.out_stride + int64_t{h} * D + d, result[d]);
      }
    }
  }
  if (p.lse) std::copy(lses.begin(), lses.end(), p.lse);
  return absl::OkStatus();
}

// Ids and pairs were validated on the host by Cache (they are host memory
// here); `checked` has nothing to record.
absl::Status CpuBackend::MoveBlocks(const BlockMoveParams& p, void*) {
  const bool copy = p.move == BlockMove::kCopy;
  for (int32_t layer = 0; layer < p.num_layers; ++layer) {
    for (int r = 0; r < CacheGeometry::kNumBlockRegions; ++r) {
      const int64_t bytes = p.geo.block_region(r).block_stride;
      if (bytes == 0) continue;
      for (int32_t i = 0; i < p.num_items; ++i) {
        const BlockMoveEnds e =
            BlockMoveRegion(p, layer, r, i, p.ids[copy ? 2 * i : i], copy ? p.ids[2 * i + 1] : 0);
        std::memcpy(e.to, e.from, static_cast<size_t>(bytes));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace kvpage
