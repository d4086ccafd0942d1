// Identity of the running executable, for keying persisted graphs. Internal to src/.
#pragma once

#include <string>

namespace tdstore::detail {

// The GNU build id of the main executable as hex; when it has none, "x" followed by the xxh3
// of /proc/self/exe's bytes. Computed once.
const std::string& executable_build_id();

}  // namespace tdstore::detail
