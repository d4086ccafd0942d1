// Shared state behind TensorDict handles. Internal to src/.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "storage/store.h"
#include "tdstore/tensordict.h"

namespace tdstore {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct TensorDict::Impl {
  std::vector<int64_t> batch_size;

  // In memory: the leaves and attributes themselves.
  std::map<std::string, at::Tensor, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> attrs;

  // Persistent: the store, and views already handed out (dropped when their key changes or
  // the snapshot moves). `mu` guards `views` so that const calls may run concurrently.
  std::unique_ptr<storage::Store> store;
  mutable std::mutex mu;
  mutable std::unordered_map<std::string, at::Tensor, StringHash, std::equal_to<>> views;

  bool persistent() const { return store != nullptr; }
};

// Validates a full key path: KeyError naming `where` unless it is a usable path.
void check_key_path(std::string_view key, const std::string& where);
std::string shape_string(at::IntArrayRef shape);

}  // namespace tdstore
