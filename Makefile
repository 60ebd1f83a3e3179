# im_sync — PGXS build of the extension plus the gateway, and the project's
# own driver targets (check, run, demo, bench).  PGXS's own `check` only
# prints "not supported", so PGXS is included only for the build goals; the
# driver goals call back into this Makefile for the build.

EXTENSION   = im_sync
MODULE_big  = im_sync
OBJS        = $(patsubst %.c,%.o,$(wildcard extension/*.c))
DATA        = $(wildcard extension/im_sync--*.sql)
PG_CPPFLAGS = -Iextension -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
SHLIB_LINK  = $(filter -lcrypto -lssl,$(LIBS))
PG_CONFIG  ?= pg_config
# No LLVM bitcode: faster builds, no clang needed to install the extension.
override with_llvm = no
# Rebuild a .c whenever a header it includes changes (gcc -MMD; PGXS reads
# the .deps files): a stale object holding an old SQL macro is a wrong build.
override autodepend = yes

DRIVER_GOALS = check run demo bench deps drills fuzz

ifeq ($(filter $(DRIVER_GOALS),$(MAKECMDGOALS)),)
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

all: gateway
.PHONY: gateway
gateway:
	$(MAKE) -C gateway PG_CONFIG=$(PG_CONFIG)
clean: clean-gateway
clean-gateway:
	-$(MAKE) -C gateway clean
else
.PHONY: $(DRIVER_GOALS)
# Installs missing Debian packages (sudo only when not root).
deps:
	@bash test/install_deps.sh
build-and-install: deps
	$(MAKE) all
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) install; else sudo $(MAKE) install; fi
check: build-and-install
	@bash test/run_checks.sh
run: build-and-install
	@bash test/run_system.sh
demo: build-and-install
	@bash test/run_demo.sh
bench: build-and-install
	@bash test/bench/run_all.sh
drills: build-and-install
	@IM_SUITES=drills bash test/run_checks.sh
fuzz: deps
	$(MAKE) -C gateway fuzz-long
endif
