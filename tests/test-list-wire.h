TEST_ENTRY(wire_batch_fast_path, 20000)
TEST_ENTRY(wire_batch_fast_path_hostile, 20000)
TEST_ENTRY(wire_batch_fast_path_declines, 5000)
