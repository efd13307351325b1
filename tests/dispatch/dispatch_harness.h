// Test harness for dispatchers: random per-rank inputs with fixed seeds, and a plain single-process
// oracle of what every rank must receive (DESIGN.md §3) and what combine must return (§5). The
// oracle is written independently of src/dispatch/plan.cpp: it walks tokens per (source,
// destination) pair the slow, obvious way and applies the placement rule of placement.h itself.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/config.h"
#include "epmoe/dispatch.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"
#include "epmoe/registry.h"

namespace epmoe::test {

struct RankInput {
  int64_t T = 0;
  std::vector<bf16_raw> hidden;  // [T][H]
  std::vector<int32_t> ids;      // [T][K]
  std::vector<float> weights;    // [T][K]
  DispatchInput view() const {
    DispatchInput in;
    in.num_tokens = T;
    in.hidden = hidden.data();
    in.topk_ids = ids.data();
    in.topk_weights = weights.data();
    return in;
  }
};

// Everything a rank received, copied out of the dispatcher's views.
struct Received {
  std::vector<uint8_t> payload, scales;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int32_t> counts, expert_counts;
};

inline MoeConfig make_config(int R, int E, int K, int H, int C, ActFormat f = ActFormat::bf16,
                             ActFormat combine = ActFormat::bf16) {
  MoeConfig c;
  c.hidden = H;
  c.intermediate = 128;
  c.num_experts = E;
  c.top_k = K;
  c.num_ranks = R;
  c.capacity = C;
  c.dispatch_format = f;
  c.combine_format = combine;
  c.nvfp4_global_scale = 448.f * 6.f / 4.f;  // inputs are ~N(0,1), amax about 4
  c.dispatcher = R == 1 ? "local" : "cpu";
  c.runner = "reference";
  c.timeout_ms = 5000;
  return c;
}

// T[r] tokens on rank r; ids distinct per token except where `allow_repeat`; each id is -1 with
// probability p_none.
inline std::vector<RankInput> random_inputs(const MoeConfig& cfg, const std::vector<int64_t>& T, uint32_t seed,
                                            double p_none = 0.1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<RankInput> out(T.size());
  for (size_t r = 0; r < T.size(); ++r) {
    RankInput& in = out[r];
    in.T = T[r];
    in.hidden.resize(size_t(in.T) * cfg.hidden);
    for (auto& h : in.hidden) h = num::f32_to_bf16(normal(rng));
    in.ids.resize(size_t(in.T) * cfg.top_k);
    in.weights.resize(size_t(in.T) * cfg.top_k);
    for (int64_t t = 0; t < in.T; ++t) {
      std::vector<int32_t> perm(cfg.num_experts);
      for (int e = 0; e < cfg.num_experts; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < cfg.top_k; ++k) {
        in.ids[t * cfg.top_k + k] = unit(rng) < p_none ? -1 : perm[k];
        in.weights[t * cfg.top_k + k] = unit(rng);
      }
    }
  }
  return out;
}

// The copy of expert e that token t of source s uses: placement.h's rule, written out again.
inline ExpertCopy oracle_copy(const MoeConfig& cfg, int e, int s, int64_t t) {
  if (!cfg.placement) {
    const int per = cfg.num_experts / cfg.num_ranks;
    return ExpertCopy{e / per, e % per};
  }
  const auto copies = cfg.placement->copies(e);
  for (const ExpertCopy& c : copies)
    if (c.rank == s) return c;
  return copies[size_t((s + t) % int64_t(copies.size()))];
}

// What rank d must receive from all sources.
inline Received expected_receive(const MoeConfig& cfg, const std::vector<RankInput>& in, int d) {
  const int R = cfg.num_ranks, C = cfg.capacity, H = cfg.hidden, K = cfg.top_k;
  const size_t pb = payload_bytes(cfg.dispatch_format, H), sb = scale_bytes(cfg.dispatch_format, H);
  Received x;
  x.payload.assign(size_t(R) * C * pb, 0);
  x.scales.assign(size_t(R) * C * sb, 0);
  x.ids.assign(size_t(R) * C * K, -1);
  x.weights.assign(size_t(R) * C * K, 0.f);
  x.counts.assign(R, 0);
  x.expert_counts.assign(cfg.experts_per_rank(), 0);
  std::vector<uint8_t> qp(pb), qs(sb);
  for (int s = 0; s < R; ++s) {
    int j = 0;
    for (int64_t t = 0; t < in[s].T; ++t) {
      std::vector<int32_t> row(K, -1);
      bool goes = false;
      for (int k = 0; k < K; ++k) {
        const int e = in[s].ids[t * K + k];
        if (e < 0) continue;
        const ExpertCopy c = oracle_copy(cfg, e, s, t);
        if (c.rank != d) continue;
        row[k] = c.slot;
        goes = true;
      }
      if (!goes) continue;
      const size_t slot = size_t(s) * C + j;
      quantize_rows(cfg.dispatch_format, cfg.quant_params(), in[s].hidden.data() + t * H, 1, H, qp.data(),
                    qs.data());
      std::memcpy(x.payload.data() + slot * pb, qp.data(), pb);
      if (sb) std::memcpy(x.scales.data() + slot * sb, qs.data(), sb);
      for (int k = 0; k < K; ++k) {
        x.ids[slot * K + k] = row[k];
        x.weights[slot * K + k] = in[s].weights[t * K + k];
        if (row[k] >= 0) ++x.expert_counts[row[k]];
      }
      ++j;
    }
    x.counts[s] = j;
  }
  return x;
}

inline Received snapshot(const DispatchOutput& o) {
  Received r;
  const size_t slots = size_t(o.slots());
  r.payload.assign(o.payload, o.payload + slots * o.payload_stride());
  if (o.scale_stride()) r.scales.assign(o.scales, o.scales + slots * o.scale_stride());
  r.ids.assign(o.local_ids, o.local_ids + slots * o.top_k);
  r.weights.assign(o.weights, o.weights + slots * o.top_k);
  r.counts.assign(o.counts, o.counts + o.num_ranks);
  if (o.expert_counts) r.expert_counts.assign(o.expert_counts, o.expert_counts + o.num_local_experts);
  return r;
}

// Bitwise comparison of what matters: counts, expert counts, ids of every slot (invalid ones must
// read -1), and payload, scales and weights of valid slots.
inline void expect_received(const MoeConfig& cfg, const Received& want, const Received& got, const std::string& ctx) {
  const int R = cfg.num_ranks, C = cfg.capacity, K = cfg.top_k;
  const size_t pb = payload_bytes(cfg.dispatch_format, cfg.hidden), sb = scale_bytes(cfg.dispatch_format, cfg.hidden);
  ASSERT_EQ(want.counts, got.counts) << ctx;
  EXPECT_EQ(want.expert_counts, got.expert_counts) << ctx;
  ASSERT_EQ(want.ids.size(), got.ids.size()) << ctx;
  EXPECT_EQ(want.ids, got.ids) << ctx;
  for (int s = 0; s < R; ++s)
    for (int j = 0; j < want.counts[s]; ++j) {
      const size_t slot = size_t(s) * C + j;
      ASSERT_EQ(0, std::memcmp(want.payload.data() + slot * pb, got.payload.data() + slot * pb, pb))
          << ctx << " payload of source " << s << " slot " << j;
      if (sb)
        ASSERT_EQ(0, std::memcmp(want.scales.data() + slot * sb, got.scales.data() + slot * sb, sb))
            << ctx << " scales of source " << s << " slot " << j;
      ASSERT_EQ(0, std::memcmp(want.weights.data() + slot * K, got.weights.data() + slot * K, 4 * K))
          << ctx << " weights of source " << s << " slot " << j;
    }
}

inline std::unique_ptr<Dispatcher> create_dispatcher(const MoeConfig& cfg, Communicator& comm) {
  const DispatcherInfo* info = Registry::global().find_dispatcher(cfg.dispatcher);
  if (!info || info->device != DeviceKind::cpu) throw std::runtime_error("no cpu dispatcher " + cfg.dispatcher);
  return info->create(cfg, comm);
}

// Runs one dispatch on every rank (R threads, or the local communicator when R == 1) and returns
// what each rank received.
inline std::vector<Received> run_dispatch(const MoeConfig& cfg, const std::vector<RankInput>& in) {
  std::vector<Received> got(cfg.num_ranks);
  std::vector<std::unique_ptr<Communicator>> comms;
  if (cfg.dispatcher == "local")
    comms.push_back(make_local_comm());
  else
    comms = make_cpu_group(cfg.num_ranks, cfg.timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    auto disp = create_dispatcher(cfg, comm);
    got[comm.rank()] = snapshot(disp->dispatch(in[comm.rank()].view()));
  });
  return got;
}

// A stand-in runner that makes every y depend on the receiving rank, the translated ids, the
// weights and the activation, so that a slot sent to the wrong place or summed in the wrong order
// shows: y[h] = bf16(x[h] * c), c = d + 1 + sum over k with id >= 0 of w_k * (id_k + 1).
inline float fake_factor(int d, const int32_t* ids, const float* w, int K) {
  float c = float(d + 1);
  for (int k = 0; k < K; ++k)
    if (ids[k] >= 0) c = c + w[k] * float(ids[k] + 1);
  return c;
}

inline std::vector<bf16_raw> fake_run(const MoeConfig& cfg, const DispatchOutput& o, int d) {
  const int H = cfg.hidden, K = cfg.top_k;
  std::vector<bf16_raw> y(size_t(o.slots()) * H, 0);
  std::vector<float> x(H);
  for (int s = 0; s < o.num_ranks; ++s)
    for (int j = 0; j < o.counts[s]; ++j) {
      const size_t slot = size_t(s) * o.capacity + j;
      dequantize_rows(o.format, o.quant, o.payload + slot * o.payload_stride(),
                      o.scale_stride() ? o.scales + slot * o.scale_stride() : nullptr, 1, H, x.data());
      const float c = fake_factor(d, o.local_ids + slot * K, o.weights + slot * K, K);
      for (int h = 0; h < H; ++h) y[slot * H + h] = num::f32_to_bf16(x[h] * c);
    }
  return y;
}

// What combine must return on rank s: for each token, sum over destinations d ascending of the
// fake runner's y, after the combine-format round trip, accumulated in fp32 from 0.
inline std::vector<bf16_raw> expected_combine(const MoeConfig& cfg, const std::vector<RankInput>& in, int s) {
  const int R = cfg.num_ranks, H = cfg.hidden, K = cfg.top_k;
  const ActFormat df = cfg.dispatch_format, cf = cfg.combine_format;
  std::vector<bf16_raw> out(size_t(in[s].T) * H);
  std::vector<uint8_t> qp(payload_bytes(df, H)), qs(scale_bytes(df, H) + 4);
  std::vector<uint8_t> cp(payload_bytes(cf, H)), cs(scale_bytes(cf, H) + 4);
  std::vector<float> x(H), acc(H), yf(H);
  std::vector<bf16_raw> y(H);
  for (int64_t t = 0; t < in[s].T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.f);
    quantize_rows(df, cfg.quant_params(), in[s].hidden.data() + t * H, 1, H, qp.data(), qs.data());
    dequantize_rows(df, cfg.quant_params(), qp.data(), qs.data(), 1, H, x.data());
    for (int d = 0; d < R; ++d) {
      std::vector<int32_t> row(K, -1);
      bool goes = false;
      for (int k = 0; k < K; ++k) {
        const int e = in[s].ids[t * K + k];
        if (e < 0) continue;
        const ExpertCopy c = oracle_copy(cfg, e, s, t);
        if (c.rank == d) row[k] = c.slot, goes = true;
      }
      if (!goes) continue;
      const float c = fake_factor(d, row.data(), in[s].weights.data() + t * K, K);
      for (int h = 0; h < H; ++h) y[h] = num::f32_to_bf16(x[h] * c);
      quantize_rows(cf, cfg.quant_params(), y.data(), 1, H, cp.data(), cs.data());
      dequantize_rows(cf, cfg.quant_params(), cp.data(), cs.data(), 1, H, yf.data());
      for (int h = 0; h < H; ++h) acc[h] = acc[h] + yf[h];
    }
    for (int h = 0; h < H; ++h) out[t * H + h] = num::f32_to_bf16(acc[h]);
  }
  return out;
}

}  // namespace epmoe::test
