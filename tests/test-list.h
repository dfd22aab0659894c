/* Every test, with its timeout in milliseconds, one file per feature. */
#include "test-list-codec.h"
#include "test-list-wire.h"
#include "test-list-parquet.h"
#include "test-list-shuffle.h"
#include "test-list-store.h"
#include "test-list-daemon.h"
#include "test-list-ctl.h"
#include "test-list-remote.h"
