/*
 * test-config.c: larderd's configuration parser (daemon/config.c): values
 * outside a key's documented range are refused with a message naming the
 * key, whichever way they come (file, flag or reload all go through
 * config_set).
 */
#include <string.h>

#include "../daemon/config.h"
#include "larder.h"
#include "task.h"

static void expect_refused(const char *key, const char *value, const char *why) {
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[256] = "";
  ASSERT_EQ(config_set(&cfg, key, value, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, key);
  ASSERT_STR_CONTAINS(err, why);
  config_free(&cfg);
}

/* Bug fix: strtoull took "-1" as 2^64 - 1, so workers=-1 started a daemon
 * with no workers (streams got no batch and no error), and a negative
 * cache_capacity meant 16 EiB. */
TEST_IMPL(config_rejects_out_of_range) {
  expect_refused("workers", "-1", "negative");
  expect_refused("cache_capacity", "-5", "negative");
  expect_refused("memory_limit", " -1G", "negative");
  expect_refused("unit_rows", "70000", "outside 1 .. 65536");
  expect_refused("unit_rows", "0", "outside");
  expect_refused("workers", "100000", "outside");
  expect_refused("socket_mode", "077777", "outside");
  expect_refused("memory_limit", "12Q", "not a size");
  /* The bounds themselves are fine. */
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[256];
  ASSERT_OK(config_set(&cfg, "unit_rows", "65536", err, sizeof(err)));
  ASSERT_EQ(cfg.unit_rows, 65536);
  ASSERT_OK(config_set(&cfg, "workers", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "cache_capacity", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "memory_limit", "1", err, sizeof(err)));
  config_free(&cfg);
  return 0;
}
