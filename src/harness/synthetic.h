// The synthetic model of the harness (`epmoe run`, the benches, the end-to-end tests): random
// weights that depend only on (seed, layer, expert, row, col), from a counter-based hash. Any rank
// builds exactly its own experts, the float64 check regenerates just the experts its tokens use,
// and no E x H x I tensor ever has to sit in one place, so the model scales to real shapes.
//
// Scales keep every stage near unit variance for unit-variance inputs: gate/up rows with a standard
// deviation of 1/sqrt(H), down rows 1/sqrt(I), router rows 1/sqrt(H) (logits spread about 1, so
// routing is neither uniform nor one-hot). Values are uniform in [-sqrt(3) s, sqrt(3) s).
#pragma once
#include <cstdint>
#include <vector>

#include "epmoe/config.h"
#include "epmoe/quant.h"

namespace epmoe::harness {

// fp32 master weights of one expert: w13 [2I][H] (rows 0..I-1 gate, I..2I-1 up), w2 [H][I].
struct ExpertMasters {
  std::vector<float> w13, w2;
};
ExpertMasters expert_masters(const MoeConfig& cfg, uint64_t seed, int layer, int expert);

// The router of one layer: w [E][H]; bias [E] zeros for softmax routing, small random values
// (standard deviation 0.05) for sigmoid_grouped_topk.
struct RouterWeights {
  std::vector<float> w, bias;
};
RouterWeights router_weights(const MoeConfig& cfg, uint64_t seed, int layer);

// logits [T][E] = router * h for bf16 h [T][H], fp32 accumulation in index order.
void router_logits(const RouterWeights& rt, int H, int E, const bf16_raw* h, int64_t T, float* logits);

// Rank `rank`'s experts of `layer` as laid out by cfg's placement, quantized to cfg.weight_format:
// w13 [El][2I][H], w2 [El][H][I]. Slots no expert occupies (an explicit map) hold zeros. Each
// quantization block lies inside one expert, so quantizing expert by expert gives the bytes
// quantize_matrix gives for the whole rank.
struct RankWeights {
  HostMatrix w13, w2;
};
// Which logical expert each of rank `rank`'s slots holds under cfg's placement (-1: empty slot).
std::vector<int> slot_experts(const MoeConfig& cfg, int rank);
RankWeights rank_weights(const MoeConfig& cfg, uint64_t seed, int layer, int rank);

// bf16 [T][H], entries ~ N(0, 1), from `seed`.
std::vector<bf16_raw> random_hidden(int64_t T, int H, uint64_t seed);

// bf16 values uniform in [-amplitude, amplitude) (then rounded to bf16), element i from the counter
// hash of (seed, i): the benches' activations, which harness/cuda/synthetic.h draws on the device.
std::vector<bf16_raw> uniform_bf16(size_t n, float amplitude, uint64_t seed);

// The local expert of each of `rows` routed rows as the model's own router (model.router, top_k
// of model.num_experts) sends tokens with random N(0, 1) logits from `seed`: tokens are routed
// until `rows` (token, k) pairs have landed on the first `local` experts, kept in token order (the
// first M rows serve a call of M rows). The benches' realistic load (`bench runner --routing router`).
std::vector<int32_t> router_rows(const MoeConfig& model, int local, int64_t rows, uint64_t seed);

// Elements of one matrix of the model (the unit the generator works in), for size estimates.
inline double expert_elements(const MoeConfig& c) { return 3.0 * c.hidden * double(c.intermediate); }

}  // namespace epmoe::harness
