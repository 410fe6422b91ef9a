// The app's default policies (dense, tokenbutler, h2o, quest at 50%) and what becomes of the
// learned predictor's policy on a model without a predictor: a default list leaves tokenbutler out
// and says so; a list the user asked for is kept as it is, so its tokenbutler fails as any bad
// policy does (an error dialog, the session kept). Shared by the window and the headless dashboard.
#pragma once

#include <string>

#include "engine/model/model.h"

namespace kvlens::app {

inline constexpr const char* kDefaultPolicies = "dense,tokenbutler,h2o,quest";
inline constexpr const char* kPredictorPolicy = "tokenbutler";

struct PolicyChoice {
  std::string policies;  // the list to run
  std::string note;      // why a policy was left out, for the status bar (empty: none was)
};

// `policies` as given when `asked` (the user named them: --policies, the sidebar's check boxes,
// a script), else without tokenbutler when `model` has no predictor (or this build has no
// tokenbutler policy), with a note saying why.
PolicyChoice choose_policies(const std::string& policies, bool asked, const Model& model);

// "FILE (variant hf, 1.23M parameters)" for the model's predictor, or "no predictor".
std::string predictor_summary(const Model& model);

}  // namespace kvlens::app
