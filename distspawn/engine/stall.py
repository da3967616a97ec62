"""Judging a stall from the ranks' recorded collectives (``engine.collective_log``).

A test has stalled when every rank still running has been blocked for the
whole stall window, in a recorded collective or in a store call that will
not give up before the test's deadline, and what they wait in shows that
none can finish: ranks of one group disagree on the call at the same
sequence number (op, shapes or dtypes), or a member of the group waits
somewhere else (another call, the store), has finished its test or has
exited before reaching the call, or every rank waits in a send (or every rank
in a receive), or every rank waits in the store. A call that every member
has reached with matching fingerprints is never judged, however long it
takes, and neither is the rest while it runs: only the deadline ends it.

Everything here works on plain data, so the words are tested without ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .collective_log import P2P_FUNCTIONS

WINDOW_VARIABLE = "DISTSPAWN_STALL_WINDOW"
DEFAULT_WINDOW_S = 3.0
# A rank's log counts only if its thread wrote (or touched) it this recently:
# an older one may describe calls that have since finished. Generous, since a
# loaded machine can hold a 0.25 s heartbeat back for seconds (a recv-facing-
# recv row once went unjudged at 1.5 s with two suites on a slow 2-core
# machine); a stall seen is confirmed only after every running rank's log has
# been written again (supervisor), so a stale log cannot decide alone.
FRESH_S = 5.0

# The recorder's dtype names, as torch spells dtypes.
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
    "ComplexHalf": "complex32", "Float8_e4m3fn": "float8_e4m3fn", "Float8_e5m2": "float8_e5m2",
}


def window_from_env() -> float:
    """The stall window in seconds (0: judge only at the deadline), from the environment."""
    text = os.environ.get(WINDOW_VARIABLE, "").strip()
    if not text:
        return DEFAULT_WINDOW_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{WINDOW_VARIABLE}={text!r}: give a number of seconds >= 0 "
                         f"(0 judges stalls only at the deadline; default {DEFAULT_WINDOW_S})")
    return value


def window_for(owner: type) -> float:
    """The stall window of a test class: its ``stall_window`` (seconds; 0 turns
    early judgement off), else the environment's, else the default. Checked
    before any rank starts."""
    value = getattr(owner, "stall_window", None)
    if value is None:
        return window_from_env()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{owner.__name__}.stall_window must be a number of seconds >= 0 "
                         f"(0 judges stalls only at the deadline), got {value!r}")
    return float(value)


@dataclass
class RankState:
    """What the parent knows of one rank: its phase and its last collective log."""

    rank: int
    phase: str  # "running", "finished" (its test returned) or "exited"
    log: dict[str, Any] | None = None
    fresh: bool = False
    exit_code: int | None = None
    log_time: float = 0.0  # when its thread last wrote or touched the log (time.time())

    def waiting(self) -> dict[str, Any] | None:
        calls = [c for c in (self.log or {}).get("calls", ()) if not c["retired"]]
        main = (self.log or {}).get("main_call") or {}
        if calls:
            if main.get("function") == calls[-1]["op"]:
                # The recorder keeps no root or reduce op; the rank's stack does.
                return {**calls[-1], **{k: main[k] for k in _ARGUMENTS if k in main}}
            return calls[-1]
        if main.get("function") in P2P_FUNCTIONS:
            # A send or recv the backend does not record (gloo), seen on the stack.
            return {"order": -1, "group": "", "group_desc": "", "seq": None, "p2p": True,
                    "op": main["function"], "sizes": [], "dtypes": [], "retired": False,
                    "created_ns": main["since_ns"]}
        return None

    def store_wait(self) -> dict[str, Any] | None:
        """The store call its main thread is blocked in (``engine.store_waits``)."""
        return (self.log or {}).get("store_wait")

    def completed(self, group: str) -> int | None:
        return ((self.log or {}).get("groups", {}).get(group) or {}).get("completed")

    def knows_group(self, group: str) -> bool:
        return group in (self.log or {}).get("groups", {})


@dataclass
class Stall:
    """The judgement: one line naming the disagreement, then each rank's part."""

    headline: str
    doing: dict[int, str] = field(default_factory=dict)  # rank -> what it was doing
    recent: dict[int, list[str]] = field(default_factory=dict)  # rank -> its last calls


# What a blocked call's stack adds to its record (engine.collective_log).
_ARGUMENTS = ("root", "reduce_op")


def signature(call: dict[str, Any], reduce_op: bool = False) -> str:
    """``broadcast float32[2] src=0``: the op, each input's dtype and shape,
    the root where known, and (``reduce_op``) how values combine."""
    shapes = call.get("sizes") or []
    dtypes = call.get("dtypes") or []
    parts = [f"{_DTYPES.get(d, d)}{list(s)}" for d, s in zip(dtypes, shapes)]
    words = [call["op"], ", ".join(parts)]
    if call.get("root") is not None:
        words.append(f"src={call['root']}" if call["op"] in _FROM_ROOT else f"dst={call['root']}")
    if reduce_op and call.get("reduce_op"):
        words.append(call["reduce_op"])
    return " ".join(w for w in words if w).strip()


# Rooted collectives whose root sends; the rest (reduce, gather) receive at it.
_FROM_ROOT = ("broadcast", "scatter")


def group_words(call: dict[str, Any], states: list[RankState]) -> str:
    if call.get("group_desc") == "default_pg":
        return "the default group"
    members = _members(call, states)
    desc = call.get("group_desc")
    label = desc if desc and desc != "undefined" else call["group"]
    return f"group {label} (ranks {_ranks(members)})"


def call_words(call: dict[str, Any], states: list[RankState]) -> str:
    if call.get("seq") is None:
        return f"dist.{call['op']} (unrecorded by the backend, seen on its stack)"
    kind = "point-to-point call" if call["p2p"] else "collective"
    return f"{kind} #{call['seq']} on {group_words(call, states)}"


def judge(states: list[RankState], now_ns: int, window_s: float,
          at_deadline: bool = False, deadline_ns: int | None = None) -> Stall | None:
    """The stall these ranks are in, or None if they may still make progress.

    ``deadline_ns``: when the test will be ended (wall clock); a store call
    that gives up before then may yet let its rank go on. ``at_deadline``: the
    test is being ended anyway; judge from whatever the logs say, without the
    window, freshness or timeout rules.
    """
    running = [s for s in states if s.phase == "running"]
    if not running:
        return None
    for state in running:
        if not (at_deadline or state.fresh):
            return None  # its thread has not written lately: nothing is known
        call = state.waiting()
        if call is not None:
            since = call["created_ns"]
        elif (store := state.store_wait()) is not None and (
                at_deadline or _outlasts(store, deadline_ns)):
            since = store["since_ns"]
        else:
            return None  # busy outside any recorded call: it may yet arrive
        if not at_deadline and now_ns - since < window_s * 1e9:
            return None
    headline = None
    for state in running:
        call = state.waiting()
        if call is None or call["p2p"]:
            continue
        reason = _what_holds_up(call, states)
        if reason is None:
            return None  # every member reached it, matching: slow, not stuck
        headline = headline or reason
    headline = headline or _p2p_deadlock(running, states) or _store_deadlock(running, states)
    if headline is None:
        return None
    return Stall(headline, {s.rank: doing(s, states, now_ns) for s in states},
                 {s.rank: recent_calls(s, states) for s in states if s.log})


def _outlasts(store: dict[str, Any], deadline_ns: int | None) -> bool:
    """Whether a store call waits at least until the deadline (else it may
    give up, and its rank handle the error and go on)."""
    until = store.get("until_ns")
    return until is None or (deadline_ns is not None and until >= deadline_ns)


def store_words(store: dict[str, Any]) -> str:
    """``store.get('ready')``: the method and the keys it waits for."""
    keys = ", ".join(repr(k) for k in store.get("keys") or ())
    if store.get("method") in ("wait", "multi_get"):
        keys = f"[{keys}]"
    return f"store.{store.get('method')}({keys})"


@dataclass
class Disagreement:
    """Calls that finished on every rank that made them, combining values differently."""

    headline: str
    parts: dict[int, str]  # rank -> its part in words, for the ranks at odds with the rest


def completed_calls_disagree(records: dict[int, Sequence[Sequence[Any]]],
                             states: Callable[[], list[RankState]]) -> Disagreement | None:
    """The first call (by number) whose ranks recorded different reduce ops,
    or None. ``records``: each rank's (group, description, number, function,
    reduce op) tuples (``engine.reduce_ops``); ``states`` is asked only to name
    a group that is not the default one.

    Calls are matched by group and number, so a call some ranks made through a
    function nobody wrapped is simply absent, never taken for another.
    """
    made: dict[tuple[int, str], dict[int, tuple[str, str]]] = {}
    descriptions: dict[str, str] = {}
    for rank, calls in records.items():
        for group, description, number, function, op in calls:
            made.setdefault((number, group), {})[rank] = (function, op)
            descriptions[group] = description
    for (number, group), by_rank in sorted(made.items()):
        parties: dict[tuple[str, str], list[int]] = {}
        for rank, key in sorted(by_rank.items()):
            parties.setdefault(key, []).append(rank)
        if len(parties) > 1:
            call = {"op": "", "group": group, "group_desc": descriptions[group],
                    "seq": number, "p2p": False}
            return _disagreement(call_words(call, states()), parties)
    return None


def _disagreement(where: str, parties: dict[tuple[str, str], list[int]]) -> Disagreement:
    ordered = sorted(parties.items(), key=lambda item: (len(item[1]), item[1]))
    described = "; ".join(f"{_rank_or_ranks(ranks)} {function} {op}"
                          for (function, op), ranks in ordered)
    what = "ops differ" if len({function for function, _ in parties}) > 1 else "reduce ops differ"
    # The odd ones out are blamed; with no single largest party, every rank is.
    largest = max(len(ranks) for ranks in parties.values())
    majority = [key for key, ranks in parties.items() if len(ranks) == largest]
    parts = {}
    for key, ranks in ordered:
        if len(majority) == 1 and key == majority[0]:
            continue
        others = "; ".join(f"{_rank_or_ranks(r)} {f} with {o}"
                           for (f, o), r in ordered if (f, o) != key)
        for rank in ranks:
            parts[rank] = f"called {key[0]} with {key[1]} in {where}, where {others}"
    return Disagreement(f"{where}: {described} ({what})", parts)


def _members(call: dict[str, Any], states: list[RankState]) -> list[int]:
    for state in states:
        group = ((state.log or {}).get("groups") or {}).get(call["group"])
        if group and group.get("ranks"):
            return list(group["ranks"])
    return [s.rank for s in states]


# Ops whose inputs legitimately differ by rank: only a scatter's root passes
# the pieces (ranks are compared by what each receives), and an all_to_all's
# splits may be uneven (ranks are compared by op and dtype only).
_COMPARED_BY_OUTPUT = ("scatter",)
_UNEVEN_PREFIXES = ("all_to_all", "alltoall")


def _fingerprint(call: dict[str, Any]) -> tuple:
    op = call["op"]
    if op in _COMPARED_BY_OUTPUT:
        return (op, tuple(tuple(s) for s in call.get("out_sizes") or ()),
                tuple(call.get("out_dtypes") or ()))
    if op.startswith(_UNEVEN_PREFIXES):
        return (op, (), tuple(call.get("dtypes") or ()))
    return (op, _shapes(call), tuple(call.get("dtypes") or ()))


def _what_holds_up(call: dict[str, Any], states: list[RankState]) -> str | None:
    """Why this waiting collective cannot finish, in words, or None where every
    member of its group has reached it (or got through it) with matching calls."""
    by_rank = {s.rank: s for s in states}
    members = [by_rank[m] for m in _members(call, states) if m in by_rank]
    # Who made this call: those waiting in it, and those it let go (gloo
    # can finish a mismatched call on some ranks and leave the rest waiting).
    made = {m.rank: c for m in members if (c := _call_at(m, call)) is not None}
    fingerprints: dict[tuple, list[int]] = {}
    for rank, made_call in sorted(made.items()):
        fingerprints.setdefault(_fingerprint(made_call), []).append(rank)
    if len(fingerprints) > 1:
        return _mismatch(call, made, fingerprints, states)
    # Members whose group got past this number without a record of the call left.
    through = [m.rank for m in members if m.rank not in made
               and (m.completed(call["group"]) or -1) >= (call["seq"] or 0)]
    for argument in _ARGUMENTS:
        # Known only for calls still waiting (read from their stacks).
        values: dict[Any, list[int]] = {}
        for rank, made_call in sorted(made.items()):
            if made_call.get(argument) is not None:
                values.setdefault(made_call[argument], []).append(rank)
        if len(values) > 1:
            return _arguments_differ(call, made, argument, values, through, states)
    here = [m for m in members if m.rank in made]
    # A member that left explains the wait better than one waiting elsewhere.
    away = sorted((m for m in members if m.rank not in made and m.rank not in through),
                  key=lambda m: m.phase == "running")
    if away:
        return _missing_member(call, here, away[0], states)
    return None


def _call_at(state: RankState, call: dict[str, Any]) -> dict[str, Any] | None:
    """The call ``state``'s rank made in ``call``'s slot (group, number), if any."""
    if state.phase == "running":
        waiting = state.waiting()
        if _same_slot(waiting, call):
            return waiting
    for made in (state.log or {}).get("calls", ()):
        if made["retired"] and _same_slot(made, call):
            return made
    return None


def _same_slot(other: dict[str, Any] | None, call: dict[str, Any]) -> bool:
    return (other is not None and not other["p2p"] and other["group"] == call["group"]
            and other["seq"] == call["seq"])


def _shapes(call: dict[str, Any]) -> tuple:
    return tuple(tuple(s) for s in call.get("sizes") or ())


def _mismatch(call: dict[str, Any], made: dict[int, dict[str, Any]],
              fingerprints: dict[tuple, list[int]], states: list[RankState]) -> str:
    # The odd ones out first: the smallest party is most likely the mistaken one.
    parties = sorted(fingerprints.values(), key=lambda ranks: (len(ranks), ranks))
    described = "; ".join(f"{_rank_or_ranks(ranks)} {signature(made[ranks[0]])}"
                          for ranks in parties)
    keys = list(fingerprints)
    what = ("ops differ" if len({k[0] for k in keys}) > 1 else
            "dtypes differ" if len({k[2] for k in keys}) > 1 else "shapes differ")
    return f"{call_words(call, states)}: {described} ({what})"


def _arguments_differ(call: dict[str, Any], made: dict[int, dict[str, Any]], argument: str,
                      values: dict[Any, list[int]], through: list[int],
                      states: list[RankState]) -> str:
    parties = sorted(values.values(), key=lambda ranks: (len(ranks), ranks))
    described = [f"{_rank_or_ranks(ranks)} {signature(made[ranks[0]], reduce_op=True)}"
                 for ranks in parties]
    through = sorted(set(through) | {r for r, c in made.items()
                                     if c.get(argument) is None and c["retired"]})
    if through:
        described.append(f"{_rank_or_ranks(through)} got through it")
    what = "roots differ" if argument == "root" else "reduce ops differ"
    return f"{call_words(call, states)}: {'; '.join(described)} ({what})"


def _missing_member(call: dict[str, Any], here: list[RankState], away: RankState,
                    states: list[RankState]) -> str:
    verb = "wait" if len(here) > 1 else "waits"
    waiting = f"{_rank_or_ranks([s.rank for s in here])} {verb} in {signature(call)}"
    where = call_words(call, states)
    if away.phase == "running":
        other = away.waiting()
        if other is None:  # blocked in the store (judge lets no other running rank by)
            return (f"rank {away.rank} never reached {where} ({signature(call)}): it waits in "
                    f"{store_words(away.store_wait() or {})}, outside any collective; "
                    f"{waiting}")
        return (f"{where}: {waiting}; rank {away.rank} waits in "
                f"{call_words(other, states)} ({signature(other)}) instead")
    if not away.knows_group(call["group"]) and not call.get("group_desc") == "default_pg":
        gone = "returned from its test" if away.phase == "finished" else _exited(away)
        return (f"rank {away.rank} never reached {where} ({signature(call)}): it {gone} "
                f"without joining that group; {waiting}")
    gone = "returned from its test" if away.phase == "finished" else _exited(away)
    return (f"rank {away.rank} never reached {where} ({signature(call)}): it {gone} "
            f"{_after(away.completed(call['group']))}; {waiting}")


def _exited(state: RankState) -> str:
    code = "" if state.exit_code is None else f" (exit code {state.exit_code})"
    return f"exited{code}"


def _after(completed: int | None) -> str:
    if completed is None or completed < 1:  # the recorder says -1 before the first
        return "before any collective on it"
    return f"after collective #{completed}"


def _p2p_deadlock(running: list[RankState], states: list[RankState]) -> str | None:
    waits = {s.rank: c for s in running if (c := s.waiting()) is not None}
    in_calls = [s for s in running if s.rank in waits]
    calls = list(waits.values())
    if not calls or not all(c["p2p"] for c in calls):
        return None
    ops = {c["op"] for c in calls}
    if ops <= {"send"} or ops <= {"recv", "recv_anysource"}:
        kind = "send" if ops == {"send"} else "receive"
        ranks = _ranks([s.rank for s in in_calls])
        rest = "".join(f"; rank {s.rank} waits in {store_words(s.store_wait() or {})}"
                       for s in running if s not in in_calls) + _gone(states)
        who = (f"every rank still running ({ranks}) waits" if len(in_calls) == len(running)
               else f"{_rank_or_ranks([s.rank for s in in_calls])} "
                    f"wait{'s' if len(in_calls) == 1 else ''}")
        facing = f"{kind} facing {kind}, " if len(in_calls) > 1 else ""
        nobody = "nobody receives" if kind == "send" else "nobody sends"
        return f"{who} in a {kind}: {facing}{nobody}{rest}"
    return None


def _store_deadlock(running: list[RankState], states: list[RankState]) -> str | None:
    """Every rank still running waits in the store: none is left to set a key."""
    if any(s.waiting() is not None for s in running):
        return None
    waits = "; ".join(f"rank {s.rank} {store_words(s.store_wait() or {})}" for s in running)
    return (f"every rank still running ({_ranks([s.rank for s in running])}) waits in the "
            f"store, with nobody left to set what it waits for: {waits}{_gone(states)}")


def _gone(states: list[RankState]) -> str:
    """``; rank 2 returned from its test; rank 3 exited``, or nothing."""
    finished = [s.rank for s in states if s.phase == "finished"]
    exited = [s.rank for s in states if s.phase == "exited"]
    words = ""
    if finished:
        their = "its test" if len(finished) == 1 else "their tests"
        words += f"; {_rank_or_ranks(finished)} returned from {their}"
    if exited:
        words += f"; {_rank_or_ranks(exited)} exited"
    return words


def doing(state: RankState, states: list[RankState], now_ns: int) -> str:
    """One rank's part, in words."""
    if state.phase == "running":
        call = state.waiting()
        store = state.store_wait()
        if call is None and store is not None:
            waited = max(0.0, (now_ns - store["since_ns"]) / 1e9)
            return f"waiting in {store_words(store)}, outside any collective (for {waited:.1f} s)"
        if call is None:
            return "busy outside any recorded collective"
        waited = max(0.0, (now_ns - call["created_ns"]) / 1e9)
        what = "" if call.get("seq") is None else f": {signature(call)}"
        return f"waiting in {call_words(call, states)}{what} (for {waited:.1f} s)"
    last = _last_call(state)
    after = f" after {call_words(last, states)}" if last is not None else ""
    if state.phase == "finished":
        return f"finished its test{after}"
    return f"{_exited(state)}{after}"


def _last_call(state: RankState) -> dict[str, Any] | None:
    calls = [c for c in (state.log or {}).get("calls", ()) if c["retired"]]
    return calls[-1] if calls else None


def recent_calls(state: RankState, states: list[RankState]) -> list[str]:
    """Its last recorded calls, oldest first, one line each."""
    return [f"{call_words(c, states)}: {signature(c)} "
            f"({'done' if c['retired'] else 'waiting'})"
            for c in (state.log or {}).get("calls", ())]


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _rank_or_ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)}"
