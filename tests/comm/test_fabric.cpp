// The cpu group: communicators, the fabric's barrier and mailboxes, timeouts that name the missing
// rank, check_same, run_ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>

#include "comm/cpu_fabric.h"
#include "epmoe/comm.h"
#include "epmoe/error.h"

namespace epmoe {
namespace {

detail::CpuFabric& fabric_of(Communicator& c) { return dynamic_cast<detail::CpuComm&>(c).fabric(); }

TEST(Comm, LocalCommIsOneRank) {
  auto c = make_local_comm(DeviceKind::cuda, 3);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_STREQ(c->kind(), "local");
  EXPECT_EQ(c->device(), DeviceKind::cuda);
  EXPECT_EQ(c->device_index(), 3);
  EXPECT_NO_THROW(c->check_same(42, "anything"));
  EXPECT_THROW(make_local_comm(DeviceKind::cpu, -1), UsageError);
}

TEST(Comm, CpuGroupRanksAndBadArguments) {
  auto comms = make_cpu_group(5, 1000);
  ASSERT_EQ(comms.size(), 5u);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), 5);
    EXPECT_STREQ(comms[r]->kind(), "cpu");
  }
  EXPECT_THROW(make_cpu_group(0), UsageError);
  EXPECT_THROW(make_cpu_group(2, 0), UsageError);
}

TEST(Comm, RunRanksJoinsAllAndRethrowsLowestRank) {
  auto comms = make_cpu_group(4, 1000);
  std::atomic<int> finished{0};
  try {
    run_ranks(comms, [&](Communicator& c) {
      ++finished;
      if (c.rank() == 3) throw std::runtime_error("three");
      if (c.rank() == 1) throw std::runtime_error("one");
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "one");
  }
  EXPECT_EQ(finished.load(), 4);
}

TEST(Fabric, ManyBackToBackGathersSeeTheirOwnGeneration) {
  auto comms = make_cpu_group(4, 5000);
  std::atomic<int> bad{0};
  run_ranks(comms, [&](Communicator& c) {
    auto& f = fabric_of(c);
    for (uint64_t i = 0; i < 2000; ++i) {
      const auto all = f.all_gather_u64(c.rank(), i * 10 + c.rank(), "test/gather");
      for (int q = 0; q < 4; ++q)
        if (all[q] != i * 10 + uint64_t(q)) ++bad;
      if (i % 7 == 0) f.barrier(c.rank(), "test/barrier");
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(Fabric, CheckSameNamesTheDifferingRanksOnEveryRank) {
  auto comms = make_cpu_group(5, 5000);
  std::vector<std::string> errors(5);
  run_ranks(comms, [&](Communicator& c) {
    try {
      c.check_same(c.rank() == 2 || c.rank() == 4 ? 7 : 5, "MoeConfig");
    } catch (const UsageError& e) {
      errors[c.rank()] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("MoeConfig differs between ranks"), std::string::npos) << e;
    EXPECT_NE(e.find("ranks 2, 4 differ from rank 0"), std::string::npos) << e;
  }
  // Agreement passes.
  auto ok = make_cpu_group(3, 5000);
  EXPECT_NO_THROW(run_ranks(ok, [](Communicator& c) { c.check_same(99, "x"); }));
}

TEST(Fabric, MissingRankIsNamedAndLaterCallsFailFast) {
  auto comms = make_cpu_group(4, 200);
  std::vector<int> missing(4, -1);
  std::vector<std::string> errors(4);
  const auto t0 = std::chrono::steady_clock::now();
  run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 2) return;  // never arrives
    try {
      c.check_same(1, "setup");
    } catch (const TimeoutError& e) {
      missing[c.rank()] = e.rank();
      errors[c.rank()] = e.what();
    }
  });
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(190));
  EXPECT_LT(waited, std::chrono::seconds(3));
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(missing[r], 2);
    EXPECT_NE(errors[r].find("rank 2 did not arrive within 200 ms at check_same/setup"), std::string::npos)
        << errors[r];
  }
  // The group is broken now: a later collective fails at once instead of waiting again.
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_THROW(comms[2]->check_same(1, "late"), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(100));
}

TEST(Comm, RunRanksPrefersTheCauseOverAPeersTimeout) {
  auto comms = make_cpu_group(3, 1000);
  try {
    run_ranks(comms, [&](Communicator& c) {
      if (c.rank() == 0) throw TimeoutError("rank 2 did not arrive", 2);
      if (c.rank() == 2) throw UsageError("the real problem");
    });
    FAIL() << "expected an exception";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "the real problem");
  }
  try {  // only timeouts: the lowest rank's
    run_ranks(comms, [&](Communicator& c) { throw TimeoutError("t" + std::to_string(c.rank()), 0); });
    FAIL() << "expected an exception";
  } catch (const TimeoutError& e) {
    EXPECT_STREQ(e.what(), "t0");
  }
}

}  // namespace
}  // namespace epmoe
