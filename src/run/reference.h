// The CPU reference runner (DESIGN.md §4) and the per-row arithmetic it is built from. The
// arithmetic is exposed so that tests (and GPU engineers) can reproduce one slot's result exactly.
//
// Exact arithmetic of the reference runner, per valid slot and per k with local id e >= 0:
//   x   = dequantize_rows(format, quant, payload, scales)              fp32 [H]
//   g_i = dot(W13_e[i],   x)   u_i = dot(W13_e[I+i], x)                 fp32, see dot_f32
//   a_i = (g_i * sigmoid_f32(g_i)) * u_i                                fp32 (num::sigmoid_f32)
//   if effective_intermediate_quant() == fp8: per block of 128 of a (the last one I - 128 b long
//   when I % 128 != 0; I % 16 == 0):
//       scale = quantize_fp8_block(a_blk, len, ue8m0, q); a_i = e4m3_to_f32(q_i) * scale
//   o_j = dot(W2_e[j], a)                                               fp32 [H]
//   y   = sum over k ascending of w_k * o   (fp32, starting from 0.f), then bf16 (RNE)
// Weights are dequantized to fp32 with dequantize_matrix_rows. Without intermediate quantization
// `a` stays fp32 (it is not rounded to bf16).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "epmoe/config.h"
#include "epmoe/runner.h"

namespace epmoe::detail {

// Sum of a[i] * b[i] in fp32 with 8 interleaved partial sums (lane l takes i % 8 == l), the
// lanes added as ((0+1)+(2+3))+((4+5)+(6+7)), then the tail i >= 8*(n/8) in order. The fixed
// order makes every slot's result independent of how tokens are batched.
float dot_f32(const float* a, const float* b, int n);

// a = silu(gate) * up for one row, then the optional fp8 rounding described above. `iq` is the
// resolved value (MoeConfig::effective_intermediate_quant()); automatic is refused.
void swiglu_row(const float* gate, const float* up, int n, IntermediateQuant iq, bool ue8m0, float* a);

// One expert applied to one dequantized row: o [H] = W2 (silu(W1 x) * W3 x). w13 [2I][H] and
// w2 [H][I] are fp32; scratch needs 3*I floats. `iq` as for swiglu_row.
void expert_ffn_row(const float* w13, const float* w2, int H, int I, const float* x, IntermediateQuant iq,
                    bool ue8m0, float* scratch, float* o);

class ReferenceRunner final : public Runner {
 public:
  explicit ReferenceRunner(const MoeConfig& cfg);
  const char* name() const override { return "reference"; }
  void run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) override;

  // Dequantized weights are cached per expert, keyed by the MatrixView's pointers: weights must
  // not change in place while this runner uses them (call this after changing them).
  void clear_cache() { cache_.clear(); }

 private:
  // out[e] = fp32 copy of expert e of matrix m for every e in `experts`, dequantizing the ones not
  // cached yet (in parallel). Called from the calling thread only: the cache has no lock.
  void dense_all(const MatrixView& m, const std::vector<int>& experts, std::vector<const float*>& out);

  MoeConfig cfg_;
  using Key = std::tuple<const void*, const void*, const void*, int, int, int, int>;
  // unique_ptr<float[]> rather than vector: no serial zero-fill; the parallel dequantization
  // touches the (often GiB-sized) pages first.
  std::map<Key, std::unique_ptr<float[]>> cache_;
};

}  // namespace epmoe::detail
