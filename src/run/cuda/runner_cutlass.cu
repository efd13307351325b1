// Runner "cuda", the CUTLASS engine's path (large M; policy::use_cutlass chooses it): per GEMM
// the operand path of policy::cutlass_plan, widened weights in chunks through one scratch buffer.
#include <algorithm>
#include <string>
#include <vector>

#include "epmoe/format.h"
#include "core/cuda/stream_fork.h"
#include "run/cuda/engine.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/policy.h"
#include "run/cuda/rows.h"
#include "run/cuda/runner.h"
#include "run/cuda/widen.h"

namespace epmoe::cuda {

namespace {

// GEMM1 `g` (N = 2I) as its one-GEMM SwiGLU form writing the intermediate `h` [rows][I].
cutlass_engine::Grouped glu_of(cutlass_engine::Grouped g, bf16_raw* h) {
  g.N /= 2;
  g.glu = true;
  g.out = h;
  return g;
}

// GEMM1 `g` (N = 2I, W = W13 of g.experts experts, out = the intermediate [rows][I]) with SwiGLU
// fused: where I % 128 == 0 as one GEMM whose tiles hold both halves of 128 intermediate columns
// (grouped_gemm_bf16_glu: the unfused bits), else as its gate half into `gate` [rows][I] and its
// up half with SwiGLU in the epilogue, reading `gate`.
void gemm1_swiglu(const cutlass_engine::Grouped& g, bf16_raw* gate, cudaStream_t st) {
  const int I = g.N / 2;
  if (cutlass_engine::glu_fits(I) && !g.alpha) return cutlass_engine::grouped_gemm_bf16_glu(glu_of(g, g.out), st);
  cutlass_engine::Grouped half = g;
  half.N = I;
  half.w_expert_stride = int64_t(2) * I * g.K;
  half.out = gate;
  cutlass_engine::grouped_gemm_bf16(half, st);
  half.W = static_cast<const bf16_raw*>(g.W) + int64_t(I) * g.K;
  half.src = gate;
  half.out = g.out;
  cutlass_engine::grouped_gemm_bf16_swiglu(half, st);
}

// GEMM `g` as one launch per tile of the split by rows (policy::bucket_launches: the ranges of one
// tile in one launch, Grouped::ranges). With `fork`, each launch goes on its own side stream with
// its own `ws_stride` bytes of g.workspace (its tables), so that they overlap: the launches no
// expert falls in (the device counts decide, so the host launches them all) end at once instead of
// one after the other, and a launch's last wave shares the GPU with the next one's first. Each
// expert's rows are in exactly one range, so the launches write disjoint rows and the bytes are
// those of the sequential order. They are issued in policy::bucket_order of `expected_rows` (the
// likely large range first).
// With `glu_out` (bf16 GEMM1, policy::glu_in_split) the unswapped launch runs the one-GEMM SwiGLU
// into glu_out [rows][N/2] instead of writing its rows of g.out.
// Launch i takes region i of the workspace (ws_stride bytes), or with `pairing` as GEMM2
// (`second`) region pairing->regions + i. GEMM1's call with pairing->gemm2 set also writes GEMM2's
// tables of the same tile in each launch's fill (Grouped::pair) where GEMM2 runs the same
// instantiation (all but GEMM1's one-GEMM SwiGLU launch), recording which in pairing->filled (bit
// i: launch i; a GEMM has at most one launch per tile), and GEMM2's call then launches those GEMMs
// without a fill: one table fill per tile and call instead of two.
struct Pairing {
  const cutlass_engine::Grouped* gemm2 = nullptr;
  size_t regions = 0;
  uint32_t filled = 0;
};
void run_buckets(cutlass_engine::Grouped g, const std::vector<policy::RowBucket>& buckets, bool fp8,
                 cudaStream_t st, StreamFork* fork, size_t ws_stride, double expected_rows,
                 bf16_raw* glu_out = nullptr, Pairing* pairing = nullptr, bool second = false) {
  const std::vector<std::vector<int>> launches =
      policy::bucket_launches(buckets, expected_rows, cutlass_engine::RowRanges::kMax);
  const bool split = fork && launches.size() > 1;
  if (split) fork->fork(st, int(launches.size()));
  uint8_t* const ws = static_cast<uint8_t*>(g.workspace);
  const size_t first = pairing && second ? pairing->regions : 0;
  const bool pairs = pairing && !second && pairing->gemm2 && launches.size() <= 32;  // one bit each
  if (pairs) pairing->filled = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    const int tile_n = buckets[launches[i].front()].tile_n;
    g.ranges = cutlass_engine::RowRanges::none();
    for (const int b : launches[i]) g.ranges.add(buckets[b].lo, buckets[b].hi);
    g.swap_ab = tile_n != 0;
    g.swap_tile_n = tile_n ? tile_n : 64;
    cudaStream_t s = split ? fork->side(int(i)) : st;
    g.workspace = ws + (first + i) * ws_stride;
    g.tables_filled = second && pairing && ((pairing->filled >> i) & 1u);
    cutlass_engine::Grouped q;
    g.pair = nullptr;
    if (pairs && !(glu_out && !g.swap_ab)) {
      q = *pairing->gemm2;
      q.ranges = g.ranges;
      q.swap_ab = g.swap_ab;
      q.swap_tile_n = g.swap_tile_n;
      q.workspace = ws + (pairing->regions + i) * ws_stride;
      g.pair = &q;
      pairing->filled |= 1u << i;
    }
    if (fp8) {
      cutlass_engine::grouped_gemm_fp8(g, s);
    } else if (glu_out && !g.swap_ab) {
      cutlass_engine::grouped_gemm_bf16_glu(glu_of(g, glu_out), s);
    } else {
      cutlass_engine::grouped_gemm_bf16(g, s);
    }
  }
  if (split) fork->join(st);
}

// fp8 GEMM1 `g` (N = 2I) as its gate and up halves (policy::CutlassPlan::split_w13): two groups
// per expert in the same launches (Grouped::halves), each N = I with its own scale tile rows,
// written into the two column halves of g.out [rows][2I]; the result is the [rows][2I] the single
// GEMM writes where I % 128 == 0.
void run_fp8_halves(cutlass_engine::Grouped g, const std::vector<policy::RowBucket>& buckets, cudaStream_t st,
                    StreamFork* fork, size_t ws_stride, double expected_rows, Pairing* pairing) {
  g.N /= 2;
  g.halves = true;
  run_buckets(g, buckets, true, st, fork, ws_stride, expected_rows, nullptr, pairing);
}

// The workspace one launch of `buckets` (fp8 or bf16 GEMMs; `glu`: the unswapped bf16 ones on the
// one-GEMM SwiGLU) needs: the largest one's, rounded up to 256 bytes so that concurrent launches'
// regions (run_buckets) stay aligned.
size_t bucket_workspace(const std::vector<policy::RowBucket>& buckets, bool fp8, int E, int sms, bool glu = false) {
  size_t n = 0;
  for (const policy::RowBucket& b : buckets) {
    const size_t s = fp8 ? (b.tile_n ? cutlass_engine::fp8_swap_workspace_bytes(E, sms, b.tile_n)
                                     : cutlass_engine::fp8_workspace_bytes(E, sms))
                         : (b.tile_n ? cutlass_engine::bf16_swap_workspace_bytes(E, sms, b.tile_n)
                                     : std::max(cutlass_engine::bf16_workspace_bytes(E, sms),
                                                glu ? cutlass_engine::glu_workspace_bytes(E, sms) : 0));
    n = std::max(n, s);
  }
  return (n + 255) / 256 * 256;
}

// The mixed-input GEMMs (fp8w, nvfp4w) are swapped launches over all experts with `tile_n`-wide
// token tiles. With 256-wide tiles they run as head, tail and mid launches (Grouped::Part): an
// expert's rows past a multiple of 256 (all of them under 256) go to a 64-wide tile of the tail
// where there are at most 64 of them, to a 128-wide tile of the mid launch where there are at most
// 128 (`mid`, CutlassPlan::mixed_mid: large experts), instead of a 256-wide tile (under the
// router, an expert of 257-306 rows at a 256-row mean; skewed, the cold experts' 128 rows). The
// tail and mid launches have their own workspace regions (tables and CUTLASS's workspace), which
// the head's table fill writes too (Grouped::pair); an empty launch returns before CUTLASS's
// prologue.
struct PartWorkspaces {
  void* tail = nullptr;
  void* mid = nullptr;  // null: no mid launch
};
template <class Gemm>
void run_mixed(cutlass_engine::Grouped g, int tile_n, PartWorkspaces ws, Gemm gemm) {
  using cutlass_engine::Grouped;
  g.swap_ab = true;
  g.swap_tile_n = tile_n;
  g.ranges = cutlass_engine::RowRanges{};
  if (tile_n != Grouped::kPartRows || !ws.tail) return gemm(g);
  g.with_mid = ws.mid != nullptr;
  Grouped tail = g, mid = g;
  tail.part = Grouped::Part::tail;
  tail.swap_tile_n = Grouped::kPartTail;
  tail.workspace = ws.tail;
  mid.part = Grouped::Part::mid;
  mid.swap_tile_n = Grouped::kPartMid;
  mid.workspace = ws.mid;
  g.part = Grouped::Part::head;
  g.pair = &tail;
  tail.pair = g.with_mid ? &mid : nullptr;
  gemm(g);
  tail.tables_filled = mid.tables_filled = true;
  gemm(tail);
  if (g.with_mid) gemm(mid);
}

// GEMM `g` (bf16 A) with fp8 weights `m` on the mixed-input GEMM (CutlassPath::fp8w): m's tile
// scales per row, `prepared` (prepare_fp8_row_scales) or written into `row_sf` here
// (expand_fp8_scales; half_rows = I for W13, whose scale grid restarts at I, N for W2).
void run_fp8w(cutlass_engine::Grouped g, const MatrixView& m, int half_rows, const float* prepared, float* row_sf,
              int tile_n, PartWorkspaces parts, cudaStream_t st) {
  if (!prepared)
    cutlass_engine::expand_fp8_scales(static_cast<const float*>(m.scales), g.experts, g.N, g.K, half_rows, row_sf, st);
  g.sfw = prepared ? prepared : row_sf;
  g.sfa = nullptr;
  run_mixed(g, tile_n, parts, [st](const cutlass_engine::Grouped& x) { cutlass_engine::grouped_gemm_fp8w(x, st); });
}

// GEMM `g` (bf16 A) with nvfp4 weights on the mixed-input GEMM (CutlassPath::nvfp4w): their paired
// copy `paired` (prepare) and alpha = 2^8 / gs per expert.
void run_nvfp4w(cutlass_engine::Grouped g, const void* paired, const float* alpha, int tile_n, PartWorkspaces parts,
                cudaStream_t st) {
  g.W = paired;
  g.alpha = alpha;
  g.sfw = g.sfa = nullptr;
  run_mixed(g, tile_n, parts, [st](const cutlass_engine::Grouped& x) { cutlass_engine::grouped_gemm_nvfp4w(x, st); });
}

}  // namespace

// Runs grouped GEMM `g` (bf16 A) with the weights of `m` widened to bf16, a chunk of `chunk`
// consecutive experts at a time through `scratch`. A chunk is the same grouped GEMM restricted to
// experts [e0, e0 + n): rows + e0 and offsets + e0 still address the full A and out matrices (the
// offsets are absolute), only W points at the chunk's widened copy. Chunks reuse one scratch
// buffer: the next widen is stream-ordered after the previous GEMM, which is what bounds memory.
// Returns the number of chunks (a host bound, independent of the device counts).
int CudaRunner::run_widened(const cutlass_engine::Grouped& g, const MatrixView& m, const float* alpha, int chunk,
                            cudaStream_t st, bf16_raw* swiglu_gate) {
  int chunks = 0;
  for (int e0 = 0; e0 < g.experts; e0 += chunk, ++chunks) {
    const int n = std::min(chunk, g.experts - e0);
    widen::to_bf16(m, e0, n, g.rows, scratch_.get<bf16_raw>(), st);  // rows indexed by absolute expert
    cutlass_engine::Grouped c = g;
    c.experts = n;
    c.rows = g.rows + e0;
    c.offsets = g.offsets + e0;
    c.W = scratch_.get();
    c.sfa = nullptr;
    c.sfw = nullptr;
    c.alpha = alpha ? alpha + e0 : nullptr;
    if (swiglu_gate)
      gemm1_swiglu(c, swiglu_gate, st);
    else
      cutlass_engine::grouped_gemm_bf16(c, st);
  }
  return chunks;
}

// count -> offsets -> permute (bf16 rows, or the e4m3 rows + scales as dispatched) -> GEMM1
// [rows][2I] (gate | up) -> SwiGLU (bf16; fp8 round trip or e4m3 + scales per intermediate_quant)
// -> GEMM2 -> weighted sum. Where GEMM1 runs on the bf16 GEMM and the intermediate stays bf16,
// GEMM1 and the SwiGLU pass are instead its gate half [rows][I] and its up half with SwiGLU in the
// epilogue (gemm1_swiglu, engine_cutlass_swiglu.cu). Where both GEMMs are on the fp8 GEMM in one
// unswapped launch (CutlassPlan::fp8_glu), GEMM1 is the fp8 one-GEMM SwiGLU into a bf16 [rows][I]
// and the pass only quantizes that (quantize_intermediate): the same bytes for GEMM2.
// Per GEMM the operand path is (policy.h):
//   bf16 weights: CUTLASS bf16;
//   fp8 weights: CUTLASS fp8 where the other operand is e4m3 already (GEMM1: fp8 dispatch, GEMM2:
//     intermediate_quant = fp8; partial 128-tiles in H or I too, GEMM1 then as its gate and up halves
//     where I % 128 != 0, run_fp8_halves), else the mixed-input GEMM decoding bf16(e4m3 * tile scale)
//     in its main loop (run_fp8w; with tuning.fp8_mixed off widened to those values + CUTLASS bf16),
//     so that a bf16 operand keeps its numerics (never requantized to e4m3);
//   nvfp4 weights: the mixed-input GEMM on their paired copy where prepare() wrote one (run_nvfp4w,
//     alpha = 2^8 / gs; GEMM1 with SwiGLU in its epilogue where the intermediate stays bf16 and
//     W13's copy is in GLU order, no pass), else widened to bf16(e2m1 * block scale) + CUTLASS bf16 with alpha = 1/gs
//     per expert (the same bits).
// Where 1/gs goes: into the bf16 GEMM's epilogue as a per-group alpha (a runtime argument of the
// existing instantiation), so it multiplies the fp32 accumulator before the one bf16 rounding,
// exactly as the mma.sync and wgmma engines do; applying it later (in the SwiGLU pass, or in the
// weighted sum, which would need each row's expert) would scale an already rounded value.
// With cutlass_swap auto the bf16 and fp8 GEMMs split by rows per expert (policy::row_buckets),
// one launch per tile over its ranges (policy::bucket_launches), each range on the tile that fits
// it (swap-AB 64, 128 or 192: the same operands and output bytes, the weights in the 128-row tile;
// or unswapped), which the device counts decide, on side streams unless
// tuning.concurrent_buckets is off; widened chunks run one swap-AB width (policy::swap_tile_n). A
// swapped GEMM1 is followed by the SwiGLU pass (the fused epilogue has no swapped form); split by
// rows with bf16 weights (policy::glu_in_split), the unswapped launch runs the one-GEMM SwiGLU and
// the pass covers only the swapped ones' experts.
// Widened GEMMs run as all GEMM1 chunks, the SwiGLU pass once over all rows, then all GEMM2 chunks:
// the SwiGLU pass and the intermediate's fp8 quantization stay one launch each, and both GEMMs
// share one scratch buffer (W13 chunks, then W2 chunks).
void CudaRunner::run_cutlass(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, cudaStream_t st) {
  using policy::CutlassPath;
  const int64_t S = in.slots();
  const int K = in.top_k, E = in.num_local_experts, H = in.hidden, I = w.intermediate;
  const int64_t max_rows = S * K;
  const WeightFormat wf = w.w13.format;
  const IntermediateQuant iq = cfg_.effective_intermediate_quant();
  const bool iq8 = iq == IntermediateQuant::fp8;
  const double er = policy::expected_rows(cfg_, in);
  policy::CutlassPlan plan =
      policy::cutlass_plan(in, w, iq, fused_swiglu_, cutlass_swap_, er, widen_scratch_, fp8_mixed_, paired_for(w));
  const CutlassPath p1 = plan.gemm1, p2 = plan.gemm2;
  if (!row_buckets_.empty()) {
    policy::check_row_buckets(row_buckets_, p1 != CutlassPath::bf16 && p2 != CutlassPath::bf16);
    plan.buckets = row_buckets_;
    plan.fused_swiglu = plan.fused_swiglu && plan.tile_n(p1) == 0;
    plan.glu_split = policy::glu_in_split(plan, I, iq);
    plan.fp8_glu = plan.fp8_glu && plan.direct_tile_n() == 0;
  }
  const bool fp8_glu = plan.fp8_glu;
  const bool fp8_1 = p1 == CutlassPath::fp8, fp8_2 = p2 == CutlassPath::fp8;
  const bool nvfp4 = wf == WeightFormat::nvfp4;
  const bool fuse = plan.fused_swiglu;
  const bool glu_split = plan.glu_split;
  // GEMM1 on nvfp4w with SwiGLU in its epilogue (prepare() wrote W13's copy in GLU order).
  const bool nv_glu = p1 == CutlassPath::nvfp4w && paired13_glu_;
  last_swiglu_fused_ = fuse || nv_glu;
  last_glu_split_ = glu_split;
  // A direct GEMM reports its buckets' tile (or kByRows); a widened pair its single width.
  last_swap_tile_n_ = plan.tile_n(p1 == CutlassPath::widened ? p2 : p1);
  // The offsets kernel also writes an m-tile table: CUTLASS does not read it, the SwiGLU pass does
  // where it skips the experts of fused ranges (glu_split).
  const int bm = 128;
  const int64_t max_tiles = (max_rows + bm - 1) / bm + E;
  last_bm_ = bm;
  engines_ = policy::path_name(p1, wf, plan.tile_n(p1)) + "/" + policy::path_name(p2, wf, plan.tile_n(p2));
  last_engines_ = engines_.c_str();

  if (sms_ == 0) EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
  // The GEMMs run one after the other on the stream, so they share one workspace (sized for a full
  // group count; a chunk has fewer groups); a GEMM's concurrent launches of a split
  // (concurrent_buckets) take one region each.
  const bool any_fp8 = p1 == CutlassPath::fp8 || p2 == CutlassPath::fp8;
  const bool any_bf16 = p1 == CutlassPath::bf16 || p2 == CutlassPath::bf16;
  const bool any_widened = p1 == CutlassPath::widened || p2 == CutlassPath::widened;
  const bool mixed1 = p1 == CutlassPath::fp8w, mixed2 = p2 == CutlassPath::fp8w;
  const bool nv1 = p1 == CutlassPath::nvfp4w, nv2 = p2 == CutlassPath::nvfp4w;
  const int sw = plan.swap_tile_n;
  const int groups8 = plan.split_w13 && !fp8_glu ? 2 * E : E;
  const size_t ws_stride = std::max(any_fp8 ? std::max(bucket_workspace(plan.buckets, true, groups8, sms_),
                                                       fp8_glu ? cutlass_engine::glu_fp8_workspace_bytes(E, sms_) : 0)
                                            : 0,
                                    any_bf16 ? bucket_workspace(plan.buckets, false, E, sms_, glu_split) : 0);
  StreamFork* const fork = concurrent_buckets_ && plan.buckets.size() > 1 ? &fork_ : nullptr;
  // Either mixed-input GEMM at its token tile and at the tail's and mid's (run_mixed), 256-byte aligned.
  auto mixed_bytes = [&](int tile) {
    return std::max(mixed1 || mixed2 ? cutlass_engine::fp8w_workspace_bytes(E, sms_, tile) : 0,
                    std::max(nv1 || nv2 ? cutlass_engine::nvfp4w_workspace_bytes(E, sms_, tile) : 0,
                             nv_glu ? cutlass_engine::nvfp4w_workspace_bytes(E, sms_, tile, true) : 0));
  };
  const size_t mixed_ws =
      (std::max({mixed_bytes(plan.fp8w_tile_n), mixed_bytes(cutlass_engine::Grouped::kPartTail),
                 mixed_bytes(cutlass_engine::Grouped::kPartMid)}) +
       255) /
      256 * 256;
  // One region per launch of each GEMM (run_buckets: GEMM1's fills also write GEMM2's tables).
  cws_.reserve(std::max({ws_stride * 2 * plan.buckets.size(),
                         any_widened ? bucket_workspace({policy::RowBucket{0, policy::RowBucket{}.hi, sw}}, false, E,
                                                        sms_)
                                     : 0,
                         fuse ? std::max(cutlass_engine::swiglu_workspace_bytes(E, sms_),
                                         cutlass_engine::glu_workspace_bytes(E, sms_))
                              : 0,
                         3 * mixed_ws}));
  // The mixed-input GEMMs' tail and mid launches (run_mixed) use the second and third thirds of
  // their reservation.
  const PartWorkspaces parts =
      mixed_ws ? PartWorkspaces{static_cast<uint8_t*>(cws_.get()) + mixed_ws,
                                plan.mixed_mid ? static_cast<uint8_t*>(cws_.get()) + 2 * mixed_ws : nullptr}
               : PartWorkspaces{};
  // fp8w GEMMs: the tile scales on each weight row, as prepare() wrote them for these weights, or
  // per call into row_sf_, which both GEMMs share: W2's expansion is a plain launch after the
  // SwiGLU pass, which waits for GEMM1 to complete (PDL), so GEMM1 has read W13's by then.
  const bool rows_prepared = prep_rows_src13_ && w.w13.scales == prep_rows_src13_ && w.w2.scales == prep_rows_src2_ &&
                             w.w2.prepared == prep2_.get();
  const float* prep_row13 = rows_prepared ? prep_rows13_.get<float>() : nullptr;
  const float* prep_row2 = rows_prepared ? prep2_.get<float>() : nullptr;
  if ((mixed1 || mixed2) && !rows_prepared)
    row_sf_.reserve(std::max(mixed1 ? cutlass_engine::fp8w_scales_bytes(E, 2 * I, H) : 0,
                             mixed2 ? cutlass_engine::fp8w_scales_bytes(E, H, I) : 0));
  const int chunk1 = plan.chunk1, chunk2 = plan.chunk2;
  scratch_.reserve(plan.scratch_bytes());
  reserve_routing(E, max_tiles, max_rows);
  if (!fp8_glu && !nv_glu) gu_.reserve(size_t(max_rows) * 2 * I * 2);
  o_.reserve(size_t(max_rows) * H * 2);
  if (fp8_1) {
    a8_.reserve(size_t(max_rows) * H);
    as_.reserve(size_t(max_rows) * fp8_blocks(H) * 4);
  } else {
    a_.reserve(size_t(max_rows) * H * 2);
  }
  if (fp8_2) {
    h8_.reserve(size_t(max_rows) * I);
    hs_.reserve(size_t(max_rows) * fp8_blocks(I) * 4);
  }
  if (!fp8_2 || fp8_glu) h_.reserve(size_t(max_rows) * I * 2);
  // prepare() may have reordered W13's scales once already (prepare_fp8_glu_scales).
  const float* glu_sfw = fp8_glu ? static_cast<const float*>(w.w13.prepared) : nullptr;
  if (fp8_glu && !glu_sfw) glu_sfw_.reserve(fp8_glu_scales_bytes(E, H, I));
  // Per-expert alpha of nvfp4 weights, [2][E] (W13, W2): 1/gs widened; the paired GEMM's weights
  // carry 2^-8 (nvfp4w), its alpha 2^8 / gs, which prepare() wrote for these global scales.
  const float* inv_gs = nullptr;
  if (nvfp4 && nv1 && nv2 && w.w13.global_scale == paired_gs13_ && w.w2.global_scale == paired_gs2_) {
    inv_gs = paired_alpha_.get<float>();
  } else if (nvfp4) {
    inv_gs_.reserve(size_t(E) * 2 * sizeof(float));
    float* const inv = inv_gs_.get<float>();
    widen::inverse_scales(w.w13.global_scale, E, inv, st, nv1 ? 256.0f : 1.0f);
    widen::inverse_scales(w.w2.global_scale, E, inv + E, st, nv2 ? 256.0f : 1.0f);
    inv_gs = inv;
  }

  launch_count(in, bm, cnt_.get<int32_t>(), offsets_.get<int32_t>(), fill_.get<int32_t>(), tiles_.get<MTile>(),
               num_tiles_.get<int32_t>(), st, pdl_);
  if (fp8_1) {
    launch_permute_fp8_rows(in, offsets_.get<int32_t>(), fill_.get<int32_t>(), pair_pos_.get<int32_t>(),
                            a8_.get<uint8_t>(), as_.get<float>(), fp8_blocks(H), 1, st, pdl_);
  } else {
    launch_permute_bf16(in, offsets_.get<int32_t>(), fill_.get<int32_t>(), pair_pos_.get<int32_t>(),
                        a_.get<bf16_raw>(), st, pdl_);
  }

  last_widen_chunks_ = 0;
  cutlass_engine::Grouped g1;
  g1.experts = E;
  g1.N = 2 * I;
  g1.K = H;
  g1.rows = cnt_.get<int32_t>();
  g1.offsets = offsets_.get<int32_t>();
  g1.W = w.w13.data;
  g1.out = gu_.get<bf16_raw>();
  g1.workspace = cws_.get();
  g1.sms = sms_;
  g1.swap_ab = sw != 0;  // g2 and the widened chunks copy both
  g1.swap_tile_n = sw ? sw : 64;
  // Launches on the fork's side streams follow an event, not the kernel before them: plain there.
  g1.pdl = pdl_ && !fork;
  cutlass_engine::Grouped g2 = g1;
  g2.N = H;
  g2.K = I;
  g2.W = w.w2.data;
  g2.out = o_.get<bf16_raw>();
  g2.A = p2 == CutlassPath::fp8 ? static_cast<const void*>(h8_.get<uint8_t>()) : h_.get<bf16_raw>();
  g2.sfa = p2 == CutlassPath::fp8 ? hs_.get<float>() : nullptr;
  g2.sfw = p2 == CutlassPath::fp8 ? static_cast<const float*>(w.w2.scales) : nullptr;
  // Both GEMMs split on the same instantiations (fp8 and fp8, or bf16 and bf16 with GEMM1 not
  // fused whole): GEMM1's table fills write GEMM2's too, into regions nb.. (run_buckets).
  Pairing pairing{&g2, plan.buckets.size(), 0};
  const bool paired = p1 == p2 && ((p1 == CutlassPath::fp8 && !fp8_glu) || (p1 == CutlassPath::bf16 && !fuse));
  Pairing* const pair = paired ? &pairing : nullptr;
  if (p1 == CutlassPath::fp8) {
    g1.A = a8_.get<uint8_t>();
    g1.sfa = as_.get<float>();
    g1.sfw = static_cast<const float*>(w.w13.scales);
    if (fp8_glu) {
      if (!glu_sfw) {
        cutlass_engine::glu_fp8_scales(g1.sfw, E, I, H, glu_sfw_.get<float>(), st, pdl_);
        glu_sfw = glu_sfw_.get<float>();
      }
      cutlass_engine::Grouped glu = g1;
      glu.N = I;
      glu.sfw = glu_sfw;
      glu.out = h_.get<bf16_raw>();
      cutlass_engine::grouped_gemm_fp8_glu(glu, st);
    } else if (plan.split_w13)
      run_fp8_halves(g1, plan.buckets, st, fork, ws_stride, er, pair);
    else
      run_buckets(g1, plan.buckets, true, st, fork, ws_stride, er, nullptr, pair);
  } else if (fuse) {
    // gu_ holds the gate half [rows][I]; the up half's epilogue writes the intermediate into h_.
    g1.A = a_.get<bf16_raw>();
    g1.out = h_.get<bf16_raw>();
    if (p1 == CutlassPath::bf16)
      gemm1_swiglu(g1, gu_.get<bf16_raw>(), st);
    else
      last_widen_chunks_ += run_widened(g1, w.w13, inv_gs, chunk1, st, gu_.get<bf16_raw>());
  } else {
    g1.A = a_.get<bf16_raw>();
    if (p1 == CutlassPath::bf16)
      run_buckets(g1, plan.buckets, false, st, fork, ws_stride, er, glu_split ? h_.get<bf16_raw>() : nullptr, pair);
    else if (mixed1)
      run_fp8w(g1, w.w13, I, prep_row13, row_sf_.get<float>(), plan.fp8w_tile_n, parts, st);
    else if (nv_glu)
      run_nvfp4w(glu_of(g1, h_.get<bf16_raw>()), paired13_.get(), inv_gs, plan.fp8w_tile_n, parts, st);
    else if (nv1)
      run_nvfp4w(g1, paired13_.get(), inv_gs, plan.fp8w_tile_n, parts, st);
    else
      last_widen_chunks_ += run_widened(g1, w.w13, inv_gs, chunk1, st);
  }

  if (fp8_glu) {
    cutlass_engine::quantize_intermediate(h_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I,
                                          max_rows, in.quant.ue8m0, h8_.get<uint8_t>(), hs_.get<float>(), st, pdl_);
  } else if (!fuse && !nv_glu) {
    // With glu_split the pass leaves the unswapped buckets' experts, whose rows GEMM1 wrote.
    cutlass_engine::SwigluSkip skip;
    if (glu_split) {
      for (const policy::RowBucket& b : plan.buckets)
        if (b.tile_n == 0) skip.fused.add(b.lo, b.hi);
      skip.tiles = tiles_.get<MTile>();
      skip.num_tiles = num_tiles_.get<int32_t>();
    }
    cutlass_engine::swiglu(gu_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, max_rows,
                           iq8 && !fp8_2, in.quant.ue8m0, fp8_2 ? nullptr : h_.get<bf16_raw>(),
                           fp8_2 ? h8_.get<uint8_t>() : nullptr, fp8_2 ? hs_.get<float>() : nullptr, st, skip,
                           pdl_);
  }

  if (p2 == CutlassPath::fp8) {
    run_buckets(g2, plan.buckets, true, st, fork, ws_stride, er, nullptr, pair, true);
  } else {
    if (p2 == CutlassPath::bf16)
      run_buckets(g2, plan.buckets, false, st, fork, ws_stride, er, nullptr, pair, true);
    else if (mixed2)
      run_fp8w(g2, w.w2, H, prep_row2, row_sf_.get<float>(), plan.fp8w_tile_n, parts, st);
    else if (nv2)
      run_nvfp4w(g2, paired2_.get(), inv_gs + E, plan.fp8w_tile_n, parts, st);
    else
      last_widen_chunks_ += run_widened(g2, w.w2, nvfp4 ? inv_gs + E : nullptr, chunk2, st);
  }

  launch_reduce(in, pair_pos_.get<int32_t>(), o_.get<bf16_raw>(), y, st, pdl_);
}

}  // namespace epmoe::cuda
