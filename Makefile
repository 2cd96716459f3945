# GNU make entry point.  BSD make: bmake -f Makefile.bsd (same targets).
# The build itself is described once, in c_src/build.mk.
PRIV ?= priv
BUILD ?= _build/c
MAKEVARS = $(BUILD)/makevars.mk
SUBMAKE = $(MAKE) --no-print-directory -f c_src/build.mk PRIV=$(PRIV) BUILD=$(BUILD) MAKEVARS=$(MAKEVARS)

.PHONY: all fixtures ctest ctest-asan ctest-valgrind ctest-musl test bench clean

all fixtures ctest ctest-asan ctest-valgrind: $(MAKEVARS)
	$(SUBMAKE) $@

$(MAKEVARS): c_src/makevars.sh
	@mkdir -p $(BUILD)
	sh c_src/makevars.sh $@

# The C tests built with musl-gcc (Debian: musl-tools) into their own tree.
MUSL_CC ?= musl-gcc
MUSL_BUILD ?= _build/c-musl

ctest-musl: $(MUSL_BUILD)/makevars.mk
	$(MAKE) --no-print-directory -f c_src/build.mk PRIV=$(MUSL_BUILD)/priv BUILD=$(MUSL_BUILD) \
		MAKEVARS=$(MUSL_BUILD)/makevars.mk $@

$(MUSL_BUILD)/makevars.mk: c_src/makevars.sh
	@command -v $(MUSL_CC) >/dev/null 2>&1 || \
		{ echo "mtrace: $(MUSL_CC) not found (Debian: apt-get install musl-tools)" >&2; exit 1; }
	@mkdir -p $(MUSL_BUILD)
	CC=$(MUSL_CC) sh c_src/makevars.sh $@

test:
	bin/test

bench: $(MAKEVARS)
	$(SUBMAKE) bench-c

clean:
	rm -rf $(BUILD) $(MUSL_BUILD) $(PRIV)/mtrace.so $(PRIV)/mtrace_nif.so
