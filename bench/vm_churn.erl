%% Erlang half of the VM-level benchmark (bench/vm.sh): on one node,
%% mtrace_bench_churn:churn(Pairs) (bench/vm_churn_nif.c) runs on a dirty CPU
%% scheduler while a few ordinary processes send messages, build maps and
%% drop binaries until it returns.  Prints "wall_ms N" for the whole thing.
%% Given mtrace's own ebin directory, it first loads mtrace's NIF (which
%% turns on Erlang frames unless MTRACE_ERLANG=0) and prints
%% "erlang_frames true|false".
%% MODE is malloc (malloc/free) or enif (enif_alloc/enif_free).
%%   erl -noshell -pa BUILD -run vm_churn main NIF_PATH_WITHOUT_SO PAIRS MODE [MTRACE_EBIN]
-module(vm_churn).
-export([main/1]).

-define(WORKERS, 4).

main([Nif, PairsArg, Mode, MtraceEbin]) ->
    true = code:add_patha(MtraceEbin),
    {module, Native} = code:ensure_loaded('Elixir.Mtrace.Native'),
    #{erlang_frames := On} = Native:stats(),
    io:format("erlang_frames ~p~n", [On]),
    main([Nif, PairsArg, Mode]);
main([Nif, PairsArg, Mode]) ->
    Pairs = list_to_integer(PairsArg),
    Churn = list_to_atom(case Mode of "malloc" -> "churn"; "enif" -> "churn_enif" end),
    load_nif(Nif),
    T0 = erlang:monotonic_time(millisecond),
    Workers = [spawn_monitor(fun() -> work(spawn_link(fun echo/0), 0) end)
               || _ <- lists:seq(1, ?WORKERS)],
    ok = mtrace_bench_churn:Churn(Pairs),
    [Pid ! stop || {Pid, _} <- Workers],
    [receive {'DOWN', Ref, process, _, normal} -> ok end || {_, Ref} <- Workers],
    io:format("wall_ms ~b~n", [erlang:monotonic_time(millisecond) - T0]),
    halt().

%% A NIF library loads into the module that calls load_nif/2, and its
%% ERL_NIF_INIT names that module; compiling the few-line stub here keeps
%% the benchmark to one .erl file.
load_nif(Path) ->
    Src = ["-module(mtrace_bench_churn).",
           "-export([load/1, churn/1, churn_enif/1]).",
           "load(Path) -> erlang:load_nif(Path, 0).",
           "churn(_Pairs) -> erlang:nif_error(not_loaded).",
           "churn_enif(_Pairs) -> erlang:nif_error(not_loaded)."],
    Forms = [begin
                 {ok, Tokens, _} = erl_scan:string(S),
                 {ok, Form} = erl_parse:parse_form(Tokens),
                 Form
             end || S <- Src],
    {ok, Mod, Beam} = compile:forms(Forms),
    {module, Mod} = code:load_binary(Mod, "mtrace_bench_churn.erl", Beam),
    ok = Mod:load(Path).

%% Ordinary work: a map and a refc binary (over 64 bytes, so off-heap) per
%% round trip to a partner process, all garbage right after.
work(Echo, N) ->
    receive
        stop -> Echo ! stop
    after 0 ->
        Map = maps:from_list([{K, K * N} || K <- lists:seq(1, 32)]),
        Bin = binary:copy(<<N:8>>, 65 + N rem 2048),
        Echo ! {self(), Map, Bin},
        receive {Echo, _} -> ok end,
        work(Echo, N + 1)
    end.

echo() ->
    receive
        {From, Map, Bin} ->
            From ! {self(), map_size(Map) + byte_size(Bin)},
            echo();
        stop ->
            ok
    end.
