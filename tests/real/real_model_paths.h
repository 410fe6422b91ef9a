// Where the `real` tests find SmolLM2-135M-Instruct: the .gguf that tools/get_model.sh fetched
// ($KVLENS_REAL_MODEL, else the script's cache folder) and the F32 Hugging Face folder that
// tools/make_real_fixtures.py saved beside it ($KVLENS_REAL_HF_DIR, else <file stem>-f32-hf).
#pragma once

#include <string>

namespace kvlens::test::real {

// The file name get_model.sh writes under <cache>/smollm2/.
inline constexpr const char* kGgufName = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The .gguf path, or "" when no such file exists.
std::string gguf_path();
// The F32 folder (holding config.json), or "" when there is none.
std::string f32_folder_path();
// Where the lookups looked, and the command that fills them, for a skip message.
std::string gguf_hint();
std::string f32_folder_hint();

}  // namespace kvlens::test::real
