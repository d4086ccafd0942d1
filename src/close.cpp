// Closing handles: TensorDict::close, Dataset::close and the ClosedError every later call on
// their shared state throws (through HandleState, tdstore/handle_state.h).
#include <mutex>

#include "src/dataset_impl.h"
#include "src/tensordict_impl.h"
#include "tdstore/dataset.h"
#include "tdstore/tensordict.h"

namespace tdstore {

void check_tensordict_open(const void* impl) {
  const auto& i = *static_cast<const TensorDict::Impl*>(impl);
  if (i.closed) [[unlikely]]
    throw ClosedError(i.closed_where +
                      ": the TensorDict was closed (close()); open the store again to use it");
}

void check_dataset_open(const void* impl) {
  const auto& i = *static_cast<const Dataset::Impl*>(impl);
  if (i.closed) [[unlikely]]
    throw ClosedError(i.where() + ": the Dataset was closed (close()); open it again to use it");
}

void TensorDict::close() {
  Impl* impl = impl_.get();
  if (!impl || impl->closed) return;
  std::string was = where(*impl);
  {
    storage::MutexLock lock(&impl->mu);
    impl->views.clear();  // views handed out keep their own pins
  }
  impl->store.reset();  // unmaps, releases the writer lock, discards what was staged
  impl->tensors.clear();
  impl->attrs.clear();
  impl->lazy.clear();
  impl->stamps.clear();
  impl->closed_where = std::move(was);
  impl->closed = true;
}

bool TensorDict::closed() const {
  const Impl* impl = impl_.get();
  return impl && impl->closed;
}

void Dataset::close() {
  Impl* impl = impl_.get();
  if (!impl || impl->closed) return;
  for (auto& [id, reader] : impl->readers) reader.close();
  impl->readers.clear();
  impl->manifest_store.close();
  impl->closed = true;
}

bool Dataset::closed() const {
  const Impl* impl = impl_.get();
  return impl && impl->closed;
}

}  // namespace tdstore
