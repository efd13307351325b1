// adopt_nccl_comm: a communicator the caller created with ncclCommInitAll becomes an epmoe
// Communicator of kind "nccl" (rank, size and device from NCCL, check_same across the group), and
// destroying the epmoe wrappers leaves the caller's communicators alive and usable. One GPU is
// enough; with more, all of them form the group (a thread per GPU, as run_ranks does elsewhere).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epmoe/comm.h"
#include "epmoe/error.h"

#if defined(EPMOE_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>

#include "common/gpu_ranks.h"
#include "epmoe/nccl_comm.h"
#endif

namespace epmoe::test {
namespace {

#if defined(EPMOE_WITH_NCCL)

#define CK(x) ASSERT_EQ(cudaSuccess, (x)) << #x
#define NCK(x)                                                          \
  do {                                                                  \
    const ncclResult_t nck_ = (x);                                      \
    ASSERT_EQ(ncclSuccess, nck_) << #x << ": " << ncclGetErrorString(nck_); \
  } while (0)

// The caller's side: NCCL communicators epmoe did not make, one per visible GPU.
struct CallerComms {
  std::vector<ncclComm_t> raw;
  std::vector<int> devs;
  ~CallerComms() {
    for (ncclComm_t c : raw)
      if (c) ncclCommDestroy(c);
  }
};

// Every rank's all-reduce of {r+1, r+1, r+1, r+1}: proves the communicators still work.
void expect_all_reduce_works(const CallerComms& cc) {
  const int R = int(cc.raw.size());
  std::vector<float*> buf(R, nullptr);
  std::vector<cudaStream_t> st(R, nullptr);
  for (int r = 0; r < R; ++r) {
    CK(cudaSetDevice(cc.devs[r]));
    CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    CK(cudaMalloc(&buf[r], 4 * sizeof(float)));
    const std::vector<float> v(4, float(r + 1));
    CK(cudaMemcpy(buf[r], v.data(), 4 * sizeof(float), cudaMemcpyHostToDevice));
  }
  // One thread drives every GPU: the calls of all ranks form one NCCL group.
  NCK(ncclGroupStart());
  for (int r = 0; r < R; ++r) NCK(ncclAllReduce(buf[r], buf[r], 4, ncclFloat, ncclSum, cc.raw[r], st[r]));
  NCK(ncclGroupEnd());
  const float want = float(R * (R + 1) / 2);
  for (int r = 0; r < R; ++r) {
    CK(cudaSetDevice(cc.devs[r]));
    CK(cudaStreamSynchronize(st[r]));
    std::vector<float> got(4);
    CK(cudaMemcpy(got.data(), buf[r], 4 * sizeof(float), cudaMemcpyDeviceToHost));
    for (float g : got) EXPECT_EQ(g, want) << "rank " << r << " after the epmoe wrappers were destroyed";
    CK(cudaFree(buf[r]));
    CK(cudaStreamDestroy(st[r]));
  }
}

TEST(AdoptNccl, NullCommOrBadTimeoutIsAUsageError) {
  EXPECT_THROW(adopt_nccl_comm(nullptr), UsageError);
  try {
    adopt_nccl_comm(nullptr, 0);
    FAIL() << "timeout_ms=0 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("timeout_ms=0"), std::string::npos) << e.what();
  }
}

TEST(AdoptNccl, AdoptedCommsWorkAndStayTheCallers) {
  if (tests_under_mpirun()) GTEST_SKIP() << "creates its own communicators over every GPU; one process only";
  const int n = visible_gpus();
  if (n < 1) GTEST_SKIP() << "needs a GPU, this machine has none";
  // As nccl_comm.h asks of a caller: NVLink multicast off before its communicators are created.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CallerComms cc;
  cc.devs.resize(n);
  for (int r = 0; r < n; ++r) cc.devs[r] = r;
  cc.raw.assign(n, nullptr);
  NCK(ncclCommInitAll(cc.raw.data(), n, cc.devs.data()));

  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(adopt_nccl_comm(cc.raw[r], 20000));
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), n);
    EXPECT_EQ(comms[r]->device_index(), cc.devs[r]);
    EXPECT_EQ(comms[r]->device(), DeviceKind::cuda);
    EXPECT_STREQ(comms[r]->kind(), "nccl");
    EXPECT_EQ(nccl_handle(*comms[r]), cc.raw[r]);
  }

  // Agreement passes; with several ranks, a disagreement is named on every rank.
  run_ranks(comms, [](Communicator& c) { c.check_same(42, "test value"); });
  if (n > 1) {
    std::vector<std::string> msgs(n);
    run_ranks(comms, [&](Communicator& c) {
      try {
        c.check_same(c.rank() == n - 1 ? 7 : 42, "test value");
      } catch (const UsageError& e) {
        msgs[c.rank()] = e.what();
      }
    });
    for (int r = 0; r < n; ++r)
      EXPECT_NE(msgs[r].find("test value differs between ranks"), std::string::npos) << "rank " << r << ": " << msgs[r];
  }

  // The wrappers go; the caller's communicators stay (CallerComms destroys them at the end).
  comms.clear();
  expect_all_reduce_works(cc);
}

#else

TEST(AdoptNccl, NeedsNccl) { GTEST_SKIP() << "this build has no NCCL (adopt_nccl_comm is off)"; }

#endif

}  // namespace
}  // namespace epmoe::test
