// Parsing and checking of policy parameter values against their specs.
#include "engine/policy/policy_params.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "engine/common/error.h"

namespace kvlens {
namespace {

std::string range_text(const ParamSpec& spec) {
  std::ostringstream out;
  out << (spec.type == ParamType::Int ? "an integer" : "a number");
  const bool has_min = std::isfinite(spec.min), has_max = std::isfinite(spec.max);
  if (has_min && has_max) {
    out << " in [" << spec.min << ", " << spec.max << "]";
  } else if (has_min) {
    out << " >= " << spec.min;
  } else if (has_max) {
    out << " <= " << spec.max;
  }
  return out.str();
}

// The value's canonical text, or throws.
std::string canonical(const ParamSpec& spec, const std::string& value, const std::string& owner) {
  const std::string field = spec.name;
  switch (spec.type) {
    case ParamType::Int: {
      char* end = nullptr;
      errno = 0;
      const long long parsed = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || end != value.c_str() + value.size() || errno == ERANGE ||
          double(parsed) < spec.min || double(parsed) > spec.max) {
        throw Error(owner, field, range_text(spec), "'" + value + "'");
      }
      return std::to_string(parsed);
    }
    case ParamType::Float: {
      char* end = nullptr;
      const double parsed = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(parsed) ||
          parsed < spec.min || parsed > spec.max) {
        throw Error(owner, field, range_text(spec), "'" + value + "'");
      }
      std::ostringstream out;
      out.precision(17);
      out << parsed;
      return out.str();
    }
    case ParamType::Bool:
      if (value == "true" || value == "1" || value == "on") return "true";
      if (value == "false" || value == "0" || value == "off") return "false";
      throw Error(owner, field, "true or false", "'" + value + "'");
    case ParamType::Choice: {
      if (std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end()) {
        return value;
      }
      std::string list;
      for (const std::string& choice : spec.choices) list += (list.empty() ? "" : ", ") + choice;
      throw Error(owner, field, "one of " + list, "'" + value + "'");
    }
  }
  throw Error(owner, field, "a known parameter type");
}

}  // namespace

const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::Int:
      return "int";
    case ParamType::Float:
      return "float";
    case ParamType::Bool:
      return "bool";
    case ParamType::Choice:
      return "choice";
  }
  return "?";
}

ParamValues resolve_params(const std::vector<ParamSpec>& specs,
                           const std::vector<std::string>& key_values, const std::string& owner) {
  ParamValues result;
  result.specs_ = specs;
  std::map<std::string, std::string> given;
  for (const std::string& item : key_values) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(owner, "parameter", "key=value", "'" + item + "'");
    }
    const std::string key = item.substr(0, eq);
    const auto spec =
        std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == key; });
    if (spec == specs.end()) {
      std::string names;
      for (const ParamSpec& s : specs) names += (names.empty() ? "" : ", ") + s.name;
      throw Error(owner, key, "a parameter of this policy (" + names + ")", "unknown parameter");
    }
    if (!given.emplace(key, item.substr(eq + 1)).second) {
      throw Error(owner, key, "the parameter given once", "given twice");
    }
  }
  for (const ParamSpec& spec : specs) {
    const auto it = given.find(spec.name);
    result.values_[spec.name] =
        canonical(spec, it == given.end() ? spec.default_value : it->second, owner);
  }
  return result;
}

const std::string& ParamValues::raw(const std::string& name, ParamType expected) const {
  const auto spec = std::find_if(specs_.begin(), specs_.end(),
                                 [&](const ParamSpec& s) { return s.name == name; });
  if (spec == specs_.end() || spec->type != expected) {
    throw Error("policy parameters", name,
                std::string("a declared ") + param_type_name(expected) + " parameter");
  }
  return values_.at(name);
}

int64_t ParamValues::get_int(const std::string& name) const {
  return std::stoll(raw(name, ParamType::Int));
}
double ParamValues::get_float(const std::string& name) const {
  return std::stod(raw(name, ParamType::Float));
}
bool ParamValues::get_bool(const std::string& name) const {
  return raw(name, ParamType::Bool) == "true";
}
const std::string& ParamValues::get_choice(const std::string& name) const {
  return raw(name, ParamType::Choice);
}

std::vector<std::string> ParamValues::describe() const {
  std::vector<std::string> out;
  for (const ParamSpec& spec : specs_) out.push_back(spec.name + "=" + values_.at(spec.name));
  return out;
}

}  // namespace kvlens
