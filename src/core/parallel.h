// A process-wide pool of CPU worker threads and a parallel_for on top of it, for the CPU
// reference paths (reference runner, float64 oracle) whose work splits into independent pieces.
//
// Determinism is the caller's job and is easy to keep: parallel_for only decides *which thread*
// runs task i, never how task i computes. Callers give every output element to exactly one task
// and compute it with the same float operations as the serial code, so results are bitwise the
// same for any thread count.
//
// Oversubscription: the pool is shared by the whole process. The cpu fabric runs R ranks as
// threads that call their runners concurrently; they all feed the same pool, so the machine sees
// at most cpu_threads() - 1 workers plus the callers themselves (each caller also runs tasks
// while it waits), never R separate pools.
#pragma once
#include <cstdint>
#include <functional>

namespace epmoe::detail {

// Threads parallel_for may use, counting the caller: env EPMOE_CPU_THREADS when set (>= 1;
// 1 = everything serial on the calling thread), else hardware_concurrency() capped at 64.
// Read once, on first use.
int cpu_threads();

// Overrides cpu_threads() for parallel_for calls made from now on (tests compare thread counts).
// n >= 1; the pool grows to n - 1 workers if it has fewer, and uses only n - 1 of them otherwise.
void set_cpu_threads(int n);

// Runs fn(i) for every i in [0, n), each exactly once, on up to cpu_threads() threads (the
// caller included), and returns when all have finished. Tasks may themselves call parallel_for
// (the caller of the inner loop runs its tasks too, so nesting cannot deadlock). If tasks throw,
// the remaining tasks still run and the exception of the lowest-numbered failing task is
// rethrown here, so the error does not depend on timing.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace epmoe::detail
