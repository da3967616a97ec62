"""A collective that can never finish is named within seconds, on process ranks.

scenarios/stalls.py holds the rows; each tier runs the whole file once with
the deadline left at 300 s, the three tiers at the same time. Stalled rows
must fail within about 10 s, naming the disagreement first and each rank's
part; rows whose calls match must pass however slow. The judgement's words
are checked on plain data too.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import computed_once, load_factor, run_python, upstream_module_imports
from distspawn.engine import reduce_ops, stall

ROWS = {
    "test_shapes_differ": "collective #{n} on the default group: rank 1 all_reduce float32[3]; "
                          "ranks 0, 2 all_reduce float32[2] (shapes differ)",
    "test_all_reduce_against_broadcast": "collective #{n} on the default group: rank 0 broadcast "
                                         "float32[4] src=0; ranks 1, 2 all_reduce float32[4] "
                                         "(ops differ)",
    "test_broadcast_roots_differ": "collective #{n} on the default group: rank 0 broadcast "
                                   "float32[4] src=0; rank 2 broadcast float32[4] src=1; "
                                   "rank 1 got through it (roots differ)",
    "test_a_rank_skips_a_collective_and_returns":
        "rank 2 never reached collective #{n} on the default group (all_reduce float32[2]): "
        "it returned from its test after collective #{m}; ranks 0, 1 wait in all_reduce",
    "test_a_rank_calls_a_subgroup_collective_it_is_not_in":
        "collective #1 on group 1 (ranks 0, 1): rank 0 waits in all_reduce float32[2]; "
        "rank 1 waits in collective #{n} on the default group (all_reduce float32[2]) instead",
    "test_a_rank_waits_in_the_store_outside_any_collective":
        "rank 2 never reached collective #{n} on the default group (all_reduce float32[2]): "
        "it waits in store.get('never set'), outside any collective; "
        "ranks 0, 1 wait in all_reduce float32[2]",
    "test_every_rank_still_running_waits_in_the_store":
        "every rank still running (0, 1) waits in the store, with nobody left to set what it "
        "waits for: rank 0 store.get('set by rank 1 later'); rank 1 store.get('set by rank 0 "
        "later'); rank 2 returned from its test",
    "test_send_facing_send": "every rank still running (0, 1) waits in a send: send facing "
                             "send, nobody receives; rank 2 returned from its test",
    "test_recv_facing_recv": "every rank still running (0, 1) waits in a receive: receive "
                             "facing receive, nobody sends; rank 2 returned from its test",
}
REDUCE_OPS_DIFFER = ("collective #{n} on the default group: rank 1 all_reduce MAX; "
                     "ranks 0, 2 all_reduce SUM (reduce ops differ)")
# Rows gloo itself ends at once (a dtype mismatch aborts a rank; an exit is seen).
FAST_ROWS = {"test_dtypes_differ": "rank 1: crashed with SIGABRT",
             "test_a_rank_exits_early": "rank 1: ended without reporting a result"}
PASSING = ("test_slow_rank_joins_a_matching_collective", "test_large_matching_all_reduce",
           "test_compiled_all_reduce_with_a_reduce_op",
           "test_a_store_wait_that_gives_up_before_the_deadline",
           "test_a_store_key_set_by_a_busy_rank")


TIERS = ("processes", "reused", "stand-in")
UPSTREAM = "torch.testing._internal.common_distributed"


def run_tier(tier):
    env = {"DISTSPAWN_STALL_TIER": tier, "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "300"}
    command = ["stalls.py", "-v"]
    if tier == "stand-in":
        # The rows as an upstream-style file, unchanged, run through the stand-in mode.
        env["DISTSPAWN_STALL_TIER"] = "upstream"
        command = ["-m", "distspawn.stand_in", *command]
    run = run_python(command, env=env, timeout=240)
    run.tier = tier
    return run


def run_every_tier():
    # The three tiers run at once: each spends most of its minute waiting out
    # stall windows and the passing rows' sleeps, not on the CPUs.
    tiers = [t for t in TIERS if t != "stand-in" or upstream_module_imports(UPSTREAM)]
    with ThreadPoolExecutor(len(tiers)) as pool:
        runs = dict(zip(tiers, pool.map(run_tier, tiers)))
    load = load_factor()  # bounds scale on a loaded machine (harness.load_factor)
    for run in runs.values():
        run.load = load
    return runs


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return computed_once(tmp_path_factory, "stall-tiers", run_every_tier)


@pytest.fixture(params=TIERS)
def table(request, tables):
    if request.param not in tables:
        pytest.skip(f"{UPSTREAM} does not import here: no upstream-style file to stand in for")
    return tables[request.param]


def failure_of(run, name):
    match = re.search(rf"RankFailure: \S+\.{name} failed after ([\d.]+)s.*?\n(.*?)"
                      r"(?=\nRe-run just this test)", run.output, re.S)
    assert match, run.output
    return float(match.group(1)), match.group(2)


def as_pattern(expected):
    return re.escape(expected).replace(r"\{n\}", r"\d+").replace(r"\{m\}", r"\d+")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_stall_is_named_in_seconds(table, name):
    seconds, report = failure_of(table, name)
    assert seconds < 10 * table.load, report
    first_line = report.splitlines()[0]
    assert re.match(as_pattern(ROWS[name]), first_line), report
    # Then each rank's part, with its recorded calls (gloo records no send or
    # recv; the store row makes no collective).
    if "facing" not in name and "store" not in name:
        assert "its last recorded collectives, oldest first:" in report, report
    assert "did not finish before the deadline" not in report, report


def test_a_rank_that_finished_is_said_to_wait_not_to_have_failed(table):
    _, report = failure_of(table, "test_a_rank_skips_a_collective_and_returns")
    assert "2 of 3 ranks failed (ranks 0, 1)" in report, report
    assert re.search(r"^rank 2: finished its test after collective #\d+ on the default group; "
                     r"waiting for ranks 0, 1$", report, re.M), report


def test_reduce_ops_that_differ_are_named_though_nothing_waits(table):
    # gloo combines with each rank's own op, so the test would pass (it does on upstream's).
    seconds, report = failure_of(table, "test_reduce_ops_differ")
    assert seconds < 10 * table.load, report
    assert re.match(as_pattern(REDUCE_OPS_DIFFER), report.splitlines()[0]), report
    assert re.search(r"^1 of 3 ranks failed \(rank 1\):\nrank 1: called all_reduce with MAX in "
                     r"collective #\d+ on the default group, where ranks 0, 2 all_reduce with SUM$",
                     report, re.M), report


@pytest.mark.parametrize("name", sorted(FAST_ROWS))
def test_rows_gloo_ends_itself_fail_at_once(table, name):
    seconds, report = failure_of(table, name)
    assert seconds < 10 * table.load and FAST_ROWS[name] in report, report


@pytest.mark.parametrize("name", PASSING)
def test_matching_calls_are_never_judged_however_slow(table, name):
    assert table.verdict_line(name).endswith("ok"), table.output


def test_nothing_is_left_behind(table):
    assert table.leftover_files == [] and table.leftover_pids == []


def test_with_early_judgement_off_the_deadline_still_names_the_stall():
    env = {"DISTSPAWN_STALL_WINDOW": "0", "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "6"}
    run = run_python(["stalls.py", "Stalls.test_a_rank_skips_a_collective_and_returns"],
                     env=env, timeout=120)
    seconds, report = failure_of(run, "test_a_rank_skips_a_collective_and_returns")
    assert seconds >= 6, report
    assert report.startswith("rank 2 never reached collective #2"), report
    assert "its stack at the deadline" in report, report
    assert "rank 2: finished its test" in report, report


def test_a_bad_window_is_refused_before_any_rank_starts():
    run = run_python(["stalls.py", "Stalls.test_shapes_differ"],
                     env={"DISTSPAWN_STALL_WINDOW": "soon"}, timeout=60)
    assert run.returncode != 0
    assert "DISTSPAWN_STALL_WINDOW='soon': give a number of seconds >= 0" in run.output
    assert "rank 0" not in run.output


# -- the words, on plain data ---------------------------------------------------------

def call(seq, op="all_reduce", sizes=((2,),), dtypes=("Float",), retired=False, group="0",
         desc="default_pg", p2p=False, created_ns=0):
    return {"order": seq, "group": group, "group_desc": desc, "seq": seq, "p2p": p2p,
            "op": op, "sizes": [list(s) for s in sizes], "dtypes": list(dtypes),
            "retired": retired, "created_ns": created_ns}


def state(rank, phase, *calls):
    return stall.RankState(rank, phase, {"groups": {"0": {"ranks": [0, 1, 2]}},
                                         "calls": list(calls)}, fresh=True)


NOW = 10 * 10**9


def test_matching_waits_are_not_a_stall():
    states = [state(r, "running", call(1)) for r in range(3)]
    assert stall.judge(states, NOW, 3.0) is None


def test_a_wait_shorter_than_the_window_is_not_judged():
    states = [state(0, "running", call(1, sizes=((3,),), created_ns=NOW - 10**9)),
              state(1, "running", call(1, created_ns=NOW - 10**9))]
    states[0].log["groups"]["0"]["ranks"] = [0, 1]
    assert stall.judge(states, NOW, 3.0) is None


def test_a_rank_busy_outside_any_collective_holds_judgement():
    states = [state(0, "running", call(1)), state(1, "running", call(1, sizes=((3,),))),
              state(2, "running", call(1, retired=True))]
    assert stall.judge(states, NOW, 3.0) is None


def test_dtypes_differ_is_said():
    states = [state(0, "running", call(1)), state(1, "running", call(1)),
              state(2, "running", call(1, dtypes=("Double",)))]
    found = stall.judge(states, NOW, 3.0)
    assert found.headline == ("collective #1 on the default group: rank 2 all_reduce "
                              "float64[2]; ranks 0, 1 all_reduce float32[2] (dtypes differ)")
    assert found.doing[2] == ("waiting in collective #1 on the default group: all_reduce "
                              "float64[2] (for 10.0 s)")


def test_an_exited_rank_is_named_with_its_code():
    states = [state(0, "running", call(1, retired=True), call(2)),
              state(1, "running", call(1, retired=True), call(2)),
              state(2, "exited", call(1, retired=True))]
    states[2].log["groups"]["0"]["completed"] = 1
    states[2].exit_code = 3
    found = stall.judge(states, NOW, 3.0)
    assert found.headline.startswith("rank 2 never reached collective #2 on the default group "
                                     "(all_reduce float32[2]): it exited (exit code 3) after "
                                     "collective #1")


def test_send_facing_send_is_said():
    states = [state(0, "running", call(1, op="send", p2p=True)),
              state(1, "running", call(1, op="send", p2p=True))]
    found = stall.judge(states, NOW, 3.0)
    assert found.headline == ("every rank still running (0, 1) waits in a send: send facing "
                              "send, nobody receives")


def store_wait(since_ns=0, until_ns=None, method="get", keys=("k",)):
    return {"method": method, "keys": list(keys), "since_ns": since_ns, "until_ns": until_ns}


def test_a_rank_blocked_in_the_store_is_named_as_the_one_missing():
    states = [state(0, "running", call(1)), state(1, "running", call(1)), state(2, "running")]
    states[2].log["store_wait"] = store_wait(keys=("ready",))
    found = stall.judge(states, NOW, 3.0, deadline_ns=NOW + 10**9)
    assert found.headline == ("rank 2 never reached collective #1 on the default group "
                              "(all_reduce float32[2]): it waits in store.get('ready'), outside "
                              "any collective; ranks 0, 1 wait in all_reduce float32[2]")
    assert found.doing[2] == "waiting in store.get('ready'), outside any collective (for 10.0 s)"


def test_a_store_wait_that_gives_up_before_the_deadline_is_not_judged():
    states = [state(0, "running", call(1)), state(1, "running", call(1)), state(2, "running")]
    states[2].log["store_wait"] = store_wait(until_ns=NOW + 5 * 10**9)
    assert stall.judge(states, NOW, 3.0, deadline_ns=NOW + 6 * 10**9) is None
    # At the deadline it is only described, and a store that never gives up outlasts any.
    assert stall.judge(states, NOW, 3.0, at_deadline=True) is not None
    states[2].log["store_wait"] = store_wait(until_ns=None)
    assert stall.judge(states, NOW, 3.0, deadline_ns=NOW + 6 * 10**9) is not None


def test_a_store_wait_shorter_than_the_window_is_not_judged():
    states = [state(0, "running", call(1)), state(1, "running", call(1)), state(2, "running")]
    states[2].log["store_wait"] = store_wait(since_ns=NOW - 10**9)
    assert stall.judge(states, NOW, 3.0, deadline_ns=NOW) is None


def test_nothing_is_judged_while_a_matching_call_can_still_finish():
    # Ranks 0 and 1 are both in a slow subgroup call; rank 2 waits for rank 0
    # on another group. Once the subgroup call ends, rank 0 may come.
    subgroup = {"ranks": [0, 1]}
    pair = {"ranks": [0, 2]}
    states = [state(0, "running", call(1, group="1", desc="undefined")),
              state(1, "running", call(1, group="1", desc="undefined")),
              state(2, "running", call(1, group="2", desc="undefined"))]
    for s in states:
        s.log["groups"].update({"1": subgroup, "2": pair})
    assert stall.judge(states, NOW, 3.0) is None
    states[1].log["calls"] = [call(1, group="1", desc="undefined", sizes=((3,),))]
    assert "shapes differ" in stall.judge(states, NOW, 3.0).headline


def test_ops_whose_inputs_differ_by_rank_are_compared_by_what_may_not():
    # A scatter's root alone passes the pieces; an all_to_all's splits may be uneven.
    def scatter(rank, out=(2,)):
        made = call(1, op="scatter", sizes=((2, 2),) if rank == 0 else (),
                    dtypes=("Float",) if rank == 0 else ())
        return {**made, "out_sizes": [list(out)], "out_dtypes": ["Float"]}

    states = [state(r, "running", scatter(r)) for r in range(3)]
    assert stall.judge(states, NOW, 3.0) is None
    states[2].log["calls"] = [scatter(2, out=(3,))]
    assert "(shapes differ)" in stall.judge(states, NOW, 3.0).headline
    uneven = [state(r, "running", call(1, op="all_to_all", sizes=((r + 1,),))) for r in range(3)]
    assert stall.judge(uneven, NOW, 3.0) is None
    uneven[1].log["calls"] = [call(1, op="all_to_all", dtypes=("Double",))]
    assert "(dtypes differ)" in stall.judge(uneven, NOW, 3.0).headline


def test_reduce_ops_read_from_blocked_stacks_are_compared():
    states = [state(r, "running", call(1)) for r in range(3)]
    for s in states:
        s.log["main_call"] = {"function": "all_reduce",
                              "reduce_op": "MAX" if s.rank == 1 else "SUM"}
    found = stall.judge(states, NOW, 3.0)
    assert found.headline == ("collective #1 on the default group: rank 1 all_reduce "
                              "float32[2] MAX; ranks 0, 2 all_reduce float32[2] SUM "
                              "(reduce ops differ)")


def test_a_stack_in_another_function_adds_nothing_to_the_recorded_call():
    states = [state(r, "running", call(1)) for r in range(3)]
    states[1].log["main_call"] = {"function": "broadcast", "root": 1}
    assert stall.judge(states, NOW, 3.0) is None  # the waits match: only the deadline ends them


def test_reduce_ops_of_completed_calls_are_compared_by_group_and_number():
    def made(*calls):
        return [("0", "default_pg", number, "all_reduce", op) for number, op in calls]

    records = {0: made((1, "SUM"), (2, "SUM")), 1: made((2, "SUM"), (3, "MAX")),
               2: made((1, "SUM"), (3, "MIN"))}
    found = stall.completed_calls_disagree(records, lambda: [])
    assert found.headline == ("collective #3 on the default group: rank 1 all_reduce MAX; "
                              "rank 2 all_reduce MIN (reduce ops differ)")
    # Two parties of one: neither is the odd one out, both are named.
    assert found.parts == {
        1: "called all_reduce with MAX in collective #3 on the default group, "
           "where rank 2 all_reduce with MIN",
        2: "called all_reduce with MIN in collective #3 on the default group, "
           "where rank 1 all_reduce with MAX"}
    # The same op at every number some ranks recorded: nothing to say.
    assert stall.completed_calls_disagree({0: made((1, "SUM")), 1: made((2, "MAX"))},
                                          lambda: []) is None


def test_a_subgroup_call_is_named_with_its_members():
    records = {r: [("1", "undefined", 1, "reduce_scatter_tensor", "MAX" if r else "SUM")]
               for r in (0, 1)}
    states = [state(r, "finished") for r in range(3)]
    for s in states[:2]:
        s.log["groups"]["1"] = {"ranks": [0, 1]}
    found = stall.completed_calls_disagree(records, lambda: states)
    assert found.headline.startswith("collective #1 on group 1 (ranks 0, 1): "
                                     "rank 0 reduce_scatter_tensor SUM;"), found.headline


def test_the_recording_wrapper_reads_the_op_and_group_however_passed(monkeypatch):
    seen = []
    monkeypatch.setattr(reduce_ops, "_record", lambda *call: seen.append(call))

    def all_reduce(tensor, op="SUM", group=None, async_op=False):
        return tensor

    wrapped = reduce_ops._recording(all_reduce, lambda: False)
    assert wrapped(1, "MAX") == 1 and wrapped(1, op="MIN", group="g") == 1 and wrapped(1) == 1
    assert wrapped(1, "AVG", "h", True) == 1
    assert seen == [("all_reduce", None, "MAX"), ("all_reduce", "g", "MIN"),
                    ("all_reduce", None, "SUM"), ("all_reduce", "h", "AVG")]
    # While torch.compile traces, it only calls through.
    assert reduce_ops._recording(all_reduce, lambda: True)(1, "MAX") == 1
    assert len(seen) == 4


def test_reduce_op_names():
    dist = pytest.importorskip("torch.distributed")
    assert [reduce_ops.op_name(op) for op in (dist.ReduceOp.MAX, dist.ReduceOp(dist.ReduceOp.MIN),
                                              "sum")] == ["MAX", "MIN", "sum"]
