TEST_ENTRY(wire_batch_fast_path, 30000)
TEST_ENTRY(wire_batch_fast_path_declines, 5000)
TEST_ENTRY(wire_decode_budget, 30000)
TEST_ENTRY(ring_pace_sleep_policy, 5000)
