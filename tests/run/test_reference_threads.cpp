// The CPU pool (core/parallel.h) and the promise built on it: the reference runner and the
// float64 oracle give bitwise the same output with 1 thread and with several, including when
// several "ranks" call their runners at the same time (the cpu fabric's situation).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/received_batch.h"
#include "core/parallel.h"
#include "epmoe/error.h"
#include "epmoe/numeric.h"
#include "epmoe/quant.h"
#include "run/oracle.h"
#include "run/reference.h"

namespace epmoe {
namespace {

// Sets the pool's thread count for one scope and restores the previous one.
struct ThreadsScope {
  int saved;
  explicit ThreadsScope(int n) : saved(detail::cpu_threads()) { detail::set_cpu_threads(n); }
  ~ThreadsScope() { detail::set_cpu_threads(saved); }
};

TEST(Parallel, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 7}) {
    ThreadsScope scope(threads);
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (auto& h : hits) h = 0;
      detail::parallel_for(n, [&](int64_t i) { hits[size_t(i)]++; });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "threads " << threads << " i " << i;
    }
  }
}

TEST(Parallel, UsesSeveralThreadsWhenAsked) {
  ThreadsScope scope(4);
  std::atomic<int> inside{0}, peak{0};
  detail::parallel_for(64, [&](int64_t) {
    const int now = ++inside;
    for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    --inside;
  });
  EXPECT_GT(peak.load(), 1);
  EXPECT_LE(peak.load(), 4);
}

TEST(Parallel, LowestFailingTaskIsRethrownAfterAllRan) {
  for (int threads : {1, 4}) {
    ThreadsScope scope(threads);
    std::atomic<int> ran{0};
    try {
      detail::parallel_for(100, [&](int64_t i) {
        ++ran;
        if (i == 37 || i == 90) throw std::runtime_error("task " + std::to_string(i));
      });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "task 37");
    }
    EXPECT_EQ(ran.load(), 100);
  }
}

TEST(Parallel, NestedAndConcurrentCallersFinish) {
  ThreadsScope scope(3);
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(5, 0);
  for (int c = 0; c < 5; ++c)
    callers.emplace_back([&, c] {
      std::vector<int64_t> part(20, 0);
      detail::parallel_for(20, [&](int64_t i) {
        std::atomic<int64_t> inner{0};
        detail::parallel_for(50, [&](int64_t j) { inner += i * 50 + j; });
        part[size_t(i)] = inner.load();
      });
      for (int64_t v : part) sums[size_t(c)] += v;
    });
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 999 * 1000 / 2);
}

TEST(Parallel, RejectsBadThreadCount) {
  try {
    detail::set_cpu_threads(0);
    FAIL() << "0 threads accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[1, 4096]"), std::string::npos) << e.what();
  }
}

// A random received batch and random weights, large enough that the runner cuts its GEMMs into
// several row and column tasks.
struct Problem : test::ReceivedBatch {
  int I;
  WeightFormat wf;
  IntermediateQuant iq;
  HostMatrix q13, q2;

  Problem(int R_, int C_, int H_, int I_, int K_, int El_, ActFormat a, WeightFormat f, IntermediateQuant q,
          uint64_t seed)
      : I(I_), wf(f), iq(q) {
    R = R_, C = C_, H = H_, K = K_, El = El_;
    format = a;
    for (int s = 0; s < R; ++s) counts.push_back(s % 2 == 1 ? 0 : C - s);  // an empty region too
    std::mt19937_64 rng(seed);
    draw(rng);
    std::vector<float> w13, w2;
    test::random_expert_weights(seed, El, H, I, w13, w2);
    q13 = quantize_matrix(w13.data(), El, 2 * I, H, f);
    q2 = quantize_matrix(w2.data(), El, H, I, f);
  }

  MoeConfig config() const {
    MoeConfig c;
    c.hidden = H, c.intermediate = I, c.weight_format = wf, c.intermediate_quant = iq;
    return c;
  }
  std::vector<bf16_raw> run() const {
    detail::ReferenceRunner runner(config());
    std::vector<bf16_raw> y(size_t(R) * C * H, 0x7e7e);
    runner.run(view(), ExpertWeights{El, H, I, q13.view(), q2.view()}, y.data(), nullptr);
    return y;
  }
};

size_t first_difference(const std::vector<bf16_raw>& a, const std::vector<bf16_raw>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return i;
  return a.size();
}

struct ThreadsCase {
  ActFormat act;
  WeightFormat wf;
  IntermediateQuant iq;
};

class ReferenceThreads : public ::testing::TestWithParam<ThreadsCase> {};

TEST_P(ReferenceThreads, BitwiseEqualForAnyThreadCount) {
  const ThreadsCase c = GetParam();
  // ~95 pairs per expert (two row tasks) on a prefill-like batch; a decode-like batch of 3 rows
  // whose GEMMs split into several column tasks.
  const Problem prefill(3, 72, 256, 256, 3, 4, c.act, c.wf, c.iq, 17);
  const Problem decode(2, 3, 2048, 512, 2, 2, c.act, c.wf, c.iq, 23);
  for (const Problem* p : {&prefill, &decode}) {
    std::vector<bf16_raw> serial;
    {
      ThreadsScope scope(1);
      serial = p->run();
    }
    int written = 0;
    for (bf16_raw v : serial) written += v != 0x7e7e;
    ASSERT_GT(written, p->H) << "the problem computed nothing";
    for (int threads : {2, 7}) {
      ThreadsScope scope(threads);
      const auto y = p->run();
      const size_t i = first_difference(serial, y);
      ASSERT_EQ(i, serial.size()) << threads << " threads differ at slot " << i / p->H << " h " << i % p->H << ": "
                                  << num::bf16_to_f32(y[i]) << " vs serial " << num::bf16_to_f32(serial[i]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, ReferenceThreads,
    ::testing::Values(ThreadsCase{ActFormat::bf16, WeightFormat::bf16, IntermediateQuant::none},
                      ThreadsCase{ActFormat::fp8, WeightFormat::fp8, IntermediateQuant::none},
                      ThreadsCase{ActFormat::nvfp4, WeightFormat::nvfp4, IntermediateQuant::none},
                      ThreadsCase{ActFormat::bf16, WeightFormat::bf16, IntermediateQuant::fp8},
                      ThreadsCase{ActFormat::fp8, WeightFormat::fp8, IntermediateQuant::fp8},
                      ThreadsCase{ActFormat::fp8, WeightFormat::nvfp4, IntermediateQuant::fp8}),
    [](const auto& info) {
      return std::string(format_name(info.param.act)) + "_w" + format_name(info.param.wf) +
             (info.param.iq == IntermediateQuant::fp8 ? "_iqfp8" : "");
    });

// The cpu fabric's situation: several ranks run their own runner at once on the shared pool.
TEST(ReferenceThreadsRanks, ConcurrentRunnersMatchSerial) {
  std::vector<Problem> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back(2, 40, 256, 128, 2, 3, ActFormat::fp8, WeightFormat::fp8, IntermediateQuant::none, 100 + r);
  std::vector<std::vector<bf16_raw>> serial(ranks.size()), par(ranks.size());
  {
    ThreadsScope scope(1);
    for (size_t r = 0; r < ranks.size(); ++r) serial[r] = ranks[r].run();
  }
  ThreadsScope scope(3);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) threads.emplace_back([&, r] { par[r] = ranks[r].run(); });
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(first_difference(serial[r], par[r]), serial[r].size()) << r;
}

// A failure inside the parallel weight dequantization must not leave a half-filled cache entry:
// the same bad weights must fail again instead of being served from the cache.
TEST(ReferenceThreadsRanks, BadWeightsLeaveNoCacheBehind) {
  ThreadsScope scope(4);
  const Problem p(1, 8, 256, 128, 2, 2, ActFormat::bf16, WeightFormat::nvfp4, IntermediateQuant::none, 5);
  detail::ReferenceRunner runner(p.config());
  ExpertWeights w{p.El, p.H, p.I, p.q13.view(), p.q2.view()};
  w.w2.global_scale = nullptr;  // dequantize_matrix_rows rejects this; w13 is still good
  std::vector<bf16_raw> y(size_t(p.C) * p.H);
  EXPECT_THROW(runner.run(p.view(), w, y.data(), nullptr), UsageError);
  EXPECT_THROW(runner.run(p.view(), w, y.data(), nullptr), UsageError);
  w.w2.global_scale = p.q2.view().global_scale;
  runner.run(p.view(), w, y.data(), nullptr);  // w13 served from the cache filled by the failed calls
  EXPECT_EQ(first_difference(y, p.run()), y.size());
}

TEST(OracleThreads, BitwiseEqualForAnyThreadCount) {
  const int E = 3, H = 128, I = 64, K = 2;
  const int64_t T = 37;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w13(size_t(E) * 2 * I * H), w2(size_t(E) * H * I), tw(size_t(T) * K);
  for (auto& v : w13) v = nd(rng) / std::sqrt(float(H));
  for (auto& v : w2) v = nd(rng) / std::sqrt(float(I));
  for (auto& v : tw) v = std::abs(nd(rng));
  std::vector<double> x(size_t(T) * H);
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> ids(size_t(T) * K);
  for (auto& v : ids) v = int32_t(rng() % (E + 1)) - 1;

  auto forward = [&](int threads, WeightFormat f) {
    ThreadsScope scope(threads);
    const auto dense = oracle::DenseExperts::quantized(w13.data(), w2.data(), E, H, I, f);
    std::vector<double> out(size_t(T) * H, -1.0);
    oracle::moe_forward(dense, x.data(), T, ids.data(), tw.data(), K, out.data());
    out.insert(out.end(), dense.w13.begin(), dense.w13.end());
    return out;
  };
  for (WeightFormat f : {WeightFormat::bf16, WeightFormat::fp8, WeightFormat::nvfp4}) {
    const auto serial = forward(1, f), par = forward(4, f);
    ASSERT_EQ(serial.size(), par.size());
    EXPECT_EQ(std::memcmp(serial.data(), par.data(), serial.size() * sizeof(double)), 0) << format_name(f);
  }

  // A bad id is reported as the first one in token order, whatever the thread count.
  ids[size_t(20) * K + 1] = E;
  ids[size_t(30) * K] = -2;
  ThreadsScope scope(4);
  const auto dense = oracle::DenseExperts::from_fp32(w13.data(), w2.data(), E, H, I);
  std::vector<double> out(size_t(T) * H);
  try {
    oracle::moe_forward(dense, x.data(), T, ids.data(), tw.data(), K, out.data());
    FAIL() << "bad id accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("topk_ids[20][1]=3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
