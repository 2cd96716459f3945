# The one description of how mtrace's C is built, included by both the GNU
# Makefile and Makefile.bsd through a sub-make.  Two binaries: c_src/preload/
# builds priv/mtrace.so, c_src/nif/ builds priv/mtrace_nif.so; all they
# share is c_src/mtrace_api.h (the NIF is built without the preload's
# headers on its include path).  Portable subset only: no
# pattern rules, no $(shell), no conditionals; $@ is the only automatic variable.
# Callers pass PRIV (output dir), BUILD (scratch dir) and MAKEVARS.

include $(MAKEVARS)

CFLAGS_ALL = $(BASE_CFLAGS) $(WARN_CFLAGS) $(EXTRA_CFLAGS)

# The preload: the exported hooks, then the tracker and what it records
# into, then the read side and the contract.
PRELOAD_SRC = c_src/preload/hooks.c $(TRACKER_SRC)
TRACKER_SRC = c_src/preload/tracker.c c_src/preload/threads.c c_src/preload/fork.c c_src/preload/libc.c c_src/preload/counters.c \
	c_src/preload/sampling.c $(READ_SRC)
READ_SRC = c_src/preload/api.c c_src/preload/query.c c_src/preload/sites.c $(TABLE_PART_SRC) \
	c_src/preload/stacks.c c_src/preload/unloads.c c_src/preload/recent_stacks.c c_src/preload/state.c c_src/preload/clock.c c_src/preload/config.c c_src/preload/estimate.c \
	c_src/preload/unwind.c c_src/preload/unwind_rules.c c_src/preload/unwind_fallback.c c_src/preload/eh_frame.c c_src/preload/objects.c c_src/preload/erlang_frames.c c_src/preload/erlang_files.c
PRELOAD_HDR = c_src/mtrace_api.h c_src/preload/state.h c_src/preload/clock.h c_src/preload/tracker.h c_src/preload/threads.h c_src/preload/libc.h \
	c_src/preload/table.h c_src/preload/table_grow.h c_src/preload/table_mem.h c_src/preload/table_spill.h c_src/preload/table_slot.h c_src/preload/table_bucket.h c_src/preload/stacks.h c_src/preload/config.h c_src/preload/spinlock.h \
	c_src/preload/sampling.h c_src/preload/estimate.h c_src/preload/math_lite.h c_src/preload/hash.h c_src/preload/unwind.h c_src/preload/unwind_frames.h c_src/preload/unwind_rules.h c_src/preload/unwind_fallback.h \
	c_src/preload/eh_frame.h c_src/preload/objects.h c_src/preload/counters.h c_src/preload/query.h \
	c_src/preload/stack_bounds.h c_src/preload/recent_stacks.h c_src/preload/fork_gate.h \
	c_src/preload/topn.h c_src/preload/erlang_frames.h c_src/preload/erlang_files.h c_src/preload/dwarf_cfi.h c_src/preload/unloads.h
NIF_SRC = c_src/nif/nif.c c_src/nif/nif_query.c c_src/nif/nif_stacks.c c_src/nif/nif_erlang.c c_src/nif/term_memo.c $(SYM_SRC)
SYM_SRC = c_src/nif/symbols.c c_src/nif/elf_symtab.c c_src/nif/demangle.c c_src/nif/name_fit.c \
	c_src/nif/dwarf_lines.c c_src/nif/proc_maps.c c_src/nif/build_id.c
SYM_HDR = c_src/nif/symbols.h c_src/nif/elf_symtab.h c_src/nif/demangle.h c_src/nif/name_fit.h \
	c_src/nif/dwarf_lines.h c_src/nif/proc_maps.h c_src/nif/build_id.h
NIF_HDR = c_src/mtrace_api.h c_src/nif/nif.h c_src/nif/erlang_layout.h c_src/nif/nif_stacks.h c_src/nif/term_memo.h $(SYM_HDR)

# test_interpose* run with the preload (test/c/run.sh); MTRACE_STRESS=1 in the
# environment makes some of them run longer.
INTERPOSE_TESTS = $(BUILD)/test_interpose $(BUILD)/test_interpose_sampling \
	$(BUILD)/test_interpose_provisional $(BUILD)/test_interpose_no_proc \
	$(BUILD)/test_interpose_corrupt_unwind \
	$(BUILD)/test_interpose_libc $(BUILD)/test_interpose_stress $(BUILD)/test_interpose_concurrent \
	$(BUILD)/test_interpose_fork $(BUILD)/test_interpose_fork_loader $(BUILD)/test_interpose_cost \
	$(BUILD)/test_interpose_fork_nested \
	$(BUILD)/test_interpose_dlopen \
	$(BUILD)/test_interpose_growth $(BUILD)/test_interpose_limit $(BUILD)/test_interpose_foreign \
	$(BUILD)/test_interpose_own_alloc $(BUILD)/test_interpose_nopie \
	$(BUILD)/test_interpose_small_stacks $(BUILD)/test_interpose_loader_lock \
	$(BUILD)/test_interpose_coroutine $(BUILD)/test_interpose_thread_exit \
	$(BUILD)/test_interpose_signals $(BUILD)/test_interpose_signal_stack \
	$(BUILD)/test_interpose_malloc_debug $(BUILD)/test_interpose_early_threads \
	$(BUILD)/test_interpose_key_signal $(BUILD)/test_interpose_fds $(BUILD)/test_interpose_realtime
CTESTS = $(BUILD)/test_table $(BUILD)/test_config $(BUILD)/test_query $(BUILD)/test_symbols \
	$(BUILD)/test_symbols_files $(BUILD)/test_dwarf_files $(BUILD)/test_name_fit $(BUILD)/test_demangle \
	$(BUILD)/test_elf_symtab \
	$(BUILD)/test_unwind $(BUILD)/test_unwind_rules $(BUILD)/test_recent_stacks \
	$(BUILD)/test_erlang_frames $(BUILD)/test_tracker_fork $(INTERPOSE_TESTS)
ASAN_TESTS = $(BUILD)/asan_test_table $(BUILD)/asan_test_config $(BUILD)/asan_test_query \
	$(BUILD)/asan_test_symbols $(BUILD)/asan_test_elf_symtab $(BUILD)/asan_test_unwind \
	$(BUILD)/asan_test_recent_stacks $(BUILD)/asan_test_erlang_frames $(BUILD)/asan_test_unwind_rules \
	$(BUILD)/asan_test_name_fit $(BUILD)/asan_test_demangle
# ThreadSanitizer: the threaded tests of single parts, and tsan_tracker, the
# whole preload built into one instrumented program (an instrumented
# mtrace.so cannot be preloaded: the loader's first malloc enters it before
# TSan's runtime is set up).
# Not test_recent_stacks (its own check counter is bumped from a thread,
# and its hit-rate check does not hold with TSan's instrumentation) nor
# test_unwind (libunwind's per-thread cache destructor runs after TSan's).
TSAN_TESTS = $(BUILD)/tsan/tsan_test_table $(BUILD)/tsan/tsan_test_query \
	$(BUILD)/tsan/tsan_test_unwind_rules $(BUILD)/tsan/tsan_test_symbols
VALGRIND_TESTS = $(BUILD)/test_table $(BUILD)/test_query $(BUILD)/test_config $(BUILD)/test_symbols \
	$(BUILD)/test_elf_symtab
DL_FIXTURES = $(BUILD)/dl_fixture_a.so $(BUILD)/dl_fixture_b.so $(BUILD)/names_v1.so \
	$(BUILD)/names_v2.so
# The preload without its exported hooks, for test_query; parts for the
# tests of single parts.
QUERY_SRC = $(TRACKER_SRC)
STATE_SRC = c_src/preload/state.c c_src/preload/clock.c c_src/preload/config.c
TABLE_PART_SRC = c_src/preload/table.c c_src/preload/table_grow.c c_src/preload/table_filter.c c_src/preload/table_mem.c c_src/preload/table_scan.c \
	c_src/preload/table_spill.c
TABLE_SRC = $(TABLE_PART_SRC) c_src/preload/estimate.c $(STATE_SRC)
ERLANG_FRAMES_SRC = c_src/preload/erlang_frames.c c_src/preload/erlang_files.c $(STATE_SRC)
# The loaded objects' lookups, which wait on the coarse clock around forks.
OBJECTS_SRC = c_src/preload/objects.c c_src/preload/clock.c
UNWIND_SRC = c_src/preload/unwind.c c_src/preload/recent_stacks.c c_src/preload/unwind_rules.c c_src/preload/eh_frame.c c_src/preload/objects.c \
	c_src/preload/clock.c
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
TSAN_FLAGS = -fsanitize=thread -O1 -g -fno-omit-frame-pointer
# hooks.c with the names it exports renamed, for the programs that build the
# tracker in (tsan_tracker, test_tracker_fork).
RENAMED_HOOKS = -Dmalloc=mtt_malloc -Dcalloc=mtt_calloc -Dfree=mtt_free -Drealloc=mtt_realloc \
	-Dreallocarray=mtt_reallocarray -Dposix_memalign=mtt_posix_memalign \
	-Daligned_alloc=mtt_aligned_alloc -Dmemalign=mtt_memalign -Dvalloc=mtt_valloc \
	-Dpvalloc=mtt_pvalloc -Dstrdup=mtt_strdup -Dstrndup=mtt_strndup -Ddlclose=mtt_dlclose
# The preload cannot run under ASan (both replace malloc), but it can under UBSan.
UBSAN_FLAGS = -fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
FIXTURE_FLAGS = -O1 -g -fno-inline -fno-optimize-sibling-calls

all: $(PRIV)/mtrace.so $(PRIV)/mtrace_nif.so

$(PRIV)/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(PRIV)
	$(CC) $(CFLAGS_ALL) $(PRELOAD_CFLAGS) -Ic_src $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(PRIV)/mtrace_nif.so: $(NIF_SRC) $(NIF_HDR) $(MAKEVARS)
	@mkdir -p $(PRIV)
	$(CC) $(CFLAGS_ALL) $(NIF_CFLAGS) -Ic_src -I$(ERTS_INCLUDE) $(NIF_LDFLAGS) -o $@ $(NIF_SRC) $(NIF_LIBS)

# Test NIF for ExUnit: leaks on purpose from static functions; and a
# stand-in for another release's preload.
fixtures: $(BUILD)/leaky_nif.so $(BUILD)/other_release.so $(BUILD)/newer_release.so

$(BUILD)/other_release.so: test/fixtures/other_release.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -o $@ test/fixtures/other_release.c

$(BUILD)/newer_release.so: test/fixtures/newer_release.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -o $@ test/fixtures/newer_release.c

$(BUILD)/leaky_nif.so: test/fixtures/leaky_nif.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(FIXTURE_FLAGS) -I$(ERTS_INCLUDE) $(NIF_LDFLAGS) -o $@ test/fixtures/leaky_nif.c -lpthread

# C tests without the VM.
ctest: all $(CTESTS) $(BUILD)/symbols_fixture.so $(DL_FIXTURES)
	sh test/c/run.sh $(BUILD) $(PRIV) $(CTESTS)

# The same under the sanitizers: the tests without the preload built with ASan
# and UBSan, the test_interpose* programs with a preload built with UBSan.
ctest-asan: $(ASAN_TESTS) $(BUILD)/symbols_fixture.so $(BUILD)/ubsan/mtrace.so $(INTERPOSE_TESTS) \
		$(DL_FIXTURES)
	sh test/c/run.sh $(BUILD) $(PRIV) $(ASAN_TESTS)
	sh test/c/run.sh $(BUILD) $(BUILD)/ubsan $(INTERPOSE_TESTS)

# The same under ThreadSanitizer (report_signal_unsafe=0: tsan_tracker's
# signal handler allocates on purpose, as the preload must allow).
ctest-tsan: $(TSAN_TESTS) $(BUILD)/tsan/tsan_tracker $(BUILD)/symbols_fixture.so $(DL_FIXTURES)
	TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 second_deadlock_stack=1 $(TSAN_OPTIONS)" \
		sh test/c/run.sh $(BUILD) $(PRIV) $(TSAN_TESTS) $(BUILD)/tsan/tsan_tracker

# The C tests built for musl (make ctest-musl: MAKEVARS written for musl-gcc),
# run with musl's loader: every test of ctest, without the NIF (no Erlang
# for musl here).
ctest-musl: $(PRIV)/mtrace.so $(CTESTS) $(BUILD)/test_libc_glue $(BUILD)/symbols_fixture.so $(DL_FIXTURES)
	sh test/c/run.sh $(BUILD) $(PRIV) $(CTESTS) $(BUILD)/test_libc_glue

# The musl glue alone, its dlsym calls routed to the test (see the test).
$(BUILD)/test_libc_glue: test/c/test_libc_glue.c test/c/check.h c_src/preload/libc.c c_src/preload/libc.h \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ddlsym=glue_dlsym -Ic_src -Ic_src/preload -o $@ test/c/test_libc_glue.c \
		c_src/preload/libc.c $(DL_LIBS)

# The C tests of a cross build under a user-mode emulator (make ctest-aarch64
# passes EMULATOR, the target's library root EMULATOR_SYSROOT, for qemu-user,
# and the directories of its libraries, EMULATOR_LIBS).
ctest-emulated: all $(CTESTS) $(BUILD)/symbols_fixture.so $(DL_FIXTURES)
	QEMU_LD_PREFIX=$(EMULATOR_SYSROOT) LD_LIBRARY_PATH=$(EMULATOR_LIBS) \
		sh test/c/run.sh --emulator $(EMULATOR) $(BUILD) $(PRIV) $(CTESTS)

# Table, query, configuration and symbol code under valgrind memcheck.
ctest-valgrind: $(VALGRIND_TESTS) $(BUILD)/symbols_fixture.so
	sh test/c/run.sh --valgrind $(BUILD) $(PRIV) $(VALGRIND_TESTS)

$(BUILD)/ubsan/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/ubsan
	$(CC) $(CFLAGS_ALL) $(UBSAN_FLAGS) $(PRELOAD_CFLAGS) -Ic_src $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(BUILD)/test_table: test/c/test_table.c test/c/check.h $(TABLE_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_table.c $(TABLE_SRC) -lpthread -lm

$(BUILD)/asan_test_table: test/c/test_table.c test/c/check.h $(TABLE_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_table.c $(TABLE_SRC) -lpthread -lm

$(BUILD)/test_config: test/c/test_config.c test/c/check.h c_src/preload/config.c c_src/preload/config.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_config.c c_src/preload/config.c

$(BUILD)/test_erlang_frames: test/c/test_erlang_frames.c test/c/check.h $(ERLANG_FRAMES_SRC) \
		$(PRELOAD_HDR) c_src/nif/erlang_layout.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_erlang_frames.c $(ERLANG_FRAMES_SRC)

$(BUILD)/asan_test_erlang_frames: test/c/test_erlang_frames.c test/c/check.h $(ERLANG_FRAMES_SRC) \
		$(PRELOAD_HDR) c_src/nif/erlang_layout.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_erlang_frames.c $(ERLANG_FRAMES_SRC)

$(BUILD)/asan_test_config: test/c/test_config.c test/c/check.h c_src/preload/config.c c_src/preload/config.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_config.c c_src/preload/config.c

$(BUILD)/test_interpose: test/c/test_interpose.c test/c/check.h test/c/queries.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -O1 -fno-inline -fno-optimize-sibling-calls -fno-builtin -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose.c $(DL_LIBS) -lpthread -rdynamic

# Its frames as written: each function a frame of its own, a call a call.
$(BUILD)/test_interpose_signal_stack: test/c/test_interpose_signal_stack.c test/c/check.h \
		test/c/queries.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -O1 -fno-inline -fno-optimize-sibling-calls -fno-builtin -Ic_src -o $@ \
		test/c/test_interpose_signal_stack.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_sampling: test/c/test_interpose_sampling.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose_sampling.c $(DL_LIBS)

$(BUILD)/test_interpose_provisional: test/c/test_interpose_provisional.c test/c/check.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_interpose_provisional.c $(DL_LIBS)

$(BUILD)/test_interpose_fork_nested: test/c/test_interpose_fork_nested.c test/c/check.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_interpose_fork_nested.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_corrupt_unwind: test/c/test_interpose_corrupt_unwind.c test/c/check.h \
		test/c/queries.h c_src/mtrace_api.h $(BUILD)/dl_fixture_a.so $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_interpose_corrupt_unwind.c $(DL_LIBS)

$(BUILD)/test_interpose_fds: test/c/test_interpose_fds.c test/c/check.h test/c/queries.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-optimize-sibling-calls -Ic_src -o $@ test/c/test_interpose_fds.c $(DL_LIBS)

$(BUILD)/test_interpose_realtime: test/c/test_interpose_realtime.c test/c/check.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -o $@ test/c/test_interpose_realtime.c -lpthread

$(BUILD)/test_interpose_no_proc: test/c/test_interpose_no_proc.c test/c/check.h c_src/mtrace_api.h \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -o $@ test/c/test_interpose_no_proc.c $(DL_LIBS)

$(BUILD)/test_query: test/c/test_query.c test/c/check.h $(QUERY_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_query.c $(QUERY_SRC) $(PRELOAD_LIBS)

# The tracker built in, its hooks renamed, to reach inside it.
$(BUILD)/renamed_hooks.o: c_src/preload/hooks.c $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(RENAMED_HOOKS) -Ic_src -c -o $@ c_src/preload/hooks.c

$(BUILD)/test_tracker_fork: test/c/test_tracker_fork.c test/c/check.h $(BUILD)/renamed_hooks.o \
		$(TRACKER_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -o $@ test/c/test_tracker_fork.c \
		$(BUILD)/renamed_hooks.o $(TRACKER_SRC) $(PRELOAD_LIBS)

$(BUILD)/asan_test_query: test/c/test_query.c test/c/check.h $(QUERY_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_query.c $(QUERY_SRC) $(PRELOAD_LIBS)

$(BUILD)/test_interpose_libc: test/c/test_interpose_libc.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose_libc.c $(DL_LIBS)

$(BUILD)/test_interpose_stress: test/c/test_interpose_stress.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose_stress.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_concurrent: test/c/test_interpose_concurrent.c test/c/check.h c_src/mtrace_api.h \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose_concurrent.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_fork: test/c/test_interpose_fork.c test/c/check.h test/c/queries.h c_src/mtrace_api.h \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_fork.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_fork_loader: test/c/test_interpose_fork_loader.c test/c/check.h test/c/queries.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_fork_loader.c $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_cost: test/c/test_interpose_cost.c test/c/check.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_cost.c

$(BUILD)/test_interpose_dlopen: test/c/test_interpose_dlopen.c test/c/check.h test/c/queries.h c_src/mtrace_api.h \
		$(SYM_SRC) $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -fno-optimize-sibling-calls -Ic_src -Ic_src/preload -Ic_src/nif -o $@ \
		test/c/test_interpose_dlopen.c $(SYM_SRC) $(DW_LIBS)

# Defines its own mmap, which the preload then uses: exported with -rdynamic.
$(BUILD)/test_interpose_growth: test/c/test_interpose_growth.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_interpose_growth.c $(DL_LIBS) -rdynamic

$(BUILD)/test_interpose_limit: test/c/test_interpose_limit.c test/c/check.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_limit.c $(DL_LIBS)

# Linked with an allocator of its own, found next to it at run time.
$(BUILD)/test_interpose_foreign: test/c/test_interpose_foreign.c test/c/check.h test/c/queries.h \
		c_src/mtrace_api.h $(BUILD)/foreign_alloc.so $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_foreign.c \
		$(BUILD)/foreign_alloc.so -Wl,-rpath,'$$ORIGIN' $(DL_LIBS)

# The same with the allocator in the program itself.
$(BUILD)/test_interpose_own_alloc: test/c/test_interpose_foreign.c test/c/foreign_alloc.c \
		test/c/check.h test/c/queries.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -DOWN_ALLOC -Ic_src -o $@ test/c/test_interpose_foreign.c \
		test/c/foreign_alloc.c -rdynamic $(DL_LIBS)

# Built without -fPIE, as some programs still are.
$(BUILD)/test_interpose_nopie: test/c/test_interpose_nopie.c test/c/check.h test/c/queries.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-pic -fno-pie -no-pie -fno-builtin -Ic_src -o $@ test/c/test_interpose_nopie.c \
		$(DL_LIBS)

$(BUILD)/test_interpose_small_stacks: test/c/test_interpose_small_stacks.c test/c/check.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_small_stacks.c \
		$(DL_LIBS) -lpthread

$(BUILD)/test_interpose_loader_lock: test/c/test_interpose_loader_lock.c test/c/check.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_loader_lock.c \
		$(DL_LIBS) -lpthread

$(BUILD)/test_interpose_coroutine: test/c/test_interpose_coroutine.c test/c/check.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_coroutine.c \
		$(DL_LIBS) -lpthread

$(BUILD)/test_interpose_thread_exit: test/c/test_interpose_thread_exit.c test/c/check.h test/c/queries.h test/c/mappings.h \
		c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_thread_exit.c \
		$(DL_LIBS) -lpthread

# Linked with a library whose constructor starts threads, found next to it.
$(BUILD)/test_interpose_early_threads: test/c/test_interpose_early_threads.c test/c/check.h \
		$(BUILD)/early_threads.so $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -o $@ test/c/test_interpose_early_threads.c \
		$(BUILD)/early_threads.so -Wl,-rpath,'$$ORIGIN' $(DL_LIBS) -lpthread

$(BUILD)/test_interpose_key_signal: test/c/test_interpose_key_signal.c test/c/check.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -o $@ test/c/test_interpose_key_signal.c $(DL_LIBS) -lpthread

$(BUILD)/early_threads.so: test/c/early_threads.c test/c/mappings.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -Wl,-soname,early_threads.so -o $@ test/c/early_threads.c -lpthread

$(BUILD)/test_interpose_malloc_debug: test/c/test_interpose_malloc_debug.c test/c/check.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -o $@ test/c/test_interpose_malloc_debug.c $(DL_LIBS)

$(BUILD)/test_interpose_signals: test/c/test_interpose_signals.c test/c/check.h test/c/queries.h \
		test/c/interrupted.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-builtin -Ic_src -o $@ test/c/test_interpose_signals.c $(DL_LIBS)

$(BUILD)/foreign_alloc.so: test/c/foreign_alloc.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -Wl,-soname,foreign_alloc.so -o $@ test/c/foreign_alloc.c

# One source, two versions of its names (see names_fixture.c), each with a
# build id, as distributions' compilers give every library (musl-gcc does not).
$(BUILD)/names_v1.so: test/c/names_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -DNAMES_VERSION=1 $(SO_LDFLAGS) -Wl,--build-id -o $@ test/c/names_fixture.c

$(BUILD)/names_v2.so: test/c/names_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -DNAMES_VERSION=2 $(SO_LDFLAGS) -Wl,--build-id -o $@ test/c/names_fixture.c

# Two copies share their DWARF through dwz; the other differs (see dwz_fixture.c).
$(BUILD)/dwz_fixture.so: test/c/dwz_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(SO_LDFLAGS) -o $@ test/c/dwz_fixture.c

$(BUILD)/dwz_other.so: test/c/dwz_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -DDWZ_OTHER $(SO_LDFLAGS) -o $@ test/c/dwz_fixture.c

$(BUILD)/test_symbols_files: test/c/test_symbols_files.c test/c/objects_api.h test/c/check.h $(SYM_SRC) \
		$(SYM_HDR) $(OBJECTS_SRC) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ \
		test/c/test_symbols_files.c $(SYM_SRC) $(OBJECTS_SRC) $(DW_LIBS)

$(BUILD)/test_dwarf_files: test/c/test_dwarf_files.c test/c/check.h c_src/nif/dwarf_lines.c \
		c_src/nif/dwarf_lines.h $(BUILD)/names_v1.so $(BUILD)/names_v2.so $(BUILD)/split_fixture.so \
		$(BUILD)/dwz_fixture.so $(BUILD)/dwz_other.so $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src/nif -o $@ test/c/test_dwarf_files.c \
		c_src/nif/dwarf_lines.c $(DW_LIBS)

# Split DWARF: its .dwo is written next to it.
$(BUILD)/split_fixture.so: test/c/split_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -gsplit-dwarf $(SO_LDFLAGS) -o $@ test/c/split_fixture.c

# One source, two frame sizes, the same code layout (see dl_fixture.c).
$(BUILD)/dl_fixture_a.so: test/c/dl_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -DFIXTURE_FRAME=200 $(SO_LDFLAGS) -o $@ test/c/dl_fixture.c

$(BUILD)/dl_fixture_b.so: test/c/dl_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -DFIXTURE_FRAME=65536 $(SO_LDFLAGS) -o $@ test/c/dl_fixture.c

$(BUILD)/test_name_fit: test/c/test_name_fit.c test/c/check.h c_src/nif/name_fit.c c_src/nif/name_fit.h \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src/nif -o $@ test/c/test_name_fit.c c_src/nif/name_fit.c

$(BUILD)/asan_test_name_fit: test/c/test_name_fit.c test/c/check.h c_src/nif/name_fit.c \
		c_src/nif/name_fit.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src/nif -o $@ test/c/test_name_fit.c c_src/nif/name_fit.c

$(BUILD)/test_demangle: test/c/test_demangle.c test/c/check.h c_src/nif/demangle.c c_src/nif/name_fit.c \
		$(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/nif -o $@ test/c/test_demangle.c c_src/nif/demangle.c \
		c_src/nif/name_fit.c $(DL_LIBS) -lpthread

$(BUILD)/asan_test_demangle: test/c/test_demangle.c test/c/check.h c_src/nif/demangle.c \
		c_src/nif/name_fit.c $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/nif -o $@ test/c/test_demangle.c \
		c_src/nif/demangle.c c_src/nif/name_fit.c $(DL_LIBS) -lpthread

$(BUILD)/test_elf_symtab: test/c/test_elf_symtab.c test/c/check.h c_src/nif/elf_symtab.c $(SYM_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -g -Ic_src -Ic_src/nif -c -Dmalloc=test_malloc -o $(BUILD)/elf_symtab_hooked.o \
		c_src/nif/elf_symtab.c
	$(CC) $(CFLAGS_ALL) -g -Ic_src -Ic_src/nif -o $@ test/c/test_elf_symtab.c $(BUILD)/elf_symtab_hooked.o

$(BUILD)/asan_test_elf_symtab: test/c/test_elf_symtab.c test/c/check.h c_src/nif/elf_symtab.c $(SYM_HDR) \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -g -Ic_src -Ic_src/nif -c -Dmalloc=test_malloc \
		-o $(BUILD)/asan_elf_symtab_hooked.o c_src/nif/elf_symtab.c
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -g -Ic_src -Ic_src/nif -o $@ test/c/test_elf_symtab.c \
		$(BUILD)/asan_elf_symtab_hooked.o

$(BUILD)/test_symbols: test/c/test_symbols.c test/c/objects_api.h $(SYM_SRC) $(SYM_HDR) $(OBJECTS_SRC) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_symbols.c $(SYM_SRC) $(OBJECTS_SRC) $(DW_LIBS)

$(BUILD)/asan_test_symbols: test/c/test_symbols.c test/c/objects_api.h $(SYM_SRC) $(SYM_HDR) $(OBJECTS_SRC) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) $(DW_CFLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_symbols.c $(SYM_SRC) $(OBJECTS_SRC) $(DW_LIBS)

$(BUILD)/test_unwind: test/c/test_unwind.c test/c/check.h $(UNWIND_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_unwind.c $(UNWIND_SRC) $(UNWIND_LIBS) $(DL_LIBS) -lpthread

$(BUILD)/asan_test_unwind: test/c/test_unwind.c test/c/check.h $(UNWIND_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_unwind.c $(UNWIND_SRC) $(UNWIND_LIBS) $(DL_LIBS) -lpthread

# The rules' cache alone, its rules made up by the test (no eh_frame.c).
$(BUILD)/test_unwind_rules: test/c/test_unwind_rules.c test/c/check.h c_src/preload/unwind_rules.c \
		$(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_unwind_rules.c c_src/preload/unwind_rules.c -lpthread

$(BUILD)/asan_test_unwind_rules: test/c/test_unwind_rules.c test/c/check.h c_src/preload/unwind_rules.c \
		$(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_unwind_rules.c c_src/preload/unwind_rules.c -lpthread

$(BUILD)/test_recent_stacks: test/c/test_recent_stacks.c test/c/check.h $(UNWIND_SRC) $(PRELOAD_HDR) \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_recent_stacks.c $(UNWIND_SRC) $(UNWIND_LIBS) $(DL_LIBS) -lpthread

$(BUILD)/asan_test_recent_stacks: test/c/test_recent_stacks.c test/c/check.h $(UNWIND_SRC) $(PRELOAD_HDR) \
		$(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(ASAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_recent_stacks.c $(UNWIND_SRC) $(UNWIND_LIBS) $(DL_LIBS) -lpthread

$(BUILD)/symbols_fixture.so: test/c/symbols_fixture.c $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -O1 -g $(SO_LDFLAGS) -o $@ test/c/symbols_fixture.c

# Benchmarks (figures only, never asserted).  The leave-out builds are
# mtrace.so without one part (-DMT_LEAVE_OUT_...), so that bench/churn.sh
# can say what each part of a lossless pair costs.
LEAVE_OUT = $(BUILD)/leave-out/table/mtrace.so $(BUILD)/leave-out/stacks/mtrace.so \
	$(BUILD)/leave-out/lock/mtrace.so
bench-build: all $(BUILD)/query_bench $(BUILD)/churn $(BUILD)/symbols_bench $(LEAVE_OUT)

bench-c: bench-build
	sh bench/run.sh $(BUILD) $(PRIV)

$(BUILD)/leave-out/table/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/leave-out/table
	$(CC) $(CFLAGS_ALL) -DMT_LEAVE_OUT_TABLE $(PRELOAD_CFLAGS) -Ic_src $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(BUILD)/leave-out/stacks/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/leave-out/stacks
	$(CC) $(CFLAGS_ALL) -DMT_LEAVE_OUT_STACKS $(PRELOAD_CFLAGS) -Ic_src $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(BUILD)/leave-out/lock/mtrace.so: $(PRELOAD_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/leave-out/lock
	$(CC) $(CFLAGS_ALL) -DMT_LEAVE_OUT_LOCK $(PRELOAD_CFLAGS) -Ic_src $(SO_LDFLAGS) -o $@ $(PRELOAD_SRC) $(PRELOAD_LIBS)

$(BUILD)/churn: bench/churn.c bench/lockstep.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -fno-optimize-sibling-calls -Ic_src -Ic_src/preload -Ic_src/nif -o $@ bench/churn.c $(DL_LIBS) -lpthread

$(BUILD)/symbols_bench: bench/symbols_bench.c bench/hundred_sites.h test/c/objects_api.h $(SYM_SRC) $(SYM_HDR) \
		$(OBJECTS_SRC) $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) $(DW_CFLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ bench/symbols_bench.c $(SYM_SRC) $(OBJECTS_SRC) $(DW_LIBS)

$(BUILD)/query_bench: bench/query_bench.c bench/hundred_sites.h c_src/mtrace_api.h $(MAKEVARS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_ALL) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ bench/query_bench.c $(DL_LIBS)

# ---- ThreadSanitizer builds (ctest-tsan) ----
$(BUILD)/tsan/tsan_hooks.o: c_src/preload/hooks.c $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) $(RENAMED_HOOKS) -ftls-model=initial-exec -Ic_src -c -o $@ \
		c_src/preload/hooks.c

$(BUILD)/tsan/tsan_work.so: test/c/tsan_work.c $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) -O1 -g -fno-inline -fno-optimize-sibling-calls $(SO_LDFLAGS) -Wl,-soname,tsan_work.so -o $@ \
		test/c/tsan_work.c

# What tsan_tracker.c includes from test/c (it and stress_preload).
TSAN_TRACKER_HDR = test/c/tsan_alloc.h test/c/interrupted.h

# Without libunwind (as on musl): libunwind's per-thread cache has a key
# destructor that may run after TSan's own has torn the thread's state down
# (a crash in TSan, not here).  tsan_tracker_libunwind keeps it, for a
# separate look (make ctest-tsan does not run it).
$(BUILD)/tsan/tsan_tracker: test/c/tsan_tracker.c $(TSAN_TRACKER_HDR) $(BUILD)/tsan/tsan_hooks.o $(BUILD)/tsan/tsan_work.so \
		$(TRACKER_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) -DMT_NO_LIBUNWIND -ftls-model=initial-exec -Ic_src -Ic_src/preload \
		-o $@ test/c/tsan_tracker.c $(BUILD)/tsan/tsan_hooks.o $(TRACKER_SRC) \
		$(BUILD)/tsan/tsan_work.so -Wl,-rpath,'$$ORIGIN' $(PRELOAD_LIBS) -lm

$(BUILD)/tsan/tsan_tracker_libunwind: test/c/tsan_tracker.c $(TSAN_TRACKER_HDR) $(BUILD)/tsan/tsan_hooks.o \
		$(BUILD)/tsan/tsan_work.so $(TRACKER_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) -ftls-model=initial-exec -Ic_src -Ic_src/preload -o $@ \
		test/c/tsan_tracker.c $(BUILD)/tsan/tsan_hooks.o $(TRACKER_SRC) $(BUILD)/tsan/tsan_work.so \
		-Wl,-rpath,'$$ORIGIN' $(PRELOAD_LIBS) -lm

$(BUILD)/tsan/tsan_test_table: test/c/test_table.c test/c/check.h $(TABLE_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_table.c $(TABLE_SRC) -lpthread -lm

$(BUILD)/tsan/tsan_test_query: test/c/test_query.c test/c/check.h $(QUERY_SRC) $(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_query.c $(QUERY_SRC) $(PRELOAD_LIBS)

$(BUILD)/tsan/tsan_test_unwind_rules: test/c/test_unwind_rules.c test/c/check.h c_src/preload/unwind_rules.c \
		$(PRELOAD_HDR) $(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_unwind_rules.c c_src/preload/unwind_rules.c -lpthread

$(BUILD)/tsan/tsan_test_symbols: test/c/test_symbols.c test/c/objects_api.h $(SYM_SRC) $(SYM_HDR) $(OBJECTS_SRC) \
		$(MAKEVARS)
	@mkdir -p $(BUILD)/tsan
	$(CC) $(CFLAGS_ALL) $(TSAN_FLAGS) $(DW_CFLAGS) -Ic_src -Ic_src/preload -Ic_src/nif -o $@ test/c/test_symbols.c $(SYM_SRC) $(OBJECTS_SRC) $(DW_LIBS)

# tsan_tracker's program against the real preload, uninstrumented: a stress
# run (not part of any ctest target), e.g.
#   LD_PRELOAD=$PWD/priv/mtrace.so MTRACE_PROGRAMS=stress_preload _build/c/stress_preload _build/c 90
# (TSAN_SKIP=fork,signal,dl,spawn,read leaves threads out).
$(BUILD)/stress_preload: test/c/tsan_tracker.c $(TSAN_TRACKER_HDR) $(BUILD)/tsan/tsan_work.so c_src/mtrace_api.h $(MAKEVARS)
	$(CC) $(CFLAGS_ALL) -O1 -fno-builtin -DPRELOADED -Ic_src -o $@ test/c/tsan_tracker.c \
		$(BUILD)/tsan/tsan_work.so -Wl,-rpath,'$$ORIGIN/tsan' $(DL_LIBS) -lpthread
