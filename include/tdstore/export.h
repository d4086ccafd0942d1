// Symbol visibility of tdstore's shared libraries. libtdstore is built with hidden visibility:
// TDSTORE_API marks the public API (declared under include/tdstore/), the only symbols it
// exports. libtdstore_storage, which it links, also exports the engine (tdstore::storage::,
// headers not installed) for libtdstore's use.
#pragma once

#define TDSTORE_API __attribute__((visibility("default")))
// For the definitions of an exported class's nested implementation types (pimpl), which would
// otherwise inherit its visibility. Used inside the libraries only.
#define TDSTORE_HIDDEN __attribute__((visibility("hidden")))
