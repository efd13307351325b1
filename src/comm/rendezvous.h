// A file rendezvous: one process publishes a small blob (an NCCL unique id) in a directory that all
// processes of a job share, the others wait for it. It is what lets `mpirun -np N epmoe ...` start
// NCCL without linking MPI. Kept free of NCCL so that CI tests it without a GPU.
#pragma once
#include <cstddef>
#include <string>

namespace epmoe::detail {

// Writes `n` bytes to `path` atomically (a temporary file, then rename): a reader never sees a
// partial blob. Throws BackendError naming the path when the directory is not writable.
void publish_blob(const std::string& path, const void* data, size_t n);

// Waits until `path` holds at least `n` bytes and copies them into `data`. Throws TimeoutError
// (naming rank `publisher`) after `timeout_ms`, with `hint` appended to the message.
void wait_for_blob(const std::string& path, void* data, size_t n, int timeout_ms, int publisher,
                   const std::string& hint);

}  // namespace epmoe::detail
