// Typed, described policy parameters: each policy declares ParamSpecs; the CLI (--policy-arg
// key=value) and the app (one control per spec) resolve user values against them, so every
// parameter has one name, one type, one range and one description everywhere.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace kvlens {

enum class ParamType { Int, Float, Bool, Choice };

const char* param_type_name(ParamType type);

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::Int;
  std::string description;
  std::string default_value;                              // textual, parsed like a user value
  double min = -std::numeric_limits<double>::infinity();  // Int and Float: inclusive bounds
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // Choice only
};

// Resolved values of every spec (defaults filled in), each checked against its spec.
class ParamValues {
 public:
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_choice(const std::string& name) const;
  // "name=value" pairs in spec order, for reports and traces.
  std::vector<std::string> describe() const;

 private:
  friend ParamValues resolve_params(const std::vector<ParamSpec>&, const std::vector<std::string>&,
                                    const std::string&);
  const std::string& raw(const std::string& name, ParamType expected) const;
  std::vector<ParamSpec> specs_;
  std::map<std::string, std::string> values_;  // canonical text of each value
};

// Resolves "key=value" items against specs. Throws kvlens::Error naming `owner` (e.g.
// "policy h2o"), the key and the expectation for: a malformed item, an unknown key, a key given
// twice, a value of the wrong type, out of range or not among the choices.
ParamValues resolve_params(const std::vector<ParamSpec>& specs,
                           const std::vector<std::string>& key_values, const std::string& owner);

}  // namespace kvlens
