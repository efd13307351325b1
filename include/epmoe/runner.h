// The routed runner (DESIGN.md §4): experts applied to already-dispatched tokens.
#pragma once
#include <cstddef>

#include "epmoe/dispatch.h"
#include "epmoe/quant.h"

namespace epmoe {

// The experts of one rank: W13 fused [E_loc][2I][H] (rows 0..I-1 gate, I..2I-1 up), W2 [E_loc][H][I].
struct ExpertWeights {
  int num_local_experts = 0, hidden = 0, intermediate = 0;
  MatrixView w13;
  MatrixView w2;
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual const char* name() const = 0;
  // Called once by MoeLayer's constructor, before any run(), with the weights that every later
  // run() receives: a backend may convert them here, once, into what it runs fastest from (runner
  // "cuda": nvfp4 weights copied into its decode engine's load order, tuning.nvfp4_prepare), by
  // updating `w` (e.g. MatrixView::prepared) and owning whatever it allocates for as long as it
  // lives. The results must stay the same. The work is complete when it returns. Returns the bytes
  // allocated (0: `w` unchanged, the default). Weights changed afterwards need a new runner.
  virtual size_t prepare(ExpertWeights& /*w*/, Stream /*stream*/) { return 0; }
  // For every valid slot of `in`: y = sum_k w_k * FFN_{id_k}(dequant(x)), fp32 accumulation, bf16
  // out. y: [R][C][H] on in.device; invalid slots are left untouched.
  virtual void run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) = 0;
};

}  // namespace epmoe
