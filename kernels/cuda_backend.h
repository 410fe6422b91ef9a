// The CUDA backend: kvlens::Backend on one GPU (cuBLAS GEMMs, plain kernels for the other ops).
// Plain C++ header (no CUDA includes), so the app, the CLI and the tests can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend/backend.h"

namespace kvlens {

// True when the CUDA runtime finds a driver and at least one GPU. Never throws, never aborts.
bool cuda_device_available();

// GPUs the CUDA runtime sees (0 where it finds none), and GPU `device`'s total memory in bytes
// (throws kvlens::Error for no such device).
int cuda_device_count();
int64_t cuda_device_memory_bytes(int device);

// A backend on GPU `device`. Throws kvlens::Error when there is no such device or CUDA fails.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// A tensor-parallel group: rank r on GPU devices[r], the ranks' all-reduces through NCCL
// (kernels/nccl_group.h; loaded now, an error naming what was tried when it is missing). One
// device: a plain backend. A device listed twice (0,0: NCCL refuses ranks that share a GPU) makes
// a group whose all-reduce goes through host memory, unrecorded: slow, a check of the split on
// one GPU. Throws kvlens::Error for a device that does not exist.
std::vector<std::unique_ptr<Backend>> make_cuda_backend_group(std::span<const int> devices);

}  // namespace kvlens
