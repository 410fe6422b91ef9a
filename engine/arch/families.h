// The families' architectures, one file each (engine/arch/<family>.cpp), listed once for
// architecture_for (engine/arch/architecture.cpp).
#pragma once

namespace kvlens {

class Architecture;
const Architecture& llama_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& phi3_architecture();
const Architecture& gemma3_architecture();

}  // namespace kvlens
