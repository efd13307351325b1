#include "comm/rendezvous.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "epmoe/error.h"

namespace epmoe::detail {

void publish_blob(const std::string& path, const void* data, size_t n) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!f) throw BackendError("cannot write " + tmp + " (set EPMOE_BOOTSTRAP_DIR to a writable shared directory)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw BackendError("cannot rename " + tmp + " to " + path);
  }
}

void wait_for_blob(const std::string& path, void* data, size_t n, int timeout_ms, int publisher,
                   const std::string& hint) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    {
      std::ifstream f(path, std::ios::binary);
      if (f && f.read(static_cast<char*>(data), static_cast<std::streamsize>(n)) &&
          f.gcount() == static_cast<std::streamsize>(n))
        return;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw TimeoutError("rank " + std::to_string(publisher) + " did not publish " + path + " within " +
                             std::to_string(timeout_ms) + " ms" + (hint.empty() ? "" : "; " + hint),
                         publisher);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace epmoe::detail
