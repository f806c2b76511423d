// SPDX-License-Identifier: Apache-2.0
#include "tests/common/reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "src/formats.h"

namespace kvpage {
namespace testing {
namespace {

uint16_t Read16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

DequantizedLayer DequantizedLayer::Read(const kvp_cache* cache, int32_t layer) {
  kvp_cache_info info;
  kvp_cache_info_init(&info);
  std::string err = TakeError(kvp_cache_get_info(cache, &info));
  if (!err.empty()) throw std::runtime_error(err);
  kvp_layer_layout l;
  kvp_layer_layout_init(&l);
  err = TakeError(kvp_cache_get_layout(cache, layer, &l));
  if (!err.empty()) throw std::runtime_error(err);

  DequantizedLayer out;
  out.block_size_ = info.block_size;
  out.head_size_ = info.head_size;
  out.num_kv_heads_ = info.num_kv_heads;
  const int64_t n = int64_t{info.num_blocks} * info.num_kv_heads * info.block_size * info.head_size;
  out.k_.resize(n);
  out.v_.resize(n);
  const auto* kd = static_cast<const uint8_t*>(l.k_data);
  const auto* vd = static_cast<const uint8_t*>(l.v_data);
  const auto* ks = static_cast<const uint8_t*>(l.k_scales);
  const auto* vs = static_cast<const uint8_t*>(l.v_scales);
  const DType kt = static_cast<DType>(info.k_dtype), vt = static_cast<DType>(info.v_dtype);
  int64_t i = 0;
  for (int64_t b = 0; b < info.num_blocks; ++b) {
    for (int h = 0; h < info.num_kv_heads; ++h) {
      for (int t = 0; t < info.block_size; ++t) {
        ScaleEntry kse, vse;
        if (ks) {
          const uint8_t* e = ks + b * l.k_scale_block_stride + h * l.k_scale_head_stride +
                             t * l.k_scale_entry_bytes;
          kse.scale = Read16(e);
          if (l.k_scale_entry_bytes == 4) kse.min = Read16(e + 2);
        }
        if (vs) {
          const uint8_t* e = vs + b * l.v_scale_block_stride + h * l.v_scale_head_stride +
                             t * l.v_scale_entry_bytes;
          vse.scale = Read16(e);
          if (l.v_scale_entry_bytes == 4) vse.min = Read16(e + 2);
        }
        for (int d = 0; d < info.head_size; ++d, ++i) {
          // K: chunk d / k_x, then token, then the element inside 16 bytes.
          const int64_t kbit = int64_t{d % l.k_x} * l.k_bits;
          const uint8_t* kp = kd + b * l.k_block_stride + h * l.k_head_stride +
                              (d / l.k_x) * l.k_chunk_stride + t * 16 + kbit / 8;
          const uint16_t kc = l.k_bits == 16  ? Read16(kp)
                              : l.k_bits == 8 ? kp[0]
                                              : (kp[0] >> (kbit % 8)) & 0xF;
          // V: channel row, tokens along it.
          const int64_t vbit = int64_t{t} * l.v_bits;
          const uint8_t* vp =
              vd + b * l.v_block_stride + h * l.v_head_stride + d * l.v_channel_stride + vbit / 8;
          const uint16_t vc = l.v_bits == 16  ? Read16(vp)
                              : l.v_bits == 8 ? vp[0]
                                              : (vp[0] >> (vbit % 8)) & 0xF;
          out.k_[i] = DequantizeCode(kt, kc, kse);
          out.v_[i] = DequantizeCode(vt, vc, vse);
        }
      }
    }
  }
  return out;
}

double DequantizedLayer::k(int64_t b, int h, int t, int d) const {
  return k_[((b * num_kv_heads_ + h) * block_size_ + t) * head_size_ + d];
}
double DequantizedLayer::v(int64_t b, int h, int t, int d) const {
  return v_[((b * num_kv_heads_ + h) * block_size_ + t) * head_size_ + d];
}

void ReferenceDecode(const DequantizedLayer& L, const DecodeProblem& p, std::vector<double>* out,
                     std::vector<double>* lse) {
  const int D = p.head_size;
  const int group = p.num_q_heads / L.num_kv_heads();
  const double scale = p.sm_scale != 0 ? p.sm_scale : 1.0 / std::sqrt(double(D));
  const bool varlen = !p.query_starts.empty();
  const int64_t tokens = varlen ? p.query_starts[p.num_seqs] : int64_t(p.num_seqs) * p.query_len;
  out->assign(size_t(tokens) * p.num_q_heads * D, 0.0);
  lse->assign(size_t(tokens) * p.num_q_heads, -std::numeric_limits<double>::infinity());
  for (int s = 0; s < p.num_seqs; ++s) {
    const int len = p.seq_lens[s];
    const int64_t first = varlen ? p.query_starts[s] : int64_t(s) * p.query_len;
    const int count = varlen ? p.query_starts[s + 1] - p.query_starts[s] : p.query_len;
    for (int i = 0; i < count; ++i) {
      for (int h = 0; h < p.num_q_heads; ++h) {
        const int kvh = h / group;
        const int64_t row = (first + i) * p.num_q_heads + h;
        const int pos = len - count + i;
        // Logits of every token of the sequence, -inf where masked.
        std::vector<double> logit(len, -std::numeric_limits<double>::infinity());
        for (int j = 0; j < len; ++j) {
          const bool causal = j <= pos;
          const bool in_window = p.sliding_window == 0 || j > pos - p.sliding_window;
          if (!causal || !in_window) continue;
          const int64_t b = p.block_table[int64_t(s) * p.block_table_width + j / L.block_size()];
          double dot = 0;
          for (int d = 0; d < D; ++d) {
            double q = LoadElement(p.q_dtype, p.q.data(), row * D + d);
            if (!p.key_smoothing.empty()) q *= p.key_smoothing[int64_t(kvh) * D + d];
            dot += q * L.k(b, kvh, j % L.block_size(), d);
          }
          double l = scale * dot;
          if (p.logits_soft_cap > 0) l = p.logits_soft_cap * std::tanh(l / p.logits_soft_cap);
          if (!p.alibi_slopes.empty()) l += double(p.alibi_slopes[h]) * (j - pos);
          logit[j] = l;
        }
        double m = -std::numeric_limits<double>::infinity();
        for (double l : logit) m = std::max(m, l);
        if (m == -std::numeric_limits<double>::infinity()) continue;  // nothing visible
        double sum = 0;
        for (double l : logit) sum += std::exp(l - m);
        for (int j = 0; j < len; ++j) {
          if (logit[j] == -std::numeric_limits<double>::infinity()) continue;
          const double w = std::exp(logit[j] - m) / sum;
          const int64_t b = p.block_table[int64_t(s) * p.block_table_width + j / L.block_size()];
          for (int d = 0; d < D; ++d) (*out)[row * D + d] += w * L.v(b, kvh, j % L.block_size(), d);
        }
        (*lse)[row] = m + std::log(sum);
      }
    }
  }
}

int32_t DtypeBytes(int32_t dtype) { return dtype == KVP_DTYPE_FP32 ? 4 : 2; }

const char* DtypeName(int32_t dtype) { return DTypeName(static_cast<DType>(dtype)); }

double LoadElement(int32_t dtype, const void* data, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (dtype == KVP_DTYPE_FP32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  const uint16_t h = Read16(p + 2 * i);
  return dtype == KVP_DTYPE_FP16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

void StoreElements(int32_t dtype, const std::vector<float>& values, std::vector<uint8_t>* bytes) {
  bytes->resize(values.size() * DtypeBytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == KVP_DTYPE_FP32) {
      std::memcpy(bytes->data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h =
          dtype == KVP_DTYPE_FP16 ? FloatToHalfRne(values[i]) : FloatToBf16Rne(values[i]);
      (*bytes)[2 * i] = static_cast<uint8_t>(h & 0xFF);
      (*bytes)[2 * i + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
}

Rng::Rng() : Rng((uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()) {}
Rng::Rng(uint64_t s) : seed(s), gen(s) {}

float Rng::normal(float stddev) { return std::normal_distribution<float>(0.0f, stddev)(gen); }

int Rng::uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }

std::vector<float> Rng::normals(size_t n, float stddev) {
  std::vector<float> v(n);
  for (float& x : v) x = normal(stddev);
  return v;
}

std::string TakeError(kvp_error* e) {
  if (e == nullptr) return "";
  std::string m = std::string(kvp_error_code_name(kvp_error_code(e))) + ": " + kvp_error_message(e);
  kvp_error_free(e);
  return m;
}

}  // namespace testing
}  // namespace kvpage
