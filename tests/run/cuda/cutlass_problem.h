// The runner problems of the CUTLASS engine's GPU tests (test_runner_cutlass.cu, test_runner_mixed.cu):
// a shape, formats and a load, and the inputs one seed draws for it.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "run/cuda/runner_test_util.h"

namespace epmoe::test {

// listed / listed_wide: top_k 1 and exactly kListedRows[e] / kListedRowsWide[e] rows on expert e
// (E = 8), the tokens shuffled; tokens past their sum route nowhere. The wide list's mean (250)
// takes the mixed-input GEMMs' 256-wide tiles, and its experts every part of Grouped::Part: mid
// whole (100, 128), tail whole (40), head alone (200, 512), head + tail (300), head + mid (340,
// 380).
enum class Load { uniform, uneven, one_expert, listed, listed_wide };
inline const std::vector<int> kListedRows = {0, 1, 33, 64, 100, 257, 200, 150};
inline const std::vector<int> kListedRowsWide = {100, 40, 128, 300, 380, 200, 512, 340};

struct Problem {
  int H, I, E, K, C;
  ActFormat act;
  WeightFormat wf;
  IntermediateQuant iq;
  Load load;
  int64_t T;             // tokens (-1 = C)
  int ref_tokens;        // tokens checked against the CPU reference (-1 = all)
  bool vs_mma;           // also compare every token with the mma engine
  const char* expect;    // expected last_engines()
  const char* name;
  // Also run with a widening scratch of one W13 expert (several chunks per GEMM) and require the
  // output to equal the default (one chunk) run bitwise.
  bool chunk_check = false;
};

// Ids: `uneven` draws expert e with weight e+1 (so loads differ several-fold) and never uses the
// last two experts (groups with no rows); 5% of the (token, k) entries are -1.
inline std::vector<int32_t> make_ids(const Problem& p, int64_t T, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(T) * p.K, -1);
  if (p.load == Load::listed || p.load == Load::listed_wide) {
    const std::vector<int>& listed = p.load == Load::listed ? kListedRows : kListedRowsWide;
    EXPECT_EQ(p.K, 1);
    EXPECT_EQ(p.E, int(listed.size()));
    int64_t t = 0;
    for (int e = 0; e < p.E; ++e)
      for (int r = 0; r < listed[e] && t < T; ++r) ids[t++] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
  }
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int usable = p.load == Load::uneven && p.E > p.K + 2 ? p.E - 2 : p.E;
  std::vector<double> wts(usable);
  for (int e = 0; e < usable; ++e) wts[e] = p.load == Load::uneven ? e + 1.0 : 1.0;
  for (int64_t t = 0; t < T; ++t) {
    if (p.load == Load::one_expert) {
      ids[t * p.K] = 0;
      continue;
    }
    std::vector<double> w = wts;
    for (int k = 0; k < p.K; ++k) {
      std::discrete_distribution<int> dd(w.begin(), w.end());
      const int e = dd(rng);
      w[e] = 0;  // distinct experts per token
      ids[t * p.K + k] = u(rng) < 0.05f ? -1 : e;
    }
  }
  return ids;
}

// A problem's inputs drawn from one seed: its weights, then T tokens, their routing (make_ids) and
// routing weights, as the local dispatcher's receive buffers and their device copy.
struct ProblemData {
  const MoeConfig cfg;
  std::mt19937 rng;
  const TestWeights wt;
  const detail::HostRecvBuffers recv;
  DevDispatch dd;
  const int n;  // received slots
  ProblemData(const Problem& p, uint32_t seed)
      : cfg(make_cfg(p)), rng(seed), wt(rng, p.E, p.H, p.I, p.wf), recv(draw(p)), dd(recv, cfg.quant_params()),
        n(recv.counts[0]) {}

 private:
  detail::HostRecvBuffers draw(const Problem& p) {
    const int64_t T = p.T < 0 ? p.C : p.T;
    const auto x = random_bf16(rng, T, p.H);
    const std::vector<int32_t> ids = make_ids(p, T, rng);
    std::vector<float> tw(size_t(T) * p.K);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& v : tw) v = u(rng);
    return local_receive(cfg, x, T, ids, tw);
  }
};

inline std::string problem_trace(const Problem& p, uint32_t seed) {
  return std::string(p.name) + " act " + format_name(p.act) + " weights " + format_name(p.wf) + " iq " +
         (p.iq == IntermediateQuant::fp8 ? "fp8" : "none") + " seed " + std::to_string(seed);
}

}  // namespace epmoe::test
