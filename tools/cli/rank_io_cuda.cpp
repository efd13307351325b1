// GPU ranks of `epmoe run` (device cuda): weights and activations on the rank's GPU, forwards
// timed with CUDA events on a stream of their own.
#include "epmoe/error.h"
#include "rank_io.h"

#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>

#include "bench_util.h"
#include "comm/launch.h"
#include "core/cuda/check.h"
#include "device_arena.h"

namespace epmoe::cli {
namespace {

class CudaIO : public RankIO {
 public:
  explicit CudaIO(int dev) : dev_(dev) {
    EPMOE_CUDA_CHECK(cudaSetDevice(dev));
    EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    EPMOE_CUDA_CHECK(cudaEventCreate(&ev_[0]));
    EPMOE_CUDA_CHECK(cudaEventCreate(&ev_[1]));
  }
  ~CudaIO() override {
    cudaEventDestroy(ev_[0]);
    cudaEventDestroy(ev_[1]);
    cudaStreamDestroy(st_);
  }
  MatrixView put(const HostMatrix& m) override {
    MatrixView v = m.view();
    v.data = weights_.put(m.data.data(), m.data.size());
    v.scales = m.scales.empty() ? nullptr : weights_.put(m.scales.data(), m.scales.size());
    v.global_scale = m.global_scale.empty()
                         ? nullptr
                         : static_cast<const float*>(weights_.put(m.global_scale.data(), m.global_scale.size() * 4));
    v.device = DeviceKind::cuda;
    return v;
  }
  const float* put(const std::vector<float>& v) override {
    return static_cast<const float*>(weights_.put(v.data(), v.size() * 4));
  }
  void release() override { weights_ = DeviceArena{}; }
  double forward(MoeLayer& layer, const std::vector<bf16_raw>& h, const std::vector<float>& logits,
                 std::vector<bf16_raw>& out, int64_t T, int H, int E, int reps, bool warm_up) override {
    DeviceArena io;
    auto* h_dev = io.put(h.data(), h.size() * 2);
    auto* l_dev = io.put(logits.data(), logits.size() * 4);
    auto* o_dev = io.alloc(size_t(T) * H * 2);
    const auto dv = [&](void* p, DType t, int64_t a, int64_t b) {
      return TensorView::of(p, t, {a, b}, DeviceKind::cuda, dev_);
    };
    const TensorView hv = dv(h_dev, DType::bf16, T, H), lv = dv(l_dev, DType::f32, T, E), ov = dv(o_dev, DType::bf16, T, H);
    if (warm_up) {  // workspaces grow, kernels load
      layer.forward(hv, lv, ov, st_);
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(st_));
    }
    std::vector<double> ms;
    for (int i = 0; i < std::max(1, reps); ++i) {
      EPMOE_CUDA_CHECK(cudaEventRecord(ev_[0], st_));
      layer.forward(hv, lv, ov, st_);
      EPMOE_CUDA_CHECK(cudaEventRecord(ev_[1], st_));
      EPMOE_CUDA_CHECK(cudaEventSynchronize(ev_[1]));
      float x = 0;
      EPMOE_CUDA_CHECK(cudaEventElapsedTime(&x, ev_[0], ev_[1]));
      ms.push_back(x);
    }
    out.resize(size_t(T) * H);
    if (T) EPMOE_CUDA_CHECK(cudaMemcpy(out.data(), o_dev, out.size() * 2, cudaMemcpyDeviceToHost));
    return median(ms);
  }

 private:
  int dev_;
  cudaStream_t st_ = nullptr;
  cudaEvent_t ev_[2] = {};
  DeviceArena weights_;
};

}  // namespace

std::unique_ptr<RankIO> make_cuda_io(int device_index) { return std::make_unique<CudaIO>(device_index); }

double gpu_memory_bytes() {
  size_t free_b = 0, total_b = 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return double(free_b);
}

}  // namespace epmoe::cli

#else
namespace epmoe::cli {
double gpu_memory_bytes() { return 0; }
std::unique_ptr<RankIO> make_cuda_io(int) {
  throw UsageError("--device cuda: this epmoe was built without CUDA; use --device cpu");
}
}  // namespace epmoe::cli
#endif
