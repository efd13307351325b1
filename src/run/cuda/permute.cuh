// Device pieces of the runner's permute step, shared by every permute kernel (rows.cu: bf16 rows,
// fp8 rows for both fp8 GEMM kinds). One CTA handles one received slot.
#pragma once
#include <cstdint>

namespace epmoe::cuda {

// Slot i of the [R][C] receive layout holds a token when its index in its source region is below
// that source's count. Index: int64_t, or int where the caller knows the slots fit (32-bit
// division is far cheaper on the GPU).
template <class Index>
__device__ __forceinline__ bool slot_valid(Index i, int C, const int32_t* counts) {
  return (i % C) < counts[i / C];
}

// Threads k < K claim the row of (slot i, k) in its expert's segment (offsets[e] + an atomic fill
// counter; -1 when id k is not an expert of this rank), record it in pair_pos for the weighted sum
// and in pos[] (shared, >= K entries) for the copy that follows. Ends with a barrier.
__device__ __forceinline__ void claim_rows(int64_t i, int K, int E, const int32_t* ids, const int32_t* offsets,
                                           int32_t* fill, int32_t* pair_pos, int32_t* pos) {
  if (threadIdx.x < K) {
    const int e = ids[i * K + threadIdx.x];
    const int32_t q = (e >= 0 && e < E) ? offsets[e] + atomicAdd(&fill[e], 1) : -1;
    pos[threadIdx.x] = q;
    pair_pos[i * K + threadIdx.x] = q;
  }
  __syncthreads();
}

}  // namespace epmoe::cuda
