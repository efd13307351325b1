// NCCL communicators: creation (one process for all GPUs, one process per GPU, mpirun bootstrap),
// adoption of a caller's communicator, the version check, check_same, and bounded waits.
#include "comm/nccl/nccl_comm_impl.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "comm/rendezvous.h"
#include "core/cuda/check.h"
#include "core/env.h"
#include "epmoe/error.h"
#include "epmoe/nccl_comm.h"

namespace epmoe {
namespace detail {

void nccl_check(ncclResult_t r, const char* expr, const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = ncclGetLastError(nullptr);
  throw BackendError(std::string("NCCL error at ") + file + ":" + std::to_string(line) + ": " + expr + " failed: " +
                     ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : std::string()));
}

namespace {
std::string version_string(int code) {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string((code / 100) % 100) + "." + std::to_string(code % 100);
}
}  // namespace

void nccl_preflight() {
  // Must precede every NCCL initialisation of the process: no NVLink multicast (docs/COMM.md).
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  int v = 0;
  EPMOE_NCCL_CHECK(ncclGetVersion(&v));
  if (v != NCCL_VERSION_CODE && !env::nccl_allow_version_mismatch()) {
    throw BackendError("NCCL version mismatch: epmoe was compiled against NCCL " + version_string(NCCL_VERSION_CODE) +
                       " but libnccl.so.2 loaded at run time is " + version_string(v) +
                       "; the NCCL device API is inlined at compile time, so build against the NCCL you run with "
                       "(cmake -DEPMOE_NCCL_ROOT=<prefix>) or put the matching libnccl.so.2 first on LD_LIBRARY_PATH");
  }
}

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, int device, int timeout_ms, bool owned)
    : comm_(comm), rank_(rank), size_(size), device_(device), timeout_ms_(timeout_ms), owned_(owned) {
  const auto dev = activate();
  EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  dev_scratch_bytes_ = 4096;
  EPMOE_CUDA_CHECK(cudaMalloc(&dev_scratch_, dev_scratch_bytes_));
}

NcclComm::~NcclComm() {
  const cuda::DeviceGuard dev(device_, std::nothrow);
  if (!owned_ && broken_) {
    // A collective of ours may still be pending on the caller's communicator, which we may not
    // abort: waiting for the stream or freeing (an implicit device sync) could block forever, so
    // the stream is released without waiting and the small scratch buffer is left behind.
    if (stream_) cudaStreamDestroy(stream_);
    return;
  }
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_ && owned_) {
    // A broken group may never complete a destroy (it synchronises with peers): abort instead.
    if (broken_) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
  }
  if (dev_scratch_) cudaFree(dev_scratch_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::wait(cudaStream_t stream, const char* where, int timeout_ms) {
  if (broken_) throw BackendError(std::string("nccl communicator of rank ") + std::to_string(rank_) +
                                  " is unusable after an earlier timeout or error (at " + where + ")");
  const int limit = timeout_ms > 0 ? timeout_ms : timeout_ms_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit);
  int spins = 0;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) EPMOE_CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    EPMOE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      broken_ = true;
      EPMOE_NCCL_CHECK(async);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      broken_ = true;
      // An adopted communicator belongs to the caller: aborting it would free it under their feet.
      if (owned_) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      }
      throw TimeoutError("rank " + std::to_string(rank_) + ": a peer did not arrive within " + std::to_string(limit) +
                             " ms at " + where + " (NCCL collectives do not say which peer; rank -1 = unknown). "
                             "Check that every rank calls the same collectives in the same order, or raise "
                             "MoeConfig::timeout_ms (--timeout-ms)",
                         -1);
    }
    // Spin briefly first (most waits are microseconds), then yield the core.
    if (++spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::vector<int32_t> NcclComm::all_gather_i32(const int32_t* host_values, int n, const char* where,
                                             cudaStream_t stream) {
  const auto dev = activate();
  const size_t bytes = size_t(n) * 4 * (size_ + 1);
  if (bytes > dev_scratch_bytes_) {
    EPMOE_CUDA_CHECK(cudaFree(dev_scratch_));
    dev_scratch_bytes_ = bytes;
    EPMOE_CUDA_CHECK(cudaMalloc(&dev_scratch_, dev_scratch_bytes_));
  }
  int32_t* send = static_cast<int32_t*>(dev_scratch_);
  int32_t* recv = send + n;
  std::vector<int32_t> out(size_t(n) * size_);
  // Pageable host memory: the copies are synchronous with respect to the host, which is what a
  // small exchange wants anyway.
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(send, host_values, size_t(n) * 4, cudaMemcpyHostToDevice, stream));
  EPMOE_NCCL_CHECK(ncclAllGather(send, recv, size_t(n), ncclInt32, comm_, stream));
  wait(stream, where);
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(out.data(), recv, out.size() * 4, cudaMemcpyDeviceToHost, stream));
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

std::vector<uint64_t> NcclComm::all_gather_u64(uint64_t value, const char* where) {
  int32_t parts[2];
  std::memcpy(parts, &value, 8);
  const std::vector<int32_t> all = all_gather_i32(parts, 2, where);
  std::vector<uint64_t> out(size_);
  for (int r = 0; r < size_; ++r) std::memcpy(&out[r], &all[size_t(r) * 2], 8);
  return out;
}

void NcclComm::check_same(uint64_t value, const char* what) {
  const std::vector<uint64_t> all = all_gather_u64(value, what);
  std::string bad;
  for (int r = 1; r < size_; ++r)
    if (all[r] != all[0]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (!bad.empty())
    throw UsageError(std::string(what) + " differs between ranks: rank(s) " + bad + " disagree with rank 0 (seen by rank " +
                     std::to_string(rank_) + "); create every rank with the same configuration");
}

NcclComm& as_nccl(Communicator& c, const char* who) {
  auto* n = dynamic_cast<NcclComm*>(&c);
  if (!n)
    throw UsageError(std::string(who) + " needs a communicator of kind \"nccl\" but got \"" + c.kind() +
                     "\"; create it with make_nccl_group, make_nccl_comm or adopt_nccl_comm (include epmoe/nccl_comm.h)");
  return *n;
}

}  // namespace detail

namespace {

int visible_devices() {
  std::string why;
  const int n = cuda::device_count(&why);
  if (n == 0) throw BackendError("no CUDA device for an nccl communicator: " + why);
  return n;
}

void check_timeout(int timeout_ms, const char* who) {
  if (timeout_ms <= 0)
    throw UsageError(std::string(who) + ": timeout_ms=" + std::to_string(timeout_ms) +
                     " must be positive (MoeConfig::timeout_ms, --timeout-ms)");
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::vector<int> devices, int timeout_ms) {
  check_timeout(timeout_ms, "make_nccl_group");
  if (devices.empty()) throw UsageError("make_nccl_group: devices is empty; pass the CUDA device of each rank, e.g. {0, 1}");
  const int n = visible_devices();
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= n)
      throw UsageError("make_nccl_group: device " + std::to_string(d) + " does not exist (this process sees " +
                       std::to_string(n) + " CUDA devices: 0.." + std::to_string(n - 1) + ")");
    if (!seen.insert(d).second)
      throw UsageError("make_nccl_group: device " + std::to_string(d) + " is listed twice; one rank per GPU");
  }
  detail::nccl_preflight();
  std::vector<ncclComm_t> raw(devices.size());
  EPMOE_NCCL_CHECK(ncclCommInitAll(raw.data(), static_cast<int>(devices.size()), devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_unique<detail::NcclComm>(raw[r], int(r), int(devices.size()), devices[r], timeout_ms));
  return out;
}

ncclUniqueId make_nccl_unique_id() {
  detail::nccl_preflight();
  ncclUniqueId id;
  EPMOE_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

std::unique_ptr<Communicator> make_nccl_comm(const ncclUniqueId& id, int rank, int nranks, int device, int timeout_ms) {
  check_timeout(timeout_ms, "make_nccl_comm");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw UsageError("make_nccl_comm: rank=" + std::to_string(rank) + " with nranks=" + std::to_string(nranks) +
                     " is invalid; pass 0 <= rank < nranks");
  const int n = visible_devices();
  if (device < 0 || device >= n)
    throw UsageError("make_nccl_comm: device=" + std::to_string(device) + " does not exist (this process sees " +
                     std::to_string(n) + " CUDA devices)");
  detail::nccl_preflight();
  const cuda::DeviceGuard dev(device);
  ncclComm_t c = nullptr;
  EPMOE_NCCL_CHECK(ncclCommInitRank(&c, nranks, id, rank));
  return std::make_unique<detail::NcclComm>(c, rank, nranks, device, timeout_ms);
}

std::unique_ptr<Communicator> adopt_nccl_comm(ncclComm_t comm, int timeout_ms) {
  check_timeout(timeout_ms, "adopt_nccl_comm");
  if (comm == nullptr)
    throw UsageError("adopt_nccl_comm: comm is null; pass a communicator initialised with ncclCommInitRank, "
                     "ncclCommInitAll or ncclCommSplit");
  detail::nccl_preflight();
  ncclResult_t state = ncclSuccess;
  EPMOE_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
  if (state == ncclInProgress)
    throw UsageError("adopt_nccl_comm: comm is still initialising (a non-blocking communicator); wait until "
                     "ncclCommGetAsyncError reports ncclSuccess, then adopt it");
  EPMOE_NCCL_CHECK(state);
  int rank = -1, size = 0, device = -1;
  EPMOE_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  EPMOE_NCCL_CHECK(ncclCommCount(comm, &size));
  EPMOE_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  const int n = visible_devices();
  if (device < 0 || device >= n)
    throw UsageError("adopt_nccl_comm: comm runs on CUDA device " + std::to_string(device) +
                     ", which this process does not see (it sees " + std::to_string(n) +
                     "); adopt the communicator in the process that created it");
  return std::make_unique<detail::NcclComm>(comm, rank, size, device, timeout_ms, /*owned=*/false);
}

bool launched_under_mpi() { return env::mpi_launch().has_value(); }

std::unique_ptr<Communicator> make_nccl_comm_from_env(int timeout_ms) {
  check_timeout(timeout_ms, "make_nccl_comm_from_env");
  const std::optional<env::MpiLaunch> mpi = env::mpi_launch();
  if (!mpi)
    throw UsageError("make_nccl_comm_from_env: OMPI_COMM_WORLD_RANK/SIZE are not set; launch with mpirun -np <R>");
  const int rank = mpi->rank, size = mpi->size, local = mpi->local_rank;
  const std::string job = env::job_id();
  if (job.empty())
    throw UsageError("make_nccl_comm_from_env: no job id found (EPMOE_JOB_ID, PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid); "
                     "export EPMOE_JOB_ID=<something unique per job> on every rank");
  // The n-th communicator a process creates meets the n-th of every other rank (all ranks create
  // them in the same order): a file per creation, so that a rank that is already on its next
  // creation can never read the id of the previous one before rank 0 has removed it.
  static std::atomic<uint64_t> created{0};
  const uint64_t seq = created.fetch_add(1);
  const std::string path = env::bootstrap_dir() + "/epmoe-nccl-" + job + "-" + std::to_string(seq) + ".id";
  ncclUniqueId id{};
  if (rank == 0) {
    id = make_nccl_unique_id();
    detail::publish_blob(path, &id, sizeof id);
  } else {
    detail::wait_for_blob(path, &id, sizeof id, timeout_ms, 0,
                  "make_nccl_comm_from_env: is EPMOE_BOOTSTRAP_DIR shared by all ranks?");
  }
  const int ndev = visible_devices();
  auto comm = make_nccl_comm(id, rank, size, local % ndev, timeout_ms);
  // Every rank has read the id once the (collective) init returned.
  if (rank == 0) std::remove(path.c_str());
  return comm;
}

ncclComm_t nccl_handle(Communicator& comm) {
  auto* n = dynamic_cast<detail::NcclComm*>(&comm);
  return n ? n->handle() : nullptr;
}

std::string nccl_compiled_version() { return detail::version_string(NCCL_VERSION_CODE); }

std::string nccl_runtime_version() {
  int v = 0;
  EPMOE_NCCL_CHECK(ncclGetVersion(&v));
  return detail::version_string(v);
}

}  // namespace epmoe
