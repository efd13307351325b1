// Fork/join of a caller's stream onto side streams, for independent launches that may overlap
// (runner cuda's CUTLASS launches per row range). Events order them, so it also holds inside
// CUDA-graph capture: the side streams join the capture at the fork and leave it at the join.
#pragma once
#include <cuda_runtime.h>

#include <vector>

namespace epmoe::cuda {

class StreamFork {
 public:
  StreamFork() = default;
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  // Makes `n` side streams (created on the current device at first use, with `st`'s priority)
  // wait for everything queued on `st` so far; side(0..n-1) are then valid until join().
  void fork(cudaStream_t st, int n);
  cudaStream_t side(int i) const { return streams_[i]; }
  // Makes `st` wait for everything queued on the forked side streams.
  void join(cudaStream_t st);

 private:
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> joins_;
  cudaEvent_t fork_ = nullptr;
  int forked_ = 0;
};

}  // namespace epmoe::cuda
