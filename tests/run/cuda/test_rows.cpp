// The runner's row passes (src/run/cuda/rows.cu and the SwiGLU pass of the CUTLASS engine) have a
// vector form (16-byte accesses) and a scalar form that runs where rows are not 16-byte aligned.
// Both must give the same bits: here each pass runs twice on the same data, once on aligned
// buffers (vector form) and once on buffers offset by 4 bytes (scalar form), including NaN, Inf,
// huge and subnormal values. The permute's K-order form (the nvfp4 engine's token order) must give
// the bytes of the natural rows rewritten by the in-place K-order pass. The fp8 permute is checked
// against the dispatched bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "run/cuda/engine.h"
#include "run/cuda/engine_cutlass.h"
#include "run/cuda/rows.h"
#include "run/cuda/tile_tables.h"
#include "run/cuda/runner_test_util.h"

namespace epmoe::test {
namespace {

// n bf16 values ~ N(0, 1) with a sprinkling of the values that take the slow paths.
std::vector<bf16_raw> random_bf16(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16_raw> v(n);
  for (auto& x : v) x = num::f32_to_bf16(nd(rng));
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 3e38f, -1e30f, 1e-40f, -0.f, 0.f};
  for (size_t i = 0; i < n / 97; ++i) v[(i * 7919) % n] = num::f32_to_bf16(specials[i % 8]);
  return v;
}

// A device copy of `h` starting `shift` elements into its buffer (shift 2: 4-byte aligned only).
template <class T>
struct Shifted {
  Dev<T> buf;
  int shift;
  Shifted(const std::vector<T>& h, int s) : buf(h.size() + 8), shift(s) {
    std::vector<T> padded(h.size() + 8, T(0));
    std::copy(h.begin(), h.end(), padded.begin() + s);
    buf.upload(padded);
  }
  T* get() const { return buf.get() + shift; }
  std::vector<T> download(size_t n) const {
    const std::vector<T> all = buf.download();
    return std::vector<T>(all.begin() + shift, all.begin() + shift + n);
  }
};

struct Problem {
  int H, I, E, K, C;
  ActFormat act;
  WeightFormat wf = WeightFormat::bf16;  // make_cfg needs them; the row passes do not read them
  IntermediateQuant iq = IntermediateQuant::none;
};

// Routing of T tokens: K distinct experts each, random weights.
void random_routing(std::mt19937& rng, int64_t T, int E, int K, std::vector<int32_t>& ids, std::vector<float>& w) {
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  ids.assign(size_t(T) * K, -1);
  w.assign(size_t(T) * K, 0.f);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = (k == K - 1 && t % 5 == 0) ? -1 : perm[k];  // some unused top-k entries
      w[t * K + k] = ud(rng);
    }
  }
}

// Rows per local expert of the valid slots, and their exclusive prefix (the permute's offsets).
void expert_offsets(const detail::HostRecvBuffers& recv, int E, std::vector<int32_t>& offsets, int64_t& rows) {
  std::vector<int32_t> cnt(E, 0);
  for (int64_t j = 0; j < recv.counts[0]; ++j)
    for (int k = 0; k < recv.top_k; ++k) {
      const int e = recv.local_ids[size_t(j) * recv.top_k + k];
      if (e >= 0 && e < E) ++cnt[e];
    }
  offsets.assign(E, 0);
  rows = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e] = int32_t(rows);
    rows += cnt[e];
  }
}

// T tokens of random rows routed by random_routing, received by one rank. The quantizers reject
// non-finite inputs, so values that are not finite or above 1e4 become `stand_in`.
detail::HostRecvBuffers random_receive(const MoeConfig& cfg, std::mt19937& rng, int64_t T, float stand_in) {
  std::vector<bf16_raw> x = random_bf16(rng, size_t(T) * cfg.hidden);
  for (auto& v : x)
    if (!std::isfinite(num::bf16_to_f32(v)) || std::fabs(num::bf16_to_f32(v)) > 1e4f) v = num::f32_to_bf16(stand_in);
  std::vector<int32_t> ids;
  std::vector<float> tw;
  random_routing(rng, T, cfg.num_experts, cfg.top_k, ids, tw);
  return local_receive(cfg, x, T, ids, tw);
}

TEST(RowPasses, PermuteAndWeightedSumVectorEqualScalarBitwise) {
  EPMOE_REQUIRE_GPU();
  for (ActFormat act : {ActFormat::bf16, ActFormat::fp8, ActFormat::nvfp4}) {
    SCOPED_TRACE(format_name(act));
    const Problem p{1152, 256, 16, 6, 300, act};
    const MoeConfig cfg = make_cfg(p);
    std::mt19937 rng(11 + int(act));
    const int64_t T = 257;
    const detail::HostRecvBuffers recv = random_receive(cfg, rng, T, 1.5f);
    DevDispatch dd(recv, cfg.quant_params());
    std::vector<int32_t> offsets;
    int64_t rows = 0;
    expert_offsets(recv, p.E, offsets, rows);
    ASSERT_GT(rows, 0);
    const Dev<int32_t> d_off(offsets);
    const size_t S = size_t(p.C), K = size_t(p.K);

    // Permute, vector and scalar form (A shifted by 2 elements: 4-byte aligned, not 16).
    Dev<int32_t> fill_v(std::vector<int32_t>(p.E, 0)), fill_s(std::vector<int32_t>(p.E, 0));
    Dev<int32_t> pp_v(S * K), pp_s(S * K);
    Dev<bf16_raw> a_v(size_t(rows) * p.H);
    Shifted<bf16_raw> a_s(std::vector<bf16_raw>(size_t(rows) * p.H, 0), 2);
    cuda::launch_permute_bf16(dd.view, d_off.get(), fill_v.get(), pp_v.get(), a_v.get(), nullptr);
    cuda::launch_permute_bf16(dd.view, d_off.get(), fill_s.get(), pp_s.get(), a_s.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int32_t> hpv = pp_v.download(), hps = pp_s.download();
    const std::vector<bf16_raw> hav = a_v.download(), has = a_s.download(size_t(rows) * p.H);
    int64_t compared = 0;
    for (int64_t j = 0; j < recv.counts[0]; ++j)
      for (size_t k = 0; k < K; ++k) {
        const int32_t rv = hpv[j * K + k], rs = hps[j * K + k];
        ASSERT_EQ(rv < 0, rs < 0) << "slot " << j << " k " << k;
        if (rv < 0) continue;
        // Rows within an expert are claimed by atomics: compare the slot's rows, not positions.
        ASSERT_EQ(0, std::memcmp(&hav[size_t(rv) * p.H], &has[size_t(rs) * p.H], size_t(p.H) * 2))
            << "permuted row of slot " << j << " k " << k;
        ++compared;
      }
    EXPECT_EQ(compared, rows);

    // The nvfp4 engine's K order written by the permute itself (kperm = true) against the natural
    // rows rewritten by the in-place pass (kperm_nvfp4_tokens): the same bytes. The scalar form
    // (A not 16-byte aligned) declines and writes natural rows.
    {
      SCOPED_TRACE("K order");
      std::vector<int32_t> cnt(p.E);
      for (int e = 0; e < p.E; ++e) cnt[e] = int32_t((e + 1 < p.E ? offsets[e + 1] : rows) - offsets[e]);
      const Dev<int32_t> d_cnt(cnt);
      cuda::kperm_nvfp4_tokens(a_v.get(), d_off.get(), d_cnt.get(), p.E, p.H, rows, nullptr);
      Dev<int32_t> fill_k(std::vector<int32_t>(p.E, 0)), pp_k(S * K);
      Dev<bf16_raw> a_k(size_t(rows) * p.H);
      EXPECT_TRUE(cuda::launch_permute_bf16(dd.view, d_off.get(), fill_k.get(), pp_k.get(), a_k.get(), nullptr, false,
                                            true));
      Dev<int32_t> fill_n(std::vector<int32_t>(p.E, 0)), pp_n(S * K);
      Shifted<bf16_raw> a_n(std::vector<bf16_raw>(size_t(rows) * p.H, 0), 2);
      EXPECT_FALSE(cuda::launch_permute_bf16(dd.view, d_off.get(), fill_n.get(), pp_n.get(), a_n.get(), nullptr, false,
                                             true));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<int32_t> hpk = pp_k.download(), hpn = pp_n.download();
      const std::vector<bf16_raw> hak = a_k.download(), hkv = a_v.download(), han = a_n.download(size_t(rows) * p.H);
      int64_t same = 0;
      for (int64_t j = 0; j < recv.counts[0]; ++j)
        for (size_t k = 0; k < K; ++k) {
          const int32_t rv = hpv[j * K + k], rk = hpk[j * K + k], rn = hpn[j * K + k];
          ASSERT_EQ(rv < 0, rk < 0) << "slot " << j << " k " << k;
          if (rv < 0) continue;
          ASSERT_EQ(0, std::memcmp(&hkv[size_t(rv) * p.H], &hak[size_t(rk) * p.H], size_t(p.H) * 2))
              << "K-ordered row of slot " << j << " k " << k;
          ASSERT_EQ(0, std::memcmp(&hav[size_t(rv) * p.H], &han[size_t(rn) * p.H], size_t(p.H) * 2))
              << "natural row (declined K order) of slot " << j << " k " << k;
          ++same;
        }
      EXPECT_EQ(same, rows);
    }

    // Weighted sum over random expert outputs (specials included), both forms, same pair_pos.
    const std::vector<bf16_raw> o = random_bf16(rng, size_t(rows) * p.H);
    const Dev<bf16_raw> o_v(o);
    const Shifted<bf16_raw> o_s(o, 2);
    Dev<bf16_raw> y_v(S * p.H);
    Shifted<bf16_raw> y_s(std::vector<bf16_raw>(S * p.H, 0xffff), 2);
    y_v.poison();
    cuda::launch_reduce(dd.view, pp_v.get(), o_v.get(), y_v.get(), nullptr);
    cuda::launch_reduce(dd.view, pp_v.get(), o_s.get(), y_s.get(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<bf16_raw> hyv = y_v.download(), hys = y_s.download(S * p.H);
    const size_t valid = size_t(recv.counts[0]) * p.H;
    EXPECT_EQ(0, std::memcmp(hyv.data(), hys.data(), valid * 2)) << "weighted sums differ";
  }
}

// The fp8 permute feeds both fp8 GEMM kinds: the wgmma engine with transposed
// scales (sf_row 1, sf_block = leading dimension), CUTLASS with row-major ones (ceil(H/128), 1).
// Every valid pair must get one row of its expert's segment holding the slot's codes and scales
// unchanged; rows are claimed by atomics, so the check goes through pair_pos. H 1040 has a partial
// last scale block; A8 shifted by 4 bytes takes the byte-copy form.
TEST(RowPasses, Fp8PermuteCopiesRowsAndScales) {
  EPMOE_REQUIRE_GPU();
  for (const int H : {1152, 1040})
    for (const bool transposed : {true, false})
      for (const int shift : {0, 4}) {
        SCOPED_TRACE("H " + std::to_string(H) + (transposed ? " transposed" : " row-major") + " shift " +
                     std::to_string(shift));
        const Problem p{H, 256, 13, 6, 300, ActFormat::fp8};
        const MoeConfig cfg = make_cfg(p);
        std::mt19937 rng(uint32_t(H + 2 * transposed + shift));
        const int64_t T = 281;
        detail::HostRecvBuffers recv = random_receive(cfg, rng, T, -2.5f);
        for (size_t j = 0; j < recv.local_ids.size(); j += 17)  // ids the rank has no expert for
          if (recv.local_ids[j] >= 0) recv.local_ids[j] = p.E + 3;
        DevDispatch dd(recv, cfg.quant_params());
        std::vector<int32_t> offsets;
        int64_t rows = 0;
        expert_offsets(recv, p.E, offsets, rows);
        ASSERT_GT(rows, 0);
        const Dev<int32_t> d_off(offsets);
        const int K = p.K, nb = fp8_blocks(H);
        Dev<int32_t> fill(std::vector<int32_t>(p.E, 0)), pp(size_t(p.C) * K);
        Shifted<uint8_t> a8(std::vector<uint8_t>(size_t(rows) * H, 0), shift);
        Dev<float> sf(size_t(rows) * nb);
        const int64_t sf_row = transposed ? 1 : nb, sf_block = transposed ? rows : 1;
        cuda::launch_permute_fp8_rows(dd.view, d_off.get(), fill.get(), pp.get(), a8.get(), sf.get(), sf_row, sf_block,
                                      nullptr, true);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<int32_t> hp = pp.download();
        const std::vector<uint8_t> ha = a8.download(size_t(rows) * H);
        const std::vector<float> hs = sf.download();
        std::vector<int> claimed(rows, 0);
        const auto* scales = reinterpret_cast<const float*>(recv.scales.data());
        for (int64_t j = 0; j < recv.counts[0]; ++j)
          for (int k = 0; k < K; ++k) {
            const int e = recv.local_ids[size_t(j) * K + k];
            const int32_t r = hp[size_t(j) * K + k];
            if (e < 0 || e >= p.E) {
              EXPECT_EQ(r, -1) << "slot " << j << " k " << k;
              continue;
            }
            const int32_t end = e + 1 < p.E ? offsets[e + 1] : int32_t(rows);
            ASSERT_TRUE(r >= offsets[e] && r < end) << "slot " << j << " k " << k << " row " << r;
            ++claimed[r];
            ASSERT_EQ(0, std::memcmp(&ha[size_t(r) * H], &recv.payload[size_t(j) * H], size_t(H)))
                << "codes of slot " << j << " k " << k;
            for (int b = 0; b < nb; ++b)
              ASSERT_EQ(hs[r * sf_row + b * sf_block], scales[size_t(j) * nb + b]) << "scale " << b << " of slot " << j;
          }
        for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(claimed[r], 1) << "row " << r;
      }
}

// The routing tables (launch_count) against the host's count: per-expert rows, offsets, zeroed
// fill counters and the m-tile table(s), on the one-CTA path (at most kFusedCountPairs pairs) and
// the grid-wide count + one-CTA scan, with one tile height and with the wide nvfp4 engine's two;
// ids outside [0, E) and slots past their region's count count nowhere. E up to 2500 (several
// experts per scan thread). With one height, also launch_count_claim (the decode GEMM1 reading the
// dispatch buffer): the same tables and the rows it claims.
TEST(RowPasses, CountTablesMatchHost) {
  EPMOE_REQUIRE_GPU();
  std::mt19937 rng(41);
  struct Case { int R, C, K, E, bm, bm2; };
  const Case cases[] = {{1, 1000, 8, 64, 128, 0},  {3, 700, 3, 40, 128, 160}, {2, 9000, 4, 256, 128, 0},
                        {4, 5000, 8, 2500, 128, 160}, {1, 3, 2, 7, 128, 0},   {2, 2048, 1, 16, 32, 0},
                        {1, 1000, 8, 2500, 128, 160}};
  for (const Case& c : cases) {
    SCOPED_TRACE("R " + std::to_string(c.R) + " C " + std::to_string(c.C) + " K " + std::to_string(c.K) + " E " +
                 std::to_string(c.E) + " bm2 " + std::to_string(c.bm2));
    const int64_t S = int64_t(c.R) * c.C;
    std::vector<int32_t> ids(size_t(S) * c.K), counts(c.R);
    std::uniform_int_distribution<int> pick(-2, c.E + 1);  // a few ids outside [0, E)
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& e : ids) e = u(rng) < 0.3f ? int(u(rng) * float(std::min(c.E, 5))) : pick(rng);  // some hot experts
    for (int r = 0; r < c.R; ++r) counts[r] = r == 0 ? c.C : int(u(rng) * float(c.C));
    // Host: rows per expert, offsets, the tables.
    std::vector<int32_t> cnt(c.E, 0);
    for (int64_t i = 0; i < S; ++i)
      if (i % c.C < counts[i / c.C])
        for (int k = 0; k < c.K; ++k) {
          const int e = ids[size_t(i) * c.K + k];
          if (e >= 0 && e < c.E) ++cnt[e];
        }
    std::vector<int32_t> offs(c.E);
    std::vector<cuda::MTile> t1, t2;
    int32_t r = 0;
    for (int e = 0; e < c.E; ++e) {
      offs[e] = r;
      const bool second = cuda::tile_tables::in_second(cnt[e], c.bm, c.bm2);
      const int bm = second ? c.bm2 : c.bm, n = cuda::tile_tables::tiles_of(cnt[e], bm);
      for (int j = 0; j < n; ++j)
        (second ? t2 : t1).push_back({e, r + j * bm, std::min(bm, cnt[e] - j * bm), cuda::tile_tables::walk_tag(j, n)});
      r += cnt[e];
    }
    const int64_t max_tiles = (S * c.K + c.bm - 1) / c.bm + c.E;
    const Dev<int32_t> d_ids(ids), d_counts(counts);
    Dev<int32_t> d_cnt(c.E), d_off(c.E), d_fill(c.E), d_nt(2);
    Dev<cuda::MTile> d_t1(max_tiles), d_t2(max_tiles);
    for (auto* d : {&d_cnt, &d_off, &d_fill, &d_nt}) d->poison();
    DispatchOutput dout;
    dout.num_ranks = c.R;
    dout.capacity = c.C;
    dout.top_k = c.K;
    dout.num_local_experts = c.E;
    dout.device = DeviceKind::cuda;
    dout.local_ids = d_ids.get();
    dout.counts = d_counts.get();
    cuda::launch_count(dout, c.bm, d_cnt.get(), d_off.get(), d_fill.get(), d_t1.get(), d_nt.get(), nullptr, false,
                       c.bm2, c.bm2 ? d_t2.get() : nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(d_cnt.download(), cnt);
    EXPECT_EQ(d_off.download(), offs);
    EXPECT_EQ(d_fill.download(), std::vector<int32_t>(c.E, 0));
    const std::vector<int32_t> nt = d_nt.download();
    ASSERT_EQ(nt[0], int32_t(t1.size()));
    if (c.bm2) ASSERT_EQ(nt[1], int32_t(t2.size()));
    const std::vector<cuda::MTile> g1 = d_t1.download(), g2 = d_t2.download();
    for (size_t i = 0; i < t1.size(); ++i)
      ASSERT_EQ(0, std::memcmp(&g1[i], &t1[i], sizeof(cuda::MTile))) << "tile " << i;
    for (size_t i = 0; i < t2.size(); ++i)
      ASSERT_EQ(0, std::memcmp(&g2[i], &t2[i], sizeof(cuda::MTile))) << "second-table tile " << i;
    if (c.bm2) continue;

    // launch_count_claim: where the one-CTA form applies, the same tables and every valid pair's
    // row, claimed once inside its expert's segment, with src_rows naming the pair's slot; ids of
    // no local expert get -1, invalid slots' entries stay as they were. Elsewhere nothing runs.
    constexpr int32_t kUntouched = -7;
    const bool fits = S * c.K <= 8192 && c.E <= 8192;
    Dev<int32_t> q_cnt(c.E), q_off(c.E), q_fill(c.E), q_nt(std::vector<int32_t>(2, kUntouched));
    Dev<int32_t> q_pp(std::vector<int32_t>(size_t(S) * c.K, kUntouched));
    Dev<int32_t> q_src(std::vector<int32_t>(size_t(r) + 1, kUntouched));
    Dev<cuda::MTile> q_t1(max_tiles);
    ASSERT_EQ(cuda::launch_count_claim(dout, c.bm, q_cnt.get(), q_off.get(), q_fill.get(), q_t1.get(), q_nt.get(),
                                       q_pp.get(), q_src.get(), nullptr, true),
              fits);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (!fits) {
      EXPECT_EQ(q_nt.download(), std::vector<int32_t>(2, kUntouched)) << "a count ran where it does not fit";
      continue;
    }
    EXPECT_EQ(q_cnt.download(), cnt);
    EXPECT_EQ(q_off.download(), offs);
    ASSERT_EQ(q_nt.download()[0], int32_t(t1.size()));
    const std::vector<cuda::MTile> q1 = q_t1.download();
    for (size_t i = 0; i < t1.size(); ++i)
      ASSERT_EQ(0, std::memcmp(&q1[i], &t1[i], sizeof(cuda::MTile))) << "claim: tile " << i;
    const std::vector<int32_t> pp = q_pp.download(), src = q_src.download();
    std::vector<int> claimed(size_t(r), 0);
    for (int64_t i = 0; i < S; ++i)
      for (int k = 0; k < c.K; ++k) {
        const int32_t q = pp[size_t(i) * c.K + k];
        if (i % c.C >= counts[i / c.C]) {
          ASSERT_EQ(q, kUntouched) << "invalid slot " << i;
          continue;
        }
        const int e = ids[size_t(i) * c.K + k];
        if (e < 0 || e >= c.E) {
          ASSERT_EQ(q, -1) << "slot " << i << " k " << k;
          continue;
        }
        ASSERT_TRUE(q >= offs[e] && q < offs[e] + cnt[e]) << "slot " << i << " k " << k << " row " << q;
        ++claimed[size_t(q)];
        ASSERT_EQ(src[size_t(q)], int32_t(i)) << "row " << q;
      }
    for (int32_t x = 0; x < r; ++x) ASSERT_EQ(claimed[size_t(x)], 1) << "row " << x;
    EXPECT_EQ(src[size_t(r)], kUntouched) << "a row past the claimed ones was written";
  }
}

TEST(RowPasses, SwigluVectorEqualsScalarBitwise) {
  EPMOE_REQUIRE_GPU();
  const int I = 1152;  // 4.5 groups of 256 columns: the last group is half empty
  // 4111 rows: more (row, group) items than the grid has warps, so that warps take several.
  for (const int64_t rows : {int64_t(37), int64_t(4111)}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    std::mt19937 rng(5);
    const std::vector<bf16_raw> h = random_bf16(rng, size_t(rows) * 2 * I);
    const Dev<bf16_raw> h_v(h);
    const Shifted<bf16_raw> h_s(h, 1);  // 2-byte offset: the scalar form
    const Dev<int32_t> offsets(std::vector<int32_t>{0}), cnt(std::vector<int32_t>{int32_t(rows)});
    for (int mode = 0; mode < 5; ++mode) {  // bf16; round trip (+ue8m0); fp8 codes (+ue8m0)
      SCOPED_TRACE(mode);
      const bool round_trip = mode == 1 || mode == 2, codes = mode >= 3, ue8m0 = mode == 2 || mode == 4;
      Dev<bf16_raw> a_v(size_t(rows) * I), a_s(size_t(rows) * I);
      Dev<uint8_t> q_v(size_t(rows) * I), q_s(size_t(rows) * I);
      Dev<float> s_v(size_t(rows) * I / 128), s_s(size_t(rows) * I / 128);
      for (auto* d : {&a_v, &a_s}) d->poison();
      for (auto* d : {&q_v, &q_s}) d->poison();
      for (auto* d : {&s_v, &s_s}) d->poison();
      cuda::cutlass_engine::swiglu(h_v.get(), offsets.get(), cnt.get(), 1, I, rows, round_trip, ue8m0, a_v.get(),
                                   codes ? q_v.get() : nullptr, codes ? s_v.get() : nullptr, nullptr);
      cuda::cutlass_engine::swiglu(h_s.get(), offsets.get(), cnt.get(), 1, I, rows, round_trip, ue8m0, a_s.get(),
                                   codes ? q_s.get() : nullptr, codes ? s_s.get() : nullptr, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (codes) {
        EXPECT_TRUE(q_v.download() == q_s.download()) << "e4m3 codes differ";
        const std::vector<float> sv = s_v.download(), ss = s_s.download();
        EXPECT_EQ(0, std::memcmp(sv.data(), ss.data(), sv.size() * 4)) << "block scales differ";
      } else {
        EXPECT_TRUE(a_v.download() == a_s.download()) << "intermediate rows differ";
      }
    }
  }
}

}  // namespace
}  // namespace epmoe::test
