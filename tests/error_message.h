// What a call throws, as the text a user reads.
#pragma once

#include <functional>
#include <string>

#include "tdstore/errors.h"

namespace tdstore::testing {

// The message of the tdstore::Error fn throws; "" when it throws none.
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tdstore::testing
