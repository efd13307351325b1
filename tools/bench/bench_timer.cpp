// The benches' GPU timer (bench_timer.h).
#include "bench_timer.h"

#if defined(EPMOE_WITH_CUDA)
#include "bench_util.h"
#include "core/cuda/check.h"

namespace epmoe::cli {

std::vector<double> time_each_us(cudaStream_t st, const TimeSpec& spec, const std::function<void()>& fn) {
  for (int i = 0; i < spec.warm; ++i) fn();
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (spec.graph) {
    EPMOE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fn();
    EPMOE_CUDA_CHECK(cudaStreamEndCapture(st, &g));
    EPMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 2; ++i) EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, st));  // first replays upload the graph
  }
  std::vector<cudaEvent_t> ev(size_t(2) * spec.reps);
  for (auto& e : ev) EPMOE_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < spec.reps; ++i) {
    EPMOE_CUDA_CHECK(cudaEventRecord(ev[2 * i], st));
    if (spec.graph) EPMOE_CUDA_CHECK(cudaGraphLaunch(exec, st));
    else fn();
    EPMOE_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], st));
    if (spec.sync_each) EPMOE_CUDA_CHECK(cudaEventSynchronize(ev[2 * i + 1]));
  }
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> t(spec.reps);
  for (int i = 0; i < spec.reps; ++i) {
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  return t;
}

double median_us(cudaStream_t st, const TimeSpec& spec, const std::function<void()>& fn) {
  return median(time_each_us(st, spec, fn));
}

}  // namespace epmoe::cli
#endif
