// CUDA router (DESIGN.md §1): the same ids and bitwise-equal weights as route_cpu (router.h).
// One warp per token; see route.cu for the operation order, which mirrors src/route/cpu.cpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "epmoe/config.h"
#include "epmoe/tensor.h"

namespace epmoe::cuda {

constexpr int kMaxRouteExperts = 512;
constexpr int kMaxRouteTopK = 16;

// logits: [T, E] f32 or bf16 on a CUDA device. bias_dev: [E] fp32 on the device or null (zero).
// ids / w: [T, K] device outputs. Asynchronous on `stream`; no host synchronization.
void route(const RouterConfig& cfg, const TensorView& logits_on_device, const float* bias_dev, int top_k,
           int32_t* ids, float* w, cudaStream_t stream);

}  // namespace epmoe::cuda
