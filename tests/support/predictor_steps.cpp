// tokenbutler_predicted_rows (predictor_steps.h).
#include "tests/support/predictor_steps.h"

#include <span>

#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"

namespace kvlens::test {

PredictedRows tokenbutler_predicted_rows(Backend& backend, std::shared_ptr<const Model> model,
                                         const std::vector<int32_t>& tokens, int64_t prefill,
                                         double sparsity) {
  const auto resident = upload_model(std::move(model), backend);
  DecoderSession session(resident);
  PolicyConfig config;
  config.id = "tokenbutler";
  config.sparsity = sparsity;
  session.set_policy(make_policy(config, session.policy_shape(), backend), prefill);
  const int64_t layers = resident->config().num_layers, heads = resident->config().num_heads;
  PredictedRows rows(tokens.size());
  if (prefill > 0) session.forward(std::span(tokens).first(size_t(prefill)));
  for (int64_t t = prefill; t < int64_t(tokens.size()); ++t) {
    session.forward(std::span(tokens).subspan(size_t(t), 1));
    rows[size_t(t)].resize(size_t(layers));
    for (int64_t l = 1; l < layers; ++l) {
      const DeviceTensor& scores = session.policy_scores()[size_t(l)];
      const int64_t stride = scores.dim(1);
      std::vector<float> all(size_t(heads * stride));
      backend.to_host(scores, all.data(), all.size() * sizeof(float));
      std::vector<float>& row = rows[size_t(t)][size_t(l)];
      for (int64_t h = 0; h < heads; ++h)
        row.insert(row.end(), all.begin() + h * stride, all.begin() + h * stride + t + 1);
    }
  }
  return rows;
}

}  // namespace kvlens::test
