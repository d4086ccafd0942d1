#include "storage/keys.h"

#include "storage/format.h"
#include "storage/messages.h"
#include "tdstore/errors.h"
#include "tdstore/keys.h"

namespace tdstore::storage {

std::string key_problem(std::string_view key, bool ragged) {
  if (key.empty()) return "is empty";
  if (key.find('\0') != std::string_view::npos) return "contains a NUL byte";
  const size_t limit = ragged ? kMaxKeyBytes - kRaggedSuffix.size() : kMaxKeyBytes;
  if (key.size() > limit)
    return "is " + std::to_string(key.size()) + " bytes; at most " + std::to_string(limit) +
           (ragged ? " fit a ragged key (its offsets key adds 8)" : " are stored");
  for (size_t s = 0;;) {
    size_t e = key.find('/', s);
    std::string_view part =
        key.substr(s, e == std::string_view::npos ? std::string_view::npos : e - s);
    if (part.empty()) return "has an empty path component";
    if (part == "." || part == "..")
      return "has a " + in_quotes(std::string(part)) + " path component";
    if (e == std::string_view::npos) break;
    s = e + 1;
  }
  return "";
}

void check_key(std::string_view key, std::string_view where, bool ragged) {
  std::string problem = key_problem(key, ragged);
  if (problem.empty()) return;
  std::string shown(key.substr(0, 64));
  for (char& c : shown)
    if (c == '\0') c = '?';
  throw KeyError(std::string(where) + ": key '" + shown + (key.size() > 64 ? "...'" : "'") + " " +
                 problem);
}

std::string ragged_offsets_key(std::string_view key) {
  std::string k(key);
  k += kRaggedSuffix;
  return k;
}

std::string_view ragged_owner(std::string_view stored_key) {
  size_t nul = stored_key.find('\0');
  if (nul == std::string_view::npos || stored_key.substr(nul) != kRaggedSuffix) return {};
  return stored_key.substr(0, nul);
}

}  // namespace tdstore::storage

namespace tdstore {

std::vector<std::string> split_key(std::string_view key) {
  std::vector<std::string> parts;
  for (size_t s = 0, e; s <= key.size(); s = e + 1) {
    e = key.find('/', s);
    if (e == std::string_view::npos) e = key.size();
    parts.emplace_back(key.substr(s, e - s));
  }
  return parts;
}

}  // namespace tdstore
