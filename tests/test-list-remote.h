/* Remote sources (test-remote-*.c): each starts loopback servers from
 * tests/remote (nginx, the S3 front, the fault proxy) and a real larderd. */
TEST_ENTRY(remote_http_order, 120000)
TEST_ENTRY(remote_http_no_range, 120000)
TEST_ENTRY(remote_https, 120000)
TEST_ENTRY(remote_mixed, 120000)
TEST_ENTRY(remote_revalidate, 180000)
TEST_ENTRY(remote_s3_listing, 120000)
TEST_ENTRY(remote_s3_credentials, 180000)
TEST_ENTRY(remote_s3_errors, 120000)
TEST_ENTRY(remote_faults_transient, 180000)
TEST_ENTRY(remote_faults_s3_slowdown, 120000)
TEST_ENTRY(remote_faults_wrong_bytes, 120000)
TEST_ENTRY(remote_faults_permanent, 180000)
