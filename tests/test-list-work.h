TEST_ENTRY(work_pool_runs_tasks, 20000)
TEST_ENTRY(work_pool_wakes_sleeping_loop, 20000)
TEST_ENTRY(work_pool_stop_cancels_queued, 10000)
