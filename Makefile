# GNU make entry point.  BSD make: bmake -f Makefile.bsd (same targets).
# The build itself is described once, in c_src/build.mk.
PRIV ?= priv
BUILD ?= _build/c
MAKEVARS = $(BUILD)/makevars.mk
SUBMAKE = $(MAKE) --no-print-directory -f c_src/build.mk PRIV=$(PRIV) BUILD=$(BUILD) MAKEVARS=$(MAKEVARS)

.PHONY: all fixtures ctest ctest-asan ctest-valgrind test bench clean

all fixtures ctest ctest-asan ctest-valgrind: $(MAKEVARS)
	$(SUBMAKE) $@

$(MAKEVARS): c_src/makevars.sh
	@mkdir -p $(BUILD)
	sh c_src/makevars.sh $@

test:
	bin/test

bench: $(MAKEVARS)
	$(SUBMAKE) bench-c

clean:
	rm -rf $(BUILD) $(PRIV)/mtrace.so $(PRIV)/mtrace_nif.so
