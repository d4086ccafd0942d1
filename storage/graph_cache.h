// Where compiled-graph records are read and written (tdstore/trust.h): the store a compiled
// function persists into, and this user's graph cache beside it. The one owner of which records
// a process may load (sealed under a trusted key) and of where a new record goes. Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/store.h"

namespace tdstore::storage {

struct TrustedRecord {
  std::string key;               // graph/<function>/<code id>/<libtorch version>/<guard hash>
  std::string record;            // unsealed: storage/graph_record.h
  std::filesystem::path source;  // the store it was read from
};

// This user's graph cache (<cache>/graphs, tdstore/trust.h), created on first use in a 0700
// directory; nullptr with *why set when it cannot be opened or created, or when it or its
// catalog is owned by another user or writable by others. Opened once per process; thread-safe.
Store* user_graph_cache(std::string* why);

// Records under prefix that this user may load: the store's, then the graph cache's for keys
// the store holds no trusted record of. Each record passed over (not trusted, or a damaged
// catalog value) is reported through refused(key, where, reason) before any of it is parsed.
std::vector<TrustedRecord> load_trusted_graphs(
    Store& store, std::string_view prefix,
    const std::function<void(const std::string&, const std::filesystem::path&, const std::string&)>&
        refused);

// Seals record with the signing key and writes it under key: into `store` when its catalog is
// writable by this process and the key there holds no record or one of this user's
// (graph_seal.h, replaceable: never a teammate's or another user's); else into the graph cache,
// then trimmed to its byte budget (the records sealed longest ago go first; never this one).
// Returns the store written. Error when there is no signing key or no place to write.
std::filesystem::path put_trusted_graph(Store& store, std::string_view key,
                                        std::string_view record);

// Removes this user's record under key (unsigned, or sealed under the signing key; never
// another signer's) from the store and the graph cache, where their catalogs are writable.
void erase_own_graph(Store& store, std::string_view key);

// The graph cache's byte budget: $TDSTORE_GRAPH_CACHE_BYTES (decimal digits; anything else is
// warned about once on stderr), default 1 GiB.
uint64_t graph_cache_budget();
// When the cache's catalog takes more than budget bytes (an O(1) check), removes the records
// sealed longest ago (unsigned ones first, damaged catalog values first of all), but never
// `keep`, until its records (keys and values) take at most budget bytes; the removals are one
// catalog transaction. A trim racing another process's write may remove a record written
// meanwhile (a later trace, never a wrong graph). Returns the records removed.
uint64_t trim_graph_cache(Store& cache, uint64_t budget, std::string_view keep = {});

}  // namespace tdstore::storage
