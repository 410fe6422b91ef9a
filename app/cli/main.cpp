// kvlens-cli entry point (placeholder until the commands land).
#include <cstdio>
int main() { std::puts("kvlens-cli"); return 0; }
