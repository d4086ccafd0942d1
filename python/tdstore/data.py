"""torch.utils.data adapters: a map-style Dataset over a store, for DataLoader users."""
import torch.utils.data

import tdstore


class Dataset(torch.utils.data.Dataset):
    """Rows of a store (batch dim 0) as a map-style dataset. Items are in-memory TensorDicts;
    __getitems__ fetches a whole batch in one gather. The store is reopened by path when the
    dataset is pickled (spawned workers); forked workers keep using the parent's handle."""

    def __init__(self, path_or_td, keys=None):
        self.td = tdstore.open(path_or_td) if isinstance(path_or_td, str) else path_or_td
        if keys is not None:
            self.td = self.td.select(*keys)

    def __len__(self):
        return len(self.td)

    def __getitem__(self, i):
        return self.td[int(i)]

    def __getitems__(self, indices):
        return self.td[torch.as_tensor(indices, dtype=torch.long)]
