#include "bench_util.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "epmoe/error.h"

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

}  // namespace epmoe::cli
