// Shared worker pool behind parallel_for. A parallel_for call is a Job with an atomic cursor:
// whoever holds the job (the caller or a worker) claims the next index until none is left. The
// caller claims indices too and only then waits for the ones workers are still running, so a
// job always finishes even when every worker is busy elsewhere (concurrent ranks, nesting).
#include "core/parallel.h"

#include "core/env.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epmoe/error.h"

namespace epmoe::detail {

namespace {

constexpr int kMaxDefaultThreads = 64;

int threads_from_env() {
  if (const int n = env::cpu_threads(); n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(int(hw == 0 ? 1 : hw), 1, kMaxDefaultThreads);
}

struct Job {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  int max_helpers = 0;              // workers allowed on this job besides the caller
  std::atomic<int64_t> next{0};     // next unclaimed index
  std::atomic<int64_t> finished{0}; // indices whose fn returned (or threw)
  int helpers = 0;                  // workers currently attached (guarded by Pool::mu)
  std::mutex err_mu;
  int64_t err_index = -1;
  std::exception_ptr err;

  // Runs claimed indices until the cursor passes n. Returns true if this call finished the job.
  bool drain() {
    bool last = false;
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (err_index < 0 || i < err_index) err_index = i, err = std::current_exception();
      }
      if (finished.fetch_add(1) + 1 == n) last = true;
    }
    return last;
  }
};

class Pool {
 public:
  static Pool& get() {
    static Pool pool;
    return pool;
  }

  int threads() {
    std::lock_guard<std::mutex> lk(mu_);
    return threads_;
  }

  void set_threads(int n) {
    std::lock_guard<std::mutex> lk(mu_);
    threads_ = n;
    grow_locked(n - 1);
  }

  void run(int64_t n, const std::function<void(int64_t)>& fn) {
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    {
      std::lock_guard<std::mutex> lk(mu_);
      job->max_helpers = int(std::min<int64_t>(threads_ - 1, n - 1));
      grow_locked(threads_ - 1);
      jobs_.push_back(job);
    }
    work_cv_.notify_all();
    job->drain();
    {
      // Detach the job so no worker picks it up again, then wait for the helpers still in it.
      std::unique_lock<std::mutex> lk(mu_);
      jobs_.erase(std::find(jobs_.begin(), jobs_.end(), job));
      done_cv_.wait(lk, [&] { return job->helpers == 0; });
    }
    if (job->err) std::rethrow_exception(job->err);
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  Pool() : threads_(threads_from_env()) {}

  void grow_locked(int want) {
    while (int(workers_.size()) < want) workers_.emplace_back([this] { worker(); });
  }

  // A job a worker may join: work left and fewer helpers than it allows.
  std::shared_ptr<Job> pick_locked() {
    for (auto& j : jobs_)
      if (j->helpers < j->max_helpers && j->next.load() < j->n) return j;
    return nullptr;
  }

  void worker() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      std::shared_ptr<Job> job;
      work_cv_.wait(lk, [&] { return stop_ || (job = pick_locked()) != nullptr; });
      if (stop_) return;
      ++job->helpers;
      lk.unlock();
      job->drain();
      lk.lock();
      if (--job->helpers == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  std::vector<std::thread> workers_;
  int threads_;
  bool stop_ = false;
};

}  // namespace

int cpu_threads() { return Pool::get().threads(); }

void set_cpu_threads(int n) {
  if (n < 1 || n > 4096)
    throw UsageError("set_cpu_threads(" + std::to_string(n) + "): the thread count must be in [1, 4096]");
  Pool::get().set_threads(n);
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || cpu_threads() == 1) {
    // Serial path: same error rule as the pool (every task runs, lowest failing index wins).
    std::exception_ptr err;
    for (int64_t i = 0; i < n; ++i) {
      try {
        fn(i);
      } catch (...) {
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
    return;
  }
  Pool::get().run(n, fn);
}

}  // namespace epmoe::detail
