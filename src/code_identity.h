// The identity of a compiled function's code, for keying persisted graphs. Internal to src/.
#pragma once

#include <string>
#include <typeinfo>

namespace tdstore::detail {

// The GNU build id (hex) of the loaded object (executable or shared library) whose image
// contains `address`; when it has none, "x" followed by the xxh3 of that object's file. Empty
// when no loaded object contains it.
std::string object_build_id(const void* address);

// xxh3 (16 hex digits) of: the build id of the object defining `type` (the function object's
// type, whose type_info lives in the object compiled from its code), the type's name, and
// `extra` (CompileOptions::code_identity). Rebuilding that object, or changing `extra`,
// changes it.
std::string code_identity(const std::type_info& type, const std::string& extra);

}  // namespace tdstore::detail
