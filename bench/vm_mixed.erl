%% A realistic node's work for bench/vm.sh: WORKERS processes each run ROUNDS
%% rounds of what services do all day (messages to a peer process, ETS
%% writes, reads and deletes, term encoding and decoding, JSON through the
%% jiffy NIF, hashing and random bytes through crypto, zlib compression,
%% binaries built and dropped).  The work is fixed, so wall time compares
%% across runs.  Prints "wall_ms N"; given mtrace's ebin directory it loads
%% mtrace's NIF and also prints "mallocs N", the malloc-family calls the
%% preload saw during the work.
%%   erl -noshell -pa BUILD -run vm_mixed main ROUNDS [MTRACE_EBIN]
-module(vm_mixed).
-export([main/1]).

-define(WORKERS, 4).

main([RoundsArg, MtraceEbin]) ->
    true = code:add_patha(MtraceEbin),
    {module, Native} = code:ensure_loaded('Elixir.Mtrace.Native'),
    Before = calls(Native:stats()),
    run(list_to_integer(RoundsArg)),
    io:format("mallocs ~b~n", [calls(Native:stats()) - Before]),
    halt();
main([RoundsArg]) ->
    run(list_to_integer(RoundsArg)),
    halt().

calls(Stats) ->
    lists:sum([maps:get(K, Stats) || K <- [malloc_cnt, calloc_cnt, realloc_cnt, free_cnt]]).

run(Rounds) ->
    {ok, _} = application:ensure_all_started(crypto),
    {module, jiffy} = code:ensure_loaded(jiffy),
    Table = ets:new(mixed, [public, set, {write_concurrency, true}, {read_concurrency, true}]),
    T0 = erlang:monotonic_time(millisecond),
    Workers = [spawn_monitor(fun() -> worker(W, Rounds, Table) end) || W <- lists:seq(1, ?WORKERS)],
    [receive {'DOWN', Ref, process, _, normal} -> ok end || {_, Ref} <- Workers],
    io:format("wall_ms ~b~n", [erlang:monotonic_time(millisecond) - T0]).

worker(W, Rounds, Table) ->
    Peer = spawn_link(fun echo/0),
    round(W, Rounds, Table, Peer),
    Peer ! stop.

round(_W, 0, _Table, _Peer) ->
    ok;
round(W, N, Table, Peer) ->
    Doc = #{<<"id">> => N, <<"worker">> => W,
            <<"tags">> => [<<"alpha">>, <<"beta">>, integer_to_binary(N)],
            <<"payload">> => binary:copy(<<"x">>, 64 + N rem 512)},
    Json = jiffy:encode(Doc),
    Doc = jiffy:decode(Json, [return_maps]),
    Term = binary_to_term(term_to_binary({W, N, Doc, lists:seq(1, 20)})),
    Key = {W, N rem 1000},
    true = ets:insert(Table, {Key, Term}),
    [{Key, _}] = ets:lookup(Table, Key),
    N rem 3 =:= 0 andalso ets:delete(Table, {W, (N + 500) rem 1000}),
    _ = crypto:hash(sha256, Json),
    _ = crypto:strong_rand_bytes(32),
    Packed = zlib:compress(Json),
    Json = zlib:uncompress(Packed),
    Peer ! {self(), Json},
    receive {Peer, Json} -> ok end,
    round(W, N - 1, Table, Peer).

echo() ->
    receive
        {From, Msg} -> From ! {self(), Msg}, echo();
        stop -> ok
    end.
