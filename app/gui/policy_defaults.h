// The app's default policies (the registry's default comparison, at 50%) and what becomes of a
// policy that needs a learned predictor on a model without one: a default list leaves it out
// and says so; a list the user asked for is kept as it is, so such a policy fails as any bad
// policy does (an error dialog, the session kept). And the head a dashboard selects first.
// Shared by the window and the headless dashboard.
#pragma once

#include <string>

#include "engine/model/model.h"
#include "engine/trace/trace.h"

namespace kvlens::app {

// The policies the app opens on (default_comparison_policies in engine/policy/registry.h).
std::string default_policies();

struct PolicyChoice {
  std::string policies;  // the list to run
  std::string note;      // why a policy was left out, for the status bar (empty: none was)
};

// `policies` as given when `asked` (the user named them: --policies, the sidebar's check boxes,
// a script), else without the policies that need a predictor when `model` has none (and without
// ids this build does not register), with a note saying why.
PolicyChoice choose_policies(const std::string& policies, bool asked, const Model& model);

// "FILE (variant hf, 1.23M parameters)" for the model's predictor, or "no predictor".
std::string predictor_summary(const Model& model);

// The head a dashboard selects when a recording opens: for the first run whose policy predicts
// logits (tokenbutler), the head whose top-50% hit rate at `step` is the median over the heads
// with scores (a typical head, neither its best nor its worst), with a line saying so; without
// such a run, or before `step` exists, the first head of the first sparse layer (found = false).
struct HeadChoice {
  int64_t layer = 0, head = 0;
  bool found = false;
  std::string why;  // "tokenbutler s=0.5's median head by top-50% hit rate: 0.62 (0.41-0.83)"
};
HeadChoice typical_predicted_head(const Trace& trace, int64_t step);

}  // namespace kvlens::app
