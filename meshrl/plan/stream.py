"""The schedule of streaming generation with partial rollouts (``train.stream_steps=S`` with
``train.off_policy=k``): which batches the generation step of each policy version decodes, and how
far. Pure: the step order (plan/steps.py) carries it, the runtime runs it (runtime/stream.py).

Version v is the actor after v updates; iteration t trains version t. The generation stream is a
bounded buffer of k batches: batch j (the samples iteration j trains on) is

- *admitted* at version max(start, j - k): its prompts enter the stream, so at most
  (v + k + 1) batches have been admitted by version v (AReaL's admission rule);
- *advanced* S decode steps at every version from j - k to j - 2: between two versions the weights
  change, and its sequences still in flight continue under the new ones (re-prefilled: prompt and
  tokens so far), each token recording the version that sampled it;
- *finished at the bound* at version j - 1: whatever is still in flight is decoded to its end
  (EOS or ``gen_len``) under version j - 1, since iteration j consumes it. Nothing is dropped or
  restarted; ``rollout/at_bound`` counts those sequences.

So a token of batch j has version between j - k and j - 1: staleness 1 .. k when iteration j
trains on it (0 .. k over the first k iterations, whose batches start at version ``start``). The
schedule is the config's: it fixes which decode step each weight update lands at, whatever the
timing, so every plan gives the same numbers. S >= gen_len decodes each batch whole at admission,
which is exactly the whole-batch ``off_policy=k`` schedule; k = 1 admits and finishes each batch
at the same version (nothing in flight across an update).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One batch's share of a generation step: batch ``batch`` decoded from decode step ``first``
    (the tokens it has so far) for ``steps`` steps (None: to the end, the at-bound finish), under
    the weights of version ``version``."""

    batch: int
    version: int
    first: int
    steps: int | None


def advance(t: int, k: int, s: int, stop: int) -> tuple[Segment, ...]:
    """The segments of version t's generation step (it runs while iteration t trains): batch t + 1
    finished, batches t + 2 .. t + k (up to the last iteration, stop - 1) advanced S steps each,
    t + k admitted. Batch j has had S steps at each of versions j - k .. t - 1 before."""
    if k < 1 or s < 1:
        raise ValueError(f"streaming needs off_policy >= 1 and stream_steps >= 1, got {k}, {s}")
    out = []
    for j in range(t + 1, min(t + k, stop - 1) + 1):
        first = s * (t - (j - k))
        out.append(Segment(j, t, first, None if j == t + 1 else s))
    return tuple(out)


def prologue(start: int, ahead: int, k: int, s: int, stop: int) -> tuple[Segment, ...]:
    """What the stream must hold before iteration ``start`` trains, under version ``start``: the
    batches start .. start + k - 1 that a checkpoint did not restore (``ahead`` of them were), each
    given at once the S-step segments of the versions before ``start`` (batch ``start`` whole)."""
    out = []
    for j in range(start + ahead, min(start + k, stop)):
        out.append(Segment(j, start, 0, None if j == start else s * (start + k - j)))
    return tuple(out)


def token_budget(seg: Segment, gen_len: int) -> int:
    """Decode steps the segment may run: to ``gen_len`` for the finish, else S (never past gen_len)."""
    left = gen_len - seg.first
    return max(0, left if seg.steps is None else min(seg.steps, left))
