// Per-policy op extensions of a Backend. The Backend interface (backend.h) holds the core ops
// every policy and the decode loop share; an op that serves one policy lives beside that policy
// as an extension: an interface deriving from OpExtension (engine/policy/quest_ops.h, say) with
// an implementation per backend, registered here under (extension name, backend name). A policy
// fetches its backend's instance once (Backend::extension<T>()), made by the registered factory
// on first use and kept by that backend object until it goes.
//
// Registration is explicit (static initialisers of a static library are dropped by the linker):
// the CPU implementations register themselves the first time a policy asks for its ops
// (quest_ops(backend), ...), the CUDA ones through register_cuda_policy_ops()
// (kernels/policy/cuda_policy_ops.h), which whoever makes a CUDA backend calls.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvlens {

class Backend;

// The base of every extension interface. An extension may keep references to its backend (it
// never outlives it) but must not call the backend from its destructor: extensions go while the
// backend object is being destroyed.
class OpExtension {
 public:
  virtual ~OpExtension() = default;
};

// Makes `backend`'s instance of one extension (the backend's name() is the one registered). It
// runs while that backend's cache of instances is locked: it must not ask the backend for an
// extension itself.
using OpExtensionFactory = std::function<std::unique_ptr<OpExtension>(Backend& backend)>;

// Registers (or replaces) the factory of `extension` for backends named `backend`. Thread-safe.
// A backend that already made its instance keeps it.
void register_op_extension(std::string_view extension, std::string_view backend,
                           OpExtensionFactory factory);
// Whether a factory of `extension` is registered for `backend`.
bool has_op_extension(std::string_view extension, std::string_view backend);
// The backend names `extension` is registered for, sorted.
std::vector<std::string> op_extension_backends(std::string_view extension);

}  // namespace kvlens
