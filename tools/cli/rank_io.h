// Where one rank of `epmoe run` keeps its weights and activations and how its forward is timed:
// host memory (cpu) or one GPU (cuda). The driver (run_driver.cpp) is the same for both.
#pragma once
#include <memory>
#include <vector>

#include "epmoe/layer.h"
#include "epmoe/quant.h"

namespace epmoe::cli {

class RankIO {
 public:
  virtual ~RankIO() = default;
  // A view of `m` on this rank's device, valid until release().
  virtual MatrixView put(const HostMatrix& m) = 0;
  virtual const float* put(const std::vector<float>& v) = 0;
  // Frees what put() returned (the layer is done with it).
  virtual void release() = 0;
  // out = layer(h, logits), h bf16 [T][H] and logits f32 [T][E] in host memory, out bf16 [T][H]
  // back in host memory. Runs `reps` timed forwards (after an untimed warm-up when warm_up) and
  // returns the median in milliseconds.
  virtual double forward(MoeLayer& layer, const std::vector<bf16_raw>& h, const std::vector<float>& logits,
                         std::vector<bf16_raw>& out, int64_t T, int H, int E, int reps, bool warm_up) = 0;
};

std::unique_ptr<RankIO> make_host_io();
// Free memory of GPU 0 in bytes; 0 without CUDA or GPU.
double gpu_memory_bytes();

// GPU `device_index` (CUDA builds; elsewhere throws UsageError).
std::unique_ptr<RankIO> make_cuda_io(int device_index);

}  // namespace epmoe::cli
