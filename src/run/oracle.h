// The plain single-process computation of a whole MoE layer (DESIGN.md §4 without any
// parallelism): every token of every rank at once, float64 throughout. Tests and `epmoe run`
// compare the distributed, quantized path against it.
#pragma once
#include <cstdint>
#include <vector>

#include "epmoe/format.h"
#include "epmoe/quant.h"

namespace epmoe::oracle {

// All E experts of a layer in float64, indexed by global expert id.
// w13: [E][2I][H] (rows 0..I-1 gate, I..2I-1 up); w2: [E][H][I].
struct DenseExperts {
  int num_experts = 0, hidden = 0, intermediate = 0;
  std::vector<double> w13, w2;

  // The unquantized master weights (fp32 [E][2I][H] and [E][H][I]).
  static DenseExperts from_fp32(const float* w13, const float* w2, int E, int H, int I);
  // What a runner with weights in format `f` actually multiplies with: the master weights
  // quantized per expert (quantize_matrix) and dequantized again.
  static DenseExperts quantized(const float* w13, const float* w2, int E, int H, int I, WeightFormat f);
};

// out[t] = sum over k with ids[t][k] >= 0 of w[t][k] * W2_e (silu(W1_e x_t) * W3_e x_t), all in
// float64. x [T][H], ids/w [T][K] (global ids), out [T][H]. A token with every id -1 gets zeros.
// Throws UsageError for an id outside [-1, E).
void moe_forward(const DenseExperts& ex, const double* x, int64_t T, const int32_t* ids, const float* w, int K,
                 double* out);

// bf16 [n] widened to double.
std::vector<double> widen_bf16(const bf16_raw* x, size_t n);
// The activations a runner sees after dispatch in format f: quantize_rows then dequantize_rows,
// widened to double. x is bf16 [T][H].
std::vector<double> dispatched_activations(ActFormat f, const QuantParams& p, const bf16_raw* x, int64_t T, int H);

// Accuracy of `got` against `ref` (n values each).
struct ErrorStats {
  double max_abs = 0;        // max |got - ref|
  double max_rel = 0;        // max |got - ref| / max |ref| (0 when ref is all zero and so is got)
  double one_minus_cos = 0;  // 1 - <got, ref> / (|got| |ref|); 0 when both are zero vectors
  int64_t nonfinite = 0;     // entries where got or ref is NaN/Inf (left out of the three above)
};
ErrorStats compare(const double* got, const double* ref, size_t n);
ErrorStats compare_bf16(const bf16_raw* got, const double* ref, size_t n);

}  // namespace epmoe::oracle
