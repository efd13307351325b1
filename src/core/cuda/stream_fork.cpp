#include "core/cuda/stream_fork.h"

#include "core/cuda/check.h"

namespace epmoe::cuda {

StreamFork::~StreamFork() {
  // Destroying a stream or event with work queued is allowed: CUDA releases it once that work ends.
  for (cudaEvent_t e : joins_) cudaEventDestroy(e);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  if (fork_) cudaEventDestroy(fork_);
}

void StreamFork::fork(cudaStream_t st, int n) {
  if (!fork_) EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  int priority = 0;
  EPMOE_CUDA_CHECK(cudaStreamGetPriority(st, &priority));
  while (int(streams_.size()) < n) {
    cudaStream_t s = nullptr;
    EPMOE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
    streams_.push_back(s);
    cudaEvent_t e = nullptr;
    EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    joins_.push_back(e);
  }
  EPMOE_CUDA_CHECK(cudaEventRecord(fork_, st));
  for (int i = 0; i < n; ++i) EPMOE_CUDA_CHECK(cudaStreamWaitEvent(streams_[i], fork_, 0));
  forked_ = n;
}

void StreamFork::join(cudaStream_t st) {
  for (int i = 0; i < forked_; ++i) {
    EPMOE_CUDA_CHECK(cudaEventRecord(joins_[i], streams_[i]));
    EPMOE_CUDA_CHECK(cudaStreamWaitEvent(st, joins_[i], 0));
  }
  forked_ = 0;
}

}  // namespace epmoe::cuda
