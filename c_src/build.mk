# The one description of how mtrace's C is built, included by both the GNU
# Makefile and Makefile.bsd through a sub-make.  Portable subset only: no
# pattern rules, no $(shell), no conditionals; $@ is the only automatic variable.
# Callers pass PRIV (output dir), BUILD (scratch dir) and MAKEVARS.

include $(MAKEVARS)

CFLAGS_ALL = $(BASE_CFLAGS) $(WARN_CFLAGS) $(EXTRA_CFLAGS)

PRELOAD_SRC = c_src/interpose.c c_src/table.c c_src/stacks.c c_src/query.c c_src/sites.c c_src/config.c \
	c_src/sampling.c c_src/unwind.c c_src/eh_frame.c c_src/counters.c
PRELOAD_HDR = c_src/mtrace_api.h c_src/table.h c_src/stacks.h c_src/interpose.h \
	c_src/config.h c_src/spinlock.h c_src/sampling.h c_src/unwind.h c_src/eh_frame.h c_src/counters.h \
	c_src/query.h c_src/topn.h
NIF_SRC = c_src/nif.c c_src/nif_query.c c_src/symbols.c c_src/dwarf_lines.c
SYM_SRC = c_src/symbols.c c_src/dwarf_lines.c
SYM_HDR = c_src/symbols.h c_src/dwarf_lines.h
NIF_HDR = c_src/mtrace_api.h c_src/nif.h $(SYM_HDR)

CTESTS = $(BUILD)/test_table $(BUILD)/test_config $(BUILD)/test_interpose $(BUILD)/test_symbols \
	$(BUILD)/test_unwind $(BUILD)/test_interpose_sampling
ASAN_TESTS = $(BUILD)/asan_test_table $(BUILD)/asan_test_config $(BUILD)/asan_test_symbols \
	$(BUILD)/asan_test_unwind
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
FIXTURE_FLAGS = -O1 -g -fno-inline -fno-optimize-sibling-calls

all: $(PRIV)/mtrace.so $(PRIV)/mtrace_nif.so

$(PRIV)/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(PRIV)
	$(CC) $(CFLAGS_ALL) $(PRELOAD_CFLAGS) $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(PRIV)/mtrace_nif.so: $(NIF_SRC) $(NIF_HDR) $(MAKEVARS)
	@mkdir -p $(PRIV)
	$(CC) $(CFLAGS_ALL) $(NIF_CFLAGS) -I$(ERTS_INCLUDE) $(NIF_LDFLAGS) -o $@ $(NIF_SRC) $(NIF_LIBS)

# Test NIF for ExUnit: leaks on purpose from static functions.
fixtures: $(BUILD)/leaky_nif.so

$(BUILD)/leaky_nif.so: test/fixtures/leaky_nif.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(FIXTURE_FLAGS) -I$(ERTS_INCLUDE) $(NIF_LDFLAGS) -o $@ test/fixtures/leaky_nif.c -lpthread

# C tests without the VM.
ctest: all $(CTESTS) $(BUILD)/symbols_fixture.so
	sh test/c/run.sh $(BUILD) $(PRIV) $(CTESTS)

ctest-asan: $(ASAN_TESTS) $(BUILD)/symbols_fixture.so
	sh test/c/run.sh $(BUILD) $(PRIV) $(ASAN_TESTS)

$(BUILD)/test_table: test/c/test_table.c test/c/check.h c_src/table.c c_src/table.h \
		c_src/sampling.c c_src/sampling.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_table.c c_src/table.c c_src/sampling.c -lpthread -lm

$(BUILD)/asan_test_table: test/c/test_table.c test/c/check.h c_src/table.c c_src/table.h \
		c_src/sampling.c c_src/sampling.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -o $@ test/c/test_table.c c_src/table.c c_src/sampling.c -lpthread -lm

$(BUILD)/test_config: test/c/test_config.c test/c/check.h c_src/config.c c_src/config.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_config.c c_src/config.c

$(BUILD)/asan_test_config: test/c/test_config.c test/c/check.h c_src/config.c c_src/config.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -o $@ test/c/test_config.c c_src/config.c

$(BUILD)/test_interpose: test/c/test_interpose.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -O1 -fno-inline -fno-optimize-sibling-calls -fno-builtin -Ic_src -o $@ test/c/test_interpose.c $(DL_LIBS) -lpthread -rdynamic

$(BUILD)/test_interpose_sampling: test/c/test_interpose_sampling.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_interpose_sampling.c $(DL_LIBS)

$(BUILD)/test_symbols: test/c/test_symbols.c $(SYM_SRC) $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src -o $@ test/c/test_symbols.c $(SYM_SRC) $(DW_LIBS)

$(BUILD)/asan_test_symbols: test/c/test_symbols.c $(SYM_SRC) $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) $(DW_CFLAGS) -Ic_src -o $@ test/c/test_symbols.c $(SYM_SRC) $(DW_LIBS)

$(BUILD)/test_unwind: test/c/test_unwind.c test/c/check.h c_src/unwind.c c_src/unwind.h \
		c_src/eh_frame.c c_src/eh_frame.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_unwind.c c_src/unwind.c c_src/eh_frame.c -lunwind $(DL_LIBS) -lpthread

$(BUILD)/asan_test_unwind: test/c/test_unwind.c test/c/check.h c_src/unwind.c c_src/unwind.h \
		c_src/eh_frame.c c_src/eh_frame.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -o $@ test/c/test_unwind.c c_src/unwind.c c_src/eh_frame.c -lunwind $(DL_LIBS) -lpthread

$(BUILD)/symbols_fixture.so: test/c/symbols_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -O1 -g $(SO_LDFLAGS) -o $@ test/c/symbols_fixture.c

# Benchmarks (figures only, never asserted).
bench-c: all $(BUILD)/query_bench $(BUILD)/churn $(BUILD)/symbols_bench
	sh bench/run.sh $(BUILD) $(PRIV)

$(BUILD)/churn: bench/churn.c c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-optimize-sibling-calls -Ic_src -o $@ bench/churn.c $(DL_LIBS) -lpthread

$(BUILD)/symbols_bench: bench/symbols_bench.c bench/hundred_sites.h $(SYM_SRC) $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src -o $@ bench/symbols_bench.c $(SYM_SRC) $(DW_LIBS)

$(BUILD)/query_bench: bench/query_bench.c bench/hundred_sites.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ bench/query_bench.c $(DL_LIBS)
