// A recording ready to step, as `kvlens-cli trace` and the desktop app open one: over a loaded
// model, the text chosen (a prompt or a co-reference sample with its answer marked), the backend
// made and a TraceRecorder of the runs over it. Members are declared in destruction-safe order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/session/common_options.h"
#include "engine/model/model.h"
#include "engine/session/trace_recorder.h"

namespace kvlens::session {

struct RecordingSource {
  std::string prompt;        // used when coref_index < 0
  int64_t coref_index = -1;  // a co-reference sample instead of the prompt
  uint64_t seed = 0;
  bool hard = false;
  std::string pools_path;  // empty: the bundled pools
  int64_t max_tokens = 0;  // prompt: keep the first N tokens (0: all)
};

struct Recording {
  std::shared_ptr<const Model> model;
  // One backend, or a tensor-parallel group (CommonOptions::tensor_parallel: rank r's backend).
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<int> devices;  // the GPU (or CPU rank) of each backend
  // The model on the one backend; null under tensor parallelism, where `shards` hold it.
  std::shared_ptr<const BackendModel> resident;
  std::vector<std::shared_ptr<const BackendModel>> shards;
  std::unique_ptr<TraceRecorder> recorder;
};

// What each GPU of a recording holds, for a status line: "cpu", "cuda 0", or under tensor
// parallelism "cuda 0,1: 16 of 32 heads, 8 of 16 KV heads each" ("cpu ranks 0,1: ..." on the CPU).
std::string placement_text(const Recording& recording);

// Throws kvlens::Error naming the flag or file at fault (`prompt_flag` names the prompt's source
// in messages: "--prompt" for the CLI, "prompt" for the app).
Recording open_recording(const CommonOptions& common, std::shared_ptr<const Model> model,
                         const RecordingSource& source, const std::vector<PolicyConfig>& runs,
                         const TraceOptions& options, const std::string& prompt_flag = "--prompt");

}  // namespace kvlens::session
