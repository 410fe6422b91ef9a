// load_on_cpu (cpu_model.h).
#include "tests/support/cpu_model.h"

namespace kvlens::test {

CpuModel load_on_cpu(const std::string& dir, int threads) {
  CpuModel loaded;
  loaded.backend = make_cpu_backend(threads);
  loaded.model = Model::load(dir);
  loaded.resident = upload_model(loaded.model, *loaded.backend);
  return loaded;
}

}  // namespace kvlens::test
