TEST_ENTRY(config_rejects_out_of_range, 10000)
