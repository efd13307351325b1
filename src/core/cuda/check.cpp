#include "core/cuda/check.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace epmoe::detail {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw BackendError(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr +
                     " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace epmoe::detail

namespace epmoe::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused by it
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 devices";
  return n;
}

bool is_device_pointer(const void* p) {
  if (!p) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

KernelFit fit_kernel(const void* kernel, int threads, int smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, KernelFit> cache;
  int dev = 0;
  EPMOE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({kernel, dev});
  if (it != cache.end()) return it->second;
  KernelFit f;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev));
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  EPMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.per_sm, kernel, threads, smem));
  if (f.per_sm < 1) f.per_sm = 1;
  cache.emplace(std::make_pair(kernel, dev), f);
  return f;
}

}  // namespace epmoe::cuda
