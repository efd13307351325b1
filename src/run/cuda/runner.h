// The "cuda" routed runner (design.md 3.4) on one GPU. Steps, all on the device and without host
// synchronization (CUDA-graph capturable once its workspace has grown to the step's size):
//   1. count (slot, k) pairs per local expert; offsets and the m-tile table by a one-CTA scan;
//   2. permute: each valid pair gets a row in the expert-sorted matrix A, filled with the slot's
//      activation dequantized to bf16 (the row order inside an expert does not affect any result:
//      every row is computed independently);
//   3. GEMM1 with W13 and SiLU(gate)*up fused into its epilogue -> h [rows][I] bf16
//      (when intermediate_quant is fp8, h then takes the fp8 block-128 round trip);
//   4. GEMM2 with W2 -> o [rows][H] bf16;
//   5. per slot: y = bf16(sum over k ascending of w_k * o[row(slot, k)]), fp32, one pass.
// Numerics (documented in docs/RUNNER.md): activations and the intermediate are rounded to bf16;
// fp8 weights become bf16(e4m3 * fp32 tile scale) (one rounding); nvfp4 weights become
// bf16(e2m1 * e4m3 block scale), exact, and the per-expert global scale divides the fp32 accumulator
// (it is multiplied by 1/gs before the bf16 store). This holds on every engine: mma.sync widens in
// its B fragments, nvfp4 wgmma in registers, the CUTLASS engine into a scratch buffer (widen.h) with
// 1/gs as the bf16 GEMM's per-group epilogue alpha. Exception, the fp8 x fp8 paths (decode wgmma
// m-tile 32, and CUTLASS fp8): with an fp8 dispatch the activations stay e4m3 and GEMM1 runs on fp8
// tensor cores with both scales applied in fp32 per 128-K block; with intermediate_quant = fp8 the
// intermediate becomes e4m3 codes + block scales and GEMM2 does the same.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/cuda/check.h"
#include "epmoe/config.h"
#include "epmoe/runner.h"
#include "run/cuda/engine_cutlass.h"

namespace epmoe::cuda {

class CudaRunner final : public Runner {
 public:
  CudaRunner(const MoeConfig& cfg, int device_index);
  const char* name() const override { return "cuda"; }
  void run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) override;

  // Rows per GEMM m-tile chosen for the last run (32 or 128), for benchmarks and tests.
  int last_block_m() const { return last_bm_; }
  // Force the m-tile (0 = automatic from the average rows per expert).
  void set_block_m(int bm) { force_bm_ = bm; }
  // Decode (m-tile 32) GEMMs on the Hopper wgmma engine (default) or on the mma.sync one (false),
  // for tests and benchmarks that compare the two.
  void set_wgmma_decode(bool on) { wgmma_decode_ = on; }
  // Engines of the last run's two GEMMs, e.g. "wgmma-fp8/mma-fp8".
  const char* last_engines() const { return last_engines_; }

  // Large-M engine choice. automatic: the CUTLASS grouped GEMMs (engine_cutlass.h) when the rows an
  // expert can expect, S*K / E_total (expected_rows), are >= kCutlassMinRows, else the mma.sync/wgmma
  // kernels; cutlass: CUTLASS whatever M; mma: never CUTLASS. CUTLASS takes every weight format:
  // bf16 weights on the bf16 GEMM; fp8 weights on the fp8 x fp8 GEMM where the other operand is
  // e4m3 (GEMM1: fp8 dispatch with H, I % 128 == 0 and a 16-byte aligned payload; GEMM2:
  // intermediate_quant = fp8); otherwise (fp8 with a bf16 operand, and nvfp4 always) the weights
  // are widened to bf16 in a scratch buffer, a chunk of whole experts at a time, and run on the
  // bf16 GEMM: last_engines() then says e.g. "cutlass-fp8/cutlass-bf16(widened fp8)" or
  // "cutlass-bf16(widened nvfp4)/cutlass-bf16(widened nvfp4)". The constructor reads
  // EPMOE_RUNNER_ENGINE (auto|mma|cutlass); set_engine overrides it. Asking for cutlass in a build
  // without CUTLASS throws UsageError.
  enum class Engine { automatic, mma, cutlass };
  // 33 = more than one 32-row decode m-tile: measured on an H200 (DeepSeek-V3 experts, 128 local),
  // 32 rows per expert: decode wgmma 3.3 ms vs CUTLASS 3.9 ms (bf16); 64 rows: CUTLASS 4.0 ms vs
  // 6.6 ms for the mma.sync kernel (bench/results/2026-11-29-run7-10-2xh200.md).
  static constexpr int kCutlassMinRows = 33;
  // nvfp4 weights are widened to bf16 first (~6 ms for 128 DeepSeek-V3 experts), which the GEMMs
  // only repay at larger M: 64 rows per expert measured 10.3 ms widened vs 8.6 ms on mma.sync,
  // 256 rows 10.9 ms vs 17.6 ms.
  static constexpr int kCutlassMinRowsNvfp4 = 128;
  void set_engine(Engine e);
  Engine engine() const { return engine_; }
  // "auto", "mma", "cutlass" -> Engine; anything else throws UsageError naming `what`.
  static Engine parse_engine(const std::string& s, const char* what);

  // Bound of the widening scratch (bytes; default widen::kDefaultScratchBytes = 1 GiB, or
  // EPMOE_WIDEN_SCRATCH_MB read by the constructor). A chunk holds as many whole experts as fit,
  // at least one. Tests shrink it to force several chunks; 0 throws UsageError.
  void set_widen_scratch_bytes(size_t bytes);
  size_t widen_scratch_bytes() const { return widen_scratch_; }
  // Widen-and-GEMM chunks of the last CUTLASS run (both GEMMs together; 0 when nothing was widened).
  int last_widen_chunks() const { return last_widen_chunks_; }

  // CUTLASS engine, GEMM1 on the bf16 GEMM with a bf16 intermediate (intermediate_quant none): run
  // as its gate half and then its up half with SwiGLU in the epilogue (engine_cutlass_swiglu.cu) instead of
  // GEMM1 [rows][2I] plus a SwiGLU pass. Off by default (run 28, bf16 M 32768: 4.74 ms fused
  // against 4.71 without: two N = I GEMMs cost more than the pass they remove);
  // EPMOE_CUTLASS_SWIGLU=0|1 (read by the constructor) or set_fused_swiglu override it.
  void set_fused_swiglu(bool on) { fused_swiglu_ = on; }
  // Whether the last CUTLASS run fused SwiGLU into GEMM1.
  bool last_swiglu_fused() const { return last_swiglu_fused_; }
  // "<n>" (MiB, 1..2^24) -> bytes; anything else throws UsageError naming `what`.
  static size_t parse_scratch_mb(const std::string& s, const char* what);

 private:
  void check(const DispatchOutput& in, const ExpertWeights& w, const bf16_raw* y) const;
  // Whether this call runs on the CUTLASS engine (host-side rule above), and that engine's run.
  bool use_cutlass(const DispatchOutput& in, const ExpertWeights& w) const;
  // Rows per local expert with full slots and balanced routing: S*K / max(cfg.num_experts, E_loc).
  double expected_rows(const DispatchOutput& in) const;
  void run_cutlass(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, cudaStream_t st);
  // swiglu_gate non-null: g is GEMM1 and each chunk runs as the fused pair (gate half into
  // swiglu_gate, up half with SwiGLU into g.out).
  int run_widened(const cutlass_engine::Grouped& g, const MatrixView& m, const float* alpha, int chunk,
                  cudaStream_t st, bf16_raw* swiglu_gate = nullptr);

  MoeConfig cfg_;
  int device_ = 0;
  int last_bm_ = 0, force_bm_ = 0;
  bool wgmma_decode_ = true;
  const char* last_engines_ = "";
  DeviceBuffer cnt_, offsets_, fill_, tiles_, num_tiles_, pair_pos_, a_, h_, o_;
  DeviceBuffer a8_, as_, h8_, hs_;  // fp8 operands of the wgmma fp8 engine (codes, transposed scales)
  Engine engine_ = Engine::automatic;
  int sms_ = 0;
  DeviceBuffer gu_, cws_;  // CUTLASS engine: GEMM1 output [rows][2I] (gate | up), GEMM tables/workspace
  DeviceBuffer scratch_, inv_gs_;  // widened weights of one chunk; 1/gs of W13 and W2 (nvfp4) [2][E]
  size_t widen_scratch_ = size_t(1) << 30;
  int last_widen_chunks_ = 0;
  bool fused_swiglu_ = false, last_swiglu_fused_ = false;
  std::string engines_;  // last_engines() of the CUTLASS engine (built per run)
};

// nvfp4 weights on the decode engine run fastest from a prepared copy (engine_wgmma_nvfp4_prepared.cu:
// each weight tile's stages contiguous, in the order the threads load them, the code bits
// permuted for a cheaper decode; the same bytes as data + scales, the same results bit for bit).
// Writes the copies of w's nvfp4 matrices into w13 / w2 (grown as needed) and points
// w.w13.prepared / w.w2.prepared at them, for each matrix the engine takes (K % 128 == 0, W13 with
// I % 64 == 0); returns the bytes prepared (0 for other formats or shapes: nothing changes). The
// copies must be redone if the weights change; data and scales stay in use (large-M GEMMs widen
// from them). Enqueued on `stream`.
size_t prepare_nvfp4_weights(ExpertWeights& w, DeviceBuffer& w13, DeviceBuffer& w2, cudaStream_t stream);

}  // namespace epmoe::cuda
