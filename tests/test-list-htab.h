/* The growing hash table (test-htab.c). */
TEST_ENTRY(htab_flat_ops, 60000)
TEST_ENTRY(htab_empty_and_misuse, 10000)
