// The CUTLASS engine's grouped GEMMs alone (engine_cutlass_*.cu), without the runner around them
// (test_runner_cutlass.cu): the plain GEMMs unswapped and swap-AB against a float64 product, a
// launch restricted to a row range bitwise as the whole launch, and GEMM1 with SwiGLU as one GEMM
// (engine_cutlass_glu.cu), whole and inside a split by rows, bitwise as GEMM1 followed by the
// SwiGLU pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "epmoe/error.h"
#include "common/gpu_test_util.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/runner_test_util.h"

namespace epmoe::test {
namespace {

// Groups of `rows` packed one after the other: each group's first row, and the rows in all.
struct PackedGroups {
  std::vector<int32_t> offsets;
  int total = 0;
};
PackedGroups pack_groups(const std::vector<int32_t>& rows) {
  PackedGroups p;
  for (const int32_t r : rows) {
    p.offsets.push_back(p.total);
    p.total += r;
  }
  return p;
}

int sm_count() {
  int sms = 0;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

// The grouped GEMMs alone, unswapped and swap-AB (64-, 128- and 192-wide token tiles, fp8 also 96), against a
// float64 product of the same operands: groups with 0 rows (first, middle and last), one row,
// partial m/n tiles (33, 100, 130, 257 rows: partial 128-row tiles unswapped, partial token tiles
// swapped); out rows outside the groups must stay untouched. A launch restricted to a row range
// (Grouped::ranges, the runner's split by rows; one range or several in one launch) writes exactly
// the experts in the ranges, bitwise as the unrestricted launch with the same tile.
TEST(CutlassEngine, GroupedGemmDirect) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  namespace ce = cuda::cutlass_engine;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> us(0.5f, 2.f);
  const std::vector<int32_t> rows = {0, 130, 1, 33, 64, 0, 100, 257, 0};
  const int E = int(rows.size()), N = 384, K = 256;
  const PackedGroups packed = pack_groups(rows);
  const std::vector<int32_t>& offs = packed.offsets;
  const int total = packed.total;
  const int sms = sm_count();
  Dev<int32_t> drows(rows), doffs(offs);
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    // Operands as exact values: bf16, or e4m3 codes with fp32 scales (a: per row and 128 of K,
    // w: per 128x128 tile).
    std::vector<float> a(size_t(total) * K), w(size_t(E) * N * K), sa(size_t(total) * (K / 128)),
        sw(size_t(E) * (N / 128) * (K / 128));
    std::vector<bf16_raw> a16(a.size()), w16(w.size());
    std::vector<uint8_t> a8(a.size()), w8(w.size());
    for (auto& v : sa) v = us(rng) / 64;
    for (auto& v : sw) v = us(rng) / 256;
    for (size_t i = 0; i < a.size(); ++i) {
      if (fp8) {
        a8[i] = num::f32_to_e4m3(nd(rng) * 100.f);
        a[i] = num::e4m3_to_f32(a8[i]) * sa[(i / K) * (K / 128) + (i % K) / 128];
      } else {
        a16[i] = num::f32_to_bf16(nd(rng));
        a[i] = num::bf16_to_f32(a16[i]);
      }
    }
    for (size_t i = 0; i < w.size(); ++i) {
      if (fp8) {
        w8[i] = num::f32_to_e4m3(nd(rng) * 100.f);
        const size_t e = i / (size_t(N) * K), n = (i / K) % N, k = i % K;
        w[i] = num::e4m3_to_f32(w8[i]) * sw[(e * (N / 128) + n / 128) * (K / 128) + k / 128];
      } else {
        w16[i] = num::f32_to_bf16(nd(rng) / 16);
        w[i] = num::bf16_to_f32(w16[i]);
      }
    }
    Dev<bf16_raw> da16(a16), dw16(w16);
    Dev<uint8_t> da8(a8), dw8(w8);
    Dev<float> dsa(sa), dsw(sw);
    Dev<bf16_raw> out(size_t(total + 8) * N);
    out.poison();
    // One grouped GEMM with token tile `tile_n` (0 = unswapped) over the experts whose rows fall in
    // `ranges`, into the poisoned `out`; returns `out`.
    auto launch = [&](int tile_n, const ce::RowRanges& ranges) {
      const bool swap = tile_n != 0;
      out.poison();
      ce::Grouped g;
      g.experts = E;
      g.N = N;
      g.K = K;
      g.rows = drows.get();
      g.offsets = doffs.get();
      g.A = fp8 ? static_cast<const void*>(da8.get()) : da16.get();
      g.sfa = fp8 ? dsa.get() : nullptr;
      g.W = fp8 ? static_cast<const void*>(dw8.get()) : dw16.get();
      g.sfw = fp8 ? dsw.get() : nullptr;
      g.out = out.get();
      g.sms = sms;
      g.swap_ab = swap;
      g.swap_tile_n = swap ? tile_n : 64;
      g.ranges = ranges;
      const size_t ws = fp8 ? (swap ? ce::fp8_swap_workspace_bytes(E, sms, tile_n) : ce::fp8_workspace_bytes(E, sms))
                            : (swap ? ce::bf16_swap_workspace_bytes(E, sms, tile_n) : ce::bf16_workspace_bytes(E, sms));
      cuda::DeviceBuffer wsb(ws);
      g.workspace = wsb.get();
      if (fp8)
        ce::grouped_gemm_fp8(g, nullptr);
      else
        ce::grouped_gemm_bf16(g, nullptr);
      EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
      return out.download();
    };
    std::vector<bf16_raw> outs[4];  // by tile_n / 64 (96: fp8 only, checked against the product, not kept)
    for (const int tile_n : {0, 64, 96, 128, 192}) {
      if (tile_n == 96 && !fp8) {
        EXPECT_THROW(launch(96, ce::RowRanges{}), UsageError) << "bf16 has no 96-wide swap-AB tile";
        continue;
      }
      SCOPED_TRACE("swap_tile_n " + std::to_string(tile_n));
      const auto o = launch(tile_n, ce::RowRanges{});
      if (tile_n != 96) outs[tile_n / 64] = o;
      double worst = 0, scale = 0;
      for (int e = 0; e < E; ++e)
        for (int r = 0; r < rows[e]; ++r)
          for (int n = 0; n < N; ++n) {
            double ref = 0;
            const float* ar = &a[size_t(offs[e] + r) * K];
            const float* wr = &w[(size_t(e) * N + n) * K];
            for (int k = 0; k < K; ++k) ref += double(ar[k]) * wr[k];
            const double got = num::bf16_to_f32(o[size_t(offs[e] + r) * N + n]);
            worst = std::max(worst, std::fabs(got - ref));
            scale = std::max(scale, std::fabs(ref));
          }
      std::printf("[cutlass] grouped %s swap_tile_n %3d rows {0,130,1,33,64,0,100,257,0} N %d K %d: "
                  "max|a-b|/max|ref| %.3e\n",
                  fp8 ? "fp8" : "bf16", tile_n, N, K, worst / scale);
      // bf16 output rounding (2^-9 relative) dominates; fp32 accumulation order adds far less.
      EXPECT_LE(worst / scale, 4e-3);
      for (size_t i = size_t(total) * N; i < o.size(); ++i)
        if (o[i] != 0xffff) {
          ADD_FAILURE() << "row " << i / N << " past the groups was written";
          break;
        }
    }
    // Swapped vs unswapped: both within the bound above of the exact product; how many outputs are
    // bitwise the same says whether the tensor cores summed in the same order (informational).
    for (const int t : {1, 2, 3}) {
      size_t same = 0;
      for (size_t i = 0; i < size_t(total) * N; ++i) same += outs[0][i] == outs[t][i];
      std::printf("[cutlass] grouped %s swap-AB %d vs unswapped: %zu of %zu outputs identical\n", fp8 ? "fp8" : "bf16",
                  64 * t, same, size_t(total) * N);
    }
    // Row ranges: [33, 100] on the 128-wide tiles, [101, max] unswapped, [0, 1] on 192, and [0, 1] +
    // [65, 130] (1, 100, 130 rows) in one 64-wide launch write exactly their experts (33, 64, 100
    // rows; then 130, 257; ...), each bitwise as that tile's launch over all experts.
    struct Range {
      ce::RowRanges ranges;
      int tile_n;
    };
    ce::RowRanges two = ce::RowRanges::one(0, 1);
    two.add(65, 130);
    for (const Range& rg : {Range{ce::RowRanges::one(33, 100), 128}, Range{ce::RowRanges::one(101, 0x7fffffff), 0},
                            Range{ce::RowRanges::one(0, 1), 192}, Range{two, 64}}) {
      SCOPED_TRACE("ranges " + std::to_string(rg.ranges.n) + " from " + std::to_string(rg.ranges.lo[0]) + " tile " +
                   std::to_string(rg.tile_n));
      const auto o = launch(rg.tile_n, rg.ranges);
      const auto& full = outs[rg.tile_n / 64];
      int wrong = 0, ran = 0;
      for (int e = 0; e < E; ++e) {
        const bool in = rg.ranges.contains(rows[e]);
        ran += in && rows[e] > 0;
        for (size_t i = size_t(offs[e]) * N; i < size_t(offs[e] + rows[e]) * N; ++i)
          wrong += in ? o[i] != full[i] : o[i] != 0xffff;
      }
      EXPECT_GT(ran, 0);
      EXPECT_EQ(wrong, 0) << "outputs differing from the full launch inside the range or written outside it";
    }
  }
}

// The operands both SwiGLU-GEMM tests share: random bf16 rows and W13 of experts with `rows` rows
// each (I intermediate columns, K), on the device; the Grouped over them (N = 2I, workspace for the
// plain and the one-GEMM forms); and the reference intermediate of GEMM1 [rows][2I] over all
// experts followed by the whole SwiGLU pass, with 8 poisoned rows past the groups.
struct GluCase {
  GluCase(std::vector<int32_t> rows_, int I_, int K_, uint32_t seed)
      : rows(std::move(rows_)), E(int(rows.size())), I(I_), K(K_), packed(pack_groups(rows)), total(packed.total) {
    namespace ce = cuda::cutlass_engine;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<bf16_raw> a(size_t(total) * K), w(size_t(E) * 2 * I * K);
    for (auto& v : a) v = num::f32_to_bf16(nd(rng));
    for (auto& v : w) v = num::f32_to_bf16(nd(rng) / 8);
    da.upload(a);
    dw.upload(w);
    drows.upload(rows);
    doffs.upload(packed.offsets);
    const int sms = sm_count();
    wsb.reserve(std::max(ce::bf16_workspace_bytes(E, sms), ce::glu_workspace_bytes(E, sms)));
    g.experts = E;
    g.N = 2 * I;
    g.K = K;
    g.rows = drows.get();
    g.offsets = doffs.get();
    g.A = da.get();
    g.W = dw.get();
    g.workspace = wsb.get();
    g.sms = sms;
    Dev<bf16_raw> h(size_t(total) * 2 * I);
    ref = Dev<bf16_raw>(size_t(total + 8) * I);
    ref.poison();
    ce::Grouped g1 = g;
    g1.out = h.get();
    ce::grouped_gemm_bf16(g1, nullptr);
    ce::swiglu(h.get(), doffs.get(), drows.get(), E, I, total, false, false, ref.get(), nullptr, nullptr, nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Every output row bitwise as the reference, nothing written past the groups (`what` names the run).
  void expect_same(const Dev<bf16_raw>& out, const char* what) const {
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16_raw> r = ref.download(), o = out.download();
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < size_t(total) * I; ++i)
      if (r[i] != o[i] && differ++ == 0) first = i;
    std::printf("[cutlass] %s vs GEMM1 + SwiGLU pass, %d experts, I %d K %d: %zu of %zu differ\n", what, E, I, K,
                differ, size_t(total) * I);
    EXPECT_EQ(differ, 0u) << "first at row " << first / I << " column " << first % I;
    for (size_t i = size_t(total) * I; i < o.size(); ++i)
      if (o[i] != 0xffff) {
        ADD_FAILURE() << "row " << i / I << " past the groups was written";
        break;
      }
  }
  // A poisoned intermediate of the same size as the reference.
  Dev<bf16_raw> poisoned_out() const {
    Dev<bf16_raw> out(size_t(total + 8) * I);
    out.poison();
    return out;
  }

  std::vector<int32_t> rows;
  int E, I, K;
  PackedGroups packed;
  int total;
  Dev<bf16_raw> da, dw, ref;
  Dev<int32_t> drows, doffs;
  cuda::DeviceBuffer wsb;
  cuda::cutlass_engine::Grouped g;
};

// GEMM1 with SwiGLU as one grouped GEMM (grouped_gemm_bf16_glu: each tile's weight slices are the
// gate and up rows of the same 128 intermediate columns) against GEMM1 [rows][2I] followed by the
// SwiGLU pass: bitwise equal on every row of every group (0, 1, partial and multi-tile experts,
// several intermediate tiles), and no write past the groups' rows.
TEST(CutlassEngine, GluEqualsGemmAndPass) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  namespace ce = cuda::cutlass_engine;
  const GluCase c({0, 130, 1, 33, 257, 0, 64}, 384, 320, 29);
  Dev<bf16_raw> out = c.poisoned_out();
  ce::Grouped g = c.g;
  g.N = c.I;
  g.out = out.get();
  ce::grouped_gemm_bf16_glu(g, nullptr);
  c.expect_same(out, "glu");
  // Arguments it does not take.
  ce::Grouped bad = g;
  bad.N = 200;
  EXPECT_THROW(ce::grouped_gemm_bf16_glu(bad, nullptr), UsageError);
}

// GEMM1 split by rows with SwiGLU fused where the launch is unswapped (policy::glu_in_split): the
// one-GEMM SwiGLU on two row ranges in one launch (Grouped::ranges), the plain GEMM1 on the others and the
// SwiGLU pass told to leave the fused ranges' experts (SwigluSkip) give, together, every row
// bitwise as GEMM1 over all experts followed by the whole pass; nothing is written past the rows.
TEST(CutlassEngine, GluSplitEqualsGemmAndPass) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  namespace ce = cuda::cutlass_engine;
  const GluCase c({0, 130, 1, 33, 257, 0, 64, 200, 129}, 256, 192, 31);
  const int I = c.I;
  // The 128-row m-tiles the runner's count kernel lists (expert, first row, rows).
  std::vector<cuda::MTile> tiles;
  for (int e = 0; e < c.E; ++e)
    for (int j = 0; j * 128 < c.rows[e]; ++j)
      tiles.push_back({e, c.packed.offsets[e] + 128 * j, std::min(128, c.rows[e] - 128 * j), 0});
  Dev<int32_t> dnt(std::vector<int32_t>{int32_t(tiles.size())});
  Dev<cuda::MTile> dtiles(tiles);
  // Fused on [1, 1] and [129, 200] (experts of 1, 130, 200 and 129 rows); GEMM1 + pass elsewhere.
  ce::SwigluSkip skip;
  skip.fused = ce::RowRanges::one(1, 1);
  skip.fused.add(129, 200);
  skip.tiles = dtiles.get();
  skip.num_tiles = dnt.get();
  Dev<bf16_raw> h2(size_t(c.total) * 2 * I), out = c.poisoned_out();
  h2.poison();  // rows of fused experts stay poison here: the pass must not read them into out
  const int64_t edges[][2] = {{0, 0}, {2, 128}, {201, 0x7fffffff}};
  for (const auto& r : edges) {
    ce::Grouped part = c.g;
    part.ranges = ce::RowRanges::one(int(r[0]), int(r[1]));
    part.out = h2.get();
    ce::grouped_gemm_bf16(part, nullptr);
  }
  ce::Grouped glu = c.g;
  glu.N = I;
  glu.ranges = skip.fused;
  glu.out = out.get();
  ce::grouped_gemm_bf16_glu(glu, nullptr);
  ce::swiglu(h2.get(), c.doffs.get(), c.drows.get(), c.E, I, c.total, false, false, out.get(), nullptr, nullptr,
             nullptr, skip);
  c.expect_same(out, "glu split");
  // A skip without its tile table is refused before any launch.
  ce::SwigluSkip bad = skip;
  bad.tiles = nullptr;
  EXPECT_THROW(ce::swiglu(h2.get(), c.doffs.get(), c.drows.get(), c.E, I, c.total, false, false, out.get(), nullptr,
                          nullptr, nullptr, bad),
               UsageError);
}


// A launch's table fill also writing its pair's tables (Grouped::pair: the runner's GEMM1 launch
// filling GEMM2's of the same tile): the pair, launched later with tables_filled, writes exactly
// what it writes with its own fill, here over other row ranges and into another output, unswapped
// and swap-AB 128; the first launch is unchanged by carrying the pair. A pair of another tile, or
// one sharing the workspace, is refused before any launch.
TEST(CutlassEngine, PairedTableFill) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  namespace ce = cuda::cutlass_engine;
  const GluCase c({0, 130, 1, 33, 257, 0, 64}, 192, 256, 37);
  const int N = 2 * c.I;
  const int sms = sm_count();
  const size_t elems = size_t(c.total + 8) * N;
  auto differ = [](const Dev<bf16_raw>& x, const Dev<bf16_raw>& y) {
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16_raw> a = x.download(), b = y.download();
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  for (const int tile : {0, 128}) {
    SCOPED_TRACE("swap_tile_n " + std::to_string(tile));
    const size_t ws = tile ? ce::bf16_swap_workspace_bytes(c.E, sms, tile) : ce::bf16_workspace_bytes(c.E, sms);
    cuda::DeviceBuffer w0(ws), w1(ws), w2(ws);
    auto make = [&](void* workspace, Dev<bf16_raw>& out) {
      out.poison();
      ce::Grouped g = c.g;
      g.workspace = workspace;
      g.out = out.get();
      g.swap_ab = tile != 0;
      g.swap_tile_n = tile ? tile : 64;
      return g;
    };
    Dev<bf16_raw> own_all(elems), own_part(elems), first(elems), second(elems);
    ce::grouped_gemm_bf16(make(w0.get(), own_all), nullptr);
    ce::Grouped part = make(w0.get(), own_part);
    part.ranges = ce::RowRanges::one(1, 130);  // experts of 1, 130 and 33 rows
    ce::grouped_gemm_bf16(part, nullptr);
    ce::Grouped a = make(w1.get(), first);
    ce::Grouped b = make(w2.get(), second);
    b.ranges = part.ranges;
    a.pair = &b;
    ce::grouped_gemm_bf16(a, nullptr);
    b.tables_filled = true;
    ce::grouped_gemm_bf16(b, nullptr);
    EXPECT_EQ(differ(first, own_all), 0u) << "the launch carrying the pair";
    EXPECT_EQ(differ(second, own_part), 0u) << "the pair on the tables written for it";
  }
  ce::Grouped a = c.g, b = c.g;
  Dev<bf16_raw> out(elems);
  a.out = b.out = out.get();
  b.swap_ab = true;
  b.swap_tile_n = 128;
  a.pair = &b;
  EXPECT_THROW(ce::grouped_gemm_bf16(a, nullptr), UsageError) << "a pair of another tile";
  b.swap_ab = false;
  EXPECT_THROW(ce::grouped_gemm_bf16(a, nullptr), UsageError) << "a pair on the same workspace";
}

// GEMM1 with SwiGLU as one fp8 GEMM (engine_cutlass_glu_fp8.cu, W13's scales reordered by
// glu_fp8_scales) and quantize_intermediate after it, bitwise as the fp8 GEMM1 over 2I columns
// (as its two halves where I % 128 != 0, as the runner runs it) followed by the SwiGLU pass: the
// bf16 intermediate, and the e4m3 codes and scales GEMM2 reads. I = 192 puts a tile's gate and up
// halves in different scale rows and a partial block at the end of I; nothing is written past the
// groups.
TEST(CutlassEngine, Fp8GluEqualsGemmAndPass) {
  EPMOE_REQUIRE_GPU();
  EPMOE_REQUIRE_CUTLASS();
  namespace ce = cuda::cutlass_engine;
  std::mt19937 rng(37);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> us(0.5f, 2.f);
  const std::vector<int32_t> rows = {0, 130, 1, 33, 257, 0, 64};
  const PackedGroups packed = pack_groups(rows);
  const int E = int(rows.size()), K = 384, kb = K / 128, total = packed.total, sms = sm_count();
  Dev<int32_t> drows(rows), doffs(packed.offsets);
  for (const int I : {192, 256}) {
    SCOPED_TRACE("I " + std::to_string(I));
    const int nbI = fp8_blocks(I);
    std::vector<uint8_t> a8(size_t(total) * K), w8(size_t(E) * 2 * I * K);
    std::vector<float> sa(size_t(total) * kb), sw(size_t(E) * 2 * nbI * kb);
    for (auto& v : a8) v = num::f32_to_e4m3(nd(rng) * 100.f);
    for (auto& v : w8) v = num::f32_to_e4m3(nd(rng) * 100.f);
    for (auto& v : sa) v = us(rng) / 64;
    for (auto& v : sw) v = us(rng) / 4096;
    Dev<uint8_t> da(a8), dw(w8);
    Dev<float> dsa(sa), dsw(sw), dsglu(size_t(E) * 2 * (I / 64) * kb);
    cuda::DeviceBuffer wsb(std::max(ce::fp8_workspace_bytes(2 * E, sms), ce::glu_fp8_workspace_bytes(E, sms)));
    ce::Grouped g;
    g.experts = E;
    g.K = K;
    g.rows = drows.get();
    g.offsets = doffs.get();
    g.A = da.get();
    g.sfa = dsa.get();
    g.W = dw.get();
    g.sfw = dsw.get();
    g.workspace = wsb.get();
    g.sms = sms;
    // Unfused: GEMM1 [rows][2I], then the pass to bf16 and to the codes and scales.
    Dev<bf16_raw> h(size_t(total) * 2 * I), ref(size_t(total + 8) * I);
    Dev<uint8_t> ref8(size_t(total + 8) * I);
    Dev<float> refs(size_t(total + 8) * nbI);
    ref.poison();
    ref8.poison();
    refs.poison();
    ce::Grouped g1 = g;
    g1.out = h.get();
    g1.N = I % 128 == 0 ? 2 * I : I;
    g1.halves = I % 128 != 0;
    ce::grouped_gemm_fp8(g1, nullptr);
    ce::swiglu(h.get(), doffs.get(), drows.get(), E, I, total, false, false, ref.get(), nullptr, nullptr, nullptr);
    ce::swiglu(h.get(), doffs.get(), drows.get(), E, I, total, false, false, nullptr, ref8.get(), refs.get(),
               nullptr);
    // Fused.
    Dev<bf16_raw> out(size_t(total + 8) * I);
    Dev<uint8_t> out8(size_t(total + 8) * I);
    Dev<float> outs(size_t(total + 8) * nbI);
    out.poison();
    out8.poison();
    outs.poison();
    ce::glu_fp8_scales(dsw.get(), E, I, K, dsglu.get(), nullptr);
    ce::Grouped glu = g;
    glu.N = I;
    glu.sfw = dsglu.get();
    glu.out = out.get();
    ce::grouped_gemm_fp8_glu(glu, nullptr);
    ce::quantize_intermediate(out.get(), doffs.get(), drows.get(), E, I, total, false, out8.get(), outs.get(),
                              nullptr);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    auto count_diff = [](const auto& x, const auto& y, size_t n) {
      size_t d = 0;
      for (size_t i = 0; i < n; ++i) d += std::memcmp(&x[i], &y[i], sizeof(x[i])) != 0;
      return d;
    };
    const auto r = ref.download(), o = out.download();
    const auto r8 = ref8.download(), o8 = out8.download();
    const auto rs = refs.download(), os = outs.download();
    const size_t n = size_t(total) * I, ns = size_t(total) * nbI;
    std::printf("[cutlass] fp8 glu vs GEMM1 + SwiGLU pass, I %d: bf16 %zu, codes %zu, scales %zu of %zu / %zu differ\n", I,
                count_diff(r, o, n), count_diff(r8, o8, n), count_diff(rs, os, ns), n, ns);
    EXPECT_EQ(count_diff(r, o, n), 0u);
    EXPECT_EQ(count_diff(r8, o8, n), 0u);
    EXPECT_EQ(count_diff(rs, os, ns), 0u);
    // Rows past the groups untouched (poison), in all three outputs.
    for (size_t i = n; i < o.size(); ++i) ASSERT_EQ(o[i], 0xffff) << "bf16 row " << i / I << " written";
    for (size_t i = n; i < o8.size(); ++i) ASSERT_EQ(o8[i], 0xff) << "code row " << i / I << " written";
    // Arguments it does not take.
    ce::Grouped bad = glu;
    bad.N = 200;
    EXPECT_THROW(ce::grouped_gemm_fp8_glu(bad, nullptr), UsageError);
    EXPECT_THROW(ce::glu_fp8_scales(dsw.get(), E, 200, K, dsglu.get(), nullptr), UsageError);
  }
}

}  // namespace
}  // namespace epmoe::test
