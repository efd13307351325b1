#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "epmoe/error.h"

#if defined(EPMOE_WITH_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(EPMOE_WITH_NCCL)
#include <nccl.h>

#include "epmoe/nccl_comm.h"
#endif

namespace epmoe::cli {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> split_list(const std::string& text, const std::string& flag) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t c = text.find(',', pos);
    std::string item = text.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    if (item.empty())
      throw UsageError("--" + flag + "=" + text + " has an empty item; give a comma-separated list");
    out.push_back(std::move(item));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

std::vector<const ModelPreset*> parse_presets(const std::string& list) {
  std::vector<const ModelPreset*> out;
  if (list == "all") {
    for (const ModelPreset& p : presets())
      if (p.name != "tiny") out.push_back(&p);
    return out;
  }
  for (const std::string& name : split_list(list, "preset")) out.push_back(&preset(name));
  return out;
}

std::vector<ActFormat> parse_act_formats(const std::string& text, const std::string& flag) {
  std::vector<ActFormat> out;
  for (const std::string& s : split_list(text, flag)) {
    const auto f = parse_act_format(s);
    if (!f) throw UsageError("--" + flag + ": unknown format '" + s + "'; use bf16, fp8 or nvfp4");
    out.push_back(*f);
  }
  return out;
}

WeightFormat weight_family(ActFormat f) {
  return f == ActFormat::fp8 ? WeightFormat::fp8 : f == ActFormat::nvfp4 ? WeightFormat::nvfp4 : WeightFormat::bf16;
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int nt = int(std::max<int64_t>(1, std::min<int64_t>(n, threads)));
  std::mutex mu;
  std::exception_ptr first;
  int64_t next = 0;
  // Items are handed out one at a time: the work per item (an expert, a block of tokens) varies.
  auto worker = [&] {
    while (true) {
      int64_t i;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (next >= n || first) return;
        i = next++;
      }
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) first = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

int host_threads_per_rank(int ranks_in_process) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  int sharing = std::max(1, ranks_in_process);
  // Under mpirun the other ranks of this node are processes of their own.
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); local && under_mpirun())
    sharing = std::max(sharing, std::atoi(local));
  return std::max(1, hw / sharing);
}

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_RANK") != nullptr && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

int default_gpu_ranks() {
  if (under_mpirun()) return std::max(1, std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
#if defined(EPMOE_WITH_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

int ranks_in_this_process(int num_ranks) { return under_mpirun() ? 1 : num_ranks; }

bool rank0_process() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  return !under_mpirun() || (r && std::atoi(r) == 0);
}

void launch_gpu_ranks(int num_ranks, int timeout_ms, const std::function<void(Communicator&)>& fn) {
#if defined(EPMOE_WITH_CUDA)
  if (num_ranks < 1) throw UsageError("ranks=" + std::to_string(num_ranks) + " must be at least 1");
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess) {
    cudaGetLastError();
    ngpu = 0;
  }
  if (under_mpirun()) {
#if defined(EPMOE_WITH_NCCL)
    const int world = std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE"));
    if (world != num_ranks)
      throw UsageError("ranks=" + std::to_string(num_ranks) + " but mpirun started " + std::to_string(world) +
                       " processes; leave --ranks out or pass mpirun -np " + std::to_string(num_ranks));
    if (ngpu < 1) throw UsageError("this process sees no GPU; each mpirun rank needs one");
    auto comm = make_nccl_comm_from_env(timeout_ms);
    if (cudaSetDevice(comm->device_index()) != cudaSuccess)
      throw BackendError("cudaSetDevice(" + std::to_string(comm->device_index()) + ") failed");
    fn(*comm);
    return;
#else
    throw UsageError("this build has no NCCL, so it cannot run one process per GPU under mpirun");
#endif
  }
  if (ngpu < num_ranks)
    throw UsageError("ranks=" + std::to_string(num_ranks) + " needs " + std::to_string(num_ranks) +
                     " GPUs but this machine shows " + std::to_string(ngpu) + "; use --ranks " +
                     std::to_string(std::max(1, ngpu)) + " or a larger machine");
  if (num_ranks == 1) {
    if (cudaSetDevice(0) != cudaSuccess) throw BackendError("cudaSetDevice(0) failed");
    auto comm = make_local_comm(DeviceKind::cuda, 0);
    fn(*comm);
    return;
  }
#if defined(EPMOE_WITH_NCCL)
  std::vector<int> devs(num_ranks);
  for (int r = 0; r < num_ranks; ++r) devs[r] = r;
  auto comms = make_nccl_group(devs, timeout_ms);
  run_ranks(comms, [&](Communicator& comm) {
    if (cudaSetDevice(comm.device_index()) != cudaSuccess)
      throw BackendError("cudaSetDevice(" + std::to_string(comm.device_index()) + ") failed");
    fn(comm);
  });
#else
  throw UsageError("ranks=" + std::to_string(num_ranks) + " needs NCCL, which this build does not have; use --ranks 1");
#endif
#else
  (void)num_ranks;
  (void)timeout_ms;
  (void)fn;
  throw UsageError("this build has no CUDA; GPU ranks are not available");
#endif
}

std::vector<double> allgather(Communicator& comm, const std::vector<double>& mine) {
  if (comm.size() == 1) return mine;
#if defined(EPMOE_WITH_NCCL)
  ncclComm_t nc = nccl_handle(comm);
  if (!nc) throw UsageError(std::string("allgather: communicator kind '") + comm.kind() + "' is not nccl");
  const int R = comm.size();
  const size_t n = mine.size();
  void *send = nullptr, *recv = nullptr;
  cudaStream_t st = nullptr;
  auto ck = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw BackendError(std::string("allgather: ") + what + ": " + cudaGetErrorString(e));
  };
  struct Cleanup {
    void** s;
    void** r;
    cudaStream_t* st;
    ~Cleanup() {
      if (*st) cudaStreamDestroy(*st);
      cudaFree(*s);
      cudaFree(*r);
    }
  } cleanup{&send, &recv, &st};
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  ck(cudaMalloc(&send, std::max<size_t>(n, 1) * 8), "cudaMalloc");
  ck(cudaMalloc(&recv, std::max<size_t>(n * R, 1) * 8), "cudaMalloc");
  // The upload goes on `st` itself: a legacy-stream cudaMemcpy from pageable memory may return
  // before its DMA lands, and a non-blocking stream does not wait for it, so NCCL could read the
  // tail of a large buffer (beyond the first ~2 MB staging chunk) before it is written. That race
  // gave the wrong `bench layer` error figures of runs 7 and 12 (the layer output was right).
  if (n) ck(cudaMemcpyAsync(send, mine.data(), n * 8, cudaMemcpyHostToDevice, st), "upload");
  const ncclResult_t r = ncclAllGather(send, recv, n, ncclDouble, nc, st);
  if (r != ncclSuccess) throw BackendError(std::string("allgather: ncclAllGather: ") + ncclGetErrorString(r));
  // Polled with a deadline, so a rank that never arrives is reported instead of hanging the job.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (true) {
    const cudaError_t q = cudaStreamQuery(st);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) ck(q, "waiting for ncclAllGather");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(nc, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      throw BackendError(std::string("allgather: NCCL error: ") + ncclGetErrorString(async));
    if (std::chrono::steady_clock::now() > deadline) {
      // The collective may still run and write into these buffers: leak them rather than free
      // (cudaFree would also wait for it, which is the hang this check exists to avoid).
      send = recv = nullptr;
      st = nullptr;
      throw TimeoutError("allgather: a rank did not join the result exchange within 5 minutes", -1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<double> all(n * R);
  if (!all.empty()) {
    ck(cudaMemcpyAsync(all.data(), recv, all.size() * 8, cudaMemcpyDeviceToHost, st), "download");
    ck(cudaStreamSynchronize(st), "download");
  }
  return all;
#else
  throw UsageError(std::string("allgather: communicator kind '") + comm.kind() + "' needs NCCL");
#endif
}

}  // namespace epmoe::cli
