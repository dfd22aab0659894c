

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
