// Tensor-core partition kernels of the decode with BF16 K and V, the head
// sizes of KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE (see tc_decode.cuh), and the
// staged kernel at head size 128 (tc_staged_decode.cuh;
// dispatched in decode_dispatch.cu). One translation unit per dtype so that
// nvcc builds them in parallel.
#include "kernels/tc_decode.cuh"
#include "kernels/tc_staged_decode.cuh"

namespace kvpage {
namespace kernels {
namespace decode {

KVPAGE_TC_DECODE_FOR_EACH_HEAD_SIZE(KVPAGE_TC_DECODE_INSTANTIATE, DType::kBF16)
KVPAGE_TC_STAGED_DECODE_INSTANTIATE(DType::kBF16)

}  // namespace decode
}  // namespace kernels
}  // namespace kvpage
