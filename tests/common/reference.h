// SPDX-License-Identifier: Apache-2.0
// Test helpers: an independent float64 reference of decode attention over
// a cache read back through the public layout query, and random inputs.
#ifndef KVPAGE_TESTS_COMMON_REFERENCE_H_
#define KVPAGE_TESTS_COMMON_REFERENCE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "include/kvpage/kvpage.h"

namespace kvpage {
namespace testing {

// A layer of a host-memory cache, dequantized: value(block, head, token, d).
class DequantizedLayer {
 public:
  // Reads through kvp_cache_get_layout (byte offsets computed from the
  // layout's strides, not from the library's geometry code).
  static DequantizedLayer Read(const kvp_cache* cache, int32_t layer);
  double k(int64_t block, int head, int token, int d) const;
  double v(int64_t block, int head, int token, int d) const;
  int block_size() const { return block_size_; }
  int head_size() const { return head_size_; }
  int num_kv_heads() const { return num_kv_heads_; }

 private:
  int block_size_ = 0, head_size_ = 0, num_kv_heads_ = 0;
  std::vector<double> k_, v_;  // [block][head][token][d]
};

// Everything a decode call sees, in host memory, as the test built it.
struct DecodeProblem {
  int32_t num_seqs = 0;
  int32_t query_len = 1;
  // kvp_attend: sequence s owns query tokens query_starts[s] ..
  // query_starts[s + 1] - 1 (query_len unused); empty = kvp_decode's
  // query_len tokens each.
  std::vector<int32_t> query_starts;
  int32_t num_q_heads = 0;
  int32_t head_size = 0;
  int32_t q_dtype = KVP_DTYPE_FP32;
  std::vector<uint8_t> q;            // [token][head][d] in q_dtype, dense
  std::vector<int32_t> block_table;  // [seq][width]
  int32_t block_table_width = 0;
  std::vector<int32_t> seq_lens;
  std::vector<float> alibi_slopes;   // empty = none
  std::vector<float> key_smoothing;  // empty = none; [kv_head][d]
  int32_t sliding_window = 0;
  float sm_scale = 0;  // 0 = 1/sqrt(D)
  float logits_soft_cap = 0;
};

// out: [token][head][d]; lse: [token][head]. Computed in double with the
// definition of kvp_decode / kvp_attend, masking explicitly over every
// table slot.
void ReferenceDecode(const DequantizedLayer& layer, const DecodeProblem& p,
                     std::vector<double>* out, std::vector<double>* lse);

// Element i of a buffer of FP32/FP16/BF16 values, as double.
double LoadElement(int32_t dtype, const void* data, int64_t i);
// Fills `bytes` with `count` values drawn from `values` in dtype.
void StoreElements(int32_t dtype, const std::vector<float>& values, std::vector<uint8_t>* bytes);
int32_t DtypeBytes(int32_t dtype);
const char* DtypeName(int32_t dtype);

// A seeded generator; the seed comes from std::random_device and is part of
// every failure message.
struct Rng {
  Rng();
  explicit Rng(uint64_t seed);
  uint64_t seed;
  std::mt19937_64 gen;
  float normal(float stddev = 1.0f);
  int uniform(int lo, int hi);  // inclusive
  std::vector<float> normals(size_t n, float stddev = 1.0f);
};

// Throws away an error object, returning its message ("" for success).
std::string TakeError(kvp_error* e);

}  // namespace testing
}  // namespace kvpage

#endif  // KVPAGE_TESTS_COMMON_REFERENCE_H_
