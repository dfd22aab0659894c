/* Every test, with its timeout in milliseconds, one file per feature. */
#include "test-list-codec.h"
