// The file rendezvous behind `mpirun` start-up (make_nccl_comm_from_env), without NCCL or a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "comm/rendezvous.h"
#include "epmoe/error.h"

namespace epmoe {
namespace {

std::string temp_path(const char* tag) {
  return ::testing::TempDir() + "/epmoe-rdv-" + tag + "-" + std::to_string(getpid());
}

TEST(Rendezvous, LateReaderAndEarlyReaderBothGetTheBlob) {
  const std::string path = temp_path("ok");
  std::remove(path.c_str());
  std::array<unsigned char, 128> sent{}, early{}, late{};
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<unsigned char>(i * 37 + 1);
  std::thread reader([&] { detail::wait_for_blob(path, early.data(), early.size(), 5000, 0, ""); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the reader polls before the file exists
  detail::publish_blob(path, sent.data(), sent.size());
  reader.join();
  detail::wait_for_blob(path, late.data(), late.size(), 100, 0, "");
  EXPECT_EQ(early, sent);
  EXPECT_EQ(late, sent);
  std::remove(path.c_str());
}

TEST(Rendezvous, AShortFileIsNotTakenForTheBlob) {
  const std::string path = temp_path("short");
  { std::ofstream(path, std::ios::binary) << "only a few bytes"; }
  std::array<unsigned char, 128> got{};
  try {
    detail::wait_for_blob(path, got.data(), got.size(), 100, 0, "check the directory");
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("rank 0 did not publish " + path + " within 100 ms; check the directory"),
              std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
}

TEST(Rendezvous, UnwritableDirectoryIsABackendErrorNamingThePath) {
  const std::string path = "/nonexistent-epmoe-dir/x.id";
  const char blob[4] = {1, 2, 3, 4};
  try {
    detail::publish_blob(path, blob, sizeof blob);
    FAIL() << "expected an error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-epmoe-dir/x.id"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
