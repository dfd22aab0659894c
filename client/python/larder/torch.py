"""larder.torch: a PyTorch IterableDataset over larderd.

    from larder.torch import LarderDataset, LarderDataLoader
    ds = LarderDataset("/data/train/*.parquet", columns=["x", "y"], batch_size=256, seed=1)
    loader = LarderDataLoader(ds, num_workers=2, pin_memory=True)
    for epoch in range(10):
        ds.set_epoch(epoch)
        for batch in loader:                  # {"x": tensor, "y": tensor}
            ...
        torch.save({"data": ds.state_dict(), ...}, path)

The dataset yields whole batches (larder batches them): use it with
``DataLoader(ds, batch_size=None)``, which LarderDataLoader sets.  Each
``iter()`` is one epoch, the one ``set_epoch`` chose (0 by default), in
larder's deterministic order for the seed.

Ranks: from torch.distributed when it is initialised, else RANK and
WORLD_SIZE (as liblarder reads them), else the ``rank`` and ``world_size``
given.  With ``num_workers=N`` each worker connects on its own and reads
as rank ``rank*N + w`` of ``world_size*N``: the rank's batches are the
interleaving of its workers' in the DataLoader's round-robin order, every
row of an epoch once across all ranks and workers (plus the padding of the
last global batch), deterministic for a given N.  The order differs from
N=0 (other ranks' shares), so a checkpoint records N and resumes only with
the same N.

Checkpoints: ``state_dict()`` is the position after the last batch the
loop received: the dataset counts them itself without workers, and
LarderDataLoader counts them with workers (a plain DataLoader with
workers cannot tell the dataset, and state_dict then refuses).
``load_state_dict()`` checks that the dataset (sources, columns, shuffle,
drop_last, partitions), seed, global batch size and N are the same, and
the next iteration resumes at the exact batch.  The position counts global
batches, so a job may resume on another number of ranks with the same
global batch (batch_size times world size).
"""
import hashlib
import json
import multiprocessing
import os

import torch
import torch.utils.data as tud

import larder

_STATE_VERSION = 1


def _env_int(names, default):
    for n in names:
        v = os.environ.get(n)
        if v is not None and v != "":
            try:
                return int(v)
            except ValueError:
                raise ValueError("larder: %s=%r is not a number" % (n, v)) from None
    return default


def _rank_world(rank, world_size):
    """(rank, world size) as the docstring says."""
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size)
    r = rank if rank is not None else _env_int(("RANK", "SLURM_PROCID", "LOCAL_RANK"), 0)
    w = world_size if world_size is not None else _env_int(("WORLD_SIZE", "SLURM_NTASKS"), 1)
    return r, w


class LarderDataset(tud.IterableDataset):
    """Batches of a larder stream as dicts of tensors (``Batch.torch()``),
    passed through ``transform`` when given.  Tensors are zero-copy views of
    the daemon's arena and hold their batch until they are dropped; they
    are read-only memory (copy before writing in place).  ``output="numpy"``
    yields numpy dicts instead."""

    def __init__(self, sources, columns=None, batch_size=256, seed=0, shuffle=True,
                 drop_last=False, rank=None, world_size=None, socket=None, window=None,
                 transform=None, output="torch", shuffle_window=0, unit_rows=0, partitions=0,
                 local_world_size=None, job=None, memory="host", device=None):
        super().__init__()
        if isinstance(sources, (str, bytes, os.PathLike)):
            sources = [sources]
        # Absolute now, as liblarder would make them, so that a checkpoint
        # names the same files wherever the process runs from.
        self.sources = [s if "://" in str(s) else os.path.abspath(os.fsdecode(s)) for s in sources]
        self.columns = None if columns is None else ([columns] if isinstance(columns, str)
                                                     else list(columns))
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._rank, self._world = rank, world_size
        self.socket = socket
        self.window = window
        self.transform = transform
        if output not in ("torch", "numpy"):
            raise ValueError("larder: output is 'torch' or 'numpy'")
        self.output = output
        if memory not in ("host", "cuda"):
            raise ValueError("larder: memory is 'host' or 'cuda', not %r" % (memory,))
        if memory == "cuda" and output != "torch":
            raise ValueError("larder: memory='cuda' batches are CUDA tensors: output='torch'")
        # Where the batches land: not part of the identity (the same rows
        # in the same order, wherever they are delivered).
        self.memory, self.device = memory, device
        self.shuffle_window, self.unit_rows = shuffle_window, unit_rows
        # Node partitions (larder.h): part of the order, so of the identity.
        self.partitions = partitions or 0
        self._local = local_world_size
        self.job = job
        self.epoch = 0
        self._resume = None        # (epoch, batches consumed) to resume at
        self._consumed = 0         # batches of self.epoch the loop received
        self._counted = False      # a counter (this process or the loader) knows
        self._num_workers = 0      # as the loader last told
        # Set by any worker that iterates: a plain DataLoader with workers
        # then left the count unknown here (state_dict refuses).
        self._worker_iterated = multiprocessing.get_context("fork").RawValue("b", 0) \
            if "fork" in multiprocessing.get_all_start_methods() else None
        self._len = None

    # -- identity and state

    def identity(self):
        """What makes two datasets the same stream of rows."""
        return {"sources": self.sources, "columns": self.columns, "shuffle": bool(self.shuffle),
                "drop_last": bool(self.drop_last), "shuffle_window": self.shuffle_window,
                "unit_rows": self.unit_rows, "partitions": self.partitions}

    def _local_world(self, nw):
        """Ranks per node as the streams count them: the node's ranks, each
        split into nw worker sub-ranks; None when unknown (one node)."""
        local = self._local
        if local is None:
            for k in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
                if os.environ.get(k):
                    local = int(os.environ[k])
                    break
        return None if local is None else local * nw

    def _fingerprint(self):
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()

    def set_epoch(self, epoch):
        """Chooses the epoch the next iteration reads (as DistributedSampler)."""
        if epoch != self.epoch:
            self._consumed = 0
        self.epoch = epoch

    def state_dict(self):
        """The position after the last batch received, with what it means."""
        if not self._counted and self._worker_iterated is not None and self._worker_iterated.value:
            raise RuntimeError(
                "larder: the dataset was iterated by DataLoader workers, which cannot tell it "
                "the batches consumed: iterate it through larder.torch.LarderDataLoader to "
                "checkpoint with num_workers > 0")
        rank, world = _rank_world(self._rank, self._world)
        epoch, k = self.epoch, self._consumed
        return {"larder_dataset": _STATE_VERSION, "fingerprint": self._fingerprint(),
                "identity": self.identity(), "seed": self.seed,
                "global_batch_size": self.batch_size * world, "world_size": world,
                "num_workers": self._num_workers, "epoch": epoch, "batch": k}

    def load_state_dict(self, state):
        """Resumes at the state's exact batch; raises ValueError naming what
        differs when the checkpoint is of another dataset or setting."""
        if not isinstance(state, dict) or state.get("larder_dataset") != _STATE_VERSION:
            raise ValueError("larder: not a LarderDataset state (or of another version)")
        rank, world = _rank_world(self._rank, self._world)
        diffs = []
        if state["fingerprint"] != self._fingerprint():
            mine = self.identity()
            diffs += ["%s: checkpoint %r, dataset %r" % (k, state["identity"].get(k), mine[k])
                      for k in mine if state["identity"].get(k) != mine[k]] or ["dataset identity"]
        # The position is of global batches: any world size with the same
        # global batch resumes it (elastic), so the world size is not checked.
        for k, mine in (("seed", self.seed), ("global_batch_size", self.batch_size * world)):
            if state[k] != mine:
                diffs.append("%s: checkpoint %r, dataset %r" % (k, state[k], mine))
        if diffs:
            raise ValueError("larder: the checkpoint is of another stream: " + "; ".join(diffs))
        self.epoch = state["epoch"]
        self._consumed = state["batch"]
        self._resume = (state["epoch"], state["batch"], state["num_workers"])
        self._counted = True

    # -- iteration

    def __len__(self):
        """Batches per epoch on this rank (opens a stream once to learn it)."""
        if self._len is None or self._len[0] != self._num_workers:
            nw = max(1, self._num_workers)
            rank, world = _rank_world(self._rank, self._world)
            with larder.Client(self.socket) as c:
                s = c.stream(self.sources, self.columns, batch_size=self.batch_size,
                             seed=self.seed, shuffle=self.shuffle, drop_last=self.drop_last,
                             rank=rank * nw, world_size=world * nw, epochs=1,
                             shuffle_window=self.shuffle_window, unit_rows=self.unit_rows,
                             partitions=self.partitions, local_world_size=self._local_world(nw))
                self._len = (self._num_workers, len(s) * nw)
                s.close()
        return self._len[1]

    def __iter__(self):
        info = tud.get_worker_info()
        nw, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        in_worker = info is not None
        if in_worker and self._worker_iterated is not None:
            self._worker_iterated.value = 1
        if in_worker and self.memory == "cuda":
            # A worker's CUDA tensors would reach the trainer through torch's
            # own CUDA IPC, which cannot export memory the worker imported.
            raise ValueError("larder: memory='cuda' needs num_workers=0: batches in GPU memory "
                             "cannot cross DataLoader worker processes (larderd already "
                             "loads in parallel; workers add nothing here)")
        rank, world = _rank_world(self._rank, self._world)
        epoch = self.epoch
        k = 0
        if self._resume is not None and self._resume[0] == epoch:
            saved_nw = max(1, self._resume[2])
            if saved_nw != nw:
                raise ValueError("larder: the checkpoint was taken with num_workers=%d, this "
                                 "loader has %d: the order of batches differs"
                                 % (self._resume[2], 0 if nw == 1 and not in_worker else nw))
            k = self._resume[1]
        # Worker w serves the k+w-th batch onwards of the interleaving: the
        # sub-rank (k + w) % N, from its batch (k + w) // N (see the module
        # docstring), so that the DataLoader's round-robin, which starts at
        # worker 0, continues the sequence exactly.
        role = (k + wid) % nw
        start = (k + wid) // nw
        if not in_worker:
            self._consumed = k
            self._counted = True
            self._resume = None
        client = larder.Client(self.socket)
        try:
            stream = client.stream(self.sources, self.columns, batch_size=self.batch_size,
                                   seed=self.seed, shuffle=self.shuffle, drop_last=self.drop_last,
                                   rank=rank * nw + role, world_size=world * nw,
                                   epochs=epoch + 1, start=(epoch, start), window=self.window,
                                   shuffle_window=self.shuffle_window, unit_rows=self.unit_rows,
                                   partitions=self.partitions,
                                   local_world_size=self._local_world(nw), job=self.job,
                                   memory=self.memory, device=self.device)
            tf = self.transform
            as_torch = self.output == "torch"
            try:
                while True:
                    b = stream.next()
                    if b is None or b.epoch != epoch:
                        break
                    out = b.torch() if as_torch else b.numpy()
                    del b
                    if tf is not None:
                        out = tf(out)
                    if not in_worker:
                        self._consumed += 1
                    yield out
            finally:
                stream.close()
        finally:
            client.close()

    # Called by LarderDataLoader's iterator in the main process.
    def _loader_started(self, num_workers):
        self._num_workers = num_workers
        r = self._resume
        self._consumed = r[1] if r is not None and r[0] == self.epoch else 0
        self._counted = True

    def _loader_yielded(self):
        self._consumed += 1


class LarderDataLoader(tud.DataLoader):
    """A DataLoader for a LarderDataset (batch_size=None) that counts the
    batches the loop receives, so that ``dataset.state_dict()`` is exact
    with workers too.  Other arguments as DataLoader's."""

    def __init__(self, dataset, **kwargs):
        if not isinstance(dataset, LarderDataset):
            raise TypeError("larder: LarderDataLoader takes a LarderDataset")
        if kwargs.setdefault("batch_size", None) is not None:
            raise ValueError("larder: a LarderDataset yields whole batches: batch_size=None")
        super().__init__(dataset, **kwargs)

    def __len__(self):
        self.dataset._num_workers = self.num_workers
        return len(self.dataset)

    def __iter__(self):
        ds = self.dataset
        ds._loader_started(self.num_workers)
        it = super().__iter__()
        if self.num_workers == 0:
            # The dataset counts in this process, and reads its own resume
            # point when the iterator first asks it for a batch.
            yield from it
            return
        # The workers have their copy of the resume point now.
        ds._resume = None
        for out in it:
            ds._loader_yielded()
            yield out
