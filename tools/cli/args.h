// Flag parsing for the `epmoe` commands: `--name value`, `--name=value`, and switches (`--ue8m0`,
// `--ue8m0=false`). Unknown flags are an error that lists the flags the command knows.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace epmoe::cli {

class Flags {
 public:
  explicit Flags(std::string command) : command_(std::move(command)) {}
  // value_name empty: a switch (true when given, or =true/false/1/0).
  void add(const std::string& name, const std::string& value_name, const std::string& help);
  // Throws UsageError for unknown flags, missing values and stray arguments.
  void parse(const std::vector<std::string>& args);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  const std::string& get(const std::string& name) const;
  bool get_bool(const std::string& name, bool fallback) const;
  int get_int(const std::string& name, int fallback) const;
  double get_double(const std::string& name, double fallback) const;

  std::string help() const;  // one line per flag

 private:
  struct Spec {
    std::string name, value_name, help;
  };
  const Spec* find(const std::string& name) const;

  std::string command_;
  std::vector<Spec> specs_;
  std::map<std::string, std::string> values_;
};

// Parses "37,0,64,0" into numbers; throws UsageError naming `flag`.
std::vector<long long> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace epmoe::cli
