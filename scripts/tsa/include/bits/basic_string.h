// Seen only by the thread-safety analysis (bits/c++config.h here says why): std::string is not
// a literal type once its C++20 constexpr members are plain, so basic_string.h must not declare
// its constexpr operator""s either.
#pragma push_macro("__cpp_lib_is_constant_evaluated")
#undef __cpp_lib_is_constant_evaluated
#include_next <bits/basic_string.h>
#pragma pop_macro("__cpp_lib_is_constant_evaluated")
