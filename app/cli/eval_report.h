// What `kvlens-cli eval` and `kvlens-cli merge` share: the per-run results written as the table,
// the JSON result file, the CSV and the per-sample lines (cmd_eval.cpp), so a merged sharded run
// writes exactly what one unsharded run writes. rows: one per run, from cmd_eval's row heads.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/session/common_options.h"
#include "app/session/output_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/perplexity.h"

namespace kvlens::cli {

struct EvalReport {
  std::string task;   // coref | ppl
  std::string model;  // --model as given
  bool hit_rate = false;
  std::vector<nlohmann::ordered_json> rows;  // row heads (policy, sparsity, run, ...), run order
  std::vector<CorefEvalResult> coref;        // task coref: one per run
  std::vector<PerplexityResult> perplexity;  // task ppl: one per run
  nlohmann::ordered_json match;              // --match effective: how it was matched (else null)
  std::vector<std::string> warnings;         // nominal budgets capped or not token shares
};

// Fills the rows, prints the table on stdout and writes the files that are given (each
// committed here); per_sample only for coref.
void write_eval_report(EvalReport& report, session::AtomicOutputFile* json,
                       session::AtomicOutputFile* csv, session::AtomicOutputFile* per_sample);

// What a model needs on GPUs of `device_bytes` each: its weights at the chosen --dtype, plus
// `kv_bytes` of caches, in whole GPUs (gpus_needed). eval runs one whole copy per GPU, so it
// needs gpus == 1; info prints it for the current device.
struct GpuNeed {
  int64_t device_bytes = 0;
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t gpus = 1;
  std::string dtype;  // the weights' dtype on the GPU: as stored (auto) or --dtype
};
GpuNeed gpu_need(const session::CommonOptions& common, const Model& model, int64_t kv_bytes,
                 int64_t device_bytes);

}  // namespace kvlens::cli
