// The `real` label: SmolLM2-135M-Instruct (fetched by tools/get_model.sh, never committed) against
// transformers' references in tests/fixtures/real_smollm2/reference.json
// (tools/make_real_fixtures.py: 4 prompts x 64 tokens, per-position argmax / top-1 / log-sum-exp,
// last-position top 50, 32 greedy tokens). Two forms of the same weights: the F32 Hugging Face
// folder transformers saved from the GGUF, and the .gguf file itself. A test whose model is absent
// exits 4 (ctest: Skipped).
//
// Tolerance: |kvlens - transformers| <= 1e-3 * logit_scale (max(1, max |logit|), about 30 here),
// for F32 compute of the dequantized weights on both sides: the gap is summation order only
// (about 6e-5 measured for the F32 folder). A position's argmax must match wherever transformers'
// top-2 margin exceeds twice that bound (inside it either is right); greedy tokens always.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "engine/trace/trace.h"
#include "tests/real/real_model_paths.h"
#include "tests/support/llama_cpp_ids.h"
#include "tests/support/test_paths.h"

namespace {

using json = nlohmann::json;
using kvlens::Backend;
using kvlens::BackendModel;
using kvlens::DecoderSession;
using kvlens::DeviceTensor;
namespace real = kvlens::test::real;

constexpr double kLogitRel = 1e-3;  // times the logit scale: the bound
constexpr int kTraceSteps = 16;

const json& reference() {
  static const json doc = [] {
    std::ifstream in(kvlens::test::source_path("tests/fixtures/real_smollm2/reference.json"));
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return doc;
}

double tolerance() {
  return kLogitRel * std::max(1.0, reference().at("logit_scale").get<double>());
}

// The model under test, in one of its two forms; `skip_reason` set (and nothing loaded) when
// this machine cannot run that form.
struct RealModel {
  std::string path;
  std::string skip_reason;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const BackendModel> model;
};

// Weights widened to F32 at upload (the bound above is for F32 compute), F32 KV caches.
void load_into(RealModel& m) {
  m.backend = kvlens::make_cpu_backend();
  m.model = kvlens::upload_model(kvlens::Model::load(m.path), *m.backend,
                                 kvlens::UploadOptions{.weight_dtype = kvlens::DType::F32});
}

const RealModel& f32_folder() {
  static RealModel m = [] {
    RealModel r;
    r.path = real::f32_folder_path();
    if (r.path.empty()) {
      r.skip_reason =
          "no F32 Hugging Face folder of the real model (" + real::f32_folder_hint() + ")";
    } else {
      load_into(r);
    }
    return r;
  }();
  return m;
}

const RealModel& gguf_file() {
  static RealModel m = [] {
    RealModel r;
    r.path = real::gguf_path();
    if (r.path.empty()) {
      r.skip_reason = "the real model is not fetched (" + real::gguf_hint() + ")";
      return r;
    }
    load_into(r);  // (a file that does not load fails the test)
    return r;
  }();
  return m;
}

// ctest reports exit code 4 as Skipped (SKIP_RETURN_CODE); bootstrap.sh --test repeats the
// "real test skipped: <why>" lines in its summary.
void skip_if_unavailable(const RealModel& m) {
  if (m.skip_reason.empty()) return;
  std::string why = m.skip_reason;
  while (!why.empty() && std::isspace(static_cast<unsigned char>(why.back()))) why.pop_back();
  std::printf("real test skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(4);
}

std::vector<int32_t> ids_of(const json& array) {
  std::vector<int32_t> ids;
  for (const json& v : array) ids.push_back(v.get<int32_t>());
  return ids;
}

// Every position's logits for `ids` fed in one forward call, [T][vocab].
std::vector<std::vector<float>> logits_for(const RealModel& m, const std::vector<int32_t>& ids) {
  DecoderSession session(m.model);
  const DeviceTensor& logits = session.forward(std::span<const int32_t>(ids));
  const int64_t vocab = m.model->config().vocab_size;
  REQUIRE(logits.shape == std::vector<int64_t>{int64_t(ids.size()), vocab});
  std::vector<float> host(size_t(logits.numel()));
  m.backend->to_host(logits, host.data(), host.size() * sizeof(float));
  std::vector<std::vector<float>> rows;
  for (size_t t = 0; t < ids.size(); ++t) {
    rows.emplace_back(host.begin() + std::ptrdiff_t(t * size_t(vocab)),
                      host.begin() + std::ptrdiff_t((t + 1) * size_t(vocab)));
  }
  return rows;
}

double log_sum_exp(const std::vector<float>& row) {
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float v : row) sum += std::exp(double(v) - top);
  return top + std::log(sum);
}

int32_t argmax_of(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// The largest gap between kvlens' logits and the reference's numbers for one prompt, and
// every argmax that differs outside the near-tie band.
struct Comparison {
  double max_gap = 0.0;
  std::string where;
  std::vector<std::string> argmax_mismatches;
  void add(double ours, double theirs, const std::string& what) {
    const double gap = std::abs(ours - theirs);
    if (!(gap <= max_gap)) {  // NaN is recorded too
      max_gap = gap;
      where = what;
    }
  }
};

Comparison compare_prompt(const RealModel& m, const json& prompt) {
  const std::vector<int32_t> ids = ids_of(prompt.at("ids"));
  const std::vector<std::vector<float>> rows = logits_for(m, ids);
  Comparison c;
  const double tie_band = 2 * tolerance();
  for (size_t t = 0; t < rows.size(); ++t) {
    const int32_t want = prompt.at("argmax")[t].get<int32_t>();
    const std::string at = "position " + std::to_string(t);
    c.add(rows[t][size_t(want)], prompt.at("top1")[t].get<double>(), at + " top-1 logit");
    c.add(log_sum_exp(rows[t]), prompt.at("lse")[t].get<double>(), at + " log-sum-exp");
    const int32_t got = argmax_of(rows[t]);
    if (got != want && prompt.at("margin")[t].get<double>() > tie_band) {
      c.argmax_mismatches.push_back(at + ": argmax " + std::to_string(got) + ", transformers " +
                                    std::to_string(want));
    }
  }
  const json& last = prompt.at("last");
  const std::vector<float>& row = rows.back();
  for (size_t k = 0; k < last.at("top_ids").size(); ++k) {
    const size_t id = last.at("top_ids")[k].get<size_t>();
    c.add(row[id], last.at("top_logits")[k].get<double>(),
          "last position, id " + std::to_string(id));
  }
  double sum = 0.0, sum_sq = 0.0;
  for (float v : row) sum += v;
  const double mean = sum / double(row.size());
  for (float v : row) sum_sq += (v - mean) * (v - mean);
  c.add(mean, last.at("mean").get<double>(), "last position, mean over the vocabulary");
  c.add(std::sqrt(sum_sq / double(row.size())), last.at("std").get<double>(),
        "last position, std over the vocabulary");
  c.add(*std::min_element(row.begin(), row.end()), last.at("min").get<double>(),
        "last position, min over the vocabulary");
  c.add(*std::max_element(row.begin(), row.end()), last.at("max").get<double>(),
        "last position, max over the vocabulary");
  return c;
}

void check_logits(const RealModel& m) {
  for (const json& prompt : reference().at("prompts")) {
    const Comparison c = compare_prompt(m, prompt);
    INFO(m.path << ", prompt from " << prompt.at("source").get<std::string>() << ": max gap "
                << c.max_gap << " at " << c.where << " (bound " << tolerance() << ")");
    CHECK(c.max_gap <= tolerance());
    std::printf("%s: max logit gap %.3g at %s (bound %.3g)\n",
                prompt.at("source").get<std::string>().c_str(), c.max_gap, c.where.c_str(),
                tolerance());
    for (const std::string& mismatch : c.argmax_mismatches) FAIL_CHECK(mismatch);
  }
}

// 32 greedy tokens after the prompt, one token per forward (the decode path, not the prefill's),
// identical to transformers' (its smallest greedy margin, 0.013, is 200 times the F32 gap).
void check_greedy(const RealModel& m) {
  for (const json& prompt : reference().at("prompts")) {
    const std::vector<int32_t> want = ids_of(prompt.at("greedy"));
    DecoderSession session(m.model);
    const std::vector<int32_t> ids = ids_of(prompt.at("ids"));
    const DeviceTensor* logits = &session.forward(std::span<const int32_t>(ids));
    const int64_t vocab = m.model->config().vocab_size;
    std::vector<int32_t> got;
    for (size_t step = 0; step < want.size(); ++step) {
      std::vector<float> all(size_t(logits->numel()));
      m.backend->to_host(*logits, all.data(), all.size() * sizeof(float));
      const std::vector<float> row(all.end() - vocab, all.end());  // the last row of [n, vocab]
      got.push_back(argmax_of(row));
      if (got.back() != want[step]) {
        FAIL_CHECK(m.path << ", prompt from " << prompt.at("source").get<std::string>()
                          << ": greedy token " << step << " is " << got.back() << ", transformers' "
                          << want[step] << " (its margin "
                          << prompt.at("greedy_margin")[step].get<double>() << ")");
        break;
      }
      const int32_t next = got.back();
      logits = &session.forward(std::span<const int32_t>(&next, 1));
    }
    CHECK(got == want);
  }
}

// The files a policy reads beside the model, made for that model by a tools/ script. kvlens ships
// SmolLM2's in assets/predictors/smollm2-135m-instruct/, found for the .gguf by its general.name
// (engine/policy/model_files.h); an F32 folder converted from it has none beside it.
const std::vector<std::pair<std::string, std::string>>& per_model_files() {
  static const std::vector<std::pair<std::string, std::string>> files = {
      {"loki", "loki_pca.safetensors"},
      {"doublesparsity", "doublesparsity_channels.safetensors"},
      {"duoattention", "duo_gates.safetensors"},
      {"seerattention", "seer_gate.safetensors"}};
  return files;
}

// Every registered policy runs 16 steps of kvlens-cli trace in lockstep over the first prompt's
// text, at 50%, and every run's steps are recorded; those that need a predictor only where the
// model has one (the .gguf gets the bundled assets/predictors one). A policy whose per-model file
// is missing (where `ships_model_files` is false and none is beside the model) must instead fail
// alone with the one-line error that names the file and the tool that makes it. Only the CLI
// loads the model (`path`; "" when absent: skipped).
void check_policies_trace(const std::string& path, const std::string& absent_hint,
                          bool has_predictor, bool ships_model_files) {
  skip_if_unavailable(RealModel{.skip_reason = path.empty() ? absent_hint : ""});
  const std::filesystem::path folder = std::filesystem::is_directory(path)
                                           ? std::filesystem::path(path)
                                           : std::filesystem::path(path).parent_path();
  std::vector<std::string> ids;
  for (const kvlens::PolicyInfo& info : kvlens::policy_infos()) {
    if (!has_predictor && info.needs_predictor) continue;
    const auto needs = std::find_if(per_model_files().begin(), per_model_files().end(),
                                    [&](const auto& entry) { return entry.first == info.id; });
    if (needs != per_model_files().end() && !ships_model_files &&
        !std::filesystem::exists(folder / needs->second)) {
      INFO(info.id << " without " << needs->second);
      const kvlens::test::CommandResult alone = kvlens::test::run_command(
          kvlens::test::cli_path() + " trace --model '" + path +
          "' --dtype f32 --prompt 'a b c' --policies " + info.id + " --out '" +
          kvlens::test::make_temp_dir("real-missing") + "/x.kvtrace'");
      CHECK(alone.exit_code != 0);
      CHECK(alone.err.find(needs->second) != std::string::npos);
      CHECK(alone.err.find("tools/") != std::string::npos);
      CHECK(std::count(alone.err.begin(), alone.err.end(), '\n') <= 1);
      continue;
    }
    ids.push_back(info.id);
  }
  REQUIRE(ids.size() >= 2);
  std::string policies;
  for (const std::string& id : ids) policies += (policies.empty() ? "" : ",") + id;
  const std::string dir = kvlens::test::make_temp_dir("real-trace");
  const std::string text_file = dir + "/prompt.txt";
  std::ofstream(text_file) << reference().at("prompts")[0].at("text").get<std::string>();
  const std::string out = dir + "/run.kvtrace";
  // The prompt's first 8 tokens are prefilled densely, then 16 decode steps under each policy.
  const kvlens::test::CommandResult result = kvlens::test::run_command(
      kvlens::test::cli_path() + " trace --model '" + path + "' --dtype f32 --prompt \"$(cat '" +
      text_file + "')\" --max-tokens " + std::to_string(8 + kTraceSteps) +
      " --prefill 8 --policies " + policies + " --sparsity 0.5 --out '" + out + "'");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const kvlens::Trace trace = kvlens::load_trace(out);
  REQUIRE(trace.runs.size() == ids.size());
  for (size_t r = 0; r < ids.size(); ++r) CHECK(trace.runs[r].policy == ids[r]);
  CHECK(trace.model.vocab_size == reference().at("config").at("vocab_size").get<int64_t>());
  int64_t decode_steps = 0;
  for (const std::vector<kvlens::StepRecord>& step : trace.steps()) {
    REQUIRE(step.size() == ids.size());
    if (step.front().columns <= 8) continue;  // a prefill position
    ++decode_steps;
    for (size_t r = 0; r < step.size(); ++r) {
      INFO(ids[r] << " at " << step[r].columns << " cached tokens");
      CHECK(step[r].argmax >= 0);
      CHECK(step[r].argmax < trace.model.vocab_size);
    }
  }
  CHECK(decode_steps >= kTraceSteps - 1);
}

}  // namespace

TEST_CASE("the F32 folder transformers saved from the GGUF gives transformers' logits", "[real]") {
  skip_if_unavailable(f32_folder());
  check_logits(f32_folder());
}

TEST_CASE("the F32 folder's greedy continuations are transformers'", "[real]") {
  skip_if_unavailable(f32_folder());
  check_greedy(f32_folder());
}

TEST_CASE("every policy runs 16 traced steps on the F32 folder", "[real]") {
  check_policies_trace(
      real::f32_folder_path(),
      "no F32 Hugging Face folder of the real model (" + real::f32_folder_hint() + ")",
      /*has_predictor=*/false, /*ships_model_files=*/false);
}

TEST_CASE("the .gguf file gives transformers' logits when dequantized to F32", "[real]") {
  skip_if_unavailable(gguf_file());
  check_logits(gguf_file());
}

TEST_CASE("the .gguf file's greedy continuations are transformers'", "[real]") {
  skip_if_unavailable(gguf_file());
  check_greedy(gguf_file());
}

TEST_CASE("every policy, tokenbutler too, runs 16 traced steps on the .gguf file", "[real]") {
  // loki, doublesparsity, duoattention and seerattention too: their files for SmolLM2 ship in
  // assets/predictors/smollm2-135m-instruct/.
  check_policies_trace(real::gguf_path(),
                       "the real model is not fetched (" + real::gguf_hint() + ")",
                       /*has_predictor=*/true, /*ships_model_files=*/true);
}

TEST_CASE("the .gguf file gets the bundled TokenButler predictor", "[real]") {
  // assets/predictors/index.json names this file's general.name; the predictor was trained for it
  // (assets/predictors/smollm2-135m-instruct/README.md) and must fit its shapes.
  skip_if_unavailable(gguf_file());
  const std::shared_ptr<const kvlens::Model> model = kvlens::Model::load(real::gguf_path());
  INFO(model->predictor.searched.size());
  REQUIRE(model->predictor.predictor != nullptr);
  CHECK(model->predictor.predictor->config.layers == model->config.num_layers);
}

TEST_CASE("the .gguf file's own tokenizer gives llama.cpp's ids on ../shared/data", "[real]") {
  // Model::load reads the tokenizer from the file's metadata (the unit tests check the same
  // vocabulary from a committed copy of that metadata); the ids are llama.cpp's for this file.
  skip_if_unavailable(gguf_file());
  const std::shared_ptr<const kvlens::Model> model = kvlens::Model::load(real::gguf_path());
  const kvlens::test::LlamaCppComparison c =
      kvlens::test::compare_with_llama_cpp(model->require_tokenizer(), "smollm2");
  CHECK(c.entries > 100);
  CHECK(c.mismatches == 0);
}

TEST_CASE("the fixture was made from the pinned file", "[real]") {
  // get_model.sh pins the same sha256: a new file needs new references.
  std::ifstream script(kvlens::test::source_path("tools/get_model.sh"));
  const std::string text((std::istreambuf_iterator<char>(script)), {});
  CHECK_THAT(text, Catch::Contains(reference().at("gguf_sha256").get<std::string>()));
}
