// The identity of a compiled function's code, for keying persisted graphs. Internal to src/.
#pragma once

#include <cstdint>
#include <string>
#include <typeinfo>

namespace tdstore::detail {

// The GNU build id (hex) of the loaded object (executable or shared library) whose image
// contains `address`; when it has none, "x" followed by the xxh3 of that object's file. Empty
// when no loaded object contains it.
// `offset` (when given) receives address's offset from the object's load address.
std::string object_build_id(const void* address, uintptr_t* offset);

// xxh3 (16 hex digits) of: the type's name; for a plain function (`function` not null) the
// build id of the object holding its code and its offset there, else the build id of the
// object defining `type` (a function object's type_info lives in the object compiled from its
// code); and `extra` (CompileOptions::code_identity). Rebuilding that object, or changing
// `extra`, changes it.
std::string code_identity(const std::type_info& type, const void* function,
                          const std::string& extra);

}  // namespace tdstore::detail
