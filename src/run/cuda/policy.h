// Engine and tile choice of runner "cuda": which engine each of a call's two GEMMs runs on, with
// which m-tile, and how the CUTLASS engine's widened weights are chunked; plus the configuration
// limits of the engines (check_config, the runner's RunnerInfo::check). Host-side rules from the
// configuration, the tuning options and the call's shapes only, never device data, so that a
// captured CUDA graph replays the choice it was captured with. The measured thresholds live here.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/runner.h"

namespace epmoe::cuda::policy {

// ---- m-tile -------------------------------------------------------------------------------------
// Up to this many expected rows per expert, the GEMMs use 32-row m-tiles (the decode engines);
// above, 128-row ones.
constexpr double kDecodeMaxRows = 48.0;
// Rows per local expert with full slots and balanced routing: the S*K (slot, k) pairs spread over
// all cfg.num_experts experts, so S*K / E_total per local expert (with several ranks, most of a
// slot's K ids name other ranks' experts: R*C*K / E_loc would overstate it R times).
double expected_rows(const MoeConfig& cfg, const DispatchOutput& in);
// 32 or 128 from expected_rows; `forced` (!= 0) wins (tests and benchmarks). decode_max_rows
// (tuning.decode_max_rows, 0 = built in): 32-row tiles up to that many rows per expert.
int block_m(double expected_rows, int forced, int decode_max_rows = 0);

// ---- CUTLASS or the decode engines ---------------------------------------------------------------
// 33 = more than one 32-row decode m-tile: measured on an H200 (DeepSeek-V3 experts, 128 local),
// 32 rows per expert: decode wgmma 3.3 ms vs CUTLASS 3.9 ms (bf16); 64 rows: CUTLASS 4.0 ms vs
// 6.6 ms for the mma.sync kernel (bench/results/2026-11-29-run7-10-2xh200.md). Up to 32 rows an
// expert fits one m-tile of the decode kernels, which stream each weight once; beyond, they would
// stream it twice and CUTLASS's 128-row tiles win.
constexpr int kCutlassMinRows = 33;
// nvfp4 weights without paired copies are widened to bf16 first (~6 ms for 128 DeepSeek-V3
// experts), which the GEMMs only repay at larger M: 64 rows per expert measured 10.3 ms widened vs
// 8.6 ms on mma.sync, 256 rows 10.9 ms vs 17.6 ms. (With paired copies CUTLASS runs nvfp4w, no
// widening; this crossover, which applies where the decode engines do not take both GEMMs, was not
// re-measured for it.)
constexpr int kCutlassMinRowsNvfp4 = 128;
// Whether a call runs on the CUTLASS engine. automatic: from kCutlassMinRows (nvfp4:
// kCutlassMinRowsNvfp4) expected rows per expert on; cutlass: always; mma: never. Never in a build
// without CUTLASS (validate() rejects engine cutlass there). Every weight format qualifies: what
// CUTLASS has no kernel for is widened to bf16 (widen.h), except where the mixed-input GEMM takes it
// (fp8 weights with a bf16 operand; nvfp4 weights with paired copies).
// decode_max_rows > 0 (tuning.decode_max_rows) replaces the crossover: CUTLASS above that many
// rows per expert.
bool use_cutlass(RunnerEngine engine, WeightFormat wf, double expected_rows, int decode_max_rows = 0);

// ---- swap-AB (CUTLASS) ---------------------------------------------------------------------------
// Up to this many expected rows per expert the CUTLASS GEMMs run swapped (engine_cutlass.h): the
// weights' output dimension fills the 128-row tile and the expert's rows a 64-wide one. Unswapped,
// an expert with up to 128 rows is one 128-row m-tile whose cluster partner (2x1, for the weight
// multicast) has nothing to do, so half the SMs idle: measured 3.92 ms (bf16) and 3.02 ms (fp8) at
// 64 rows per expert, 4.30 / 3.17 ms at 128, against a weight-streaming floor of 2.98 / 1.48 ms
// (DeepSeek-V3, 128 local experts, H200); at 256 rows (two busy m-tiles, 4.93 ms = 0.84 of the
// floor) the unswapped 128x256 tiles do more work per byte read than 128x64 ones. 192 = three
// token tiles, between the two. Swapped, measured: bf16 3.02 / 3.29 ms at 64 / 128 rows (0.98 /
// 0.90 of the floor), fp8 1.61 / 2.01 ms; 192 itself, and 256 swapped, are not measured yet
// (`epmoe bench runner --cutlass-swap 0` / `1` shows both; tuning.cutlass_swap forces either).
constexpr double kSwapMaxRows = 192.0;
// Token-tile width of the swapped GEMMs: 64 up to this many expected rows per expert (one tile, no
// padding), 128 above (one or two tiles instead of two or three 64-wide ones, each of which would
// read every weight tile again from L2; engine_cutlass_swap.cuh). The width at equal rows is not
// compared yet (cutlass_swap 64 / 128 forces either).
constexpr double kSwapNarrowMaxRows = 64.0;
// 0 = unswapped, else the token-tile width (64 or 128) of a GEMM run with one tile for every
// expert: automatic: by kSwapNarrowMaxRows up to kSwapMaxRows, 0 above; on: by kSwapNarrowMaxRows
// whatever the rows; n64 / n128 / n192: that width; off: 0. The widened GEMMs use it as it is; the
// others split by rows (row_buckets) where cutlass_swap is automatic.
int swap_tile_n(CutlassSwap swap, double expected_rows);
inline bool use_swap_ab(CutlassSwap swap, double expected_rows) { return swap_tile_n(swap, expected_rows) != 0; }

// ---- the tile by each expert's rows (CUTLASS) --------------------------------------------------------
// The experts with lo <= rows <= hi run in one launch with token tile tile_n (0 = unswapped).
struct RowBucket {
  int lo = 0, hi = 0x7fffffff, tile_n = 0;
};
// Real routing is not uniform: with the router on random logits, at a mean of 64 rows per expert
// half the experts get more than 64, and one 64-wide tile width gives them two tiles each, every
// one re-reading the expert's weights (1.46x the tiles of uniform routing, measured 1.30x the time
// at M 8192, DeepSeek-V3, H200; bench/results/2026-12-01-session11-h200.md). Likewise unswapped,
// an expert with 257..384 rows has three 128-row m-tiles, and the 2x1 cluster pads them to four.
// The host never sees the counts (graph capture), so the split is made on the device: one launch
// per tile over its row ranges (bucket_launches), each expert's tables filled only in the launch
// of its range (Grouped::ranges), so every expert runs in one launch on a tile that wastes little
// on its rows.
// Automatic (cutlass_swap auto), bf16: [0, 64] swap-AB 64, [65, 128] swap-AB 128, [129, 192]
// swap-AB 192, [193, 256] unswapped (two m-tiles, one cluster), [257, 384] swap-AB 192 (two token
// tiles instead of four m-tile slots), [385, 512] unswapped, [513, 576] swap-AB 192 (three token
// tiles instead of five m-tiles), above unswapped. fp8 has no 192-wide tile (it spills: two
// 96-register accumulator sets per thread under the 168-register cap; measured slower than 128-wide
// pairs, router at M 16384 2.82 ms vs 2.53): [0, 64] 64, [65, 128] 128, [129, 192] swap-AB 96 (two
// 96-wide token tiles, 192 rows of MMA where an unswapped pair of 128-row m-tiles does 256: router
// at M 16384 2.411 ms vs 2.587 with [129, 256] unswapped, the other M within 1.5%, session 13),
// [193, 256] unswapped, [257, 288] swap-AB 96 (three tiles: 288 rows of MMA instead of 384;
// router at M 32768 3.897 ms vs 4.353 with [257, 384] on 128, M 24576 3.128 vs 3.083), [289, 384]
// swap-AB 128, above unswapped. A launch with no expert in its range cost ~6 us when the launches
// ran one after the other (Qwen3-235B uniform at a 512-row mean, ten ranges: +102-107 us, session
// 23; its GEMM now returns at once, ~2.5 us, engine_cutlass.h), so the runner runs them on side
// streams (tuning.concurrent_buckets): 0.94-1.00x the sequential time. Forced widths (and off /
// on): one bucket of all rows with swap_tile_n.
// Automatic runs one launch per GEMM instead (tile: single_tile_n) where the split cannot pay:
// - small experts (all local weights of both GEMMs, `weight_bytes`, under kSplitMinWeightBytes):
//   each launch, even with no expert in its range, costs its table fill (~2 us) and a grid, which
//   Qwen3-30B's 0.3 ms GEMM pairs cannot win back (under the router, 64 local experts, H200, one
//   call: split 0.333 / 0.377 / 0.567 / 0.885 ms at M 4096 / 8192 / 16384 / 32768, one launch of
//   single_tile_n's tile 0.255 / 0.325 / 0.498 / 0.804; bench/results/2026-12-01-session13-h200.md;
//   still 4-22% slower with concurrent launches and the GLU in the split, bf16 and fp8, router and
//   uniform, session 28);
// - few experts (`experts` under kSplitMinExperts): a range then holds one or two experts, and
//   every launch adds its own last partial wave of tiles to the sum (Mixtral-8x7B, 4 experts,
//   router M 2048, one call: bf16 1.422 split vs 1.296, fp8 1.157 vs 1.065).
// - a large mean (expected rows per expert above split_max_rows: bf16 576, fp8 384): the experts'
//   m-tiles are full. bf16 splits up to 576 because under the router a 512-row mean spreads to
//   ~470-575 rows, and [513, 576] on 192-wide tiles pays (session 23, concurrent launches, split /
//   one launch, router: Qwen3-235B M 32768 2.224 / 2.351 ms, gpt-oss-120b M 32768 2.841 / 3.128,
//   DeepSeek-V3 M 65536 10.097 / 11.209; uniform +0.8-1.1%). fp8 has no 192-wide tile, and its
//   split at 512 (six 96-wide tiles for [513, 576]) was 3.6-9.3% slower on Qwen3-235B and gpt-oss,
//   router included (session 23). At a 256-row mean both split (router: three-m-tile experts).
// - a small mean (up to kSplitNarrowMaxRows = 64 expected rows per expert): two tiles only, [0, 64]
//   swap-AB 64 and above swap-AB 128 (bf16 and fp8), i.e. two launches per GEMM instead of four.
//   Every tile of the full table costs its launch even with no expert in its ranges, and at this
//   mean the other tiles hold only the outliers of uneven loads, which the 128-wide tile pads
//   little more (a skewed expert of 320 rows: 384 rows of MMA on either table). Measured ABBA
//   against the full table (H200, session 34, call 8): gpt-oss-120b and Qwen3-235B fp8 M 4096
//   -2.9 / -3.2% uniform, -4.9 / -4.2% router, -4.2 / -4.6% skewed; DeepSeek-V3 fp8 M 8192 -1.5 /
//   -1.8 / -0.7%; Qwen3-235B bf16 M 4096 -2.5 / -2.6 / -1.4%. At a 128-row mean the analogous
//   cut (129 and up on 96-wide tiles) lost 7-9% on skewed loads, so the full table stays there.
// `cutlass_swap = byrows` splits on the full table whatever the size.
std::vector<RowBucket> row_buckets(CutlassSwap swap, double expected_rows, bool fp8 = false,
                                   double weight_bytes = 1e30, int experts = 1 << 30);
constexpr double kSplitMinWeightBytes = 1024.0 * 1024 * 1024;
// row_buckets' weight_bytes for E experts of H x I: the bytes both GEMMs stream (fp8: one per
// weight, else bf16's two; nvfp4 is widened, unsplit).
inline double split_weight_bytes(int E, int H, int I, bool fp8) { return double(E) * 3.0 * H * I * (fp8 ? 1 : 2); }
constexpr int kSplitMinExperts = 16;
constexpr double kSplitNarrowMaxRows = 64.0;
constexpr double kSplitMaxRowsFp8 = 384.0;
constexpr double kSplitMaxRowsBf16 = 576.0;
inline double split_max_rows(bool fp8) { return fp8 ? kSplitMaxRowsFp8 : kSplitMaxRowsBf16; }
// A split table as text, "lo-hi:tile,...,lo-:tile" (e.g. "0-64:64,65-128:128,129-:0"; tile 0 =
// unswapped), for trying other ranges without a rebuild (CudaRunner::set_row_buckets, `epmoe bench
// runner --row-buckets`). The ranges must start at 0, follow each other and end open; tiles 0, 64,
// 96, 128 or 192 (96 exists for fp8 only: check_row_buckets). Throws UsageError naming the part.
std::vector<RowBucket> parse_row_buckets(const std::string& spec);
// The order in which concurrent launches per range are issued (indices into `buckets`): the range
// holding the expected rows per expert first, then the others by their distance from it (ties: the
// lower range first). The launches hold one CTA per SM each (their shared memory), so the first
// issued takes the SMs first: a range no expert falls in then starts and ends while the likely
// large one already runs, rather than ahead of it. Any order writes the same bytes.
std::vector<int> bucket_order(const std::vector<RowBucket>& buckets, double expected_rows);
// The launches of a split (indices into `buckets`): the ranges of one tile go into one launch,
// up to `max_ranges` of them (cutlass_engine::RowRanges), so that a launch runs every expert on
// its tile, whichever of the tile's ranges its rows fall in; launches in the bucket_order of their
// first range, ranges inside a launch ascending. The same tile per expert as one launch per range,
// so the same bytes, with fewer launches: the automatic fp8 table's 7 ranges are 4 launches, bf16's
// 8 are 4. Every range that no expert falls in costs a launch (its table fill and an early-exit
// GEMM that holds SMs at the tail of the launches before it); at a 64-row mean, where one range
// has rows, 2 ranges instead of 7 took 4-5% off the call (gpt-oss-120b and Qwen3-235B fp8 M 4096,
// session 34).
std::vector<std::vector<int>> bucket_launches(const std::vector<RowBucket>& buckets, double expected_rows,
                                              int max_ranges);
// Throws UsageError when a bucket's tile has no instantiation on that GEMM
// (cutlass_engine::swap_tile_exists: 96 is fp8's only).
void check_row_buckets(const std::vector<RowBucket>& buckets, bool fp8);
// The one tile of an unsplit automatic GEMM: swap-AB 128 up to kSwapMaxRows expected rows per expert
// (under a router's uneven loads half the experts exceed the mean, so a 64-wide tile at a 64-row
// mean would give them two tiles; measured best at 64 and 128 rows above), unswapped above.
int single_tile_n(double expected_rows);
// (The fused SwiGLU epilogue, tuning.fused_swiglu, exists unswapped only: where it is asked for
// and GEMM1 can take it, automatic keeps one unswapped bucket above kSwapMaxRows, as before.)

// ---- decode engines (m-tile 32) ------------------------------------------------------------------
// Per GEMM (1: W13, 2: W2), whether it runs on a wgmma engine; a GEMM with none set runs on the
// mma.sync engine (widened weights in its B fragments). bf16 weights: wgmma bf16; fp8 weights:
// fp8 x fp8 wgmma where the operand arrives as fp8 (an fp8 dispatch for GEMM1,
// intermediate_quant = fp8 for GEMM2); nvfp4 weights: wgmma with the weights decoded in registers
// where K % 128 == 0, or K % 64 == 0 when that matrix has a prepared copy (prepared13 / prepared2;
// wgmma_nvfp4_supports). Nothing is set unless `wgmma_decode` and bm == 32.
// `iq` here and in cutlass_plan is the resolved MoeConfig::effective_intermediate_quant().
struct DecodeEngines {
  bool bf16 = false;
  bool fp8_1 = false, fp8_2 = false;
  bool nvfp4_1 = false, nvfp4_2 = false;
};
DecodeEngines decode_engines(bool wgmma_decode, int bm, WeightFormat wf, ActFormat act, IntermediateQuant iq,
                             int hidden, int intermediate, bool prepared13 = false, bool prepared2 = false);

// ---- the decode engines past one m-tile -----------------------------------------------------------
// The decode engines stream an expert's weights once per 32-row m-tile, so their time grows with
// the m-tiles. Where both GEMMs of an nvfp4 expert run on the register-decode wgmma engine they
// still beat every other engine well past one m-tile, since CUTLASS has to widen nvfp4 first.
// Measured on an H200, DeepSeek-V3 experts, 128 local (bench/results/2026-12-01-session10-h200.md),
// at 64 / 128 / 256 rows per expert: nvfp4 decode 2.74 / 5.47 / 11.0 ms; mma.sync 7.18 (64);
// widened CUTLASS 9.98 / 10.3 (128, 256), swap-AB widened 8.58 / 8.96 (64, 128): crossover ~236
// rows. fp8 x fp8 and bf16 keep one m-tile: swap-AB CUTLASS beats their decode engines from two
// (fp8 1.61 vs 2.38 ms, bf16 3.02 vs 4.88 at 64 rows).
constexpr int kDecodeMaxRowsNvfp4 = 192;
// With prepared nvfp4 weights both GEMMs have the wide engine past one 32-row m-tile
// (use_nvfp4_wide), which decodes each weight once per kWgmmaWideBlockM rows instead of once per 32.
constexpr int kDecodeMaxRowsNvfp4Wide = 32;
// bf16 weights on few local experts (under kSplitMinExperts) keep the decode engine up to two
// m-tiles: there each expert is large and the swap-AB CUTLASS GEMM streams its weights slower than
// the decode engine reading them once for both m-tiles (Mixtral-8x7B, 4 local experts, 64 rows per
// expert, H200: decode 0.400 / 0.408 / 0.410 ms against swap-AB 0.448 / 0.445, one call each;
// session 22 saw 7-9%). Not fp8 (decode 0.266 against 0.258 there), nor many experts (Qwen3,
// gpt-oss at 64 rows: swap-AB 3% ahead; bench/results/2026-12-04-session32-h200.md).
constexpr int kDecodeMaxRowsFewBf16 = 64;
// fp8 weights where a decode GEMM would have a bf16 operand (GEMM1 of a bf16 dispatch, GEMM2 with
// intermediate_quant none: mma.sync, decoding in its B fragments) skip the decode engines for
// CUTLASS's mixed-input GEMM (fp8w, tuning.fp8_mixed) at every M: always where both GEMMs would be
// on mma.sync, and where only GEMM2 would (GEMM1 on the fp8 wgmma engine) when an expert has at
// least kFp8MixedDecodeMinExpert weights (3·H·I). decode_max_rows then returns kDecodeNever.
// Measured on an H200, session 37 (bench/results/2026-12-04-session37-h200.md), 1 / 2 / 4 / 16 /
// 32 rows per expert. Both on mma.sync (bf16 dispatch): Qwen3-30B (4.7 M weights) 0.181 / 0.179 /
// 0.187 / 0.191 ms against decode 0.200 / 0.200 / 0.203 / 0.213, Qwen3-235B (18.9 M) 0.539-0.566
// against 0.664-0.694, DeepSeek-V3 2.222 / 2.201 at 1 / 2 rows against 2.999 / 2.999, gpt-oss-120b
// 0.711 against 0.885-0.906. GEMM2 only (fp8 dispatch): DeepSeek-V3 (44 M) 1.678 / 1.677 / 1.673
// / 1.707 / 1.772 against 1.905 / 1.914 / 1.880 / 1.922 / 1.966; gpt-oss-120b (24.9 M) 0.542-0.582
// against 0.596-0.623; Qwen3-235B within +-2% either way; Qwen3-30B decode ahead, 0.126 / 0.138
// against 0.161 / 0.170 at 2 / 32 rows.
constexpr int kDecodeNever = -1;
constexpr int64_t kFp8MixedDecodeMinExpert = int64_t(20) << 20;
// The expected rows per expert up to which the decode engines run (and CUTLASS, or the wide nvfp4
// engine, above): the tuned value (tuning.decode_max_rows > 0), else, where both GEMMs of `d32`
// (decode_engines at bm 32) are nvfp4 wgmma engines, kDecodeMaxRowsNvfp4Wide on prepared weights
// and kDecodeMaxRowsNvfp4 on natural ones, where they are the bf16 engine and `experts` (local) is
// under kSplitMinExperts kDecodeMaxRowsFewBf16, where they are fp8 weights with a bf16 operand on
// both GEMMs, or on one with experts of expert_weights >= kFp8MixedDecodeMinExpert, and
// `fp8_mixed`, kDecodeNever (use_cutlass then holds at every M), else 0: the built-in one-m-tile
// rules (kDecodeMaxRows, kCutlassMinRows, kCutlassMinRowsNvfp4).
int decode_max_rows(WeightFormat wf, const DecodeEngines& d32, int tuned, bool prepared = false,
                    int experts = 1 << 30, int64_t expert_weights = 0, bool fp8_mixed = false);

// ---- the wide nvfp4 engine (m-tile kWgmmaWideBlockM, engine.h) -----------------------------------
// engine_wgmma_nvfp4_wide.cu: the prepared register-decode engine with token tiles of up to
// kWgmmaWideBlockM rows. Used for both GEMMs above decode_max_rows and up to kNvfp4WideMaxRows
// expected rows per expert where both have the nvfp4 decode engine (d32) on prepared weights,
// unless the engine is forced to cutlass (which runs nvfp4w on paired copies, or widens nvfp4 to
// bf16 in scratch).
// Measured on an H200, DeepSeek-V3 experts, 128 local (bench/results/2026-12-01-session11-h200.md):
// at 64 / 128 / 256 / 512 / 1024 rows per expert 2.48 / 3.37 / 6.64 / 13.06 / 26.0 ms, against the
// 32-row decode engine's 2.75 / 5.53 at 64 / 128 and widened CUTLASS's 13.62 at 512 and 22.4 at
// 1024 (~400 TFLOP/s here against ~600 for CUTLASS on the widened copy): crossover ~600 rows.
// Small experts cross over sooner: the wide engine's per-tile epilogue and pipeline ramp weigh more
// against short K loops (Qwen3-30B-A3B, 3*H*I = 4.7 M weights, GEMM2 K = 768). Measured on an H200,
// 64 local experts, uniform (bench/results/2026-12-02-session17-h200.md), at 256 / 512 rows per
// expert: Qwen3-30B wide 0.602 / 1.150 ms, widened CUTLASS 0.735 / 1.052 (crossover ~400 rows);
// Qwen3-235B (18.9 M) 1.600 / 3.114 against 2.283 / 3.158; gpt-oss-120b (24.9 M) 1.948 / 3.784
// against 2.958 / 4.087. So experts under kNvfp4WideSmallExpert weights stop at
// kNvfp4WideMaxRowsSmall; nvfp4_wide_max_rows gives the bound for a shape (or the tuned one), which
// use_nvfp4_wide takes as max_rows. Re-measured after session 19's epilogue work (session 20,
// bench/results/2026-12-02-session20-h200.md, same call, --nvfp4-wide-max-rows 2048 against 1):
// Qwen3-30B at 384 / 448 / 512 / 640 / 768 rows wide 0.772 / 0.961 / 1.018 / 1.316 / 1.584 ms,
// widened 0.977 / 1.024 / 1.050 / 1.310 / 1.377 (router at 512: 1.145 against 1.134), so the small
// bound moved from 384 to 512; DeepSeek-V3 at 512 / 640 / 768 wide 11.94 / 15.28 / 18.73, widened
// 13.66 / 17.42 / 17.94, so 640 stays.
constexpr double kNvfp4WideMaxRows = 640.0;
constexpr double kNvfp4WideMaxRowsSmall = 512.0;
constexpr int64_t kNvfp4WideSmallExpert = int64_t(16) << 20;
// With the paired copies (CudaRunner::prepare, tuning.nvfp4_mixed) CUTLASS runs nvfp4 on the
// mixed-input GEMM (CutlassPath::nvfp4w) without widening, which takes over from the wide engine
// sooner. Measured on an H200 (bench/results/2026-12-04-session38-h200.md, call 3,
// --nvfp4-wide-max-rows 1 against 65536), nvfp4w against wide in ms at 64 / 128 / 192-256 rows per
// expert: DeepSeek-V3 2.482 / 3.106 / 4.075 (192) against 2.349 / 2.914 / 5.135; Qwen3-235B and
// gpt-oss-120b at 128 / 256 0.771 / 1.046 and 0.989 / 1.337 against 0.718 / 1.409 and 0.929 /
// 1.770; Qwen3-30B and Mixtral-8x7B at 128 0.263 and 0.420 against 0.278 and 0.486. So the wide
// engine kept up to 128 rows for every shape (5% and 14% lost at Qwen3-30B's and Mixtral's 128).
// With SwiGLU in nvfp4w's GEMM1 epilogue (session 39, bench/results/2026-12-04-session39-h200.md,
// call 2, ABAB) at 64 / 128 rows: DeepSeek-V3 2.56 / 3.06 against wide 2.35 / 2.90, Qwen3-235B
// 0.618 / 0.743 against 0.565 / 0.722, gpt-oss-120b 0.797 / 0.951 against 0.758 / 0.930 (wide
// keeps 128); Qwen3-30B 0.208 / 0.254 against 0.200 / 0.279, and at 96 rows (call 3) 0.247 against
// 0.235 (small experts: wide up to 96, kNvfp4WideMaxRowsPairedSmall); Mixtral-8x7B (4 local
// experts) 0.344 / 0.399 against 0.438 / 0.490, at 48 rows (call 3) 0.354 against 0.418: with few
// experts (under kSplitMinExperts) nvfp4w follows the decode engine directly.
constexpr double kNvfp4WideMaxRowsPaired = 128.0;
constexpr double kNvfp4WideMaxRowsPairedSmall = 96.0;
// tuned > 0 (tuning.nvfp4_wide_max_rows) replaces the measured bound, for re-measuring it;
// `paired`: the weights have their paired copies (the bounds above; 0 under kSplitMinExperts
// local `experts`).
double nvfp4_wide_max_rows(int hidden, int intermediate, int tuned = 0, bool paired = false, int experts = 1 << 30);
bool use_nvfp4_wide(RunnerEngine engine, const DecodeEngines& d32, bool prepared, double expected_rows,
                    int decode_max_rows, double max_rows);

// ---- CUTLASS engine (large M) --------------------------------------------------------------------
// Operand path of one GEMM on the CUTLASS engine: bf16 weights on the bf16 GEMM; fp8 weights on
// the fp8 x fp8 GEMM where the other operand is e4m3 already (GEMM1: fp8 dispatch with a 16-byte
// aligned payload and weight scales; GEMM2: intermediate_quant = fp8; partial 128-tiles in H or I
// included, W13 then run as its gate and up halves, split_w13), so that a
// bf16 operand keeps its numerics (never requantized to e4m3); fp8 with a bf16 operand on the
// mixed-input GEMM that decodes the weights in its main loop (fp8w, engine_cutlass_fp8w.cuh: the
// widened path's bits without the widened copy) unless tuning.fp8_mixed is off; otherwise (that
// switch off, nvfp4 always) widened to bf16 in a scratch buffer and run on the bf16 GEMM.
enum class CutlassPath { bf16, fp8, widened, fp8w, nvfp4w };
// "cutlass-bf16", "cutlass-fp8", "cutlass-bf16(widened fp8)", "cutlass-bf16(widened nvfp4)",
// "cutlass-fp8w", "cutlass-nvfp4w"; swapped (swap_tile_n 64, 128, 192 or, fp8w only, 256) with "-swap64" / ... after
// the GEMM's name, e.g. "cutlass-fp8-swap64", "cutlass-bf16-swap128(widened nvfp4)",
// "cutlass-fp8w-swap256"; split by rows (swap_tile_n kByRows, several row_buckets) "-byrows", e.g.
// "cutlass-fp8-byrows".
constexpr int kByRows = -1;
std::string path_name(CutlassPath p, WeightFormat wf, int swap_tile_n = 0);

struct CutlassPlan {
  CutlassPath gemm1 = CutlassPath::bf16, gemm2 = CutlassPath::bf16;
  // GEMM1 as its gate half and its up half with SwiGLU in the epilogue: asked for
  // (tuning.fused_swiglu) and possible (GEMM1 on the bf16 GEMM, the intermediate stays bf16), and
  // unasked where GEMM1 is one unswapped launch of bf16 weights with I % 128 == 0 (the one-GEMM
  // form, engine_cutlass_glu.cu: the unfused bits, no split given up).
  bool fused_swiglu = false;
  // Widened GEMMs: swap-AB with this token-tile width (swap_tile_n), 0 = unswapped. The others
  // (bf16 and fp8 paths): one launch per tile of the row buckets (row_buckets, bucket_launches),
  // of which a single bucket of all rows with tile swap_tile_n is the plain case. The SwiGLU
  // epilogue has no swapped form, so only a plan of one unswapped bucket fuses; otherwise GEMM1
  // writes [rows][2I] and the SwiGLU pass follows.
  int swap_tile_n = 0;
  std::vector<RowBucket> buckets;
  // GEMM1 on the fp8 GEMM with I % 128 != 0: W13's scale grid splits at I (FORMATS.md), so one
  // 128-row weight tile would span the gate's last block and the up's first. It runs as its gate
  // half and its up half (N = I each, their own scale tiles) into the two column halves of [rows][2I].
  bool split_w13 = false;
  // GEMM1 split by rows with SwiGLU fused where it can be (glu_in_split): its unswapped buckets run
  // the one-GEMM SwiGLU into the intermediate, the pass then covers only the other buckets' experts.
  bool glu_split = false;
  // GEMM1 and GEMM2 both on the fp8 GEMM (intermediate_quant = fp8) in one unswapped launch with
  // I % 64 == 0: GEMM1 runs as the fp8 one-GEMM SwiGLU (engine_cutlass_glu_fp8.cu) into a bf16
  // [rows][I], which cutlass_engine::quantize_intermediate turns into GEMM2's codes and scales, in
  // place of [rows][2I] and the SwiGLU pass (the same bytes); split_w13 is then not used.
  bool fp8_glu = false;
  // The direct GEMMs' tile for names and RunnerInfo: the one bucket's tile_n, or kByRows.
  int direct_tile_n() const { return buckets.size() == 1 ? buckets[0].tile_n : kByRows; }
  // The tile of a GEMM on path p: swap_tile_n widened, direct_tile_n otherwise.
  int tile_n(CutlassPath p) const {
    return p == CutlassPath::widened                             ? swap_tile_n
           : p == CutlassPath::fp8w || p == CutlassPath::nvfp4w ? fp8w_tile_n
                                                                 : direct_tile_n();
  }
  // The mixed-input GEMMs, fp8w and nvfp4w (always swapped, one launch over all experts): the
  // token-tile width, fp8w_tile_n().
  int fp8w_tile_n = 256;
  // At 256-wide tiles they also run a mid launch (128-wide tiles, cutlass_engine::Grouped::Part)
  // for remainders of 65-128 rows: experts of kMixedMidMinExpert weights or more.
  bool mixed_mid = false;
  // Widened weights: bytes of one expert of W13 / W2 in bf16, and experts per widen-and-GEMM chunk,
  // as many whole experts as fit in the scratch bound (at least one, at most 65535), from the
  // configuration alone so that graph replays see the same chunks.
  size_t expert_bytes1 = 0, expert_bytes2 = 0;
  int chunk1 = 0, chunk2 = 0;
  // The scratch buffer both GEMMs' chunks share (0 when nothing is widened).
  size_t scratch_bytes() const;
};
// fp8_mixed (tuning.fp8_mixed): fp8 weights with a bf16 operand on fp8w instead of widened.
// nvfp4_paired: nvfp4 weights have their paired copies (CudaRunner::prepare with
// tuning.nvfp4_mixed), so both GEMMs run nvfp4w instead of widened.
CutlassPlan cutlass_plan(const DispatchOutput& in, const ExpertWeights& w, IntermediateQuant iq, bool fused_swiglu,
                         CutlassSwap swap, double expected_rows, size_t widen_scratch_bytes, bool fp8_mixed = true,
                         bool nvfp4_paired = false);
// A mid launch of the 256-wide mixed-input GEMMs (Grouped::Part) pays where experts are large.
// Measured on an H200 (bench/results/2026-12-04-session40-h200.md, call 4, alternating), M 32768
// nvfp4 skewed (every cold expert 128 rows): DeepSeek-V3 (44 M weights) 5.68 -> 5.05 ms, fp8w
// 5.83 -> 5.10; Qwen3-235B (18.9 M) 1.933 -> 1.935; Qwen3-30B (4.7 M) 0.458 -> 0.469 at M 16384 and
// under the router 0.446 -> 0.460 and 0.742 -> 0.756: with short K loops a third launch's ramp and
// half-empty wave cost more than the padding it saves. Uniform loads unchanged at every shape.
constexpr int64_t kMixedMidMinExpert = int64_t(16) << 20;
// Whether experts of hidden x intermediate have the mid launch (CutlassPlan::mixed_mid).
constexpr bool mixed_mid(int hidden, int intermediate) {
  return 3 * int64_t(hidden) * intermediate >= kMixedMidMinExpert;
}
// The fp8w token tile for a mean of `expected_rows` per expert: the narrowest of 64 / 128 / 256
// holding it (a wider tile multiplies padding; TMA loads no rows past an expert's end, so the
// padding costs tensor-core time only), 256 above.
int fp8w_tile_n(double expected_rows);
// Whether GEMM1 of plan `p` (its buckets final) fuses SwiGLU inside a split by rows: GEMM1 on the
// direct bf16 GEMM (bf16 weights, so no alpha), a bf16 intermediate (iq none), glu_fits(I), several
// buckets of which 1..RowRanges::kMax unswapped, and not fused whole already. The swapped
// buckets have no SwiGLU form; the unswapped ones run grouped_gemm_bf16_glu on their row range,
// which gives the unfused bits, so this takes nothing but the pass's work on those rows and
// GEMM1's [rows][2I] write of them.
bool glu_in_split(const CutlassPlan& p, int intermediate, IntermediateQuant iq);

// ---- configuration limits --------------------------------------------------------------------------
// The engines' limits on a configuration (RunnerInfo::check of runner "cuda", called by
// validate()): hidden and intermediate multiples of 64 (the tiles), engine cutlass only in a build
// with CUTLASS. top_k <= 32 and intermediate % 16 with intermediate_quant = fp8 are limits of the
// runner too, but validate() already enforces them (top_k <= 16, the fp8 intermediate's blocks) for
// every runner, so they are not reported twice.
void check_config(const MoeConfig& cfg, std::vector<ConfigIssue>& issues);

}  // namespace epmoe::cuda::policy
