// CUDA error checking and small device-memory helpers shared by the single-GPU backends.
// Every CUDA failure becomes an epmoe::BackendError carrying file:line, the failing expression and
// CUDA's own error string, so that a failure deep inside a layer step says where it came from.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <new>
#include <string>
#include <utility>

#include "epmoe/error.h"

namespace epmoe::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace epmoe::detail

#define EPMOE_CUDA_CHECK(expr)                                                      \
  do {                                                                              \
    cudaError_t epmoe_err_ = (expr);                                                \
    if (epmoe_err_ != cudaSuccess)                                                  \
      ::epmoe::detail::throw_cuda_error(epmoe_err_, #expr, __FILE__, __LINE__);     \
  } while (0)

// After a kernel launch: launch-configuration errors surface here (asynchronous faults surface at
// the next synchronizing call, which is checked as well).
#define EPMOE_CUDA_CHECK_LAUNCH() EPMOE_CUDA_CHECK(cudaGetLastError())

namespace epmoe::cuda {

// Launch facts of one kernel on the current device: its dynamic shared-memory limit is raised to
// `smem` there, and `per_sm` is its occupancy. Kernel attributes are per device, and one process may
// drive several GPUs from several threads, so the set-up is cached per (kernel, device) under a lock.
struct KernelFit {
  int sms = 0;     // multiprocessors of the device
  int per_sm = 1;  // resident blocks per multiprocessor (at least 1)
};
KernelFit fit_kernel(const void* kernel, int threads, int smem);

// Owning device allocation (cudaMalloc); move-only. Grows on request, never shrinks, so that
// workspaces sized for the largest step are allocated once and CUDA-graph replays see stable
// pointers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reserve(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  // Ensures at least `bytes` (contents are not preserved when it grows).
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    EPMOE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  void release() noexcept {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Makes `dev` current for a scope and restores the caller's device afterwards: the library never
// leaves the calling thread on another device (a PyTorch process keeps its own current device).
class [[nodiscard]] DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    EPMOE_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != dev) EPMOE_CUDA_CHECK(cudaSetDevice(dev));
  }
  // For destructors: a failure to switch is ignored (the teardown calls after it fail on their own).
  DeviceGuard(int dev, std::nothrow_t) noexcept {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = dev;
    if (prev_ != dev) cudaSetDevice(dev);
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Number of CUDA devices, or 0 with `why` set when there is none usable (no driver, no GPU).
int device_count(std::string* why = nullptr);

// Whether `p` is device memory (or managed) that kernels may dereference.
bool is_device_pointer(const void* p);

}  // namespace epmoe::cuda
