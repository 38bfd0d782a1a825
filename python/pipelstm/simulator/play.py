"""The event simulation of one pipeline's training step, as the engine runs it.

Rules, each from the engine (``csrc/pipeline``):

* every stage runs the items of a pass in ``item_order`` (``schedule.h``):
  it starts item ``i`` once it has run the item before in its order and the
  stage before it (after it, backward) has handed item ``i`` over
  (``pass.cpp``);
* a hand-over to another device or process is asynchronous for the sender
  (the courier's copy stream, ``streams.cpp``; a posted send,
  ``remote.cpp``) and the hand-overs of one stage to the next go over one
  link in order: item ``i`` arrives ``link.seconds(bytes)`` after both its
  end and the arrival of the item sent before it;
* backward, a recomputed item (``recomputes``) replays its forward first;
* after its last backward item a stage runs its units' parameter
  gradients, one task per unit with parameters, last unit first
  (``weight_tasks.h``); stages that share one CPU process with the same
  thread budget (``groups``) then take each other's ready tasks, a stage
  its own first and then those of the lowest stage that has some;
* in one process the backward pass starts once every stage has finished
  the forward (one engine call each); stages in processes of their own
  start it as soon as their own forward is done.

Times are seconds from the step's start; the events are the engine's trace
format (``Pipeline.trace``), nanoseconds.
"""

import heapq
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .schedule import item_order, recomputes

__all__ = ["StageCosts", "Played", "play"]


@dataclass
class StageCosts:
    """What the player needs of each stage, in seconds.

    ``forward(s, m, k)`` and ``backward(s, m, k)``: the stage's units on
    item ``(m, k)`` (backward: the data gradients; a recomputation costs
    ``forward``); ``send(s, direction, m, k)``: the hand-over of the item's
    result to the next stage (forward) or the one before (backward), 0 when
    none is made; ``weights(s)``: the stage's parameter-gradient tasks in
    the engine's order (last unit first), as ``(seconds, bytes of the
    gradients it makes, bytes it frees, bytes it holds only while it runs)``.

    Memory, in bytes (optional): ``kept(s, m, k)``, what the item's forward
    keeps for its backward (``full(s, m, k)``: what it would keep without
    recomputation, held from a replay on); ``pieces(s, m, k)``, what of it
    outlives the item's backward, for the parameter gradients (the weight
    tasks free it); ``transient(s, m, k)``, what the stage holds only while
    it runs the item (its output in the making, the gradient coming back).
    """

    forward: Callable[[int, int, int], float]
    backward: Callable[[int, int, int], float]
    send: Callable[[int, str, int, int], float]
    weights: Callable[[int], Sequence[Tuple[float, float, float, float]]]
    kept: Callable[[int, int, int], float] = lambda s, m, k: 0.0
    full: Callable[[int, int, int], float] = lambda s, m, k: 0.0
    pieces: Callable[[int, int, int], float] = lambda s, m, k: 0.0
    transient: Callable[[int, int, int], float] = lambda s, m, k: 0.0


@dataclass
class Played:
    """One step as played: per stage, the ends of its forward and backward
    passes; the passes' spans; the busy seconds; the trace events; and the
    memory each stage takes or gives back, ``(seconds, stage, bytes)``."""

    forward_end: List[float]
    backward_end: List[float]
    forward_span: Tuple[float, float]
    backward_span: Tuple[float, float]
    busy: List[float]
    events: List[Dict[str, object]] = field(default_factory=list)
    memory: List[Tuple[float, int, float]] = field(default_factory=list)

    def peak(self, stages: Sequence[int]) -> float:
        """The most bytes ``stages`` held at once (what ``memory`` adds up to)."""
        live = top = 0.0
        # at equal times, what is given back first
        for _, _, delta in sorted((m for m in self.memory if m[1] in stages), key=lambda m: (m[0], m[2])):
            live += delta
            top = max(top, live)
        return top


def _event(stage: int, phase: str, m: int, k: int, start: float, end: float) -> Dict[str, object]:
    return dict(stage=stage, phase=phase, micro_batch=m, chunk=k, start_ns=int(round(start * 1e9)),
                end_ns=int(round(end * 1e9)))


def _pass(direction: str, S: int, K: int, M: int, costs: StageCosts, checkpoint: str, start: Sequence[float],
          events: List[dict], busy: List[float], memory: List[tuple]) -> List[float]:
    """Plays one pass; returns each stage's end of its last item."""
    forward = direction == "forward"
    order = item_order(direction, K, M)
    arrive: Optional[Dict[Tuple[int, int], float]] = None  # from the neighbour upstream in this pass
    ends = [0.0] * S
    for s in (range(S) if forward else range(S - 1, -1, -1)):
        free, link_free = start[s], start[s]
        sent: Dict[Tuple[int, int], float] = {}
        last = (s == S - 1) if forward else (s == 0)
        for m, k in order:
            begin = max(free, arrive[(m, k)] if arrive is not None else start[s])
            held = costs.transient(s, m, k)
            memory.append((begin, s, held))
            if not forward and recomputes(checkpoint, m, k, K, M):
                seconds = costs.forward(s, m, k)
                events.append(_event(s, "recompute", m, k, begin, begin + seconds))
                memory.append((begin, s, costs.full(s, m, k)))
                held += costs.full(s, m, k)
                busy[s] += seconds
                begin += seconds
            seconds = costs.forward(s, m, k) if forward else costs.backward(s, m, k)
            end = begin + seconds
            events.append(_event(s, direction, m, k, begin, end))
            memory.append((end, s, -held))
            if forward:
                memory.append((end, s, costs.kept(s, m, k)))
            else:  # what the item kept, but what the weight tasks need
                memory.append((end, s, costs.pieces(s, m, k) - costs.kept(s, m, k)))
            busy[s] += seconds
            free = end
            if last:
                continue
            hand_over = costs.send(s, direction, m, k)
            link_free = max(link_free, end) + hand_over
            if hand_over > 0:
                events.append(_event(s, "transfer", m, k, link_free - hand_over, link_free))
            sent[(m, k)] = link_free
        ends[s] = free
        arrive = sent
    return ends


def _weights(S: int, costs: StageCosts, ready: Sequence[float], groups: Sequence[int], events: List[dict],
             busy: List[float], memory: List[tuple]) -> List[float]:
    """Plays the parameter-gradient tasks (weight_tasks.h); returns each
    stage's end. ``groups[s]``: stages with equal values take each other's
    tasks."""
    tasks = [list(costs.weights(s)) for s in range(S)]
    nxt = [0] * S
    ends = list(ready)
    # (time the stage looks for a task, 0 = its own stage just got ready / 1 = woken, stage)
    queue = [(ready[s], 0, s) for s in range(S)]
    heapq.heapify(queue)
    while queue:
        t, _, s = heapq.heappop(queue)
        owner = s if nxt[s] < len(tasks[s]) else -1
        if owner < 0:
            mates = [o for o in range(S) if o != s and groups[o] == groups[s] and nxt[o] < len(tasks[o])]
            ready_now = [o for o in mates if ready[o] <= t]
            if ready_now:
                owner = ready_now[0]
            elif mates:  # waits until another stage of its group marks its tasks ready
                heapq.heappush(queue, (min(ready[o] for o in mates), 1, s))
                continue
            else:
                ends[s] = max(ends[s], t)
                continue
        seconds, grads, freed, joined = tasks[owner][nxt[owner]]
        nxt[owner] += 1
        events.append(_event(s, "weights", -1, -1, t, t + seconds))
        memory.append((t, owner, joined))  # the task's joined copy, while it runs
        memory.append((t + seconds, owner, grads - freed - joined))
        busy[s] += seconds
        ends[s] = t + seconds
        heapq.heappush(queue, (t + seconds, 0, s))
    return ends


def play(S: int, K: int, M: int, costs: StageCosts, *, checkpoint: str = "never", in_process: bool = True,
         groups: Optional[Sequence[int]] = None, pass_gap_s: float = 0.0) -> Played:
    """Plays one training step of an ``S``-stage pipeline over ``K`` x ``M`` items.

    Args:
        S, K, M: stages, time chunks, micro-batches (K and M as the engine
            clamps them, ``schedule.item_grid``).
        costs: the stages' costs.
        checkpoint: the recomputation mode.
        in_process: all stages are one engine in one process (the backward
            starts after the whole forward), else one process each.
        groups: per stage, its weight-task group (equal values share
            tasks); default: none shared.
        pass_gap_s: seconds between a stage's forward and its backward
            outside the engine (the caller's autograd, the loss's return).

    Returns:
        A :class:`Played`.
    """
    groups = list(range(S)) if groups is None else list(groups)
    events: List[dict] = []
    memory: List[tuple] = []
    busy = [0.0] * S
    f_end = _pass("forward", S, K, M, costs, checkpoint, [0.0] * S, events, busy, memory)
    b_start = [max(f_end) + pass_gap_s] * S if in_process else [f + pass_gap_s for f in f_end]
    items_end = _pass("backward", S, K, M, costs, checkpoint, b_start, events, busy, memory)
    b_end = _weights(S, costs, items_end, groups, events, busy, memory)
    if in_process:  # the pass returns when every stage's thread is done
        b_end = [max(b_end)] * S
    return Played(forward_end=f_end, backward_end=b_end, forward_span=(0.0, max(f_end)),
                  backward_span=(min(b_start), max(b_end)), busy=busy, events=events, memory=memory)
