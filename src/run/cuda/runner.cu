// Runner "cuda" (runner.h): tuning, the prepare step, the per-call checks and the decode engines'
// path (mma.sync / wgmma); the CUTLASS engine's path is runner_cutlass.cu, the choice between them
// policy.h.
#include "run/cuda/runner.h"

#include <string>

#include "epmoe/error.h"
#include "run/cuda/engine.h"
#include "run/cuda/policy.h"
#include "run/cuda/rows.h"
#include "run/cuda/widen.h"

namespace epmoe::cuda {
namespace {

std::string mat_desc(const MatrixView& m) {
  return std::string(format_name(m.format)) + "[" + std::to_string(m.experts) + ", " + std::to_string(m.rows) + ", " +
         std::to_string(m.cols) + "] on " + device_name(m.device);
}

// One grouped GEMM on the engine chosen for it (decode wgmma variants, else mma.sync).
void launch_on_engine(const GemmArgs& g, bool wgmma_fp8, bool wgmma_bf16, bool wgmma_nvfp4, bool wide, int bm,
                      cudaStream_t st) {
  if (wide) launch_grouped_gemm_wgmma_nvfp4_wide(g, bm, st);
  else if (wgmma_fp8) launch_grouped_gemm_wgmma_fp8(g, st);
  else if (wgmma_bf16) launch_grouped_gemm_wgmma_bf16(g, st);
  else if (wgmma_nvfp4 && g.W.prepared) launch_grouped_gemm_wgmma_nvfp4_prepared(g, st);
  else if (wgmma_nvfp4) launch_grouped_gemm_wgmma_nvfp4(g, st);
  else launch_grouped_gemm(g, bm, st);
}

}  // namespace

CudaRunner::CudaRunner(const MoeConfig& cfg, int device_index)
    : cfg_(cfg),
      device_(device_index),
      engine_(cfg.tuning.engine),
      wgmma_defer_(cfg.tuning.wgmma_defer),
      pdl_(cfg.tuning.pdl),
      widen_scratch_(size_t(cfg.tuning.widen_scratch_mb) << 20),
      fused_swiglu_(cfg.tuning.fused_swiglu),
      concurrent_buckets_(cfg.tuning.concurrent_buckets),
      fp8_mixed_(cfg.tuning.fp8_mixed),
      cutlass_swap_(cfg.tuning.cutlass_swap) {}

size_t CudaRunner::prepare(ExpertWeights& w, Stream stream) {
  const bool nvfp4 = cfg_.tuning.nvfp4_prepare && w.w13.format == WeightFormat::nvfp4;
  const bool paired = cfg_.tuning.nvfp4_mixed && w.w13.format == WeightFormat::nvfp4 && cutlass_engine::available();
  const bool fp8 = w.w13.format == WeightFormat::fp8;
  if (!nvfp4 && !paired && !fp8) return 0;
  DeviceGuard guard(device_);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  size_t bytes = nvfp4 ? prepare_nvfp4_weights(w, prep13_, prep2_, st) : fp8 ? prepare_fp8_glu_scales(w, prep13_, st) : 0;
  if (paired) {
    // GEMM1 on them runs SwiGLU in its epilogue where the intermediate stays bf16 (the fp8 round
    // trip's 128-column blocks span two of its tiles): W13's copy is then in GLU order.
    const bool glu = cfg_.effective_intermediate_quant() != IntermediateQuant::fp8;
    const size_t n = prepare_nvfp4_paired(w, paired13_, paired2_, st, glu);
    paired13_glu_ = n && glu;
    paired_src13_ = n ? w.w13.data : nullptr;
    paired_src2_ = n ? w.w2.data : nullptr;
    // Their GEMMs' alpha, 2^8 / gs per expert (W13's E, then W2's), once instead of per call.
    paired_gs13_ = paired_gs2_ = nullptr;
    if (n) {
      const int E = w.w13.experts;
      paired_alpha_.reserve(size_t(E) * 2 * sizeof(float));
      widen::inverse_scales(w.w13.global_scale, E, paired_alpha_.get<float>(), st, 256.0f);
      widen::inverse_scales(w.w2.global_scale, E, paired_alpha_.get<float>() + E, st, 256.0f);
      paired_gs13_ = w.w13.global_scale;
      paired_gs2_ = w.w2.global_scale;
      bytes += size_t(E) * 2 * sizeof(float);
    }
    bytes += n;
  }
  if (fp8 && fp8_mixed_ && cutlass_engine::available()) {
    bytes += prepare_fp8_row_scales(w, prep_rows13_, prep2_, st);
    prep_rows_src13_ = w.w13.scales;
    prep_rows_src2_ = w.w2.scales;
  }
  // Complete before any run, whatever stream the caller then uses.
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(st));
  return bytes;
}

void CudaRunner::set_engine(Engine e) {
  if (e == Engine::cutlass && !cutlass_engine::available())
    throw UsageError("runner cuda: engine cutlass was asked for, but this build has no CUTLASS (run scripts/setup.sh and "
                     "re-run cmake), or use engine auto/mma");
  engine_ = e;
}

void CudaRunner::set_widen_scratch_bytes(size_t bytes) {
  if (bytes == 0)
    throw UsageError("runner cuda: widen scratch of 0 bytes; give a positive size (default " +
                     std::to_string(widen::kDefaultScratchBytes >> 20) + " MiB)");
  widen_scratch_ = bytes;
}

void CudaRunner::check(const DispatchOutput& in, const ExpertWeights& w, const bf16_raw* y) const {
  auto fail = [](const std::string& m) { throw UsageError("runner cuda: " + m); };
  if (in.device != DeviceKind::cuda) fail("dispatch output is on " + std::string(device_name(in.device)) + ", needs cuda");
  if (w.w13.device != DeviceKind::cuda || w.w2.device != DeviceKind::cuda)
    fail("weights must be on the CUDA device (w13 " + mat_desc(w.w13) + ", w2 " + mat_desc(w.w2) + ")");
  const int H = in.hidden, I = w.intermediate, E = in.num_local_experts;
  if (w.hidden != H || w.num_local_experts != E)
    fail("weights are for hidden=" + std::to_string(w.hidden) + ", experts=" + std::to_string(w.num_local_experts) +
         " but the dispatch output has hidden=" + std::to_string(H) + ", experts=" + std::to_string(E));
  if (w.w13.experts != E || w.w13.rows != 2 * I || w.w13.cols != H)
    fail("w13 is " + mat_desc(w.w13) + "; expected [" + std::to_string(E) + ", " + std::to_string(2 * I) + ", " +
         std::to_string(H) + "]");
  if (w.w2.experts != E || w.w2.rows != H || w.w2.cols != I)
    fail("w2 is " + mat_desc(w.w2) + "; expected [" + std::to_string(E) + ", " + std::to_string(H) + ", " +
         std::to_string(I) + "]");
  if (w.w13.format != w.w2.format) fail("w13 and w2 must share one weight format");
  if (!row_split_ok(w.w13, I)) fail(row_split_error("w13", w.w13, I));
  if (!row_split_ok(w.w2, 0)) fail(row_split_error("w2", w.w2, 0));
  if (H % 64 != 0 || I % 64 != 0)
    fail("hidden=" + std::to_string(H) + " and intermediate=" + std::to_string(I) + " must be multiples of 64");
  if (in.top_k > 32) fail("top_k=" + std::to_string(in.top_k) + " exceeds 32");
  if (in.slots() > 0 && (!in.payload || !in.local_ids || !in.weights || !in.counts || !y))
    fail("payload, local_ids, weights, counts and y must be non-null");
  if (in.format != ActFormat::bf16 && !in.scales) fail(std::string("scales are null for format ") + format_name(in.format));
  if (in.format == ActFormat::nvfp4 && !(in.quant.nvfp4_global_scale > 0.f))
    fail("nvfp4 dispatch needs quant.nvfp4_global_scale > 0");
  if (w.w13.format == WeightFormat::nvfp4 && (!w.w13.global_scale || !w.w2.global_scale))
    fail("nvfp4 weights need global_scale arrays on the device");
}

void CudaRunner::reserve_routing(int E, int64_t max_tiles, int64_t max_rows) {
  cnt_.reserve(size_t(E) * 4);
  offsets_.reserve(size_t(E) * 4);
  fill_.reserve(size_t(E) * 4);
  tiles_.reserve(size_t(max_tiles) * sizeof(MTile));
  num_tiles_.reserve(2 * 4);  // [0]: the m-tile table; [1]: the wide engine's 160-row table
  pair_pos_.reserve(size_t(max_rows) * 4);
}

void CudaRunner::run(const DispatchOutput& in, const ExpertWeights& w, bf16_raw* y, Stream stream) {
  check(in, w, y);
  const int64_t S = in.slots();
  if (S == 0) return;
  DeviceGuard g(device_);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int E = in.num_local_experts, H = in.hidden, I = w.intermediate;
  const int64_t max_rows = S * in.top_k;
  const double avg = policy::expected_rows(cfg_, in);
  const IntermediateQuant iq = cfg_.effective_intermediate_quant();
  // The engines a 32-row m-tile would get: they decide how far the decode engines reach.
  const policy::DecodeEngines d32 =
      policy::decode_engines(wgmma_decode_, kWgmmaBlockM, w.w13.format, in.format, iq, H, I, w.w13.prepared != nullptr,
                             w.w2.prepared != nullptr);
  const bool prepared = w.w13.prepared && w.w2.prepared;
  const int decode_limit = policy::decode_max_rows(w.w13.format, d32, cfg_.tuning.decode_max_rows, prepared, E,
                                                   3 * int64_t(H) * I, fp8_mixed_);
  const double wide_limit = policy::nvfp4_wide_max_rows(H, I, cfg_.tuning.nvfp4_wide_max_rows, paired_for(w), E);
  const bool wide = force_bm_ == 0 && policy::use_nvfp4_wide(engine_, d32, prepared, avg, decode_limit, wide_limit);
  // The wide engine's token tiles: 128 or 160 rows, or by rows (tuning.nvfp4_wide_rows = 0): each
  // expert the height that gives it fewer tiles, in a second table and a second launch per GEMM.
  const bool split = wide && cfg_.tuning.nvfp4_wide_rows == 0;
  const int bm = wide ? (cfg_.tuning.nvfp4_wide_rows == kWgmmaWide160BlockM ? kWgmmaWide160BlockM : kWgmmaWideBlockM)
                      : policy::block_m(avg, force_bm_, decode_limit);
  last_bm_ = split ? policy::kByRows : bm;
  const int64_t max_tiles = (max_rows + bm - 1) / bm + E;
  const int64_t max_tiles2 = split ? (max_rows + kWgmmaWide160BlockM - 1) / kWgmmaWide160BlockM + E : 0;
  if (max_rows > INT32_MAX) throw UsageError("runner cuda: R*C*K=" + std::to_string(max_rows) + " rows exceed 2^31");
  last_direct_rows_ = false;
  if (!wide && policy::use_cutlass(engine_, w.w13.format, avg, decode_limit)) return run_cutlass(in, w, y, st);
  last_swap_tile_n_ = 0;
  last_swiglu_fused_ = last_glu_split_ = false;

  reserve_routing(E, max_tiles + max_tiles2, max_rows);
  a_.reserve(size_t(max_rows) * H * 2);
  h_.reserve(size_t(max_rows) * I * 2);
  o_.reserve(size_t(max_rows) * H * 2);

  // The decode engines at m-tile 32, the wide nvfp4 engine for both GEMMs, else none (m-tile 128).
  const policy::DecodeEngines d = bm == kWgmmaBlockM || wide ? d32 : policy::DecodeEngines{};
  MTile* const tiles2 = split ? tiles_.get<MTile>() + max_tiles : nullptr;
  // One GEMM; split: the experts of the second table in a second launch of 160-row tiles.
  auto gemm = [&](const GemmArgs& g, bool wgmma_fp8, bool wgmma_nvfp4) {
    launch_on_engine(g, wgmma_fp8, d.bf16, wgmma_nvfp4, wide, bm, st);
    if (!split) return;
    GemmArgs g160 = g;
    g160.tiles = tiles2;
    g160.num_tiles = num_tiles_.get<int32_t>() + 1;
    g160.max_tiles = static_cast<int>(max_tiles2);
    launch_grouped_gemm_wgmma_nvfp4_wide(g160, kWgmmaWide160BlockM, st);
  };
  static const char* const kEngines[2][2][2] = {
      {{"mma/mma", "mma/wgmma-fp8"}, {"wgmma-fp8/mma", "wgmma-fp8/wgmma-fp8"}},
      {{"wgmma-bf16/wgmma-bf16", "wgmma-bf16/wgmma-bf16"}, {"wgmma-bf16/wgmma-bf16", "wgmma-bf16/wgmma-bf16"}}};
  last_engines_ = kEngines[d.bf16][d.fp8_1][d.fp8_2];
  if (d.nvfp4_1 || d.nvfp4_2) {
    auto name = [wide](bool wg, const MatrixView& m) {
      return !wg ? "mma" : wide ? "wgmma-nvfp4w" : m.prepared ? "wgmma-nvfp4p" : "wgmma-nvfp4";
    };
    engines_ = std::string(name(d.nvfp4_1, w.w13)) + "/" + name(d.nvfp4_2, w.w2);
    last_engines_ = engines_.c_str();
  }
  if (d.fp8_2) {
    h8_.reserve(size_t(max_rows) * I);
    hs_.reserve(size_t(max_rows) * fp8_blocks(I) * 4);
  }

  // GEMM1 on the wgmma bf16 engine with a bf16 dispatch, or on the wgmma fp8 engine with an fp8
  // one, takes the dispatched rows as they are: where the count's single CTA also claims the rows
  // (launch_count_claim), GEMM1 reads them from the dispatch buffer through src_rows_ and no
  // permute runs (one launch fewer at decode sizes: the permute was 4-7 us of a 0.1 ms Qwen3-30B
  // call, ncu, session 32).
  const bool fp8_in = in.format == ActFormat::fp8;
  const bool direct_ok = direct_rows_ && bm == kWgmmaBlockM && !wide && !d.nvfp4_1 &&
                         (d.fp8_1 ? fp8_in : d.bf16 && in.format == ActFormat::bf16) &&
                         reinterpret_cast<uintptr_t>(in.payload) % 16 == 0 &&
                         in.payload_stride() == size_t(H) * (fp8_in ? 1 : 2) &&
                         (!fp8_in || in.scale_stride() == size_t(fp8_blocks(H)) * 4);
  if (direct_ok) src_rows_.reserve(size_t(max_rows) * 4);
  const bool direct =
      direct_ok && launch_count_claim(in, bm, cnt_.get<int32_t>(), offsets_.get<int32_t>(), fill_.get<int32_t>(),
                                      tiles_.get<MTile>(), num_tiles_.get<int32_t>(), pair_pos_.get<int32_t>(),
                                      src_rows_.get<int32_t>(), st, pdl_);
  last_direct_rows_ = direct;
  if (!direct)
    launch_count(in, bm, cnt_.get<int32_t>(), offsets_.get<int32_t>(), fill_.get<int32_t>(), tiles_.get<MTile>(),
                 num_tiles_.get<int32_t>(), st, pdl_, split ? kWgmmaWide160BlockM : 0, tiles2);
  if (d.fp8_1 && !direct) {
    a8_.reserve(size_t(max_rows) * H);
    as_.reserve(size_t(max_rows) * fp8_blocks(H) * 4);
  }
  // The nvfp4 engine reads its tokens K-permuted: the permute writes GEMM1's rows that way where it
  // can (else they are rewritten in place below); GEMM2's come that way out of GEMM1 when it ran on
  // the same engine, else they are rewritten too.
  bool a_korder = false;
  if (direct) {
    // GEMM1 reads the dispatch buffer (below); pair_pos_ was written with the counts.
  } else if (d.fp8_1) {
    launch_permute_fp8_rows(in, offsets_.get<int32_t>(), fill_.get<int32_t>(), pair_pos_.get<int32_t>(),
                            a8_.get<uint8_t>(), as_.get<float>(), 1, max_rows, st, pdl_);
  } else {
    a_korder = launch_permute_bf16(in, offsets_.get<int32_t>(), fill_.get<int32_t>(), pair_pos_.get<int32_t>(),
                                   a_.get<bf16_raw>(), st, pdl_, d.nvfp4_1);
  }

  GemmArgs g1;
  g1.A = a_.get<bf16_raw>();
  g1.K = H;
  g1.W = w.w13;
  g1.fused = true;
  g1.N = I;
  g1.out = h_.get<bf16_raw>();
  g1.tiles = tiles_.get<MTile>();
  g1.num_tiles = num_tiles_.get<int32_t>();
  g1.max_tiles = static_cast<int>(max_tiles);
  g1.wgmma_defer = wgmma_defer_;
  g1.pdl = pdl_;
  if (d.fp8_1) {
    g1.A8 = a8_.get<uint8_t>();
    g1.a_scales = as_.get<float>();
    g1.a_scales_ld = max_rows;
  }
  if (direct) {
    g1.a_rows = src_rows_.get<int32_t>();
    if (d.fp8_1) {
      g1.A8 = in.payload;
      g1.a_scales = reinterpret_cast<const float*>(in.scales);
      g1.a_scales_ld = fp8_blocks(H);
    } else {
      g1.A = reinterpret_cast<const bf16_raw*>(in.payload);
    }
  }
  if (d.nvfp4_1 && !a_korder)
    kperm_nvfp4_tokens(a_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, H, max_rows, st);
  g1.out_kperm = d.nvfp4_1 && d.nvfp4_2;
  gemm(g1, d.fp8_1, d.nvfp4_1);

  if (d.fp8_2) {
    launch_intermediate_to_fp8(h_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, in.quant.ue8m0,
                               max_rows, h8_.get<uint8_t>(), hs_.get<float>(), st, pdl_);
  } else if (iq == IntermediateQuant::fp8) {
    launch_intermediate_fp8(h_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, in.quant.ue8m0,
                            max_rows, st, pdl_);
  }

  GemmArgs g2 = g1;
  g2.a_rows = nullptr;
  g2.A = h_.get<bf16_raw>();
  g2.K = I;
  g2.W = w.w2;
  g2.fused = false;
  g2.N = H;
  g2.out = o_.get<bf16_raw>();
  g2.A8 = nullptr;
  g2.a_scales = nullptr;
  g2.a_scales_ld = 0;
  if (d.fp8_2) {
    g2.A8 = h8_.get<uint8_t>();
    g2.a_scales = hs_.get<float>();
    g2.a_scales_ld = max_rows;
  }
  g2.out_kperm = false;
  if (d.nvfp4_2 && !d.nvfp4_1)
    kperm_nvfp4_tokens(h_.get<bf16_raw>(), offsets_.get<int32_t>(), cnt_.get<int32_t>(), E, I, max_rows, st);
  gemm(g2, d.fp8_2, d.nvfp4_2);

  launch_reduce(in, pair_pos_.get<int32_t>(), o_.get<bf16_raw>(), y, st, pdl_);
}

}  // namespace epmoe::cuda
