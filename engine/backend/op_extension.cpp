// The registry of op extension factories and each backend's cache of instances (op_extension.h,
// Backend::extension in backend.h).
#include "engine/backend/op_extension.h"

#include <map>
#include <mutex>
#include <utility>

#include "engine/backend/backend.h"
#include "engine/common/error.h"

namespace kvlens {

namespace {

struct Registry {
  std::mutex mutex;
  // (extension, backend) -> factory
  std::map<std::pair<std::string, std::string>, OpExtensionFactory, std::less<>> factories;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_op_extension(std::string_view extension, std::string_view backend,
                           OpExtensionFactory factory) {
  if (extension.empty() || backend.empty() || !factory)
    throw Error("backend", "register_op_extension",
                "an extension name, a backend name and a factory",
                "'" + std::string(extension) + "' for '" + std::string(backend) + "'");
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[{std::string(extension), std::string(backend)}] = std::move(factory);
}

bool has_op_extension(std::string_view extension, std::string_view backend) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.factories.count({std::string(extension), std::string(backend)}) != 0;
}

std::vector<std::string> op_extension_backends(std::string_view extension) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [key, factory] : r.factories)
    if (key.first == extension) names.push_back(key.second);
  return names;
}

// One backend object's instances, by extension name.
struct Backend::ExtensionCache {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<OpExtension>, std::less<>> instances;
};

Backend::Backend() : extensions_(std::make_unique<ExtensionCache>()) {}

Backend::~Backend() = default;

OpExtension& Backend::extension_named(std::string_view extension) {
  const std::lock_guard<std::mutex> lock(extensions_->mutex);
  auto found = extensions_->instances.find(extension);
  if (found != extensions_->instances.end()) return *found->second;
  const std::string backend = name();
  OpExtensionFactory factory;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> registry_lock(r.mutex);
    auto it = r.factories.find(std::pair<std::string, std::string>(extension, backend));
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory)
    throw Error("backend", "op extension '" + std::string(extension) + "'",
                "an implementation for the '" + backend + "' backend (none is registered)");
  std::unique_ptr<OpExtension> made = factory(*this);
  if (!made)
    throw Error("backend", "op extension '" + std::string(extension) + "'",
                "an instance from the '" + backend + "' backend's factory", "none");
  OpExtension& instance = *made;
  extensions_->instances.emplace(std::string(extension), std::move(made));
  return instance;
}

void Backend::wrong_extension_type(std::string_view extension) const {
  throw Error("backend", "op extension '" + std::string(extension) + "'",
              "an instance of its interface from the '" + name() + "' backend's factory",
              "another type");
}

}  // namespace kvlens
