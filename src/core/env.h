// The one reader of the process environment. Nothing else in epmoe calls getenv: tuning options
// come from default_tuning() (options.h); the launch environment (mpirun's OMPI_* variables, the
// rendezvous directory and job id) and process-wide settings (CPU threads) from the functions
// below. NCCL reads its own variables itself.
#pragma once
#include <optional>
#include <string>

namespace epmoe::env {

// The raw value of `name`, or nullopt when unset or empty.
std::optional<std::string> get(const char* name);

// Parsers with one error style. Unset or empty -> nullopt. A malformed value throws UsageError:
//   "environment variable NAME='value' is not <expected> (<what>); unset it or give e.g. <example>"
std::optional<long long> integer(const char* name, long long lo, long long hi, const char* what);
std::optional<bool> flag(const char* name, const char* what);  // "0" or "1"

// Launch environment under Open MPI's mpirun (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK /
// _LOCAL_SIZE); nullopt when not set.
struct MpiLaunch {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
};
std::optional<MpiLaunch> mpi_launch();

// EPMOE_BOOTSTRAP_DIR (default /tmp) and the job id that names the rendezvous file: EPMOE_JOB_ID,
// else the PMIx namespace, else Open MPI's job id; empty when none is set.
std::string bootstrap_dir();
std::string job_id();

// EPMOE_NCCL_ALLOW_VERSION_MISMATCH set (to anything): skip the NCCL header/library version check.
bool nccl_allow_version_mismatch();

// EPMOE_CPU_THREADS: threads of the CPU reference (0 = unset: the caller's default).
int cpu_threads();

}  // namespace epmoe::env
