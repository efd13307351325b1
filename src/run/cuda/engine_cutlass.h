// The CUTLASS engine of the "cuda" runner: Hopper grouped GEMMs (wgmma + TMA, warp-specialized,
// persistent, one GEMM per local expert) for large M, where the mma.sync engine of engine_mma.cuh
// is far from the tensor-core peak.
//
// Shapes never reach the host: a small device kernel turns the runner's device counts/offsets into
// CUTLASS's per-group tables (problem shapes, pointers, strides, scale pointers) in a workspace, and
// the grouped kernel reads them there (GroupProblemShape with device shapes, no host shapes), so the
// whole engine is CUDA-graph capturable.
//
// Instantiations, one per .cu so that they build in parallel:
//   engine_cutlass_bf16.cu: bf16 x bf16 -> bf16, fp32 accumulation (tile 128x256x64, cluster 2x1;
//                    engine_cutlass_bf16.cuh, shared with the SwiGLU forms _swiglu.cu and _glu.cu);
//   engine_cutlass_fp8.cu : e4m3 x e4m3 -> bf16 with DeepSeek block scales (A: 1x128 fp32 per row,
//                    B: 128x128 fp32 tiles), promoted into fp32 every 128 of K (tile 128x128x128,
//                    cluster 2x1).
// Both clusters pair two m-tiles of one expert, so each weight tile is multicast to both.
//   swiglu_pass.cu: the SwiGLU pass between the GEMMs (no CUTLASS code; declared below).
//   engine_cutlass_swap_{bf16,fp8}{,_n128,_n192}.cu, engine_cutlass_swap_fp8_n96.cu
//                    (engine_cutlass_swap.cuh): the same products
//                    swapped (swap-AB, Grouped::swap_ab): CUTLASS computes out_e^T = W_e * A_e^T, so
//                    the weights' output dimension N is CUTLASS's M (128-row tiles) and the expert's
//                    rows are its N (64-, 128- or 192-wide tiles, Grouped::swap_tile_n). Made for few rows per
//                    expert, where a 128-row token tile (and its cluster partner) would mostly
//                    multiply padding: there each weight tile is streamed about once. No
//                    transposes: A = W [N][K] and B = the rows [rows][K] are both K-major as stored,
//                    and D = out^T [N x rows] column-major is out [rows][N] row-major.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "epmoe/error.h"
#include "epmoe/format.h"
#include "epmoe/numeric.h"  // EPMOE_HD
#include "epmoe/tensor.h"
#include "run/cuda/engine.h"

namespace epmoe::cuda::cutlass_engine {

// True when the library was built with the CUTLASS headers (EPMOE_WITH_CUTLASS); otherwise every
// entry point below throws UsageError.
bool available();

// Whether a swap-AB instantiation with token tiles `tile_n` wide exists (engine_cutlass_swap_*.cu):
// 64, 128 and 192, and for fp8 also 96 (its 192-wide tile spills).
constexpr bool swap_tile_exists(int tile_n, bool fp8) {
  return tile_n == 64 || tile_n == 128 || tile_n == 192 || (fp8 && tile_n == 96);
}

// Ranges of rows per expert, lo[i] <= rows <= hi[i] for some i < n: the experts one launch of a
// split GEMM runs (Grouped::ranges), or those a SwiGLU pass leaves (SwigluSkip). The default holds
// every expert; none() holds none.
struct RowRanges {
  static constexpr int kMax = 8;
  int n = 1;
  int lo[kMax] = {0};
  int hi[kMax] = {0x7fffffff};
  static RowRanges none() {
    RowRanges r;
    r.n = 0;
    return r;
  }
  static RowRanges one(int lo, int hi) {
    RowRanges r;
    r.lo[0] = lo;
    r.hi[0] = hi;
    return r;
  }
  // Appends [lo_, hi_]; throws UsageError past kMax ranges.
  void add(int lo_, int hi_) {
    if (n >= kMax) throw UsageError("cutlass row ranges: more than " + std::to_string(kMax) + " ranges in one launch");
    lo[n] = lo_;
    hi[n] = hi_;
    ++n;
  }
  // Over all kMax entries with constant indices: a loop to n indexed lo / hi with a run-time index,
  // so kernels taking the ranges as a parameter copied them to local memory (88 bytes per thread in
  // the SwiGLU pass with a skip, SASS).
  EPMOE_HD bool contains(int rows) const {
    bool in = false;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kMax; ++i) in |= i < n && rows >= lo[i] && rows <= hi[i];
    return in;
  }
};

// out_e[rows_e][N] = A_e[rows_e][K] * W_e[N][K]^T for every local expert e, rows of all experts
// packed by expert in A and out (expert e's rows start at offsets[e]).
struct Grouped {
  int experts = 0, N = 0, K = 0;
  const int32_t* rows = nullptr;     // [E] on the device
  const int32_t* offsets = nullptr;  // [E] on the device
  const void* A = nullptr;           // [rows][K]: bf16, or e4m3 for the fp8 GEMM
  const float* sfa = nullptr;        // fp8: [rows][ceil(K/128)] fp32 (one scale per row and 128 of K)
  const void* W = nullptr;           // [E][N][K]: bf16, or e4m3
  const float* sfw = nullptr;        // fp8: [E][ceil(N/128)][ceil(K/128)] fp32 (MatrixView's tile scales)
  bf16_raw* out = nullptr;           // [rows][N], with `halves` [rows][2N]
  // Per-group factor of the fp32 accumulator before the bf16 store, alpha[e] for group e (device,
  // [experts]); null = 1. The runner passes 1/global_scale of widened nvfp4 weights here. It is a
  // runtime argument of the existing epilogue (LinearCombination's alpha_ptr with an L stride of
  // 1), so it costs no extra CUTLASS instantiation.
  const float* alpha = nullptr;
  // Elements between two experts' weight matrices; 0 = N * K. GEMM1 run as its gate and up halves
  // (grouped_gemm_bf16_swiglu) passes 2I * H with N = I.
  int64_t w_expert_stride = 0;
  // Two groups per expert, 2e + h = half h (N rows, its own ceil(N/128) scale tile rows) of
  // expert e's [2N][K] weights, written to output columns [hN, hN + N) of [rows][2N]: a W13 whose
  // scale grid splits at I (I % 128 != 0) with N = I gives the [rows][2I] of one N = 2I GEMM.
  // The workspace is then sized for 2 * experts groups; alpha must be null.
  bool halves = false;
  // grouped_gemm_bf16_swiglu only: the gate [rows][N] bf16, read by the epilogue as its source.
  const bf16_raw* src = nullptr;
  void* workspace = nullptr;         // *_workspace_bytes(experts, sms) bytes, 256-byte aligned
  int sms = 0;                       // multiprocessors of the device (persistent grid)
  // grouped_gemm_bf16_glu sets it for its tables: N is I, the problem 2I wide (W13's gate and up
  // rows), out [rows][I]. The caller sets it for grouped_gemm_nvfp4w's SwiGLU form (the same).
  bool glu = false;
  // grouped_gemm_bf16 / grouped_gemm_fp8 run their swap-AB instantiation (the same product; the
  // workspace then needs *_swap_workspace_bytes). Not with src (the SwiGLU GEMM is not swapped).
  bool swap_ab = false;
  int swap_tile_n = 64;  // swapped: rows of an expert per tile, 64, 128 or 192
  // Only the experts whose rows[e] fall in one of these ranges run (the others get no tiles): the
  // runner splits one GEMM into launches by rows per expert, each with the tile that fits those
  // rows (policy::RowBucket, policy::bucket_launches). Decided on the device, from the device counts.
  RowRanges ranges;
  // The table fill and the GEMM launched with programmatic dependent launch (core/cuda/pdl.cuh):
  // each may be scheduled while the kernel before it in the stream finishes, and waits for it
  // before its first global access (the GEMM through detail::gemm_kernel, which waits and then runs
  // CUTLASS's kernel). The same bits. The runner sets it from tuning.pdl.
  bool pdl = false;
  // Also write the tables of `pair` in this call's table fill: another GEMM of the same
  // instantiation (the same entry point, flags and tile; its own workspace, rows and pointers),
  // whose own call then sets tables_filled and launches only its GEMM. The runner pairs each
  // launch of a split GEMM2 with GEMM1's launch of the same tile: GEMM2's tables depend only on
  // the counts and its pointers, so one fill kernel per tile writes both (runner_cutlass.cu). A
  // head launch (Part) pairs its tail, whose own `pair` may be the mid launch: one fill for all
  // three (kMaxFill tables at most).
  const Grouped* pair = nullptr;
  // The tables in `workspace` were written by an earlier call's fill (as its `pair`): no fill.
  bool tables_filled = false;
  // Which of an expert's rows this launch takes (the mixed-input GEMMs at 256-wide tiles under
  // uneven loads). An expert's rows past its last multiple of kPartRows (all of them under
  // kPartRows) go to the tail launch (64-wide tiles) where there are at most kPartTail, to the mid
  // launch (128-wide; only where `with_mid`, set alike in all three) where there are at most
  // kPartMid, else to the head with the rest; the head takes the multiples. A tail or mid tile
  // after a head tile decodes the expert's weights again, which costs ~0.61 (64 wide) and ~0.74
  // (128 wide) of a 256-wide tile, still less than a second 256-wide one; an expert of at most 128
  // rows has no head tile, so nothing is decoded twice (bench/results/history-runner.md, session
  // 40). `all`: every row, one launch.
  enum class Part { all, head, tail, mid };
  static constexpr int kPartRows = 256, kPartTail = 64, kPartMid = 128, kMaxFill = 3;
  Part part = Part::all;
  bool with_mid = false;
  // The launch of an expert's rows past its last multiple of kPartRows, `rem` of them.
  static constexpr Part remainder_part(int rem, bool with_mid) {
    return rem == 0 || rem > (with_mid ? kPartMid : kPartTail) ? Part::head
           : rem <= kPartTail                                  ? Part::tail
                                                               : Part::mid;
  }
  // Of an expert's m rows, those launch `part` takes (`rows`) and the rows before them (`skip`):
  // the table fill's rule, also what `bench runner --dry-run` counts.
  struct PartRows {
    int skip, rows;
  };
  static constexpr PartRows part_rows(int m, Part part, bool with_mid) {
    if (part == Part::all) return {0, m};
    const int rem = m % kPartRows;
    const Part owner = remainder_part(rem, with_mid);
    if (part == Part::head) return {0, owner == Part::head ? m : m - rem};
    return {m - rem, owner == part ? rem : 0};
  }
};

size_t bf16_workspace_bytes(int experts, int sms);
void grouped_gemm_bf16(const Grouped& g, cudaStream_t stream);
// The up half of GEMM1 with SwiGLU in its epilogue: out = bf16(silu(src) * alpha[e] * acc), src
// being the gate half already run by grouped_gemm_bf16 (bf16, as the unfused pass reads it); the
// up half is not rounded before the product. silu(g) = g / (1 + exp(-g)) with the fast exp, as
// every other engine computes it (engine_cutlass_swiglu.cu).
size_t swiglu_workspace_bytes(int experts, int sms);
void grouped_gemm_bf16_swiglu(const Grouped& g, cudaStream_t stream);
// GEMM1 and SwiGLU as one grouped GEMM (engine_cutlass_glu.cu): out [rows][N] = bf16(silu(g) * u),
// g and u the bf16-rounded products of A with W's gate rows [0, N) and up rows [N, 2N) (W is
// [E][2N][K]); the same bits as grouped_gemm_bf16 with 2N columns followed by swiglu. Needs
// glu_fits(N) (each tile holds 128 intermediate columns), bf16 weights and no alpha, halves,
// swap-AB or source.
constexpr bool glu_fits(int intermediate) { return intermediate % 128 == 0; }
size_t glu_workspace_bytes(int experts, int sms);
void grouped_gemm_bf16_glu(const Grouped& g, cudaStream_t stream);
// The fp8 form (engine_cutlass_glu_fp8.cu): the same product from e4m3 rows and W13 with their
// block scales, out [rows][N] bf16 with the bits of grouped_gemm_fp8 over 2N columns followed by
// swiglu's bf16 intermediate. Its 128x128 tiles hold 64 intermediate columns each (128 columns with
// the blockwise promotion's two accumulator sets would not fit in registers), so a tile's gate and
// up halves may lie in different 128-row scale tiles: the mainloop takes one weight scale per 64
// rows, and g.sfw must be W13's scales as glu_fp8_scales reorders them. Needs glu_fp8_fits(N),
// fp8 weights and no alpha, halves, swap-AB or source.
constexpr bool glu_fp8_fits(int intermediate) { return intermediate % 64 == 0; }
size_t glu_fp8_workspace_bytes(int experts, int sms);
void grouped_gemm_fp8_glu(const Grouped& g, cudaStream_t stream);
// W13's tile scales (per half, [E][2][ceil(I/128)][kb], kb = ceil(K/128): one grid over 2I rows
// where I % 128 == 0) to the fp8 GLU's [E][2I/64][kb], row 2n + h being the scale of the 64 rows of
// half h starting at intermediate column 64n; `out` holds E * (2I/64) * kb floats.
void glu_fp8_scales(const float* sfw, int E, int I, int K, float* out, cudaStream_t stream, bool pdl = false);
size_t fp8_workspace_bytes(int experts, int sms);
// Needs K % 16 == 0 (16-byte TMA rows). A last partial 128-block of K or of N is its own scale
// block: TMA fills the codes past K with zeros, and the scale loads past N are predicated off, so
// the partial tile computes exactly its own elements. A W13 whose scale grid splits at I with
// I % 128 != 0 has a tile row holding two blocks; it runs as its two halves (runner_cutlass.cu).
void grouped_gemm_fp8(const Grouped& g, cudaStream_t stream);
// The argument checks of both fp8 GEMMs (UsageError naming the field).
void check_fp8(const Grouped& g, const char* what);

// Swap-AB instantiations (engine_cutlass_swap_bf16.cu, engine_cutlass_swap_fp8.cu), reached through
// grouped_gemm_bf16 / grouped_gemm_fp8 with g.swap_ab; same arguments and limits. The fp8 one keeps
// the block scales as they are: the weights' 128x128 tiles become CUTLASS's A scales (granularity
// 128 in M and K), the rows' 1x128 groups its B scales (granularity 1 in N, 128 in K), both K-major.
// g.swap_tile_n picks the instantiation (64, 128 or 192; anything else throws UsageError).
size_t bf16_swap_workspace_bytes(int experts, int sms, int tile_n);
void grouped_gemm_bf16_swap(const Grouped& g, cudaStream_t stream);
size_t fp8_swap_workspace_bytes(int experts, int sms, int tile_n);
void grouped_gemm_fp8_swap(const Grouped& g, cudaStream_t stream);
namespace detail {  // the 128- and 192-wide instantiations (engine_cutlass_swap_*_n{128,192}.cu)
size_t bf16_swap_n128_workspace_bytes(int experts, int sms);
void grouped_gemm_bf16_swap_n128(const Grouped& g, cudaStream_t stream);
size_t fp8_swap_n128_workspace_bytes(int experts, int sms);
void grouped_gemm_fp8_swap_n128(const Grouped& g, cudaStream_t stream);
size_t bf16_swap_n192_workspace_bytes(int experts, int sms);
void grouped_gemm_bf16_swap_n192(const Grouped& g, cudaStream_t stream);
size_t fp8_swap_n192_workspace_bytes(int experts, int sms);
size_t fp8_swap_n96_workspace_bytes(int experts, int sms);
void grouped_gemm_fp8_swap_n96(const Grouped& g, cudaStream_t stream);
void grouped_gemm_fp8_swap_n192(const Grouped& g, cudaStream_t stream);
}  // namespace detail

// fp8 weights x bf16 rows with the weights decoded in the main loop, no widened copy
// (engine_cutlass_fp8w.cuh): out [rows][N] = A (bf16) * bf16(e4m3 W * its tile scale)^T, the bits
// of widen::to_bf16 followed by grouped_gemm_bf16. Swapped (the weights are CUTLASS's register
// operand), token tiles g.swap_tile_n = 64, 128 or 256 wide. g.sfw holds the row scales
// expand_fp8_scales writes; g.sfa, alpha, halves, glu and src must be unset. Needs K % 16 == 0
// and N % 8 == 0 (UsageError otherwise).
constexpr bool fp8w_tile_exists(int tile_n) { return tile_n == 64 || tile_n == 128 || tile_n == 256; }
// Throws unless fp8w_tile_exists(tile_n); `what` names the GEMM ("fp8-weight", "nvfp4-weight"):
// both mixed-input GEMMs have these token tiles.
inline void mixed_check_tile(int tile_n, const char* what) {
  if (!fp8w_tile_exists(tile_n))
    throw UsageError(std::string("cutlass ") + what + " grouped GEMM: swap_tile_n=" + std::to_string(tile_n) +
                     " has no instantiation; use 64, 128 or 256");
}
// The shape rules both mixed-input GEMMs share: a token tile they have, 16-byte TMA rows of their
// one-byte weights (K % 16) and of the bf16 output (N % 8).
inline void mixed_check_shape(const Grouped& g, const char* what) {
  mixed_check_tile(g.swap_tile_n, what);
  if (g.K % 16 != 0)
    throw UsageError(std::string("cutlass ") + what + " grouped GEMM: K=" + std::to_string(g.K) +
                     " must be a multiple of 16 (16-byte TMA rows of one-byte weights)");
  if (g.N % 8 != 0)
    throw UsageError(std::string("cutlass ") + what + " grouped GEMM: N=" + std::to_string(g.N) +
                     " must be a multiple of 8 (16-byte TMA rows of the bf16 output and of fp8 row scales)");
}
size_t fp8w_workspace_bytes(int experts, int sms, int tile_n);
void grouped_gemm_fp8w(const Grouped& g, cudaStream_t stream);
// fp8 weights' tile scales [E][tiles][kb] (MatrixView::scales; a W13 stored as two halves of
// half_rows = I rows has its grid restart at row I, a single grid passes half_rows = N) to one
// scale per weight row and 128 of K, [E][kb][N] with the rows contiguous: fp8w_scales_bytes.
size_t fp8w_scales_bytes(int E, int N, int K);
void expand_fp8_scales(const float* sfw, int E, int N, int K, int half_rows, float* out, cudaStream_t stream);
namespace detail {  // engine_cutlass_fp8w_n{64,128}.cu
size_t fp8w_n64_workspace_bytes(int experts, int sms);
void grouped_gemm_fp8w_n64(const Grouped& g, cudaStream_t stream);
size_t fp8w_n128_workspace_bytes(int experts, int sms);
void grouped_gemm_fp8w_n128(const Grouped& g, cudaStream_t stream);
}  // namespace detail

// nvfp4 weights x bf16 rows with the weights decoded in the main loop (engine_cutlass_nvfp4w.cuh):
// out [rows][N] = A (bf16) * (e2m1 W * its block scale)^T * alpha[e], alpha = 2^8 / gs (the
// decoded weights carry 2^-8; widen::inverse_scales with factor 256): the bits of widen::to_bf16
// followed by the swapped grouped_gemm_bf16 with alpha 1/gs. g.W is the paired copy
// (write_nvfp4_paired), token tiles g.swap_tile_n = 64, 128 or 256 (fp8w_tile_exists); g.sfa,
// g.sfw, halves and src must be unset. Needs K % 16 == 0 and N % 8 == 0 (UsageError otherwise).
// With g.glu, GEMM1 with SwiGLU in its epilogue: g.W is W13's paired copy in GLU order
// (write_nvfp4_paired with glu_order), N = I, out the intermediate [rows][I] = bf16(silu(g) * u),
// g and u the bf16-rounded products (times alpha) -- the bits of the plain GEMM over 2I columns
// followed by swiglu's bf16 intermediate (nvfp4w::GluOp).
size_t nvfp4w_workspace_bytes(int experts, int sms, int tile_n, bool glu = false);
void grouped_gemm_nvfp4w(const Grouped& g, cudaStream_t stream);
// The paired copy (nvfp4_paired.h) of nvfp4 matrix m: [experts][rows][cols] bytes, two per pair of
// weights (both codes and their block scale). out 16-byte aligned; cols % 16 == 0. A NaN block
// scale, which the copy cannot hold, sets the device int *nan_seen to 1 (the copy is then unusable).
// glu_order (a W13, rows = 2I, I % 8 == 0): rows in nvfp4_paired::glu_row's order, for g.glu.
size_t nvfp4_paired_bytes(const MatrixView& m);
void write_nvfp4_paired(const MatrixView& m, uint8_t* out, int* nan_seen, cudaStream_t stream,
                        bool glu_order = false);
namespace detail {  // engine_cutlass_nvfp4w_n{64,128}.cu, engine_cutlass_nvfp4w_glu{,_n64,_n128}.cu
size_t nvfp4w_n64_workspace_bytes(int experts, int sms);
void grouped_gemm_nvfp4w_n64(const Grouped& g, cudaStream_t stream);
size_t nvfp4w_n128_workspace_bytes(int experts, int sms);
void grouped_gemm_nvfp4w_n128(const Grouped& g, cudaStream_t stream);
size_t nvfp4w_glu_workspace_bytes(int experts, int sms, int tile_n);
void grouped_gemm_nvfp4w_glu(const Grouped& g, cudaStream_t stream);
size_t nvfp4w_glu_n64_workspace_bytes(int experts, int sms);
void grouped_gemm_nvfp4w_glu_n64(const Grouped& g, cudaStream_t stream);
size_t nvfp4w_glu_n128_workspace_bytes(int experts, int sms);
void grouped_gemm_nvfp4w_glu_n128(const Grouped& g, cudaStream_t stream);
}  // namespace detail

// The experts a SwiGLU pass leaves alone: those whose row count lies in `fused` (none by default),
// whose GEMM1 launch (grouped_gemm_bf16_glu over those ranges) wrote their intermediate rows
// already. The pass then walks the experts' 128-row m-tiles (tiles, num_tiles: launch_count's
// table at bm 128) instead of the rows, to know each row's expert.
struct SwigluSkip {
  RowRanges fused = RowRanges::none();
  const MTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
};

// h [rows][2I] bf16 (gate | up) -> a = bf16(silu(g) * u) [rows][I]; rows = offsets[E-1] + cnt[E-1]
// (read on the device), max_rows bounds it. Then, when fp8_round_trip, the fp8 block-128 round trip
// of the runner's intermediate_quant = fp8 (a stays bf16). When a8 is non-null instead, a is
// quantized to e4m3 [rows][I] with fp32 scales [rows][I/128] (same block rule) for the fp8 GEMM2.
// With `skip` (skip.fused.n > 0; needs I % 8 == 0 and 16-byte aligned h and a) the rows of the
// experts it names are neither read nor written; the others get the same bytes as without it.
void swiglu(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I, int64_t max_rows,
            bool fp8_round_trip, bool ue8m0, bf16_raw* a, uint8_t* a8, float* sfa8, cudaStream_t stream,
            const SwigluSkip& skip = {}, bool pdl = false);
// The fp8 form's second half: an intermediate h [rows][I] that is bf16 already (grouped_gemm_fp8_glu)
// to e4m3 codes a8 [rows][I] and scales sfa8 [rows][I/128], the bytes swiglu writes from the same
// values. Needs I % 16 == 0, 16-byte aligned h and 8-byte aligned a8.
void quantize_intermediate(const bf16_raw* h, const int32_t* offsets, const int32_t* cnt, int E, int I,
                           int64_t max_rows, bool ue8m0, uint8_t* a8, float* sfa8, cudaStream_t stream,
                           bool pdl = false);

}  // namespace epmoe::cuda::cutlass_engine

// ---- shared implementation of the two instantiations (engine_cutlass_bf16.cu, engine_cutlass_fp8.cu) ----
// Only those files define EPMOE_CUTLASS_GROUPED_IMPL (and have the CUTLASS include directory).
#if defined(EPMOE_CUTLASS_GROUPED_IMPL) && defined(EPMOE_WITH_CUTLASS)
#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <type_traits>
#include <string>

#include "core/cuda/check.h"
#include "core/cuda/pdl.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "epmoe/error.h"

namespace epmoe::cuda::cutlass_engine::detail {

// Per-group tables CUTLASS reads on the device, carved out of the caller's workspace.
// kSwap: CUTLASS's A is the weights and its B the rows (swap-AB, Grouped::swap_ab); a, b, sfa, sfb
// and the strides are CUTLASS's operands, whichever of ours they hold.
// kMixed (needs kSwap): the mixed-input GEMM (engine_cutlass_fp8w.cuh), whose A carries one scale
// per weight row and 128 of K: sfs[g] points at the group's [kb][N] scales, ds[g] is their stride.
template <class Gemm, bool kScaled, bool kSource = false, bool kSwap = false, bool kMixed = false>
struct Tables {
  using Kernel = typename Gemm::GemmKernel;
  using Shape3 = typename Kernel::ProblemShape::UnderlyingProblemShape;
  using EA = typename Kernel::ElementA;
  using EB = typename Kernel::ElementB;
  using ED = typename Kernel::ElementD;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  // The epilogue's source C (grouped_gemm_bf16_swiglu); placeholders otherwise.
  using EC = cute::conditional_t<kSource, typename Kernel::ElementC, bf16_raw>;
  using StrideC = cute::conditional_t<kSource, typename Kernel::InternalStrideC, int64_t>;
  static constexpr bool scaled = kScaled, source = kSource, swap = kSwap, mixed = kMixed;
  // The mixed-input mainloop's scale stride: (1, N, 0), weight rows contiguous.
  using StrideS = cute::Stride<cute::Int<1>, int64_t, int64_t>;
  using ERows = cute::conditional_t<kSwap, EB, EA>;  // element of our rows operand
  using EW = cute::conditional_t<kSwap, EA, EB>;     // element of the weights
  static_assert(!(kSource && kSwap), "the SwiGLU epilogue's source is laid out for the unswapped product");
  static_assert(!kMixed || (kSwap && !kScaled && !kSource), "the mixed-input GEMM is swapped, its own scales");

  Shape3* shapes;
  const EA** a;
  const EB** b;
  ED** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  const float** sfa;
  const float** sfb;
  const EC** c;
  StrideC* sc;
  const float** sfs;
  StrideS* ds;
  // Whether any group of this launch has rows (fill_tables; 1 when it cannot tell): gemm_kernel
  // returns at once where none has, before CUTLASS's prologue.
  int* active;

  static size_t round(size_t n) { return (n + 255) / 256 * 256; }
  static size_t bytes(int E) {
    return round(sizeof(Shape3) * E) + 3 * round(sizeof(void*) * E) + round(sizeof(StrideA) * E) +
           round(sizeof(StrideB) * E) + round(sizeof(StrideD) * E) + (kScaled ? 2 * round(sizeof(void*) * E) : 0) +
           (kSource ? round(sizeof(void*) * E) + round(sizeof(StrideC) * E) : 0) +
           (kMixed ? round(sizeof(void*) * E) + round(sizeof(StrideS) * E) : 0) + round(sizeof(int));
  }
  static Tables carve(void* ws, int E) {
    uint8_t* p = static_cast<uint8_t*>(ws);
    auto take = [&](size_t n) {
      uint8_t* q = p;
      p += round(n);
      return q;
    };
    Tables t{};
    t.shapes = reinterpret_cast<Shape3*>(take(sizeof(Shape3) * E));
    t.a = reinterpret_cast<const EA**>(take(sizeof(void*) * E));
    t.b = reinterpret_cast<const EB**>(take(sizeof(void*) * E));
    t.d = reinterpret_cast<ED**>(take(sizeof(void*) * E));
    t.sa = reinterpret_cast<StrideA*>(take(sizeof(StrideA) * E));
    t.sb = reinterpret_cast<StrideB*>(take(sizeof(StrideB) * E));
    t.sd = reinterpret_cast<StrideD*>(take(sizeof(StrideD) * E));
    if constexpr (kScaled) {
      t.sfa = reinterpret_cast<const float**>(take(sizeof(void*) * E));
      t.sfb = reinterpret_cast<const float**>(take(sizeof(void*) * E));
    }
    if constexpr (kSource) {
      t.c = reinterpret_cast<const EC**>(take(sizeof(void*) * E));
      t.sc = reinterpret_cast<StrideC*>(take(sizeof(StrideC) * E));
    }
    if constexpr (kMixed) {
      t.sfs = reinterpret_cast<const float**>(take(sizeof(void*) * E));
      t.ds = reinterpret_cast<StrideS*>(take(sizeof(StrideS) * E));
    }
    t.active = reinterpret_cast<int*>(take(sizeof(int)));
    return t;
  }
};

// Whether two instantiations' tables have one layout (every element and stride type alike), so
// that one fill may write both (a head launch's fill writing its tail's, Grouped::Part).
template <class G1, class G2, bool kScaled, bool kSource = false, bool kSwap = false, bool kMixed = false>
constexpr bool same_tables() {
  using A = Tables<G1, kScaled, kSource, kSwap, kMixed>;
  using B = Tables<G2, kScaled, kSource, kSwap, kMixed>;
  return std::is_same_v<typename A::Shape3, typename B::Shape3> && std::is_same_v<typename A::EA, typename B::EA> &&
         std::is_same_v<typename A::EB, typename B::EB> && std::is_same_v<typename A::ED, typename B::ED> &&
         std::is_same_v<typename A::StrideA, typename B::StrideA> &&
         std::is_same_v<typename A::StrideB, typename B::StrideB> &&
         std::is_same_v<typename A::StrideD, typename B::StrideD> && std::is_same_v<typename A::EC, typename B::EC> &&
         std::is_same_v<typename A::StrideC, typename B::StrideC>;
}

// One thread per group (an expert, or with `halves` a half of one): shapes (the expert's rows may
// be 0: the scheduler gives it no tiles; an expert outside `ranges` is given 0 rows, so that it
// runs in another launch), t.active (whether any group has rows),
// row-major A/D and K-major W pointers and strides, and the scale pointers. Swapped, the problem is
// (N, rows, K) with the weights as CUTLASS's A, the rows as its B and D column-major (stride N
// between rows), i.e. the same bytes.
// Up to this many groups fill_tables runs as one block (DeepSeek-V3's 256 experts as halves), so
// that it can tell whether any group of the launch has rows.
constexpr int kFillOneBlock = 512;
// What fill_tables writes one launch's tables from (a Grouped, on the device).
struct FillArgs {
  int E, N, K;
  const int32_t* rows;
  const int32_t* offsets;
  RowRanges ranges;
  const void* A;
  const float* sfa;
  const void* W;
  int64_t w_stride;
  const float* sfw;
  const bf16_raw* src;
  bf16_raw* out;
  bool halves, glu;
  Grouped::Part part;
  bool with_mid;
};
inline FillArgs fill_args(const Grouped& g) {
  const int64_t w_stride =
      g.w_expert_stride ? g.w_expert_stride : int64_t(g.N) * g.K * (g.halves || g.glu ? 2 : 1);
  return FillArgs{g.experts, g.N,  g.K,   g.rows, g.offsets, g.ranges, g.A,      g.sfa,
                  g.W,       w_stride, g.sfw, g.src,  g.out,     g.halves, g.glu, g.part, g.with_mid};
}
template <class T>
__device__ void fill_one(const T& t, const FillArgs& a) {
  const int E = a.E, N = a.N, K = a.K;
  const int32_t* __restrict__ rows = a.rows;
  const int32_t* __restrict__ offsets = a.offsets;
  const RowRanges& ranges = a.ranges;
  const void* A = a.A;
  const float* sfa = a.sfa;
  const void* W = a.W;
  const int64_t w_stride = a.w_stride;
  const float* sfw = a.sfw;
  const bf16_raw* src = a.src;
  bf16_raw* out = a.out;
  const bool halves = a.halves, glu = a.glu;
  const int grp = blockIdx.x * blockDim.x + threadIdx.x;
  const bool in = grp < (halves ? 2 * E : E);
  const int e = halves ? grp >> 1 : grp, h = halves ? grp & 1 : 0;
  const int rows_e = in ? rows[e] : 0;
  // This launch's rows of the expert and the rows before them (Grouped::Part).
  const Grouped::PartRows part = Grouped::part_rows(ranges.contains(rows_e) ? rows_e : 0, a.part, a.with_mid);
  const int m = part.rows, skip = part.skip;
  // One block sees every group (kFillOneBlock): whether any has rows. Several blocks cannot
  // tell without a second pass, so they keep the launch (1).
  if (gridDim.x == 1) {
    const int any = __syncthreads_or(m > 0);
    if (threadIdx.x == 0) *t.active = any;
  } else if (grp == 0) {
    *t.active = 1;
  }
  if (!in) return;
  const int64_t out_ld = halves ? 2 * int64_t(N) : N;  // glu: [rows][N] out of a 2N-wide problem
  const int64_t off = offsets[e] + skip;
  const auto* rows_ptr = static_cast<const typename T::ERows*>(A) + off * K;
  const auto* w_ptr = static_cast<const typename T::EW*>(W) + int64_t(e) * w_stride + int64_t(h) * N * K;
  t.d[grp] = reinterpret_cast<typename T::ED*>(out) + off * out_ld + int64_t(h) * N;
  // Both operands K-major (row stride K) as stored, in either role.
  t.sa[grp] = cute::make_stride(int64_t(K), cute::Int<1>{}, cute::Int<0>{});
  t.sb[grp] = cute::make_stride(int64_t(K), cute::Int<1>{}, cute::Int<0>{});
  if constexpr (T::swap) {
    t.shapes[grp] = typename T::Shape3{glu ? 2 * N : N, m, K};  // glu: the nvfp4w SwiGLU GEMM
    t.a[grp] = w_ptr;
    t.b[grp] = rows_ptr;
    t.sd[grp] = cute::make_stride(cute::Int<1>{}, out_ld, cute::Int<0>{});
  } else {
    t.shapes[grp] = typename T::Shape3{m, glu ? 2 * N : N, K};
    t.a[grp] = rows_ptr;
    t.b[grp] = w_ptr;
    t.sd[grp] = cute::make_stride(out_ld, cute::Int<1>{}, cute::Int<0>{});
  }
  if constexpr (T::scaled) {
    const int kb = fp8_blocks(K), nb = fp8_blocks(N);  // scale blocks along K and N
    const float* rows_sf = sfa + off * kb;
    // glu (the fp8 one-GEMM SwiGLU, N = I): glu_fp8_scales' rows, one per 64 of the 2N.
    const float* w_sf = sfw + (glu ? int64_t(e) * (2 * N / 64) : (int64_t(e) * (halves ? 2 : 1) + h) * nb) * kb;
    t.sfa[grp] = T::swap ? w_sf : rows_sf;
    t.sfb[grp] = T::swap ? rows_sf : w_sf;
  }
  if constexpr (T::mixed) {
    // Row scales [E][kb][N] (expand_fp8_scales): the group's block, weight rows contiguous.
    t.sfs[grp] = sfw + int64_t(e) * fp8_blocks(K) * N;
    t.ds[grp] = cute::make_stride(cute::Int<1>{}, int64_t(N), int64_t(0));
  }
  if constexpr (T::source) {
    t.c[grp] = reinterpret_cast<const typename T::EC*>(src) + off * N;
    t.sc[grp] = cute::make_stride(int64_t(N), cute::Int<1>{}, cute::Int<0>{});
  }
}

// One launch's tables (blockIdx.y 0) and, in the grid's further rows, those of its Grouped::pair
// chain (pair, pair->pair).
template <class T>
struct FillPair {
  T t[Grouped::kMaxFill];
  FillArgs a[Grouped::kMaxFill];
};
template <class T>
__global__ void fill_tables(const FillPair<T> p) {
  dev::pdl_enter();  // Grouped::pdl: the counts and, before the writes, the previous GEMM's reads of t
  fill_one(p.t[blockIdx.y], p.a[blockIdx.y]);
}

template <class Gemm, bool kScaled, bool kSource = false, bool kSwap = false, bool kMixed = false>
typename Gemm::Arguments make_args(const Tables<Gemm, kScaled, kSource, kSwap, kMixed>& t, int E, int sms, int device,
                                   const float* alpha) {
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {E, t.shapes, nullptr};  // device shapes only: the host never learns them
  if constexpr (kSwap) {
    // Consecutive tiles (which run side by side on the persistent grid) walk the token tiles of
    // one weight tile first, so an expert with several token tiles reads each weight tile from
    // HBM about once and the rest from L2. (Unswapped, AlongM does the same with its m-tiles.)
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = Raster::AlongN;
  }
  if constexpr (kScaled)
    args.mainloop = {t.a, t.sa, t.b, t.sb, t.sfa, nullptr, t.sfb, nullptr};
  else if constexpr (kMixed)
    args.mainloop = {t.a, t.sa, t.b, t.sb, t.sfs, t.ds, 128};  // one scale per 128 of K
  else
    args.mainloop = {t.a, t.sa, t.b, t.sb};
  args.epilogue.ptr_D = t.d;
  args.epilogue.dD = t.sd;
  if constexpr (kSource) {
    // Tree (source, alpha, accumulator; node), engine_cutlass_swiglu.cu: the ptr-array scalar broadcast
    // reads alpha[group * stride_L] for each tile's group, or 1 without alpha.
    args.epilogue.ptr_C = t.c;
    args.epilogue.dC = t.sc;
    auto& a = args.epilogue.thread.op_1;
    a.scalars[0] = 1.0f;
    a.scalar_ptrs[0] = alpha;
    a.dScalar[0] = {cute::_0{}, cute::_0{}, int64_t(alpha ? 1 : 0)};
  } else {
    args.epilogue.ptr_C = nullptr;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    if constexpr (requires { args.epilogue.thread.dAlpha; }) {  // not the glu GEMMs' epilogues
      if (alpha) {
        // The ptr-array scalar broadcast reads alpha_ptr[group * stride_L] for each tile's group.
        args.epilogue.thread.alpha_ptr = alpha;
        args.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, int64_t(1)};
      }
    } else if constexpr (requires { args.epilogue.thread.alpha_ptr; }) {
      // The register-direct SwiGLU epilogues: nvfp4w::GluOp reads alpha_ptr[group] (the bf16 one
      // takes no alpha).
      args.epilogue.thread.alpha_ptr = alpha;
    }
  }
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sms;
  return args;
}

template <class Gemm, bool kScaled, bool kSource = false, bool kSwap = false, bool kMixed = false>
size_t workspace_bytes(int E, int sms) {
  using T = Tables<Gemm, kScaled, kSource, kSwap, kMixed>;
  const T t{};
  const auto args = make_args<Gemm, kScaled, kSource, kSwap, kMixed>(t, E, sms, 0, nullptr);
  return T::bytes(E) + T::round(Gemm::get_workspace_size(args)) + 256;
}

// CUTLASS's kernel behind a programmatic-dependent-launch wait. The ptr-array SM90 kernels issue
// no griddepcontrol.wait of their own, so launched with the PDL attribute they could read the
// tables and rows before the kernels ahead of them finish; this entry waits first (a no-op when
// launched without the attribute), then lets the next kernel be scheduled: it cannot share an SM
// with these CTAs (registers and shared memory are full), so it only queues its launch. Used
// instead of GemmUniversalAdapter's launch, so that CUTLASS's own device_kernel is never
// instantiated (one kernel per GEMM type to compile, not two).
// A launch none of whose groups has rows (a range of a split by rows that no expert falls in:
// the host launches every range, not knowing the counts) returns before CUTLASS's prologue.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, Kernel::MinBlocksPerMultiprocessor)
    gemm_kernel(CUTLASS_GRID_CONSTANT typename Kernel::Params const params, const int* __restrict__ active) {
  dev::pdl_enter();
  if (*active == 0) return;
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
}

// Initialized kernel Params by everything make_args reads besides the template: the workspace the tables
// are carved from, the experts, SMs, device and alpha, and for the mixed-input GEMM the scale
// blocks along K (its Params carry them; see run). For the same key the arguments are the same
// bytes, so can_implement, the host-side Params (TMA descriptors encoded by the driver) and the
// shared-memory attribute are done once per key instead of on every call. This saves host work;
// the GPU time of eager calls did not move measurably (Qwen3-30B, session 14: eager stays 2-13%
// above graph replays, the gaps between dependent launches). A few entries per instantiation (one
// per runner and call site in practice); the oldest is replaced.
template <class Params>
class InitCache {
 public:
  struct Key {
    const void* workspace;
    int experts, sms, device;
    const float* alpha;
    int scale_k;  // kMixed: blocks of 128 along K; 0 otherwise
    bool operator==(const Key&) const = default;
  };
  std::shared_ptr<const Params> find(const Key& k) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_)
      if (e.params && e.key == k) return e.params;
    return nullptr;
  }
  void add(const Key& k, std::shared_ptr<const Params> p) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[next_] = Entry{k, std::move(p)};
    next_ = (next_ + 1) % kEntries;
  }

 private:
  static constexpr int kEntries = 8;
  struct Entry {
    Key key{};
    std::shared_ptr<const Params> params;
  };
  std::mutex mu_;
  std::array<Entry, kEntries> entries_{};
  int next_ = 0;
};

template <class Gemm, bool kScaled, bool kSource = false, bool kSwap = false, bool kMixed = false>
void run(const Grouped& g, const char* what, cudaStream_t stream) {
  using T = Tables<Gemm, kScaled, kSource, kSwap, kMixed>;
  if (g.experts <= 0) return;
  if (!g.workspace || g.sms <= 0)
    throw UsageError(std::string("cutlass ") + what + ": workspace and sms must be set");
  int device = 0;
  EPMOE_CUDA_CHECK(cudaGetDevice(&device));
  const int groups = g.halves ? 2 * g.experts : g.experts;
  if (g.halves && (g.alpha || kSource))
    throw UsageError(std::string("cutlass ") + what + ": halves take no alpha and no source");
  const T t = T::carve(g.workspace, groups);
  if (kSource && !g.src) throw UsageError(std::string("cutlass ") + what + ": the source (gate) is null");
  if (!g.tables_filled) {
    FillPair<T> fp{};
    fp.t[0] = t;
    fp.a[0] = fill_args(g);
    int most = groups, fills = 1;
    for (const Grouped* q = g.pair; q; q = q->pair, ++fills) {
      // The pair runs this same instantiation later (its own call, tables_filled), or is the tail
      // or mid launch of this head (Grouped::Part), whose narrower tile has tables of the same
      // layout (same_tables, asserted where the head's instantiation is).
      const bool part = g.part == Grouped::Part::head &&
                        (q->part == Grouped::Part::tail || q->part == Grouped::Part::mid);
      if (fills == Grouped::kMaxFill || q->swap_ab != g.swap_ab ||
          (g.swap_ab && q->swap_tile_n != g.swap_tile_n && !part) || q->glu != g.glu || bool(q->src) != bool(g.src) ||
          bool(q->sfw) != bool(g.sfw) || !q->workspace || q->workspace == g.workspace || (q->halves && q->alpha))
        throw UsageError(std::string("cutlass ") + what +
                         ": the pair must be a GEMM of the same kind and tile with a workspace of its own "
                         "(at most " + std::to_string(Grouped::kMaxFill - 1) + " in a chain)");
      const int q_groups = q->halves ? 2 * q->experts : q->experts;
      fp.t[fills] = T::carve(q->workspace, q_groups);
      fp.a[fills] = fill_args(*q);
      most = std::max(most, q_groups);
    }
    const bool one_block = most <= kFillOneBlock;
    const dim3 fill_grid(one_block ? 1 : (most + 127) / 128, fills);
    const dim3 fill_block = one_block ? dim3((most + 31) / 32 * 32) : dim3(128);
    launch_kernel(fill_tables<T>, fill_grid, fill_block, 0, stream, g.pdl, fp);
  }
  const auto args = make_args<Gemm, kScaled, kSource, kSwap, kMixed>(t, groups, g.sms, device, g.alpha);
  auto fail = [&](cutlass::Status s, const char* step) {
    throw BackendError(std::string("cutlass ") + what + " grouped GEMM: " + step + " failed: " +
                       cutlassGetStatusString(s) + " (N=" + std::to_string(g.N) + ", K=" + std::to_string(g.K) + ")");
  };
  using Kernel = typename Gemm::GemmKernel;
  using Params = typename Kernel::Params;
  uint8_t* cutlass_ws = static_cast<uint8_t*>(g.workspace) + T::bytes(groups);
  static InitCache<Params> cache;
  const typename InitCache<Params>::Key key{g.workspace, groups, g.sms, device, g.alpha, kMixed ? fp8_blocks(g.K) : 0};
  std::shared_ptr<const Params> params = cache.find(key);
  // What GemmUniversalAdapter::initialize does: the kernel's workspace (every call), the Params
  // (once per key) and the shared-memory attribute (of gemm_kernel, the kernel launched here).
  cutlass::Status s = Kernel::initialize_workspace(args, cutlass_ws, stream);
  if (s != cutlass::Status::kSuccess) fail(s, "initialize_workspace");
  constexpr int smem = Kernel::SharedStorageSize;
  if (!params) {
    s = Kernel::can_implement(args) ? cutlass::Status::kSuccess : cutlass::Status::kInvalid;
    if (s != cutlass::Status::kSuccess) fail(s, "can_implement");
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    Params p = Kernel::to_underlying_arguments(args, cutlass_ws);
    // The mixed-input mainloop sizes its scale view by scale_k, which to_underlying_arguments
    // derives from a host problem shape; with shapes on the device only it would read K = 1. Every
    // group has this call's K (part of the key: GEMM1 and GEMM2 may share a workspace).
    if constexpr (kMixed) p.mainloop.scale_k = key.scale_k;
    params = std::make_shared<const Params>(p);
    cache.add(key, params);
  }
  using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = Kernel::get_grid_shape(*params);
  cfg.blockDim = Kernel::get_block_shape();
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cute::size<0>(Cluster{});
  attr[0].val.clusterDim.y = cute::size<1>(Cluster{});
  attr[0].val.clusterDim.z = cute::size<2>(Cluster{});
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = g.pdl ? 2 : 1;
  EPMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_kernel<Kernel>, *params, static_cast<const int*>(t.active)));
}

}  // namespace epmoe::cuda::cutlass_engine::detail
#endif  // EPMOE_CUTLASS_GROUPED_IMPL && EPMOE_WITH_CUTLASS
