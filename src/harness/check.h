// The float64 check of the synthetic model (synthetic.h): one MoE layer in float64 with the
// unquantized master weights, for a subset of tokens, regenerating only the experts those tokens
// use. It reuses the routing decisions of the path under test (ids and weights), so the error it
// measures is the arithmetic of the formats, not the router flipping a near-tie.
#pragma once
#include <cstdint>
#include <vector>

#include "epmoe/config.h"

namespace epmoe::harness {

// moe [S][H] = sum over k (ascending) of w[t][k] * FFN_{ids[t][k]}(x[t]) for the S tokens x [S][H]
// (float64), ids/w [S][K] global expert ids (-1: no expert). Parallel over the used experts.
void moe_f64(const MoeConfig& cfg, uint64_t seed, int layer, const std::vector<double>& x, int64_t S,
             const std::vector<int32_t>& ids, const std::vector<float>& w, std::vector<double>& moe);

// The cost of checking one layer of `cfg` for S tokens: bytes held at once by `threads` workers,
// and floating-point operations (expert regeneration is counted as ~10 flops per weight).
struct CheckCost {
  double bytes = 0, flops = 0;
};
CheckCost check_cost(const MoeConfig& cfg, int64_t S, int threads);

}  // namespace epmoe::harness
