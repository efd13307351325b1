// Format names and parsers (the CLI's --dispatch-format / --weight-format flags use them).
#include "epmoe/format.h"

#include <cctype>
#include <string>

namespace epmoe {

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

const char* format_name(ActFormat f) {
  switch (f) {
    case ActFormat::bf16: return "bf16";
    case ActFormat::fp8: return "fp8";
    case ActFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::fp8: return "fp8";
    case WeightFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

std::optional<ActFormat> parse_act_format(std::string_view s) {
  const std::string l = lower(s);
  if (l == "bf16") return ActFormat::bf16;
  if (l == "fp8") return ActFormat::fp8;
  if (l == "nvfp4") return ActFormat::nvfp4;
  return std::nullopt;
}

std::optional<WeightFormat> parse_weight_format(std::string_view s) {
  const std::string l = lower(s);
  if (l == "bf16") return WeightFormat::bf16;
  if (l == "fp8") return WeightFormat::fp8;
  if (l == "nvfp4") return WeightFormat::nvfp4;
  return std::nullopt;
}

}  // namespace epmoe
