// Grouped GEMM instantiation for fp8 weights (one format per file so that they build in parallel).
#include "run/cuda/engine_mma.cuh"

namespace epmoe::cuda {

void launch_grouped_gemm_fp8(const GemmArgs& a, int bm, cudaStream_t stream) {
  gemm::launch<WeightFormat::fp8>(a, bm, stream);
}

}  // namespace epmoe::cuda
