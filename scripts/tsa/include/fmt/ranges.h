// Seen only by the thread-safety analysis (bits/c++config.h here says why): fmt 9 makes its
// buffers constexpr in C++20 past libstdc++ 9, which needs libstdc++'s constexpr members.
#include <cstddef>
#pragma push_macro("_GLIBCXX_RELEASE")
#undef _GLIBCXX_RELEASE
#define _GLIBCXX_RELEASE 9
#include_next <fmt/ranges.h>
#pragma pop_macro("_GLIBCXX_RELEASE")
