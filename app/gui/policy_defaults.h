// The app's default policies (the registry's default comparison, at 50%) and what becomes of a
// policy that needs a learned predictor on a model without one: a default list leaves it out
// and says so; a list the user asked for is kept as it is, so such a policy fails as any bad
// policy does (an error dialog, the session kept). Shared by the window and the headless dashboard.
#pragma once

#include <string>

#include "engine/model/model.h"

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

}  // namespace kvlens::app
