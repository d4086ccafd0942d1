// Errors thrown by tdstore. Every error derives from tdstore::Error; messages name the store
// path, the key or field involved, and what was expected versus what was found.
#pragma once

#include <stdexcept>
#include <string>

#include "tdstore/export.h"

namespace tdstore {

// Base of every exception tdstore throws.
class TDSTORE_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument's value is outside what the call accepts: a non-positive batch size or block
// size, a rank outside world_size, a store option out of range, an empty list of dicts to join.
// The message names the argument and the values it takes.
class TDSTORE_API ArgumentError : public Error {
 public:
  using Error::Error;
};

// A key is absent, empty, contains NUL, or is longer than a directory slot holds.
class TDSTORE_API KeyError : public Error {
 public:
  using Error::Error;
};

// A tensor's leading dimensions do not match the dict's batch size, or it has too many dims.
class TDSTORE_API ShapeError : public Error {
 public:
  using Error::Error;
};

// An index selects a row outside a batch dimension (or a dataset's published rows). A
// ShapeError too, so code catching ShapeError keeps working.
class TDSTORE_API IndexError : public ShapeError {
 public:
  using ShapeError::ShapeError;
};

// A tensor's dtype is not in tdstore's dtype registry (see docs/FORMAT.md).
class TDSTORE_API DTypeError : public Error {
 public:
  using Error::Error;
};

// The key directory is full, or the arena's reserved address range is exhausted.
class TDSTORE_API CapacityError : public Error {
 public:
  using Error::Error;
};

// Stored bytes fail a checksum or a structural check (bad header, out-of-range extent).
class TDSTORE_API CorruptionError : public Error {
 public:
  using Error::Error;
};

// The path is not a tdstore store, or its format version is newer than this build reads.
class TDSTORE_API FormatError : public Error {
 public:
  using Error::Error;
};

// Another writer holds the store's write lock.
class TDSTORE_API LockError : public Error {
 public:
  using Error::Error;
};

// A write was attempted through a handle opened read-only.
class TDSTORE_API ReadOnlyError : public Error {
 public:
  using Error::Error;
};

// A call on a handle after close(): the dict or dataset no longer refers to its store.
class TDSTORE_API ClosedError : public Error {
 public:
  using Error::Error;
};

// An operating-system call failed (disk full, file size limit, permissions, ...). After an
// IOError during commit() the handle is broken: later writes fail at once; reopen the store.
class TDSTORE_API IOError : public Error {
 public:
  using Error::Error;
};

}  // namespace tdstore
