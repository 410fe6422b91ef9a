// A model folder loaded and uploaded to a CPU backend: the set-up the evaluation tests share.
#pragma once

#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/session/decoder_session.h"

namespace kvlens::test {

struct CpuModel {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const Model> model;
  std::shared_ptr<const BackendModel> resident;
};

CpuModel load_on_cpu(const std::string& dir, int threads = 2);

}  // namespace kvlens::test
