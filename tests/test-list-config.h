TEST_ENTRY(config_rejects_out_of_range, 10000)
TEST_ENTRY(config_long_lines, 10000)
TEST_ENTRY(config_refuses_junk_lines, 10000)
