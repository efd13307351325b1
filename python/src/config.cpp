// MoeConfig, RouterConfig, Tuning, validate/describe, presets and the registry's legal pairs.
// Every field is a read-write attribute and a keyword argument of the constructor; an unknown
// keyword or a value of the wrong kind is a UsageError naming it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "convert.h"
#include "epmoe/config.h"
#include "epmoe/presets.h"
#include "epmoe/registry.h"

namespace epmoe::py {

namespace {

#define EPMOE_ROUTER_FIELDS(X) X(kind) X(renormalize) X(n_group) X(topk_group) X(routed_scaling_factor)
#define EPMOE_TUNING_FIELDS(X)                                                                              \
  X(engine) X(wgmma_defer) X(pdl) X(nvfp4_wide_rows) X(fused_swiglu) X(concurrent_buckets) X(widen_scratch_mb) X(nvfp4_prepare) X(fp8_mixed) X(nvfp4_mixed) X(decode_max_rows) \
  X(nvfp4_wide_max_rows) X(cutlass_swap) \
  X(comm_sms) X(push_warps) X(combine) X(ce_rows) X(fault_check)
#define EPMOE_CONFIG_FIELDS(X)                                                                                  \
  X(hidden) X(intermediate) X(num_experts) X(top_k) X(router) X(num_ranks) X(capacity) X(dispatch_format)     \
  X(fp8_ue8m0) X(nvfp4_global_scale) X(weight_format) X(combine_format) X(intermediate_quant) X(dispatcher) \
  X(runner) X(timeout_ms) X(tuning)

#define EPMOE_NAME(f) #f ", "

// Applies keyword arguments to a freshly built struct; `names` lists the fields for the error.
template <class T, class Setter>
void apply_kwargs(T& obj, const nb::kwargs& kw, const char* owner, const char* names, Setter&& set) {
  for (auto [k, v] : kw) {
    const std::string key = nb::cast<std::string>(k);
    if (!set(obj, key, v))
      throw UsageError(std::string(owner) + "(" + key + "=...): no such field; fields are " + names);
  }
}

// Nested structs (router, tuning) are returned by reference, so that cfg.router.n_group = 4
// changes cfg and not a copy.
template <class C, class T>
void field(nb::class_<C>& cls, const char* owner, const char* name, T C::*member) {
  auto set = [owner, name, member](C& c, nb::handle v) { c.*member = field_value<T>(v, owner, name); };
  if constexpr (std::is_class_v<T> && !std::is_same_v<T, std::string>)
    cls.def_prop_rw(name, [member](C& c) -> T& { return c.*member; }, set, nb::rv_policy::reference_internal);
  else
    cls.def_prop_rw(name, [member](const C& c) { return c.*member; }, set);
}

bool set_router(RouterConfig& r, const std::string& key, nb::handle v) {
#define X(f)                                                                        \
  if (key == #f) {                                                                  \
    r.f = field_value<decltype(RouterConfig::f)>(v, "RouterConfig", #f);            \
    return true;                                                                    \
  }
  EPMOE_ROUTER_FIELDS(X)
#undef X
  return false;
}

bool set_tuning(Tuning& t, const std::string& key, nb::handle v) {
#define X(f)                                                              \
  if (key == #f) {                                                        \
    t.f = field_value<decltype(Tuning::f)>(v, "Tuning", #f);              \
    return true;                                                          \
  }
  EPMOE_TUNING_FIELDS(X)
#undef X
  return false;
}

bool set_config(MoeConfig& c, const std::string& key, nb::handle v) {
  if (key == "placement") {
    c.placement = v.is_none() ? std::nullopt : std::optional<ExpertPlacement>(field_value<ExpertPlacement>(v, "MoeConfig", "placement"));
    return true;
  }
#define X(f)                                                              \
  if (key == #f) {                                                        \
    c.f = field_value<decltype(MoeConfig::f)>(v, "MoeConfig", #f);        \
    return true;                                                          \
  }
  EPMOE_CONFIG_FIELDS(X)
#undef X
  return false;
}

}  // namespace

void bind_config(nb::module_& m) {
  nb::enum_<ActFormat>(m, "ActFormat").value("bf16", ActFormat::bf16).value("fp8", ActFormat::fp8).value("nvfp4", ActFormat::nvfp4);
  nb::enum_<WeightFormat>(m, "WeightFormat")
      .value("bf16", WeightFormat::bf16)
      .value("fp8", WeightFormat::fp8)
      .value("nvfp4", WeightFormat::nvfp4);
  nb::enum_<RouterKind>(m, "RouterKind")
      .value("softmax_topk", RouterKind::softmax_topk)
      .value("sigmoid_grouped_topk", RouterKind::sigmoid_grouped_topk);
  nb::enum_<IntermediateQuant>(m, "IntermediateQuant",
                               "Re-quantization of silu(gate)*up before GEMM2: auto (fp8 for fp8 weights with "
                               "I % 16 == 0, else none), none or fp8.")
      .value("auto", IntermediateQuant::automatic)
      .value("none", IntermediateQuant::none)
      .value("fp8", IntermediateQuant::fp8);
  nb::enum_<RunnerEngine>(m, "RunnerEngine")
      .value("auto", RunnerEngine::automatic)
      .value("mma", RunnerEngine::mma)
      .value("cutlass", RunnerEngine::cutlass);
  nb::enum_<CombineMode>(m, "CombineMode").value("sm", CombineMode::sm).value("ce", CombineMode::ce);
  nb::enum_<FaultCheck>(m, "FaultCheck")
      .value("off", FaultCheck::off)
      .value("count", FaultCheck::count)
      .value("raise_", FaultCheck::raise);
  nb::enum_<CutlassSwap>(m, "CutlassSwap")
      .value("auto", CutlassSwap::automatic)
      .value("off", CutlassSwap::off)
      .value("on", CutlassSwap::on)
      .value("n64", CutlassSwap::n64)
      .value("n128", CutlassSwap::n128)
      .value("n192", CutlassSwap::n192)
      .value("byrows", CutlassSwap::byrows);

  nb::class_<ConfigIssue>(m, "ConfigIssue", "One problem found by validate(): field, value, message.")
      .def_ro("field", &ConfigIssue::field)
      .def_ro("value", &ConfigIssue::value)
      .def_ro("message", &ConfigIssue::message)
      .def("__repr__", [](const ConfigIssue& i) { return "ConfigIssue(" + i.field + "=" + i.value + ": " + i.message + ")"; });

  nb::class_<ExpertPlacement>(m, "ExpertPlacement", "Which rank holds which expert (contiguous or an explicit map).")
      .def_static("contiguous", &ExpertPlacement::contiguous, nb::arg("num_experts"), nb::arg("num_ranks"))
      .def_static("parse", &ExpertPlacement::parse, nb::arg("spec"), nb::arg("num_experts"), nb::arg("num_ranks"),
                  nb::arg("slots_per_rank"), "From the CLI's --placement syntax \"e:r.s[,r.s...];e:...\".")
      .def_prop_ro("num_experts", &ExpertPlacement::num_experts)
      .def_prop_ro("num_ranks", &ExpertPlacement::num_ranks)
      .def_prop_ro("slots_per_rank", &ExpertPlacement::slots_per_rank)
      .def("problems", &ExpertPlacement::problems);

  static constexpr const char* router_names = EPMOE_ROUTER_FIELDS(EPMOE_NAME);
  nb::class_<RouterConfig> router(m, "RouterConfig", "How tokens choose experts (keyword arguments: every field).");
  router.def("__init__", [](RouterConfig* r, nb::kwargs kw) {
    new (r) RouterConfig();
    apply_kwargs(*r, kw, "RouterConfig", router_names, set_router);
  });
#define X(f) field(router, "RouterConfig", #f, &RouterConfig::f);
  EPMOE_ROUTER_FIELDS(X)
#undef X

  static constexpr const char* tuning_names = EPMOE_TUNING_FIELDS(EPMOE_NAME);
  nb::class_<Tuning> tuning(m, "Tuning",
                            "How the backends run (engines, SMs, pipelines); defaults from the EPMOE_* environment.");
  tuning.def("__init__", [](Tuning* t, nb::kwargs kw) {
    new (t) Tuning(default_tuning());
    apply_kwargs(*t, kw, "Tuning", tuning_names, set_tuning);
  });
#define X(f) field(tuning, "Tuning", #f, &Tuning::f);
  EPMOE_TUNING_FIELDS(X)
#undef X
  tuning.def("validate", [](const Tuning& t) { return validate(t); })
      .def("__repr__", [](const Tuning& t) { return "Tuning:\n" + describe(t); });

  static constexpr const char* config_names = EPMOE_CONFIG_FIELDS(EPMOE_NAME) "placement";
  nb::class_<MoeConfig> cfg(m, "MoeConfig",
                            "One MoE layer's configuration (keyword arguments: every field). intermediate_quant "
                            "defaults to \"auto\": fp8 for fp8 weights with intermediate % 16 == 0, else none "
                            "(effective_intermediate_quant says which).");
  cfg.def("__init__", [](MoeConfig* c, nb::kwargs kw) {
    new (c) MoeConfig();
    apply_kwargs(*c, kw, "MoeConfig", config_names, set_config);
  });
#define X(f) field(cfg, "MoeConfig", #f, &MoeConfig::f);
  EPMOE_CONFIG_FIELDS(X)
#undef X
  cfg.def_prop_rw(
      "placement", [](const MoeConfig& c) { return c.placement; },
      [](MoeConfig& c, nb::handle v) { set_config(c, "placement", v); });
  cfg.def("validate", [](const MoeConfig& c) { return validate(c); }, "Every issue (field, value, message); empty when valid.")
      .def("validate_or_raise", [](const MoeConfig& c) { validate_or_throw(c); }, "Raises UsageError listing every issue.")
      .def("describe", [](const MoeConfig& c) { return describe(c); })
      .def("fingerprint", [](const MoeConfig& c) { return config_fingerprint(c); })
      .def_prop_ro("experts_per_rank", &MoeConfig::experts_per_rank)
      .def_prop_ro("effective_intermediate_quant", &MoeConfig::effective_intermediate_quant,
                   "intermediate_quant with auto resolved: fp8 for fp8 weights with I % 16 == 0, else none.")
      .def("copy", [](const MoeConfig& c) { return MoeConfig(c); })
      .def("__repr__", [](const MoeConfig& c) { return "MoeConfig:\n" + describe(c); });

  nb::class_<ModelPreset>(m, "ModelPreset")
      .def_ro("name", &ModelPreset::name)
      .def_prop_ro("config", [](const ModelPreset& p) { return p.config; })
      .def_ro("num_layers", &ModelPreset::num_layers);
  m.def("presets", [] {
    std::vector<std::string> names;
    for (const auto& p : presets()) names.push_back(p.name);
    return names;
  }, "Names of the model presets.");
  m.def("preset", [](const std::string& name) { return preset(name); }, nb::arg("name"),
        "A model preset (public shapes, router, formats); UsageError lists the names when unknown.");
  m.def("validate", [](const MoeConfig& c) { return validate(c); }, nb::arg("config"));
  m.def("describe", [](const MoeConfig& c) { return describe(c); }, nb::arg("config"));
  m.def("default_tuning", [] { return default_tuning(); }, "The defaults: built-in values and EPMOE_* variables.");
  m.def("environment_issues", [] { return environment_issues(); }, "Malformed EPMOE_* variables.");
  m.def("legal_pairs", [] { return Registry::global().describe_pairs(); },
        "Every legal dispatcher+runner pair of this build with its formats.");
}

}  // namespace epmoe::py
