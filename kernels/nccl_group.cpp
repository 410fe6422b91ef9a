// NcclGroup: NCCL's C API through dlopen. The few declarations below follow nccl.h of NCCL 2.x,
// whose enum values and signatures are stable across 2.x (ncclFloat32 = 7, ncclBfloat16 = 9,
// ncclSum = 0), so no NCCL header is needed to build.
#include "kernels/nccl_group.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "engine/common/error.h"

namespace kvlens::cuda {

struct NcclGroup::Library {
  using Comm = void*;
  int (*comm_init_all)(Comm* comms, int ndev, const int* devlist) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int dtype, int op, Comm comm,
                    cudaStream_t stream) = nullptr;
  int (*comm_destroy)(Comm comm) = nullptr;
  int (*comm_abort)(Comm comm) = nullptr;
  const char* (*error_string)(int result) = nullptr;
  int (*get_version)(int* version) = nullptr;
  std::string path;
};

namespace {

constexpr int kNcclFloat32 = 7;
constexpr int kNcclBfloat16 = 9;
constexpr int kNcclSum = 0;

// The library, loaded once: KVLENS_NCCL_LIBRARY if set, else libnccl.so.2 / libnccl.so from the
// loader's path (LD_LIBRARY_PATH, the CUDA toolkit's lib folder when it is on it).
const NcclGroup::Library& nccl_library() {
  static std::once_flag once;
  static NcclGroup::Library library;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (const char* chosen = std::getenv("KVLENS_NCCL_LIBRARY"); chosen && *chosen)
      names.push_back(chosen);
    names.push_back("libnccl.so.2");
    names.push_back("libnccl.so");
    void* handle = nullptr;
    std::string tried;
    for (const std::string& name : names) {
      handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      tried += (tried.empty() ? "" : ", ") + name;
      if (handle) {
        library.path = name;
        break;
      }
    }
    if (!handle) {
      failure = "NCCL (tried " + tried + "; set KVLENS_NCCL_LIBRARY to its path)";
      return;
    }
    auto symbol = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn) failure = library.path + " without " + name;
    };
    symbol(library.comm_init_all, "ncclCommInitAll");
    symbol(library.all_reduce, "ncclAllReduce");
    symbol(library.comm_destroy, "ncclCommDestroy");
    symbol(library.comm_abort, "ncclCommAbort");
    symbol(library.error_string, "ncclGetErrorString");
    symbol(library.get_version, "ncclGetVersion");
  });
  if (!failure.empty()) throw Error("tensor parallel", "NCCL", "the NCCL library", failure);
  return library;
}

void check_nccl(const NcclGroup::Library& library, int result, const char* call) {
  if (result != 0) {
    throw Error("tensor parallel", call, "success",
                std::string(library.error_string ? library.error_string(result) : "error ") +
                    " (NCCL code " + std::to_string(result) + ")");
  }
}

}  // namespace

std::shared_ptr<NcclGroup> NcclGroup::create(std::span<const int> devices) {
  // NVLink multicast can put a host's shared GPUs out of service: off unless the user asks.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  const Library& library = nccl_library();
  std::shared_ptr<NcclGroup> group(new NcclGroup());
  group->library_ = &library;
  group->comms_.assign(devices.size(), nullptr);
  check_nccl(library,
             library.comm_init_all(group->comms_.data(), int(devices.size()), devices.data()),
             "ncclCommInitAll");
  return group;
}

NcclGroup::~NcclGroup() {
  if (!library_) return;
  for (void* comm : comms_) {
    if (comm) aborted_ ? library_->comm_abort(comm) : library_->comm_destroy(comm);
  }
}

void NcclGroup::all_reduce_sum(int rank, void* data, size_t count, DType dtype,
                               cudaStream_t stream) {
  if (aborted_) {
    throw Error("tensor parallel", "all_reduce_sum", "every rank alive", "a rank failed");
  }
  if (dtype != DType::F32 && dtype != DType::BF16) {
    throw Error("tensor parallel", "all_reduce_sum", "an F32 or BF16 tensor",
                std::string(dtype_name(dtype)));
  }
  check_nccl(
      *library_,
      library_->all_reduce(data, data, count, dtype == DType::F32 ? kNcclFloat32 : kNcclBfloat16,
                           kNcclSum, comms_.at(size_t(rank)), stream),
      "ncclAllReduce");
}

void NcclGroup::abort() {
  std::lock_guard lock(abort_mutex_);
  if (aborted_) return;
  aborted_ = true;
  for (void*& comm : comms_) {
    if (comm) library_->comm_abort(comm);
    comm = nullptr;
  }
}

}  // namespace kvlens::cuda
