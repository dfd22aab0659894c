/* CUDA streams (test-cuda.c), against the test double of the driver
 * (tests/cuda-fake/) or, from tests/cuda-real.sh, a real GPU: the bytes
 * against a host stream's, the exports, a stream closed with batches
 * held, a killed trainer, two devices, a trainer of another user and one
 * in a PID namespace of its own (on a GPU), renumbered devices, a copy
 * that fails, the errors, no driver. */
TEST_ENTRY(cuda_values_match, 180000)
TEST_ENTRY(cuda_small_arena, 120000)
TEST_ENTRY(cuda_exports, 120000)
TEST_ENTRY(cuda_close_holding, 120000)
TEST_ENTRY(cuda_client_closed_holding, 120000)
TEST_ENTRY(cuda_held_regions_limit, 120000)
TEST_ENTRY(cuda_held_regions_bytes, 120000)
TEST_ENTRY(cuda_open_off_loop, 120000)
TEST_ENTRY(cuda_open_replies_unread, 120000)
TEST_ENTRY(cuda_release_fenced, 120000)
TEST_ENTRY(cuda_region_too_small, 60000)
TEST_ENTRY(cuda_trainer_killed, 120000)
TEST_ENTRY(cuda_fd_handles, 180000)
TEST_ENTRY(cuda_two_devices, 120000)
TEST_ENTRY(cuda_other_user, 120000)
TEST_ENTRY(cuda_pid_namespace, 120000)
TEST_ENTRY(cuda_visible_devices, 120000)
TEST_ENTRY(cuda_copy_fails, 120000)
TEST_ENTRY(cuda_errors, 120000)
TEST_ENTRY(cuda_no_driver, 120000)
