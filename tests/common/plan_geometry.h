// SPDX-License-Identifier: Apache-2.0
// A cache geometry for the plan tests (no cache is made from it): one
// layer of 1024 blocks.
#ifndef KVPAGE_TESTS_COMMON_PLAN_GEOMETRY_H_
#define KVPAGE_TESTS_COMMON_PLAN_GEOMETRY_H_

#include "src/geometry.h"

namespace kvpage {

inline CacheGeometry PlanGeometry(DType k, DType v, int head_size, int block_size,
                                  int num_kv_heads) {
  CacheGeometry g;
  g.num_layers = 1;
  g.num_blocks = 1024;
  g.block_size = block_size;
  g.num_kv_heads = num_kv_heads;
  g.head_size = head_size;
  g.k_dtype = k;
  g.v_dtype = v;
  return g;
}

}  // namespace kvpage

#endif  // KVPAGE_TESTS_COMMON_PLAN_GEOMETRY_H_
