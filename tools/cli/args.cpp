#include "args.h"

#include <cstdlib>
#include <sstream>

#include "epmoe/error.h"

namespace epmoe::cli {

void Flags::add(const std::string& name, const std::string& value_name, const std::string& help) {
  specs_.push_back(Spec{name, value_name, help});
}

const Flags::Spec* Flags::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

void Flags::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0)
      throw UsageError("unexpected argument '" + a + "'; flags start with -- (see epmoe " + command_ + " --help)");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Spec* s = find(name);
    if (!s) {
      std::string known;
      for (const auto& sp : specs_) known += (known.empty() ? "--" : ", --") + sp.name;
      throw UsageError("unknown flag --" + name + " for 'epmoe " + command_ + "'; known flags: " + known);
    }
    if (!has_value) {
      if (s->value_name.empty()) {
        value = "true";
      } else {
        if (i + 1 >= args.size())
          throw UsageError("flag --" + name + " needs a value (" + s->value_name + ")");
        value = args[++i];
      }
    }
    values_[name] = value;
  }
}

const std::string& Flags::get(const std::string& name) const { return values_.at(name); }

bool Flags::get_bool(const std::string& name, bool fallback) const {
  if (!has(name)) return fallback;
  const std::string& v = get(name);
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  throw UsageError("--" + name + "=" + v + " is not a boolean; use --" + name + "=true or --" + name + "=false");
}

int Flags::get_int(const std::string& name, int fallback) const {
  if (!has(name)) return fallback;
  const std::string& v = get(name);
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < -(1L << 30) || x > (1L << 30))
    throw UsageError("--" + name + "=" + v + " is not an integer");
  return int(x);
}

double Flags::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string& v = get(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw UsageError("--" + name + "=" + v + " is not a number");
  return x;
}

std::string Flags::help() const {
  std::ostringstream os;
  for (const auto& s : specs_) {
    std::string lhs = "--" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    if (lhs.size() < 26) lhs.resize(26, ' ');
    os << "  " << lhs << " " << s.help << "\n";
  }
  return os.str();
}

std::vector<long long> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<long long> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0')
      throw UsageError("--" + flag + "=" + text + ": '" + item + "' is not an integer; give a comma-separated list");
    out.push_back(v);
  }
  if (out.empty()) throw UsageError("--" + flag + " is empty; give a comma-separated list of integers");
  return out;
}

}  // namespace epmoe::cli
