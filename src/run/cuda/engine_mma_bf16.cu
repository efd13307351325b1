// Grouped GEMM instantiation for bf16 weights (one format per file so that they build in parallel).
#include "run/cuda/engine_mma.cuh"

namespace epmoe::cuda {

void launch_grouped_gemm_bf16(const GemmArgs& a, int bm, cudaStream_t stream) {
  gemm::launch<WeightFormat::bf16>(a, bm, stream);
}

}  // namespace epmoe::cuda
