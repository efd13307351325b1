// Routing: top-k over router logits (DESIGN.md §1). CPU reference here; the CUDA router
// (src/route/cuda/) computes the same ids and bitwise-equal weights.
#pragma once
#include <cstdint>

#include "epmoe/config.h"
#include "epmoe/tensor.h"

namespace epmoe {

// logits: [T, E] f32 or bf16 on the CPU. bias: [E] fp32 (sigmoid_grouped_topk only; may be null =
// zero). Writes topk_ids [T, K] and topk_weights [T, K]. Ties: the lower expert id wins.
// NaN logits: a NaN score never wins against a number; a row of all NaN picks the lowest ids
// with NaN weights (documented in docs/FORMATS.md).
void route_cpu(const RouterConfig& cfg, const TensorView& logits, const float* bias, int top_k,
               int32_t* topk_ids, float* topk_weights);

// Checks ids in [-1, E): throws UsageError naming the first bad (token, k, id).
void check_topk_ids(const int32_t* topk_ids, int64_t num_tokens, int top_k, int num_experts);

}  // namespace epmoe
