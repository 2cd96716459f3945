%% One malloc per NIF call on a normal scheduler, from 16 Erlang stack
%% depths in turn: each call a new capture of an already interned stack.
%% Measures the Erlang frames' per-call cost (docs/performance.md):
%%   erlc -o _build/c bench/vm_frames.erl && LD_PRELOAD=$PWD/priv/mtrace.so \
%%     erl -noshell -pa _build/c/vm_app/mtrace/ebin -pa _build/c \
%%     -run vm_frames main $PWD/_build/c/leaky_nif 400000 [calls|realloc]
%% (_build/c/vm_app comes from bench/vm.sh, leaky_nif.so from make fixtures).
-module(vm_frames).
-export([main/1]).

main([Nif, CallsArg]) -> main([Nif, CallsArg, "calls"]);
main([Nif, CallsArg, Mode]) ->
    {module, Native} = code:ensure_loaded('Elixir.Mtrace.Native'),
    #{erlang_frames := On} = Native:stats(),
    Src = ["-module('Elixir.Mtrace.Test.LeakyNif').",
           "-export([load/1, leak/3, leak_dirty/3, leak_dirty2/3, spin/1, churn/2, free_kept/0,"
           " leak_threads/3, leak_enif/3, churn_enif/2]).",
           "load(P) -> erlang:load_nif(P, 0).",
           "leak(_, _, _) -> erlang:nif_error(x).", "leak_dirty(_, _, _) -> erlang:nif_error(x).",
           "leak_dirty2(_, _, _) -> erlang:nif_error(x).", "spin(_) -> erlang:nif_error(x).",
           "churn(_, _) -> erlang:nif_error(x).", "free_kept() -> erlang:nif_error(x).",
           "leak_threads(_, _, _) -> erlang:nif_error(x).", "leak_enif(_, _, _) -> erlang:nif_error(x).",
           "churn_enif(_, _) -> erlang:nif_error(x)."],
    Forms = [begin {ok, T, _} = erl_scan:string(S), {ok, F} = erl_parse:parse_form(T), F end || S <- Src],
    {ok, M, Beam} = compile:forms(Forms),
    {module, M} = code:load_binary(M, "leaky.erl", Beam),
    ok = M:load(Nif),
    Calls = list_to_integer(CallsArg),
    Run = case Mode of
              "calls" -> fun(N) -> run(M, N) end;
              %% one NIF call growing blocks by realloc: two stacks in turn
              "realloc" -> fun(N) -> M:leak(realloc, N, 16), M:free_kept() end
          end,
    Run(20000),
    T0 = erlang:monotonic_time(microsecond),
    Run(Calls),
    Us = erlang:monotonic_time(microsecond) - T0,
    io:format("frames ~p ~s ns_per_op ~.1f~n", [On, Mode, Us * 1000 / Calls]),
    halt().

run(M, N) -> run(M, N, 0).
run(_M, 0, _) -> ok;
run(M, N, I) ->
    deep(I rem 16 + 8, M),
    case N rem 1000 of 0 -> M:free_kept(); _ -> ok end,
    run(M, N - 1, I + 1).

deep(0, M) -> M:leak(malloc, 1, 16);
deep(N, M) -> deep(N - 1, M), ok.
