// A CUPTI injection library: loaded by the CUDA driver where CUDA_INJECTION64_PATH names it, it
// records every kernel (start, end, stream, grid) and runtime API call (start, end, thread) of the
// process and writes them at exit to $KVLENS_CUDA_TRACE as CSV rows
//   K,start_ns,end_ns,stream,correlation,blocks,kernel   (the kernel's mangled name)
//   R,start_ns,end_ns,thread,correlation,0,call           (a runtime API call, e.g.
//   cudaLaunchKernel)
// for tools/cuda_timeline.py. Built and used by tools/cuda_timeline.sh (a timeline where no
// Nsight Systems is installed: the GPU machine has ncu only).
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

FILE* out = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(16) << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      fprintf(out, "K,%llu,%llu,%u,%u,%llu,%s\n", static_cast<unsigned long long>(k->start),
              static_cast<unsigned long long>(k->end), k->streamId, k->correlationId,
              static_cast<unsigned long long>(k->gridX) * k->gridY * k->gridZ, k->name);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* call = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const char* name = "?";
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, call->cbid, &name);
      fprintf(out, "R,%llu,%llu,%u,%u,0,%s\n", static_cast<unsigned long long>(call->start),
              static_cast<unsigned long long>(call->end), call->threadId, call->correlationId,
              name);
    }
  }
  free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (out != nullptr) fclose(out);
  out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = getenv("KVLENS_CUDA_TRACE");
  out = fopen(path != nullptr ? path : "kvlens_cuda_trace.csv", "w");
  if (out == nullptr) return 0;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
    fprintf(stderr, "cuda_trace: CUPTI refused the activity records\n");
    return 0;
  }
  atexit(flush_at_exit);
  return 1;
}
