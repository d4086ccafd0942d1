#include "tdstore/handle_state.h"

#include <string>

#include "tdstore/errors.h"

namespace tdstore {

void throw_moved_from(const char* name) {
  throw ClosedError(
      std::string("use of a moved-from tdstore::") + name +
      ": it no longer refers to a dict, dataset, function or store; use the object it was "
      "moved to");
}

}  // namespace tdstore
