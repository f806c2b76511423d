// Partition kernels of the decode with INT4 K, all head sizes (see
// paged_decode.cuh; dispatched in decode_dispatch.cu). One translation unit
// per K dtype so that nvcc builds them in parallel.
#include "kernels/paged_decode.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

KVPAGE_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_DECODE_INSTANTIATE, DType::kINT4)

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage
