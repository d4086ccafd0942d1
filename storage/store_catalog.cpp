// Store: the catalog's records through this handle: attributes and lazy provenance (versioned,
// staged with the keys) and cache entries (unversioned).

#include <map>

#include "storage/catalog.h"
#include "storage/graph_record.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

const Catalog::Snapshot& Store::catalog_snapshot() const {
  const bool forked = process_id() != catalog_pid_;
  if (forked) {  // the parent's environment is left alone (Catalog's destructors skip it)
    catalog_ = Catalog::open(dir_ / kCatalogDir, false, false, shared_readonly_);
    catalog_pid_ = process_id();
  }
  if (writable_) {
    writer_snapshot_ = catalog_->snapshot();
    return *writer_snapshot_;
  }
  if (forked) {
    catalog_snapshot_ = catalog_->snapshot();
    // The new snapshot holds the newest two versions of each record: this handle's generation
    // is still readable unless a writer replaced a value twice since. The header's digest tells.
    catalog_lost_ =
        snap_->header.format_version >= 2 &&
        digest_at(*catalog_snapshot_, snap_->header.generation) != snap_->header.catalog_digest;
  }
  return *catalog_snapshot_;
}

const Catalog::Snapshot& Store::versioned_snapshot() const {
  const Catalog::Snapshot& s = catalog_snapshot();
  if (catalog_lost_)
    throw Error(dir_.string() + ": this handle reads generation " +
                std::to_string(snap_->header.generation) +
                " and was inherited by a forked process, whose catalog no longer holds that "
                "generation's attributes (a writer replaced them since): refresh() the handle in "
                "this process");
  return s;
}

void Store::check_catalog_key(std::string_view key) const {
  if (key.empty()) throw KeyError(dir_.string() + ": empty catalog key");
  if (key.size() > kMaxCatalogKeyBytes)
    throw KeyError(dir_.string() + ": catalog key " + in_quotes(key.substr(0, 40)) + "... is " +
                   std::to_string(key.size()) + " bytes; the catalog holds keys of at most " +
                   std::to_string(kMaxCatalogKeyBytes) + " (attribute names at most " +
                   std::to_string(kMaxCatalogKeyBytes - 5) + ")");
}

void Store::put_meta(std::string_view key, std::optional<std::string> value) {
  require_writable("put_meta " + in_quotes(key));
  check_catalog_key(key);
  txn_->stage_meta(std::string(key), std::move(value));
}

std::optional<std::string> Store::get_meta(std::string_view key) const {
  if (txn_)
    if (auto it = txn_->meta().find(std::string(key)); it != txn_->meta().end()) return it->second;
  MutexLock lock(&catalog_mu_);
  return versioned_snapshot().get(key, snap_->header.generation);
}

std::vector<std::pair<std::string, std::string>> Store::scan_meta(std::string_view prefix) const {
  std::map<std::string, std::optional<std::string>> found;
  {
    MutexLock lock(&catalog_mu_);
    versioned_snapshot().scan(
        prefix, snap_->header.generation,
        [&](std::string_view k, std::string_view v) { found[std::string(k)] = std::string(v); });
  }
  if (txn_)
    for (auto it = txn_->meta().lower_bound(std::string(prefix));
         it != txn_->meta().end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      found[it->first] = it->second;
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [k, v] : found)
    if (v) out.emplace_back(k, std::move(*v));
  return out;
}

void Store::put_cache(std::string_view key, std::optional<std::string> value) {
  check_catalog_key(key);
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();  // reopens the environment in a forked child
  catalog_->write({{std::string(key), std::move(value)}}, 0);
}

void Store::erase_cache(const std::vector<std::string>& keys) {
  std::map<std::string, std::optional<std::string>> changes;
  for (const auto& k : keys) {
    check_catalog_key(k);
    changes.emplace(k, std::nullopt);
  }
  if (changes.empty()) return;
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();
  catalog_->write(changes, 0);
}

uint64_t Store::catalog_bytes() const {
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();
  return catalog_->used_bytes();
}

std::vector<std::pair<std::string, std::string>> Store::scan_cache(
    std::string_view prefix, std::vector<std::string>* damaged) const {
  std::vector<std::pair<std::string, std::string>> out;
  visit_cache(
      prefix,
      [&](std::string_view k, std::string_view v) {
        out.emplace_back(std::string(k), std::string(v));
      },
      damaged);
  return out;
}

void Store::visit_cache(std::string_view prefix,
                        const std::function<void(std::string_view, std::string_view)>& fn,
                        std::vector<std::string>* damaged) const {
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();
  catalog_->snapshot()->scan(prefix, 0, fn, [&](std::string_view k, const std::string&) {
    if (damaged) damaged->emplace_back(k);
  });
}

bool Store::cache_writable() const {
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();
  return catalog_->writable();
}

std::vector<std::string> Store::attr_names() const {
  std::vector<std::string> out;
  for (auto& [k, v] : scan_meta(kAttrPrefix)) out.push_back(k.substr(kAttrPrefix.size()));
  return out;
}

}  // namespace tdstore::storage
