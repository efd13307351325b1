// The mma.sync and wgmma grouped-GEMM engines of the CUDA runner (host side; the CUTLASS engine
// is engine_cutlass.h). Each engine lives in its own engine_*.cu (one translation unit each, so
// that they build in parallel); which one a GEMM runs on is policy.h's choice. Rows of all
// experts are packed by expert into one [rows][K] bf16 matrix A; a device-built tile table lists
// the m-tiles (expert, first row, rows), and a device scalar how many there are, so launches never
// need the host to know the counts (CUDA-graph capturable). Each CTA loops over (m-tile, n-tile)
// pairs (persistent grid).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "epmoe/error.h"
#include "epmoe/quant.h"
#include "epmoe/tensor.h"

namespace epmoe::cuda {

struct MTile {
  int32_t expert, row0, rows;
  int32_t walk;  // the decode engines' walk order (tile_tables::walk_tag); 0: row-major
};

struct GemmArgs {
  const bf16_raw* A = nullptr;  // [rows][K]
  int K = 0;
  MatrixView W;                 // [E][rows_w][K], on the device
  // fused = true (GEMM1): W is W13 [2I][K]; out[r][j] = bf16(silu(g) * u), j < N = I.
  // fused = false (GEMM2): out[r][n] = bf16(A W^T), n < N = rows_w.
  bool fused = false;
  int N = 0;
  bf16_raw* out = nullptr;      // [rows][N]
  const MTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;  // device scalar
  int max_tiles = 0;                   // upper bound of *num_tiles (sizes the grid)
  // fp8 activations for the wgmma fp8 engine: e4m3 [rows][K] and fp32 scales per 128-block of K,
  // stored transposed, a_scales[kb * a_scales_ld + row], so one stage reads its tokens' scales
  // from one contiguous run.
  const uint8_t* A8 = nullptr;
  const float* a_scales = nullptr;
  int64_t a_scales_ld = 0;
  // Decode wgmma engine (bf16, fp8) only: token row r (of rows [0, num rows)) is row a_rows[r] of A
  // / A8, e.g. the dispatch buffer itself with launch_count_claim's src_rows, instead of row r of a
  // permuted copy; with A8 its scales are then the dispatch's row-major ones, a_scales[a_rows[r] *
  // a_scales_ld + kb]. The other engines reject it.
  const int32_t* a_rows = nullptr;
  // nvfp4 decode engine, fused GEMM1: write the output in that engine's K order (kperm_nvfp4_tokens)
  // because GEMM2 runs on it too.
  bool out_kperm = false;
  // Decode wgmma engine (bf16, fp8): its deferred-wait pipeline (true, Tuning::wgmma_defer's
  // default) or the plain one; the same results bitwise (engine_wgmma.cuh).
  bool wgmma_defer = true;
  // Decode wgmma engine (bf16, fp8): launched with programmatic dependent launch (tuning.pdl,
  // core/cuda/pdl.cuh); the other engines ignore it. The same results.
  bool pdl = false;
};

// The engines that read A by row index (all but the decode wgmma bf16 / fp8 ones) call this:
// UsageError where a.a_rows is set.
inline void check_no_a_rows(const GemmArgs& a, const char* engine) {
  if (a.a_rows)
    throw UsageError(std::string(engine) + ": GemmArgs::a_rows is read by the decode wgmma bf16 / fp8 engines only; " +
                     "give this engine a permuted A");
}

// BM = rows per m-tile: 32 (decode: few rows per expert) or 128.
void launch_grouped_gemm_bf16(const GemmArgs& a, int bm, cudaStream_t stream);
void launch_grouped_gemm_fp8(const GemmArgs& a, int bm, cudaStream_t stream);
void launch_grouped_gemm_nvfp4(const GemmArgs& a, int bm, cudaStream_t stream);

// Decode engine (m-tiles of 32 rows only): Hopper wgmma with the weights as the M operand.
// bf16: W bf16 x A bf16. fp8: W fp8 (128x128 tile scales) x A8 e4m3 (per-128 scales), promoted
// in fp32 per 128-K block. See engine_wgmma.cuh.
void launch_grouped_gemm_wgmma_bf16(const GemmArgs& a, cudaStream_t stream);
void launch_grouped_gemm_wgmma_fp8(const GemmArgs& a, cudaStream_t stream);
// Their pipeline is GemmArgs::wgmma_defer (the runner passes MoeConfig::tuning.wgmma_defer).
// nvfp4: W nvfp4 (e4m3 block-16 scales, per-expert global scale) x A bf16, the weights decoded to
// bf16 in registers as wgmma's A operand (engine_wgmma_nvfp4.cu). Needs K % 128 == 0 (and N % 64
// for the fused GEMM1), K % 64 == 0 on prepared weights (their engines run a last half stage):
// wgmma_nvfp4_supports says whether a GEMM qualifies. A must be in the
// engine's K order: rows rewritten by kperm_nvfp4_tokens, or GEMM1 output with out_kperm.
void launch_grouped_gemm_wgmma_nvfp4(const GemmArgs& a, cudaStream_t stream);
bool wgmma_nvfp4_supports(int K, int N, bool fused, bool prepared = false);
// In place: the rows [0, offsets[E-1] + cnt[E-1]) of A [max_rows][K] into the nvfp4 engine's K
// order (per 64-K block, natural 4-byte word 8t + m to word 4m + t). K % 64 == 0.
void kperm_nvfp4_tokens(bf16_raw* A, const int32_t* offsets, const int32_t* cnt, int E, int K, int64_t max_rows,
                        cudaStream_t stream);
// The same engine on prepared weights (W.prepared, engine_wgmma_nvfp4_prepared.cu): bitwise the same
// results, the weights loaded straight into registers. prepare_nvfp4_weights writes the prepared
// copy of one matrix, nvfp4_prepared_bytes(m, fused, N) bytes at `out` (W13: fused, N = I; W2:
// N = H), on `stream`; shapes wgmma_nvfp4_supports rejects throw UsageError.
void launch_grouped_gemm_wgmma_nvfp4_prepared(const GemmArgs& a, cudaStream_t stream);
size_t nvfp4_prepared_bytes(const MatrixView& m, bool fused, int N);
void prepare_nvfp4_weights(const MatrixView& m, bool fused, int N, void* out, cudaStream_t stream);
// The same engine with token tiles of up to kWgmmaWideBlockM rows, each running the narrowest wgmma width that
// covers its rows (engine_wgmma_nvfp4_wide.cu): many rows per expert. Prepared weights, tile table
// of kWgmmaWideBlockM rows; the same arithmetic, so the same bits as the 32-row engines.
// tile_rows: the tile table's m-tile, kWgmmaWideBlockM or kWgmmaWide160BlockM (an expert of 129-160
// rows in one tile, one decode of its weights instead of two). By rows (tuning.nvfp4_wide_rows = 0)
// the runner calls it once per table of launch_count (rows.h), 128 then 160.
void launch_grouped_gemm_wgmma_nvfp4_wide(const GemmArgs& a, int tile_rows, cudaStream_t stream);
constexpr int kWgmmaBlockM = 32;
constexpr int kWgmmaWideBlockM = 128;
constexpr int kWgmmaWide160BlockM = 160;

inline void launch_grouped_gemm(const GemmArgs& a, int bm, cudaStream_t stream) {
  switch (a.W.format) {
    case WeightFormat::bf16: return launch_grouped_gemm_bf16(a, bm, stream);
    case WeightFormat::fp8: return launch_grouped_gemm_fp8(a, bm, stream);
    case WeightFormat::nvfp4: return launch_grouped_gemm_nvfp4(a, bm, stream);
  }
}

}  // namespace epmoe::cuda
