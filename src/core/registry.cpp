// The (dispatcher, runner) registry. Dispatchers are keyed by (name, device), runners by name; a
// pair is legal when declared with add_pair and the formats and devices line up. Every rejection
// lists the legal pairs so the user can pick one without reading the source.
#include "epmoe/registry.h"

#include <algorithm>
#include <sstream>

#include "core/builtin_backends.h"
#include "epmoe/error.h"

namespace epmoe {

namespace {

template <class T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

template <class F>
std::string format_list(const std::vector<F>& v) {
  std::vector<std::string> names;
  for (F f : v) names.push_back(format_name(f));
  return join(names, "/");
}

}  // namespace

void default_step(StepContext& ctx, const DispatchInput& in, bf16_raw* out) {
  const DispatchOutput received = ctx.dispatcher.dispatch(in);
  ctx.runner.run(received, ctx.weights, ctx.y, in.stream);
  ctx.dispatcher.combine(CombineInput{ctx.y, in.stream}, out);
}

Registry& Registry::global() {
  // Built once, on first use, with every backend compiled into this library; the hooks live next
  // to their backends so the registry never names a backend itself.
  static Registry* reg = [] {
    auto* r = new Registry;
    detail::register_cpu_dispatchers(*r);
    detail::register_reference_runner(*r);
#if defined(EPMOE_WITH_CUDA)
    detail::register_cuda_backends(*r);
    detail::register_cuda_local_dispatcher(*r);
#endif
#if defined(EPMOE_WITH_NCCL)
    detail::register_nccl_dispatcher(*r);
    detail::register_nvlink_dispatcher(*r);
#endif
    return r;
  }();
  return *reg;
}

void Registry::add(DispatcherInfo info) {
  for (const auto& d : dispatchers_)
    if (d.name == info.name && d.device == info.device)
      throw UsageError("dispatcher '" + info.name + "' on " + device_name(info.device) +
                       " is registered twice; each (name, device) may be registered once");
  dispatchers_.push_back(std::move(info));
}

void Registry::add(RunnerInfo info) {
  if (find_runner(info.name))
    throw UsageError("runner '" + info.name + "' is registered twice; each runner name may be registered once");
  runners_.push_back(std::move(info));
}

void Registry::add_pair(const std::string& dispatcher, const std::string& runner, StepFn step) {
  for (auto& p : pairs_) {
    if (p.dispatcher == dispatcher && p.runner == runner) {
      // A later registration with a fused step replaces the plain composition.
      if (step) p.step = std::move(step);
      return;
    }
  }
  pairs_.push_back(PairEntry{dispatcher, runner, std::move(step)});
}

const DispatcherInfo* Registry::find_dispatcher(const std::string& name, DeviceKind device) const {
  for (const auto& d : dispatchers_)
    if (d.name == name && d.device == device) return &d;
  return nullptr;
}

const DispatcherInfo* Registry::find_dispatcher(const std::string& name) const {
  for (const auto& d : dispatchers_)
    if (d.name == name) return &d;
  return nullptr;
}

const RunnerInfo* Registry::find_runner(const std::string& name) const {
  for (const auto& r : runners_)
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string> Registry::describe_pairs() const {
  std::vector<std::string> out;
  for (const auto& p : pairs_) {
    const RunnerInfo* r = find_runner(p.runner);
    if (!r) continue;  // declared before (or without) its runner: not usable
    const DispatcherInfo* d = nullptr;
    for (const auto& di : dispatchers_)
      if (di.name == p.dispatcher && di.device == r->device) d = &di;
    if (!d) continue;
    std::vector<ActFormat> both;
    for (ActFormat f : d->formats)
      if (contains(r->accepts, f)) both.push_back(f);
    out.push_back(p.dispatcher + "+" + p.runner + " (" + format_list(both) + "; " + format_list(r->weights) + ")");
  }
  return out;
}

std::vector<ConfigIssue> Registry::check(const MoeConfig& cfg) const {
  std::vector<ConfigIssue> issues;
  std::vector<std::string> legal;
  for (const auto& p : pairs_) legal.push_back(p.dispatcher + "+" + p.runner);
  const std::string legal_txt = "; legal pairs: " + (legal.empty() ? std::string("(none registered)") : join(legal, ", "));

  const RunnerInfo* runner = find_runner(cfg.runner);
  const DispatcherInfo* any_disp = find_dispatcher(cfg.dispatcher);
  if (!runner) {
    std::vector<std::string> names;
    for (const auto& r : runners_) names.push_back(r.name);
    issues.push_back({"runner", cfg.runner,
                      "runner=" + cfg.runner + " is not known in this build (known: " + join(names, ", ") +
                          ")" + legal_txt});
  }
  if (!any_disp) {
    std::vector<std::string> names;
    for (const auto& d : dispatchers_)
      if (!contains(names, d.name)) names.push_back(d.name);
    issues.push_back({"dispatcher", cfg.dispatcher,
                      "dispatcher=" + cfg.dispatcher + " is not known in this build (known: " + join(names, ", ") +
                          ")" + legal_txt});
  }
  if (!runner || !any_disp) return issues;

  bool declared = false;
  for (const auto& p : pairs_) declared |= (p.dispatcher == cfg.dispatcher && p.runner == cfg.runner);
  if (!declared) {
    issues.push_back({"dispatcher", cfg.dispatcher,
                      "dispatcher=" + cfg.dispatcher + " with runner=" + cfg.runner + " is not a legal pair" + legal_txt});
    return issues;
  }

  const DispatcherInfo* disp = nullptr;
  for (const auto& d : dispatchers_)
    if (d.name == cfg.dispatcher && d.device == runner->device) disp = &d;
  if (!disp) {
    issues.push_back({"dispatcher", cfg.dispatcher,
                      "dispatcher=" + cfg.dispatcher + " has no " + device_name(runner->device) +
                          " implementation in this build, and runner=" + cfg.runner + " runs on " +
                          device_name(runner->device) + legal_txt});
    return issues;
  }

  const std::string pair = cfg.dispatcher + "+" + cfg.runner;
  if (!contains(runner->accepts, cfg.dispatch_format) || !contains(disp->formats, cfg.dispatch_format)) {
    std::vector<ActFormat> both;
    for (ActFormat f : disp->formats)
      if (contains(runner->accepts, f)) both.push_back(f);
    issues.push_back({"dispatch_format", format_name(cfg.dispatch_format),
                      std::string("dispatch_format=") + format_name(cfg.dispatch_format) + " is not supported by " +
                          pair + "; use one of: " + format_list(both)});
  }
  if (!contains(runner->weights, cfg.weight_format)) {
    issues.push_back({"weight_format", format_name(cfg.weight_format),
                      std::string("weight_format=") + format_name(cfg.weight_format) + " is not supported by runner=" +
                          cfg.runner + "; use one of: " + format_list(runner->weights)});
  }
  if (!contains(disp->combine_formats, cfg.combine_format)) {
    issues.push_back({"combine_format", format_name(cfg.combine_format),
                      std::string("combine_format=") + format_name(cfg.combine_format) + " is not supported by dispatcher=" +
                          cfg.dispatcher + "; use one of: " + format_list(disp->combine_formats)});
  }
  // The backends' own limits, once the pair itself is legal.
  if (issues.empty()) {
    if (disp->check) disp->check(cfg, issues);
    if (runner->check) runner->check(cfg, issues);
  }
  return issues;
}

Registry::Pair Registry::resolve(const MoeConfig& cfg) const {
  const auto issues = check(cfg);
  if (!issues.empty()) {
    std::ostringstream os;
    os << "invalid backend selection:";
    for (const auto& i : issues) os << "\n  " << i.message;
    throw UsageError(os.str());
  }
  Pair out;
  out.runner = find_runner(cfg.runner);
  for (const auto& d : dispatchers_)
    if (d.name == cfg.dispatcher && d.device == out.runner->device) out.dispatcher = &d;
  for (const auto& p : pairs_)
    if (p.dispatcher == cfg.dispatcher && p.runner == cfg.runner) out.step = p.step;
  if (!out.step) out.step = default_step;
  return out;
}

}  // namespace epmoe
