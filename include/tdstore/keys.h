// Key paths: nested keys are '/'-separated paths ("next/obs"). Torch-free.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tdstore/export.h"

namespace tdstore {

// The components of a key path: "next/obs" -> {"next", "obs"}; "" -> {""}.
TDSTORE_API std::vector<std::string> split_key(std::string_view key);

}  // namespace tdstore
