// Seen only by the thread-safety analysis (scripts/tsa-src.sh), never by code that runs: clang
// cannot compile libtorch 1.13's headers against libstdc++ 12 as C++20, whose constexpr
// std::vector is instantiated at once for the incomplete c10::IValue (ATen/core/List.h). With
// libstdc++'s C++20 constexpr members declared plain, as in C++17, they parse.
#include_next <bits/c++config.h>
#undef _GLIBCXX20_CONSTEXPR
#define _GLIBCXX20_CONSTEXPR
