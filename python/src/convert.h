// Python values -> epmoe field types, with UsageErrors that name the field, the value and what it
// accepts. Enums take their member or its name ("fp8"), so keyword arguments read naturally.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "epmoe/config.h"
#include "epmoe/error.h"
#include "epmoe/options.h"

namespace epmoe::py {

namespace nb = nanobind;

inline std::string py_repr(nb::handle v) { return nb::cast<std::string>(nb::repr(v)); }

template <class E>
struct EnumNames;
template <>
struct EnumNames<ActFormat> {
  static constexpr const char* list = "bf16, fp8, nvfp4";
  static bool parse(const std::string& s, ActFormat& out) {
    auto f = parse_act_format(s);
    if (f) out = *f;
    return f.has_value();
  }
};
template <>
struct EnumNames<WeightFormat> {
  static constexpr const char* list = "bf16, fp8, nvfp4";
  static bool parse(const std::string& s, WeightFormat& out) {
    auto f = parse_weight_format(s);
    if (f) out = *f;
    return f.has_value();
  }
};
template <>
struct EnumNames<RouterKind> {
  static constexpr const char* list = "softmax_topk, sigmoid_grouped_topk";
  static bool parse(const std::string& s, RouterKind& out) {
    if (s == "softmax_topk" || s == "softmax") out = RouterKind::softmax_topk;
    else if (s == "sigmoid_grouped_topk" || s == "sigmoid") out = RouterKind::sigmoid_grouped_topk;
    else return false;
    return true;
  }
};
template <>
struct EnumNames<IntermediateQuant> {
  static constexpr const char* list = "auto, none, fp8";
  static bool parse(const std::string& s, IntermediateQuant& out) { return parse_intermediate_quant(s, out); }
};
template <>
struct EnumNames<RunnerEngine> {
  static constexpr const char* list = "auto, mma, cutlass";
  static bool parse(const std::string& s, RunnerEngine& out) { return parse_engine(s, out); }
};
template <>
struct EnumNames<CombineMode> {
  static constexpr const char* list = "sm, ce";
  static bool parse(const std::string& s, CombineMode& out) { return parse_combine_mode(s, out); }
};
template <>
struct EnumNames<FaultCheck> {
  static constexpr const char* list = "off, count, raise";
  static bool parse(const std::string& s, FaultCheck& out) { return parse_fault_check(s, out); }
};

template <>
struct EnumNames<CutlassSwap> {
  static constexpr const char* list = "auto, off (0), on (1), 64, 128, 192";
  static bool parse(const std::string& s, CutlassSwap& out) { return parse_cutlass_swap(s, out); }
};

template <class T>
T field_value(nb::handle v, const char* owner, const char* field) {
  auto fail = [&](const std::string& want) -> T {
    throw UsageError(std::string(owner) + "." + field + "=" + py_repr(v) + " is not " + want);
  };
  if constexpr (std::is_enum_v<T>) {
    T out{};
    if (nb::isinstance<T>(v)) return nb::cast<T>(v);
    if (nb::isinstance<nb::str>(v) && EnumNames<T>::parse(nb::cast<std::string>(v), out)) return out;
    return fail(std::string("one of ") + EnumNames<T>::list);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!nb::isinstance<nb::bool_>(v) && !nb::isinstance<nb::int_>(v)) return fail("a bool");
    return nb::cast<bool>(v);
  } else if constexpr (std::is_integral_v<T>) {
    if (nb::isinstance<nb::bool_>(v) || !nb::isinstance<nb::int_>(v)) return fail("an int");
    const long long x = nb::cast<long long>(v);
    if (x < INT32_MIN || x > INT32_MAX) return fail("an int in the 32-bit range");
    return T(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!nb::isinstance<nb::float_>(v) && !nb::isinstance<nb::int_>(v)) return fail("a number");
    return T(nb::cast<double>(v));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!nb::isinstance<nb::str>(v)) return fail("a str");
    return nb::cast<std::string>(v);
  } else {
    if (!nb::isinstance<T>(v)) return fail(std::string("a ") + nb::type_name(nb::type<T>()).c_str());
    return nb::cast<T>(v);
  }
}

}  // namespace epmoe::py
