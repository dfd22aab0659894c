"""larder.torch.LarderDataset in DataLoaders: 0 and 2 workers, pin_memory,
exact resume from state_dict, refused checkpoints, ranks from the
environment, transforms."""
import os

import pytest
import torch
from torch.utils.data import DataLoader

import larder
import test_ctypes as lt
from larder.torch import LarderDataset, LarderDataLoader

MAIN = lt.MAIN_FILE
MAIN_ID = lt.MAIN_ID
# 1,000 rows in batches of 25: 40 batches; with 2 workers, 2 sub-ranks of
# 20 batches each.  No padding either way, so every id comes exactly once.
BS = 25


def ids(batch):
    """The ids of a yielded batch: (offsets, bytes) tensors of the string column."""
    offs, vals = batch[MAIN_ID]
    offs, raw = offs.tolist(), bytes(vals.numpy())
    return [raw[offs[i]:offs[i + 1]].decode() for i in range(len(offs) - 1)]


def make(daemon, **kw):
    kw.setdefault("batch_size", BS)
    kw.setdefault("seed", 21)
    return LarderDataset(MAIN, columns=[MAIN_ID], socket=daemon.socket, window=4, **kw)


def all_ids(daemon):
    return sorted(r[MAIN_ID] for r in lt.cat_rows(daemon.ctl, MAIN))


@pytest.mark.parametrize("workers,pin", [(0, False), (2, True)])
def test_loader_epoch_exactly_once(daemon, workers, pin):
    ds = make(daemon)
    dl = LarderDataLoader(ds, num_workers=workers, pin_memory=pin)
    assert len(dl) == 40
    seq = [ids(b) for b in dl]
    assert len(seq) == 40
    flat = [i for b in seq for i in b]
    assert sorted(flat) == all_ids(daemon)
    # Deterministic, and a new order in another epoch.
    assert [ids(b) for b in dl] == seq
    ds.set_epoch(1)
    other = [ids(b) for b in dl]
    assert other != seq and sorted(i for b in other for i in b) == all_ids(daemon)


def test_plain_dataloader_workers(daemon):
    """A plain DataLoader with workers reads the epoch as well, but the
    dataset cannot count what the loop received: state_dict refuses."""
    ds = make(daemon)
    seq = [ids(b) for b in DataLoader(ds, batch_size=None, num_workers=2)]
    assert sorted(i for b in seq for i in b) == all_ids(daemon)
    with pytest.raises(RuntimeError, match="LarderDataLoader"):
        ds.state_dict()


@pytest.mark.parametrize("workers,stop_at", [(0, 7), (2, 7), (2, 10)])
def test_resume_mid_epoch(daemon, workers, stop_at):
    """A checkpoint after stop_at + 1 batches of epoch 1 resumes (in a new
    dataset and loader) at exactly the next batch of the same sequence."""
    ref = make(daemon)
    ref.set_epoch(1)
    full = [ids(b) for b in LarderDataLoader(ref, num_workers=workers)]
    ds = make(daemon)
    ds.set_epoch(1)
    got = []
    for i, b in enumerate(LarderDataLoader(ds, num_workers=workers)):
        got.append(ids(b))
        if i == stop_at:
            break
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["batch"] == stop_at + 1
    ds2 = make(daemon)
    ds2.load_state_dict(state)
    got += [ids(b) for b in LarderDataLoader(ds2, num_workers=workers)]
    assert got == full
    # The next epoch starts from its beginning.
    ds2.set_epoch(2)
    assert len([1 for _ in LarderDataLoader(ds2, num_workers=workers)]) == 40


def test_checkpoint_mismatch(daemon):
    state = make(daemon).state_dict()
    with pytest.raises(ValueError, match="seed"):
        make(daemon, seed=22).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_size"):
        make(daemon, batch_size=BS * 2).load_state_dict(state)
    other = LarderDataset(lt.DATA + "/byte_stream_split.zstd.parquet", socket=daemon.socket)
    with pytest.raises(ValueError, match="sources"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_size"):
        make(daemon, rank=0, world_size=2).load_state_dict(state)
    ds = make(daemon)
    ds.load_state_dict(dict(state, num_workers=2))
    with pytest.raises(ValueError, match="num_workers"):
        next(iter(LarderDataLoader(ds, num_workers=0)))


def test_rank_from_env(daemon, monkeypatch):
    """Without torch.distributed, RANK and WORLD_SIZE split the epoch."""
    halves = []
    for r in (0, 1):
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("WORLD_SIZE", "2")
        halves.append([i for b in LarderDataLoader(make(daemon)) for i in ids(b)])
    assert len(halves[0]) == len(halves[1]) == 500
    assert sorted(halves[0] + halves[1]) == all_ids(daemon)


def test_transform_and_numpy(daemon):
    ds = make(daemon, transform=lambda b: len(ids(b)))
    assert list(LarderDataLoader(ds)) == [BS] * 40
    ds = LarderDataset(lt.DATA + "/byte_stream_split.zstd.parquet", batch_size=100,
                       socket=daemon.socket, output="numpy", shuffle=False)
    b = next(iter(ds))
    assert b["f32"].dtype.name == "float32" and len(b["f32"]) == 100


def test_rank_from_torch_distributed(daemon, monkeypatch, tmp_path):
    """An initialised torch.distributed decides the rank over the
    environment: a group of one reads the whole epoch though RANK and
    WORLD_SIZE say otherwise."""
    import torch.distributed as dist
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "store"), rank=0,
                            world_size=1)
    try:
        ds = make(daemon)
        got = [i for b in LarderDataLoader(ds) for i in ids(b)]
        assert sorted(got) == all_ids(daemon)
        assert ds.state_dict()["world_size"] == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pin_memory(daemon):
    """With a GPU: pin_memory=True hands the loop pinned copies (from 0 and
    2 workers), which go to the device with the batch's values."""
    for workers in (0, 2):
        ds = LarderDataset(lt.DATA + "/byte_stream_split.zstd.parquet", batch_size=50, seed=1,
                           socket=daemon.socket, window=4)
        ref = [b["f64"].clone() for b in LarderDataLoader(ds, num_workers=workers)]
        n = 0
        for b, want in zip(LarderDataLoader(ds, num_workers=workers, pin_memory=True), ref):
            assert b["f64"].is_pinned()
            on_gpu = b["f64"].cuda(non_blocking=True)
            assert torch.equal(on_gpu.cpu(), want)
            n += 1
        assert n == len(ref) == 6


def test_resume_other_world_size(daemon):
    """A checkpoint of one rank of a world of one resumes on two ranks with
    the same global batch: between them they read the rest of the epoch's
    global batches, each row of it once."""
    ref = make(daemon, batch_size=2 * BS, rank=0, world_size=1)
    ref.set_epoch(1)
    full = [ids(b) for b in LarderDataLoader(ref)]
    ds = make(daemon, batch_size=2 * BS, rank=0, world_size=1)
    ds.set_epoch(1)
    head = []
    for i, b in enumerate(LarderDataLoader(ds)):
        head.append(ids(b))
        if i == 6:
            break
    state = ds.state_dict()
    halves = []
    for r in (0, 1):
        half = make(daemon, batch_size=BS, rank=r, world_size=2)
        half.load_state_dict(state)
        halves.append([ids(b) for b in LarderDataLoader(half)])
    assert len(halves[0]) == len(halves[1]) == len(full) - 7
    for k, (a, b) in enumerate(zip(*halves)):
        assert sorted(a + b) == sorted(full[7 + k])
