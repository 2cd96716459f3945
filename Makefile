# GNU make entry point.  BSD make: bmake -f Makefile.bsd (same targets).
# The build itself is described once, in c_src/build.mk.
PRIV ?= priv
BUILD ?= _build/c
MAKEVARS = $(BUILD)/makevars.mk
SUBMAKE = $(MAKE) --no-print-directory -f c_src/build.mk PRIV=$(PRIV) BUILD=$(BUILD) MAKEVARS=$(MAKEVARS)

# aarch64 (glibc), cross-built with Debian's gcc-aarch64-linux-gnu and the
# arm64 multiarch libraries, tested under qemu-user (bin/install-deps
# installs them all): the preload, the NIF and the C tests in AARCH64_BUILD.
AARCH64_BUILD = _build/c-aarch64
AARCH64_CC = aarch64-linux-gnu-gcc
AARCH64_EMULATOR = qemu-aarch64-static
AARCH64_SYSROOT = /usr/aarch64-linux-gnu
AARCH64_LIBS = /usr/aarch64-linux-gnu/lib:/usr/lib/aarch64-linux-gnu
AARCH64_MAKE = $(MAKE) --no-print-directory -f c_src/build.mk CC=$(AARCH64_CC) \
	PRIV=$(AARCH64_BUILD)/priv BUILD=$(AARCH64_BUILD) MAKEVARS=$(AARCH64_BUILD)/makevars.mk \
	EMULATOR=$(AARCH64_EMULATOR) EMULATOR_SYSROOT=$(AARCH64_SYSROOT) EMULATOR_LIBS=$(AARCH64_LIBS)

# Each goal runs a sub-make of its own: under -j two of them would build
# the same libraries at once (the sub-makes themselves still run in parallel).
.NOTPARALLEL:

.PHONY: all fixtures ctest ctest-asan ctest-tsan ctest-valgrind ctest-musl ctest-aarch64 test bench bench-build clean

all fixtures ctest ctest-asan ctest-tsan ctest-valgrind: $(MAKEVARS)
	+$(SUBMAKE) $@

$(MAKEVARS): c_src/makevars.sh
	@mkdir -p $(BUILD)
	sh c_src/makevars.sh $@

# The C tests built with musl-gcc (Debian: musl-tools) into their own tree.
MUSL_CC ?= musl-gcc
MUSL_BUILD ?= _build/c-musl

ctest-musl: $(MUSL_BUILD)/makevars.mk
	+$(MAKE) --no-print-directory -f c_src/build.mk PRIV=$(MUSL_BUILD)/priv BUILD=$(MUSL_BUILD) \
		MAKEVARS=$(MUSL_BUILD)/makevars.mk $@

$(MUSL_BUILD)/makevars.mk: c_src/makevars.sh
	@command -v $(MUSL_CC) >/dev/null 2>&1 || \
		{ echo "mtrace: $(MUSL_CC) not found (Debian: apt-get install musl-tools)" >&2; exit 1; }
	@mkdir -p $(MUSL_BUILD)
	CC=$(MUSL_CC) sh c_src/makevars.sh $@

ctest-aarch64: $(AARCH64_BUILD)/makevars.mk
	+$(AARCH64_MAKE) ctest-emulated

$(AARCH64_BUILD)/makevars.mk: c_src/makevars.sh
	@mkdir -p $(AARCH64_BUILD)
	CC=$(AARCH64_CC) sh c_src/makevars.sh $@

test:
	bin/test

bench: $(MAKEVARS)
	+$(SUBMAKE) bench-c

# The benchmarks' programs only, for bench/compare.sh.
bench-build: $(MAKEVARS)
	+$(SUBMAKE) bench-build

clean:
	rm -rf $(BUILD) $(MUSL_BUILD) $(AARCH64_BUILD) $(PRIV)/mtrace.so $(PRIV)/mtrace_nif.so
