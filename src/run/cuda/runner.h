// The "cuda" routed runner (DESIGN.md §4) on one GPU. Steps, all on the device and without host
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
//
// Where things are: the engines in engine_*.cu (engine.h, engine_cutlass.h), which engine and tile
// a call uses in policy.h, the row passes in rows.h, this orchestration in runner.cu (decode
// engines) and runner_cutlass.cu (the CUTLASS engine's path), its configuration limits in
// policy::check_config (registered as the runner's RunnerInfo::check, register.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/stream_fork.h"
#include "epmoe/config.h"
#include "epmoe/runner.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/prepare.h"

namespace epmoe::cuda {

class CudaRunner final : public Runner {
 public:
  // Tuning from cfg.tuning: engine, wgmma_defer, fused_swiglu, widen_scratch_mb, nvfp4_prepare,
  // cutlass_swap, decode_max_rows.
  // cfg is expected to have passed validate() (policy::check_config holds this runner's limits);
  // the constructor touches no GPU and throws nothing.
  CudaRunner(const MoeConfig& cfg, int device_index);
  const char* name() const override { return "cuda"; }
  // nvfp4 weights with cfg.tuning.nvfp4_prepare: the decode engine's prepared copies of w's
  // matrices (prepare_nvfp4_weights) into buffers this runner owns (kept, and reused by a later
  // prepare, until it is destroyed), w.w13.prepared / w.w2.prepared pointed at them; complete when
  // it returns (`stream` is synchronized). fp8 weights (I % 64 == 0): W13's scales in the order of
  // the CUTLASS one-GEMM SwiGLU (prepare_fp8_glu_scales), w.w13.prepared pointed at them, and with
  // tuning.fp8_mixed in a CUTLASS build both matrices' scales per weight row for the mixed-input
  // GEMM (prepare_fp8_row_scales), w.w2.prepared pointed at W2's; nvfp4 weights with
  // tuning.nvfp4_mixed in a CUTLASS build also their paired copies (prepare_nvfp4_paired, one byte
  // per weight; W13's in GLU order unless the intermediate is quantized to fp8) and those GEMMs'
  // alpha (2^8 / gs per expert) for the mixed-input GEMM at large M; a run of the same w (the same
  // scale pointers) then skips those launches. Returns the bytes; 0 (w unchanged) for other formats,
  // shapes the engines do not take, or nvfp4 with nvfp4_prepare and nvfp4_mixed off. Run w only
  // with this runner.
  size_t prepare(ExpertWeights& w, Stream stream) override;
  void run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) override;

  // ---- what the last run chose (tests, benchmarks) ------------------------------------------------
  // Rows per GEMM m-tile (32, 128 or 160), or policy::kByRows where the wide nvfp4 engine gave
  // each expert its own height (tuning.nvfp4_wide_rows = 0).
  int last_block_m() const { return last_bm_; }
  // Engines of the two GEMMs, e.g. "wgmma-fp8/mma-fp8", "cutlass-fp8/cutlass-bf16(widened fp8)".
  const char* last_engines() const { return last_engines_; }
  // Widen-and-GEMM chunks of a CUTLASS run (both GEMMs together; 0 when nothing was widened).
  int last_widen_chunks() const { return last_widen_chunks_; }
  // Whether a CUTLASS run fused SwiGLU into GEMM1 (policy::CutlassPlan::fused_swiglu).
  bool last_swiglu_fused() const { return last_swiglu_fused_; }
  // GEMM1 split by rows fused SwiGLU in its unswapped launches (policy::glu_in_split).
  bool last_glu_split() const { return last_glu_split_; }
  // Whether a CUTLASS run's GEMMs ran swap-AB, and their token-tile width: 64, 128 or 192; 0
  // unswapped or after a decode run; policy::kByRows (-1) when each expert took the tile of its
  // rows (policy::row_buckets: swap-AB for some experts, perhaps not for all).
  bool last_swap_ab() const { return last_swap_tile_n_ != 0; }
  int last_swap_tile_n() const { return last_swap_tile_n_; }
  // Whether the last run's decode GEMM1 read the dispatch buffer (no permute; set_direct_rows).
  bool last_direct_rows() const { return last_direct_rows_; }

  // ---- test and benchmark hooks: override cfg.tuning / the policy for this runner ----------------
  // The engine choice (policy::use_cutlass); the name CudaRunner::Engine is kept for callers.
  using Engine = RunnerEngine;
  // cutlass in a build without CUTLASS throws UsageError (validate() reports it for cfg.tuning).
  void set_engine(Engine e);
  Engine engine() const { return engine_; }
  // Force the m-tile (0 = automatic, policy::block_m).
  void set_block_m(int bm) { force_bm_ = bm; }
  // Decode (m-tile 32) GEMMs on the Hopper wgmma engines (default) or on the mma.sync one (false).
  void set_wgmma_decode(bool on) { wgmma_decode_ = on; }
  // The decode wgmma engine's pipeline (tuning.wgmma_defer; the same results bitwise).
  void set_wgmma_defer(bool on) { wgmma_defer_ = on; }
  bool wgmma_defer() const { return wgmma_defer_; }
  // Programmatic dependent launch of the row passes and the GEMMs, decode wgmma and CUTLASS
  // (tuning.pdl; the same results bitwise).
  void set_pdl(bool on) { pdl_ = on; }
  bool pdl() const { return pdl_; }
  // The decode GEMM1 reading its rows from the dispatch buffer where it can (launch_count_claim;
  // the default), or always from a permuted copy (false). The same results bitwise.
  void set_direct_rows(bool on) { direct_rows_ = on; }
  // CUTLASS GEMM1 as gate half + up half with SwiGLU in the epilogue (tuning.fused_swiglu).
  void set_fused_swiglu(bool on) { fused_swiglu_ = on; }
  bool fused_swiglu() const { return fused_swiglu_; }
  // CUTLASS GEMMs swap-AB: automatic (policy::swap_tile_n), off, on, or on with a token-tile width
  // (tuning.cutlass_swap).
  void set_cutlass_swap(CutlassSwap s) { cutlass_swap_ = s; }
  CutlassSwap cutlass_swap() const { return cutlass_swap_; }
  // The CUTLASS GEMMs' launches per tile of the split on side streams, overlapping (tuning.concurrent_buckets;
  // the same bits).
  void set_concurrent_buckets(bool on) { concurrent_buckets_ = on; }
  bool concurrent_buckets() const { return concurrent_buckets_; }
  // Replaces the split table of the direct CUTLASS GEMMs (policy::parse_row_buckets; empty = the
  // policy's), whatever cutlass_swap says: for trying other ranges and tiles (bench runner
  // --row-buckets). A tile the GEMM has no instantiation for throws UsageError at run().
  void set_row_buckets(std::vector<policy::RowBucket> b) { row_buckets_ = std::move(b); }
  // fp8 weights with a bf16 operand on the CUTLASS engine's mixed-input GEMM (decoded in the main
  // loop) or, off, widened first (tuning.fp8_mixed; the same bits).
  void set_fp8_mixed(bool on) { fp8_mixed_ = on; }
  bool fp8_mixed() const { return fp8_mixed_; }
  // Bound of the widening scratch in bytes (tuning.widen_scratch_mb MiB); tests shrink it to force
  // several chunks. 0 throws UsageError.
  void set_widen_scratch_bytes(size_t bytes);
  size_t widen_scratch_bytes() const { return widen_scratch_; }

 private:
  // The tables both paths route rows with (rows.h): rows per expert and their offsets, the
  // permute's fill counters and (slot, k) -> row positions, and the m-tile table.
  void reserve_routing(int E, int64_t max_tiles, int64_t max_rows);
  void check(const DispatchOutput& in, const ExpertWeights& w, const bf16_raw* y) const;
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
  DeviceBuffer src_rows_;  // decode GEMM1 reading the dispatch buffer: each row's slot (launch_count_claim)
  DeviceBuffer a8_, as_, h8_, hs_;  // fp8 operands of the wgmma fp8 engine (codes, transposed scales)
  Engine engine_ = Engine::automatic;
  bool wgmma_defer_ = true;
  bool pdl_ = true;
  bool direct_rows_ = true, last_direct_rows_ = false;
  int sms_ = 0;
  DeviceBuffer gu_, cws_;  // CUTLASS engine: GEMM1 output [rows][2I] (gate | up), GEMM tables/workspace
  DeviceBuffer scratch_, inv_gs_;  // widened weights of one chunk; 1/gs of W13 and W2 (nvfp4) [2][E]
  DeviceBuffer glu_sfw_;  // W13's scales in the fp8 one-GEMM SwiGLU's order, per call where not prepared
  DeviceBuffer row_sf_;   // fp8w GEMMs: a matrix's tile scales per weight row (expand_fp8_scales), per call
  size_t widen_scratch_ = size_t(1) << 30;
  int last_widen_chunks_ = 0;
  bool fused_swiglu_ = false, last_swiglu_fused_ = false, last_glu_split_ = false;
  bool concurrent_buckets_ = true;
  bool fp8_mixed_ = true;
  StreamFork fork_;  // side streams of the concurrent launches of a split
  CutlassSwap cutlass_swap_ = CutlassSwap::automatic;
  std::vector<policy::RowBucket> row_buckets_;
  int last_swap_tile_n_ = 0;
  std::string engines_;  // last_engines() when built per run
  DeviceBuffer prep13_, prep2_;  // prepare(): nvfp4 weights in the decode engine's load order; fp8 W13's GLU scales
                                 // (prep13_) and W2's row scales (prep2_)
  DeviceBuffer prep_rows13_;     // prepare(): fp8 W13's row scales
  // The scales prepare() wrote row scales from (null: none): a run uses them only for these.
  const void* prep_rows_src13_ = nullptr;
  const void* prep_rows_src2_ = nullptr;
  // prepare() with tuning.nvfp4_mixed: nvfp4 W13 / W2 paired (nvfp4_paired.h) for the mixed-input
  // GEMM, and the codes they were written from (a run uses them only for these).
  DeviceBuffer paired13_, paired2_;
  bool paired13_glu_ = false;  // W13's copy in GLU order (nvfp4_paired::glu_row): GEMM1 fuses SwiGLU
  const void* paired_src13_ = nullptr;
  const void* paired_src2_ = nullptr;
  // Their GEMMs' alpha 2^8 / gs, [2][E], and the global scales it came from (a run uses it only for
  // these; otherwise it computes its own per call).
  DeviceBuffer paired_alpha_;
  const float* paired_gs13_ = nullptr;
  const float* paired_gs2_ = nullptr;
  bool paired_for(const ExpertWeights& w) const {
    return paired_src13_ && w.w13.data == paired_src13_ && w.w2.data == paired_src2_;
  }
};

}  // namespace epmoe::cuda
