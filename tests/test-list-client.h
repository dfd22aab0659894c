/* liblarder's own behaviour (test-client.c): fork safety, a batch
 * released twice or exported twice, stall accounting, frame mode with
 * several streams, a dead daemon, the rank variables, NULL vectors, the
 * checks of what a (fake) daemon sends, a map's export, and
 * larder_batch_describe. */
TEST_ENTRY(client_fork_releases, 120000)
TEST_ENTRY(client_option_ranges, 60000)
TEST_ENTRY(client_dlpack_buffer_refs, 60000)
TEST_ENTRY(client_export_then_release, 60000)
TEST_ENTRY(client_evloop_stall, 60000)
TEST_ENTRY(client_frames_two_streams_wait, 60000)
TEST_ENTRY(client_flush_dead_daemon, 60000)
TEST_ENTRY(client_closed_message, 60000)
TEST_ENTRY(client_local_rank_host, 60000)
TEST_ENTRY(client_rank_env, 60000)
TEST_ENTRY(client_open_null_vectors, 60000)
TEST_ENTRY(client_fake_bad_buffers, 30000)
TEST_ENTRY(client_fake_bad_descriptor, 30000)
TEST_ENTRY(client_fake_shm_checks, 30000)
TEST_ENTRY(client_fake_ring_rewritten, 30000)
TEST_ENTRY(client_fake_large_types, 30000)
TEST_ENTRY(client_fake_map_keys, 30000)
TEST_ENTRY(client_batch_describe, 30000)
