/*
 * crc32c.h: CRC32C (Castagnoli), the checksum of every cached value
 * (prefix cache_crc32c; internal to daemon/cache).
 *
 * Conventions
 * -----------
 * - Pure: the result depends on the arguments alone; no allocation, no
 *   errors.  Any thread (the tables are built once, on first use).
 * - Uses the SSE4.2 instruction when the CPU has it, else slicing-by-8
 *   tables; both give the same result (tests/test-store.c compares them
 *   through the store_test_crc32c_* hooks defined in crc32c.c).
 * - Depends on nothing else in the daemon.  store.c calls it, and offers it
 *   as store_crc32c (store.h) to the rest of the daemon and to the tests.
 */
#ifndef LARDER_CACHE_CRC32C_H
#define LARDER_CACHE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of len bytes at data, continuing from crc (0 to start).  Any
 * thread. */
uint32_t cache_crc32c(uint32_t crc, const void *data, size_t len);

#endif /* LARDER_CACHE_CRC32C_H */
