# im_sync — PGXS build of the extension plus the gateway, and the project's
# own driver targets (check, run, demo, bench).  PGXS's own `check` only
# prints "not supported", so PGXS is included only for the build goals; the
# driver goals call back into this Makefile for the build.

EXTENSION   = im_sync
MODULE_big  = im_sync
OBJS        = $(patsubst %.c,%.o,$(wildcard extension/*.c))
DATA        = $(wildcard extension/im_sync--*.sql)
# The router extension (contract §15): SQL over PL/Proxy, and its own
# library built in extension/router/ (linked with libpq).  PGXS installs
# only EXTENSION's control from the top directory, so the router's control
# file and scripts go with DATA into the same extension directory; `make`,
# `make install` and `make clean` also run in extension/router/.
DATA       += extension/im_sync_router.control $(wildcard extension/im_sync_router--*.sql)
PG_CPPFLAGS = -Iextension -Iextension/include -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
# The catalog version the library serves is im_sync.control's default_version
# (version_check.c: workers wait while the installed extversion differs).
IM_LIBRARY_VERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" im_sync.control)
PG_CPPFLAGS += -DIM_LIBRARY_VERSION='"$(IM_LIBRARY_VERSION)"'
SHLIB_LINK  = $(filter -lcrypto -lssl,$(LIBS))
PG_CONFIG  ?= pg_config
# No LLVM bitcode: faster builds, no clang needed to install the extension.
override with_llvm = no
# Rebuild a .c whenever a header it includes changes (gcc -MMD; PGXS reads
# the .deps files): a stale object holding an old SQL macro is a wrong build.
override autodepend = yes

# The ecosystem's entry point (make installcheck, Debian's pg_buildext):
# the regression and isolation suites against an installed, running server
# (PGHOST/PGPORT) that preloads im_sync.  Its workers serve im_sync.database
# only, so they leave the test databases alone.  `make check` is ours.
REGRESS      = $(sort $(basename $(notdir $(wildcard sql/*.sql))))
REGRESS_OPTS = --inputdir=. --load-extension=btree_gist --load-extension=im_sync
ISOLATION    = $(sort $(basename $(notdir $(wildcard test/isolation/specs/*.spec))))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=btree_gist --load-extension=im_sync

DRIVER_GOALS = check run demo bench deps drills fuzz

ifeq ($(filter $(DRIVER_GOALS),$(MAKECMDGOALS)),)
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
# the database names the tests use (sql/*.sql reconnect to im_regress);
# after the include, which sets PGXS's defaults
CONTRIB_TESTDB   = im_regress
ISOLATION_TESTDB = im_isolation

all: gateway router
# the version is compiled in from the control file
extension/version_check.o: im_sync.control
.PHONY: gateway
gateway:
	$(MAKE) -C gateway PG_CONFIG=$(PG_CONFIG)
clean: clean-gateway clean-router
clean-gateway:
	-$(MAKE) -C gateway clean
.PHONY: router install-router clean-router
router:
	$(MAKE) -C extension/router PG_CONFIG=$(PG_CONFIG)
install: install-router
install-router: router
	$(MAKE) -C extension/router install PG_CONFIG=$(PG_CONFIG)
clean-router:
	-$(MAKE) -C extension/router clean PG_CONFIG=$(PG_CONFIG)
else
.PHONY: $(DRIVER_GOALS)
# Installs missing Debian packages (sudo only when not root).
deps:
	@bash test/install_deps.sh
	@bash test/install_node_deps.sh
build-and-install: deps
	$(MAKE) all
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) install; else sudo $(MAKE) install; fi
check: build-and-install
	@bash test/run_checks.sh
# make run SHARDS=3: three nodes and a router (issue 15, test/shards.sh)
run: build-and-install
	@SHARDS='$(SHARDS)' bash test/run_system.sh
demo: build-and-install
	@bash test/run_demo.sh
# make bench BENCH_ARGS=--fsync-off: the old fsync = off variant, for comparison
bench: build-and-install
	@bash test/bench/run_all.sh $(BENCH_ARGS)
drills: build-and-install
	@IM_SUITES=drills bash test/run_checks.sh
fuzz: deps
	$(MAKE) -C gateway fuzz-long
endif
