# larder's build.
#
#   make            build everything (build/release)
#   make test       install what is missing, then run every test: the unit and
#                   integration suites in a plain build and under ASan and UBSan,
#                   the tests of threads under TSan, a bounded fuzzing run, lint,
#                   and the systemd units under a real systemd (check-systemd)
#   make demo       run the main job end to end on a built-in dataset
#   make lint       clang-tidy and cppcheck
#   make fuzz       libFuzzer over the footer parser, the page decoders and
#                   the protocol's frames
#   make bench      every benchmark (bench-decode, ...; bench-nodes for many
#                   nodes)
#
# V=release|asan|ubsan|tsan|debug picks the build flavour; each has its own tree
# under build/.
SHELL := /bin/bash
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:

V ?= release
B := build/$(V)
CC := gcc

PQ_PKGS := snappy zlib libzstd liblz4 libbrotlidec
PQ_LIBS := $(shell pkg-config --libs $(PQ_PKGS) 2>/dev/null)

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-missing-field-initializers
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE $(WARN) -g -fPIC -pthread -MMD -MP
ifeq ($(V),release)
  OPT := -O2
else ifeq ($(V),asan)
  OPT := -O1 -fsanitize=address -fno-omit-frame-pointer
else ifeq ($(V),ubsan)
  OPT := -O1 -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(V),tsan)
  # gcc warns (an error here) that TSan ignores atomic_thread_fence: those
  # fences pair liblarder with larderd across processes, through shared
  # memory, which TSan cannot see either way.
  OPT := -O1 -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan
else ifeq ($(V),debug)
  OPT := -O0
else
  $(error unknown build flavour V=$(V))
endif
CFLAGS := $(CFLAGS_BASE) $(OPT) $(EXTRA_CFLAGS)
LDFLAGS := $(OPT) -pthread

GEN := $(B)/gen
PROTO_C := $(GEN)/larder.pb-c.c
PROTO_H := $(GEN)/larder.pb-c.h
CFLAGS += -I$(GEN) -Idaemon -Iclient

# CUDA streams (client/cuda.c, daemon/serve/cuda.c): the driver is loaded at run
# time (dlopen), so only the toolkit's cuda.h is needed to build them.
# Without it everything else builds, and CUDA streams are refused with
# LARDER_EUNSUPPORTED.
CUDA_HOME ?= /usr/local/cuda
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
  CUDA_CFLAGS := -DLARDER_HAVE_CUDA_H -I$(CUDA_HOME)/include
else
  CUDA_CFLAGS :=
  ifeq ($(filter clean deps,$(MAKECMDGOALS)),)
    $(info larder: no $(CUDA_HOME)/include/cuda.h: building without the CUDA path (CUDA streams are refused; set CUDA_HOME))
  endif
endif
CFLAGS += $(CUDA_CFLAGS)
FAKE_CUDA := $(B)/lib/fake-cuda/libcuda.so.1

DAEMON_PKGS := libuv rocksdb libprotobuf-c inih libsystemd libcurl expat
DAEMON_LIBS := $(shell pkg-config --libs $(DAEMON_PKGS) 2>/dev/null)
CLIENT_LIBS := $(shell pkg-config --libs libprotobuf-c 2>/dev/null) -ldl
# larderctl reads the daemon's JSON events with jansson.
CTL_LIBS := $(shell pkg-config --libs jansson 2>/dev/null)

PQ_SRCS := $(sort $(wildcard daemon/parquet/*.c))
COMMON_SRCS := client/error.c
# Every daemon module but main.c: the daemon links them, and so do the
# unit tests.
DAEMON_STAGES := fetch cache plan serve
DAEMON_LIB_SRCS := $(filter-out daemon/main.c,$(sort $(wildcard daemon/*.c $(DAEMON_STAGES:%=daemon/%/*.c))))
CLIENT_SRCS := client/larder.c client/batch.c client/export.c client/wire.c client/error.c client/cuda.c
CTL_SRCS := client/ctl/larderctl.c client/ctl/ctl_parquet.c client/ctl/ctl_daemon.c
TEST_SRCS := tests/runner.c $(sort $(wildcard tests/test-*.c))
TEST_SRCS += tests/pqwrite.c tests/daemon-harness.c tests/remote-harness.c tests/remote/rs.c

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))
PROTO_O := $(B)/obj/gen/larder.pb-c.o

PQ_LIB := $(B)/lib/libpq.a
LIBLARDER_A := $(B)/lib/liblarder.a
LIBLARDER_SO := $(B)/lib/liblarder.so
LARDERD := $(B)/bin/larderd
LARDERCTL := $(B)/bin/larderctl
EXAMPLE_TRAINER := $(B)/bin/example-trainer
RUN_TESTS := $(B)/bin/run-tests
BENCH_DECODE := $(B)/bin/bench-decode
LABEL_MIX := $(B)/bin/label-mix
SERVE_CLIENT := $(B)/bin/serve-client
BENCH_STORE := $(B)/bin/bench-store
BENCH_CUDA := $(B)/bin/bench-cuda

# The Python package's optional extension (client/python/larder/_views.c:
# a batch's numpy views in one call), for $(PYTHON) and against its numpy,
# beside liblarder where the package looks for it.  Built with plain flags
# in every flavour (an interpreter cannot load a sanitized module), and
# skipped where python3-dev or numpy is missing: the package then runs
# without it.
PYTHON ?= /usr/bin/python3
PY_EXT_SUFFIX := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX") or "")' 2>/dev/null)
PY_INCLUDE := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_NUMPY_INCLUDE := $(shell $(PYTHON) -c 'import numpy; print(numpy.get_include())' 2>/dev/null)
PY_CAN_BUILD := $(and $(PY_EXT_SUFFIX),$(wildcard $(PY_INCLUDE)/Python.h),$(PY_NUMPY_INCLUDE))
PY_VIEWS := $(if $(PY_CAN_BUILD),$(B)/lib/larder/_views$(PY_EXT_SUFFIX))
# The one make install takes, whatever the flavour of the make that runs it.
PY_VIEWS_RELEASE := $(if $(PY_CAN_BUILD),build/release/lib/larder/_views$(PY_EXT_SUFFIX))
PY_VIEWS_CFLAGS := -I$(PY_INCLUDE) -I$(PY_NUMPY_INCLUDE)

$(B)/lib/larder/_views$(PY_EXT_SUFFIX): client/python/larder/_views.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(WARN) -O2 -g -fPIC -shared $(PY_VIEWS_CFLAGS) $< -o $@

.PHONY: all deps test check check-unit check-compat check-config check-python check-readme demo lint fuzz fuzz-build \
        bench bench-decode bench-serve bench-remote bench-store clean

all: $(LARDERD) $(LARDERCTL) $(LIBLARDER_SO) $(LIBLARDER_A) $(EXAMPLE_TRAINER) \
     $(RUN_TESTS) $(BENCH_DECODE) $(if $(CUDA_CFLAGS),$(FAKE_CUDA) $(BENCH_CUDA)) \
     $(if $(filter release,$(V)),$(PY_VIEWS))

# Generated protobuf-c code, built from proto/ and never committed.
$(PROTO_C) $(PROTO_H): proto/larder.proto
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) -Iproto proto/larder.proto

$(PROTO_O): $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Werror,$(CFLAGS)) -Wno-unused-parameter -c $< -o $@

$(B)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(PQ_LIB): $(call obj,$(PQ_SRCS))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIBLARDER_A): $(call obj,$(CLIENT_SRCS)) $(PROTO_O)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIBLARDER_SO): $(call obj,$(CLIENT_SRCS)) $(PROTO_O)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,liblarder.so.0 $^ $(CLIENT_LIBS) -o $@

$(LARDERD): $(call obj,daemon/main.c $(DAEMON_LIB_SRCS)) $(PQ_LIB) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(PQ_LIBS) $(DAEMON_LIBS) -ldl -lm -o $@

$(LARDERCTL): $(call obj,$(CTL_SRCS)) $(PQ_LIB) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(PQ_LIBS) $(CLIENT_LIBS) $(CTL_LIBS) -lm -o $@

$(EXAMPLE_TRAINER): $(call obj,client/example-trainer.c) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(CLIENT_LIBS) -lm -o $@

$(RUN_TESTS): $(call obj,$(TEST_SRCS) $(DAEMON_LIB_SRCS)) $(PQ_LIB) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(PQ_LIBS) -lbrotlienc $(DAEMON_LIBS) -ldl -lm -o $@

# The test double of the CUDA driver (tests/cuda-fake/): "device memory" in
# shared memory, IPC across processes.  The tests load it through
# LARDER_LIBCUDA, the path larderd and liblarder dlopen.  Built without
# sanitizers: it is loaded into processes of every flavour.
$(FAKE_CUDA): tests/cuda-fake/fake-cuda.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -g -O1 -fPIC -shared $(CUDA_CFLAGS) \
	  -Wl,-soname,libcuda.so.1 $< -pthread -o $@

$(BENCH_CUDA): $(call obj,bench/bench-cuda.c) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(CLIENT_LIBS) -lm -o $@

$(BENCH_DECODE): $(call obj,bench/bench-decode.c) $(PQ_LIB) $(call obj,$(COMMON_SRCS))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(PQ_LIBS) -lm -o $@

$(SERVE_CLIENT): $(call obj,bench/serve-client.c) $(LIBLARDER_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(CLIENT_LIBS) -lm -o $@

$(BENCH_STORE): $(call obj,bench/bench-store.c daemon/cache/store.c daemon/cache/index.c daemon/cache/crc32c.c daemon/util.c daemon/log.c client/error.c)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(DAEMON_LIBS) -lm -o $@

$(LABEL_MIX): $(call obj,bench/label-mix.c daemon/plan/shuffle.c client/error.c)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -lm -o $@

-include $(shell find build/$(V)/obj -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------------------
# Tests

deps:
	@scripts/deps.sh

# The whole suite, as CI runs it: dependencies first (in a separate make so
# that pkg-config sees freshly installed packages), then each flavour.
test: deps
	$(MAKE) --no-print-directory V=release check
	$(MAKE) --no-print-directory V=asan check
	$(MAKE) --no-print-directory V=ubsan check
	$(MAKE) --no-print-directory V=tsan check-threads
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=120
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory check-readme
	$(MAKE) --no-print-directory V=release check-systemd
	@echo "make test: all suites passed"

check: check-unit check-compat check-config $(if $(filter release,$(V)),check-python)
# No daemon a check starts may ask the instance metadata service
# (169.254.169.254) for credentials; the tests of that source point it at a
# loopback fake.
check check-unit check-python check-compat check-config check-threads: \
  export AWS_EC2_METADATA_DISABLED := true

# Python against a real larderd, with Debian's python3 (numpy, torch and
# pytest from deps.sh): the larder package and its PyTorch dataset
# (tests/python/test_larder.py, test_torch.py), and liblarder through raw
# ctypes (test_ctypes.py: the ABI of the options and Arrow structs, values
# against larderctl cat, exports, resume, fork, a killed client, errors),
# which test_larder.py runs; the package again without its extension
# (LARDER_PURE_PYTHON=1), as it runs where none is built.  Release builds
# only: Python cannot load an ASan library without preloading its runtime.
check-python: $(LIBLARDER_SO) $(LARDERD) $(LARDERCTL) $(PY_VIEWS)
	LARDER_BUILD_DIR=$(B) $(PYTHON) -m pytest -q -p no:cacheprovider tests/python
	$(if $(PY_VIEWS),LARDER_PURE_PYTHON=1 LARDER_BUILD_DIR=$(B) $(PYTHON) -m pytest -q \
	  -p no:cacheprovider tests/python/test_larder.py tests/python/test_torch.py)

# config/larderd.conf.example documents every key with its default; it is
# generated by `larderd --help-config` and must not drift from it.
check-config: $(LARDERD)
	@$(LARDERD) --help-config | diff -u config/larderd.conf.example - \
	  && echo "config/larderd.conf.example matches larderd --help-config"

# The daemon's integration tests (test-daemon*.c) run the larderd of the
# same flavour, and the CLI tests its larderctl.
check-unit: $(RUN_TESTS) $(LARDERD) $(LARDERCTL) $(EXAMPLE_TRAINER) $(if $(CUDA_CFLAGS),$(FAKE_CUDA))
	LARDER_TEST_DATA=tests/data LARDERD_BIN=$(LARDERD) LARDERCTL_BIN=$(LARDERCTL) $(RUN_TESTS)

# The tests whose threads share a client or a stream, under ThreadSanitizer
# (V=tsan): releases and Arrow exports on other threads, event loops, fork,
# CUDA streams (workers copying batches to the device),
# close during releases, SIGTERM mid-stream, the chaos mix, and workers
# decoding from row groups that another projection's fetch lends or that
# the staging area holds (a damaged copy among them); larderd is
# built with TSan too.  RocksDB is not, so its own atomics look like races
# to TSan: tests/tsan.supp leaves them out.  Address randomization is off:
# TSan's fixed shadow layout fails to start under the larger mmap entropy
# of some kernels.
THREAD_TESTS := client_ cuda_ daemon_footers_shared daemon_release_ daemon_reader_moves daemon_close_release_threads daemon_evloop \
                daemon_ring_wakeups daemon_client_patterns daemon_robust_bad_release \
                daemon_robust_chaos daemon_robust_sigterm_streams daemon_robust_corrupt_file \
                daemon_cache_changed_file remote_shared_projections remote_staged_damaged
check-threads: $(RUN_TESTS) $(LARDERD) $(LARDERCTL) $(if $(CUDA_CFLAGS),$(FAKE_CUDA))
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	  LARDER_TEST_DATA=tests/data LARDERD_BIN=$(LARDERD) LARDERCTL_BIN=$(LARDERCTL) \
	  setarch $(shell uname -m) -R $(RUN_TESTS) $(THREAD_TESTS)

TEST_WORK ?= tests/work
# The units under a real systemd (PID 1 in a systemd-nspawn container of
# Debian 12, made once with debootstrap): socket activation, a trainer of
# another user, reload, restart, stop.  Skipped, saying why, where no
# container can boot.
.PHONY: check-systemd
check-systemd: $(LARDERD) $(LARDERCTL) $(EXAMPLE_TRAINER) $(LIBLARDER_SO)
	tests/systemd/nspawn-check.sh $(B) $(TEST_WORK)/nspawn

# The README's two commands as written, from a clean clone of HEAD.
check-readme:
	tests/readme.sh $(TEST_WORK)/readme

check-compat: $(LARDERCTL)
	tests/compat.sh $(LARDERCTL) $(TEST_WORK)/compat-$(V)

# ---------------------------------------------------------------------------
# Fuzzing (clang's libFuzzer with ASan and UBSan)

FUZZ_SECONDS ?= 300
FUZZ_B := build/fuzz
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
               -fno-sanitize-recover=undefined -Wall -Wextra -Werror
FUZZ_TARGETS := fuzz-footer fuzz-pages fuzz-wire fuzz-ring

fuzz-build: $(addprefix $(FUZZ_B)/,$(FUZZ_TARGETS))

$(FUZZ_B)/fuzz-%: tests/fuzz/fuzz-%.c $(PQ_SRCS) $(COMMON_SRCS) $(wildcard daemon/*.h daemon/parquet/*.h)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Idaemon -Iclient $< $(PQ_SRCS) $(COMMON_SRCS) $(PQ_LIBS) -lm -o $@

# The protocol's frames, as a peer sends them (client/wire.c and the
# generated protobuf-c code).
$(FUZZ_B)/fuzz-wire: tests/fuzz/fuzz-wire.c client/wire.c client/error.c $(PROTO_C) client/wire.h
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Wno-unused-parameter -I$(GEN) -Iclient $< client/wire.c client/error.c \
	  $(PROTO_C) $(CLIENT_LIBS) -o $@

# The descriptor ring as both sides read it (client/ring.h), and
# liblarder's checks of a descriptor against the stream's arena before it
# builds arrays (client/internal.h): all of liblarder, without CUDA.
$(FUZZ_B)/fuzz-ring: tests/fuzz/fuzz-ring.c $(CLIENT_SRCS) $(PROTO_C) $(wildcard client/*.h)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -Wno-unused-parameter -Wno-missing-field-initializers -pthread -I$(GEN) \
	  -Iclient $< $(CLIENT_SRCS) $(PROTO_C) $(CLIENT_LIBS) -o $@

# Each target gets an equal share of the time; the corpus starts from the
# seeds run.sh makes, the inputs that once found a bug (tests/fuzz/regress/)
# and whatever earlier runs found.
fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_B) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ---------------------------------------------------------------------------
# Lint

# Every C source of the daemon and the clients.  (Several include the
# generated protobuf header, hence the dependency on it.)
LINT_SRCS := $(sort $(PQ_SRCS) $(DAEMON_LIB_SRCS) daemon/main.c $(CLIENT_SRCS) $(CTL_SRCS) \
               client/example-trainer.c)
# One clang-tidy process per file: clang-tidy 14 carries state from file to
# file in one process, and crashed (in its comment parser) on this list.
# The house style (.clang-format): every C file of ours, sources and tests.
FORMAT_SRCS := $(sort $(wildcard daemon/*.[ch] daemon/*/*.[ch] client/*.[ch] client/ctl/*.[ch] \
                 tests/*.[ch] tests/fuzz/*.c tests/remote/*.[ch] tests/cuda-fake/*.c bench/*.[ch] \
                 client/python/larder/*.c))
lint: $(PROTO_H)
	clang-format --dry-run --Werror $(FORMAT_SRCS)
	@rc=0; for f in $(LINT_SRCS); do \
	  clang-tidy --quiet $$f -- -std=c11 -D_GNU_SOURCE -I$(GEN) -Idaemon -Iclient $(CUDA_CFLAGS) || rc=1; \
	done; $(if $(PY_VIEWS),clang-tidy --quiet client/python/larder/_views.c -- -std=c11 $(PY_VIEWS_CFLAGS) || rc=1;) \
	exit $$rc
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --inline-suppr --suppress=missingIncludeSystem -Idaemon -Iclient -D__GNUC__ $(if $(CUDA_CFLAGS),-DLARDER_HAVE_CUDA_H) $(LINT_SRCS)

# ---------------------------------------------------------------------------
# Benchmarks

bench: bench-decode bench-serve bench-store bench-shuffle bench-remote bench-nodes

# Remote shards from nginx behind a bandwidth cap (tests/remote): epoch-1
# throughput against curl, time to first batch, stalls, remote bytes.
.PHONY: bench-remote
bench-remote: deps
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/bin/serve-client
	bench/bench-remote.sh build/release

bench-serve: deps
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/bin/serve-client
	bench/bench-serve.sh build/release

# The cache's put rate, which bounds how fast a cold epoch fills it on any
# number of cores; BENCH_STORE_DIR (default /var/tmp) should be on the
# cache's disk.
bench-store: deps
	$(MAKE) --no-print-directory V=release $(BENCH_STORE)
	d=$$(mktemp -d $${BENCH_STORE_DIR:-/var/tmp}/larder-bench-store.XXXXXX) && \
	  { $(BENCH_STORE) "$$d"; rc=$$?; rm -rf "$$d"; exit $$rc; }

bench-decode: deps
	$(MAKE) --no-print-directory V=release $(BENCH_DECODE)
	bench/bench-decode.sh $(BENCH_DECODE)

# Many nodes simulated on one machine: object-store egress and cache per
# node for 1, 2 and 4 nodes with node partitions, against the dataset.
.PHONY: bench-nodes
bench-nodes: deps
	$(MAKE) --no-print-directory V=release $(LARDERD) $(LARDERCTL) $(EXAMPLE_TRAINER)
	bench/bench-nodes.sh build/release

# Label mixing of the shuffle on sorted synthetic datasets (no files needed).
.PHONY: bench-shuffle
bench-shuffle:
	$(MAKE) --no-print-directory V=release build/release/bin/label-mix
	build/release/bin/label-mix

# A PyTorch training loop fed by larder on a GPU, against the same loop fed
# from host memory: the GPU's idle time that larder adds.  It needs python3
# with torch and a CUDA device; without them it runs a host stand-in that
# checks the bindings only.  Not part of `make bench`: a GPU host rarely has
# Debian's libraries, so it usually runs from a bundle (bench/bundle.sh; see
# bench/README.md).  BENCH_SOURCE as for bench-serve.
.PHONY: bench-torch
bench-torch: deps
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/lib/liblarder.so
	@src=$${BENCH_SOURCE:-bench/work/zstd-v1.parquet}; \
	  if [ -z "$${BENCH_SOURCE:-}" ] && [ ! -f "$$src" ]; then \
	    (cd bench && { [ -d node_modules/@duckdb ] || npm ci --no-audit --no-fund --loglevel=error; }) && \
	    node bench/gen-dataset.mjs bench/work >/dev/null; fi; \
	  python3 bench/torch-trainer.py build/release "$$src"

# The CUDA handoff on a real GPU host (not part of `make bench`; no GPU is
# needed to build it): HtoD bandwidth larder achieves per GPU beside a
# plain cuMemcpyHtoD from pinned memory, the daemon's CPU per batch on the
# CUDA path beside the host path, and a trainer's stall at a step just over
# that cost.  From a bundle: see bench/bundle.sh and tests/cuda-real.sh.
.PHONY: bench-cuda
bench-cuda: deps
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/bin/bench-cuda
	bench/bench-cuda.sh build/release

# ---------------------------------------------------------------------------

demo: deps
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/bin/larderctl \
	  build/release/bin/example-trainer
	scripts/demo.sh build/release

# ---------------------------------------------------------------------------
# Install: PREFIX (default /usr/local) and DESTDIR as usual.

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
DATADIR ?= $(PREFIX)/share
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
# The larder Python package goes where Debian's python3 looks for packages
# of this prefix: /usr/lib/python3/dist-packages for /usr, else
# PREFIX/lib/python3.X/dist-packages (/usr/local's is on its sys.path).
PYTHONDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)/dist-packages)

.PHONY: install
install:
	$(MAKE) --no-print-directory V=release build/release/bin/larderd build/release/bin/larderctl \
	  build/release/lib/liblarder.so build/release/lib/liblarder.a build/release/bin/example-trainer
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(SYSCONFDIR)/larder \
	  $(DESTDIR)$(DATADIR)/doc/larder
	install -m 0755 build/release/bin/larderd build/release/bin/larderctl $(DESTDIR)$(BINDIR)/
	install -m 0755 build/release/bin/example-trainer $(DESTDIR)$(BINDIR)/larder-example-trainer
	install -m 0644 build/release/lib/liblarder.so $(DESTDIR)$(LIBDIR)/liblarder.so.0
	ln -sf liblarder.so.0 $(DESTDIR)$(LIBDIR)/liblarder.so
	install -m 0644 build/release/lib/liblarder.a $(DESTDIR)$(LIBDIR)/
	install -m 0644 client/larder.h $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	  config/larder.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/larder.pc
	for u in larderd.service larderd.socket; do \
	  sed -e 's|@BINDIR@|$(BINDIR)|g; s|@SYSCONFDIR@|$(SYSCONFDIR)|g; s|@DATADIR@|$(DATADIR)|g' systemd/$$u.in \
	    > $(DESTDIR)$(UNITDIR)/$$u; chmod 0644 $(DESTDIR)$(UNITDIR)/$$u; done
	install -m 0644 systemd/larder.sysusers $(DESTDIR)$(SYSUSERSDIR)/larder.conf
	install -m 0644 config/larderd.conf.example $(DESTDIR)$(DATADIR)/doc/larder/
	test -e $(DESTDIR)$(SYSCONFDIR)/larder/larderd.conf || \
	  install -m 0644 config/larderd.conf.example $(DESTDIR)$(SYSCONFDIR)/larder/larderd.conf
	install -m 0644 README.md $(DESTDIR)$(DATADIR)/doc/larder/
	install -d $(DESTDIR)$(PYTHONDIR)/larder
	install -m 0644 client/python/larder/*.py $(DESTDIR)$(PYTHONDIR)/larder/
	$(if $(PY_VIEWS_RELEASE),$(MAKE) --no-print-directory V=release $(PY_VIEWS_RELEASE) && \
	  install -m 0644 $(PY_VIEWS_RELEASE) $(DESTDIR)$(PYTHONDIR)/larder/)
	printf '# Written by make install: where liblarder was installed.\nLIBDIR = "%s"\n' '$(LIBDIR)' \
	  > $(DESTDIR)$(PYTHONDIR)/larder/_config.py

clean:
	rm -rf build
