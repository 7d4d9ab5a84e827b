"""What to do with an effect, decided in one place (A4, A6, A7, N6).

A node's call names an effect (its node, its key) and brings a request. The
effect may have been tried before: earlier in this node execution, by an
earlier execution of the node, by the run this one continues. From the
newest recorded attempt of the effect and the call in hand, :func:`decide`
says which of these happens:

- **replay** — the recorded attempt answers the call: its result if it
  settled, its failure, or (unresolved) a blocked node; nothing is sent;
- **send** — a first try: admit it and send it;
- **dispatch** — the effect's PREPARED attempt (admitted, waiting for its
  approval) is sent now;
- **retry** — a new attempt, linked to the newest, because that one proved the
  effect was not performed (FAILED, VOIDED), or because the effect only reads
  and its answer was lost or written off, within the operation's retry policy;
- **refuse** — the call asks for something else than was recorded under the
  same effect: :class:`~charter.errors.NonDeterminismError`, never a silent
  re-send.

The same rule holds inside the admission transaction, on rows read under the
mission's gate (:func:`check_admissible`): a decision taken outside it on an
older read can only be refused there, never performed twice. Nothing here
reads or writes the store: :func:`charter.attempts.dispatch.performing` is the
one driver that asks :func:`decide` before every try and after every send.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from charter.adapters import EffectClass
from charter.attempts.calls import Call
from charter.attempts.model import Attempt, AttemptStatus, Effect
from charter.errors import AttemptAlreadySettled, NonDeterminismError, StateError

#: Statuses whose effect is, or may be, performed: a retry never follows them
#: unless the effect only reads (A4, A7).
PERFORMED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.WRITTEN_OFF})


class Decision(StrEnum):
    REPLAY = "replay"
    SEND = "send"
    DISPATCH = "dispatch"
    RETRY = "retry"


class Step(NamedTuple):
    """A decision, the attempt it is about, and for a new try its generation and
    the attempt it follows."""

    decision: Decision
    prior: Attempt | None = None
    generation: int = 1
    retry_of: str | None = None

    def effect(self, at: Effect) -> Effect:
        """The effect a send or retry admits: ``at`` as this try."""
        return Effect(at.node_id, at.execution, at.key, self.generation, self.retry_of, at.lineage)


def _retry(prior: Attempt, generation: int) -> Step:
    return Step(Decision.RETRY, prior, generation, prior.id)


class InHand(NamedTuple):
    """The call in hand, as much of it as the decision needs. (Steps and calls are
    tuples: one of each is made for every attempt.)"""

    run_id: str
    node_id: str
    execution: int
    key: str
    request_hash: str
    scope: str
    effect_class: EffectClass
    retries: int

    @classmethod
    def of(cls, call: Call, run_id: str, effect: Effect) -> InHand:
        retries = call.adapter.operations[call.operation].retries
        return cls(
            run_id,
            effect.node_id,
            effect.execution,
            effect.key,
            call.request_hash,
            call.scope,
            call.effect_class,
            retries,
        )


def unrecorded(attempt: Attempt) -> bool:
    """Whether ``attempt`` settled applied with no answer on record (N6): by
    evidence naming no result (a usage lookup) or by a person who gave none,
    never by its own send's answer."""
    return (
        attempt.status is AttemptStatus.SUCCEEDED
        and not attempt.answered
        and attempt.result is None
    )


def decide(prior: Attempt | None, call: InHand, *, seen: bool | None = None) -> Step:
    """The next step for ``call``, given the effect's newest attempt ``prior``.

    ``seen``: whether the call in hand saw ``prior``'s outcome itself (the
    driver knows, right after a try: not when the engine did not send it
    because its deadline had passed); ``None``: as recorded (``answered``).
    """
    if prior is None:
        return Step(Decision.SEND)
    here = prior.run_id == call.run_id and prior.execution == call.execution
    performed = prior.status in PERFORMED
    reads = prior.effect_class == EffectClass.READ_ONLY.value
    may_differ = not here and (prior.status.ended_unperformed or (performed and reads))
    if not may_differ and (prior.request_hash != call.request_hash or prior.scope != call.scope):
        raise NonDeterminismError(
            f"node {call.node_id} execution {call.execution} replayed effect {call.key} with "
            f"a different request than recorded (attempt {prior.id}); the run needs "
            "intervention",
            attempt_id=prior.id,
            recorded_hash=prior.request_hash,
            replayed_hash=call.request_hash,
        )
    if prior.status is AttemptStatus.PREPARED:
        return Step(Decision.DISPATCH, prior)
    following = prior.generation + 1 if here else 1
    if prior.status is AttemptStatus.VOIDED:
        return _retry(prior, following)  # never sent: admitted again (R3, N4)
    if not here:
        # A new node execution: what was performed is replayed from its record
        # and never performed again, unless it only read; what was not applied
        # is tried again as a new attempt (A4).
        if prior.status.ended_unperformed or (performed and reads):
            return _retry(prior, following)
        return Step(Decision.REPLAY, prior)
    # Settled as not applied while nobody waited for it (by evidence, a person, or
    # the engine's own refusal to send late): the node never saw it fail, so it
    # goes on with a new attempt. So does a read written off, or settled without
    # its answer (N6): reading again has no effect (A7), and a model call's only
    # consequence is its cost. Both within the operation's retry policy.
    saw = prior.answered if seen is None else seen
    unseen = prior.status is AttemptStatus.FAILED and not saw
    lost_read = reads and (prior.status is AttemptStatus.WRITTEN_OFF or unrecorded(prior))
    if (unseen or lost_read) and prior.generation <= call.retries:
        return _retry(prior, following)
    return Step(Decision.REPLAY, prior)


def check_admissible(rows: Sequence[Attempt], effect: Effect, run_id: str) -> None:
    """The decision's rule on the effect's attempts as read under the mission's
    gate (``rows``, newest first), for the try ``effect`` about to be admitted.

    A generation is admitted once; no attempt is admitted while any attempt of
    the effect is unresolved; a retry names the newest attempt, which must not
    have performed the effect unless it only reads. Raises; returns nothing.
    """
    for r in rows:
        if (r.run_id, r.execution, r.generation) == (run_id, effect.execution, effect.generation):
            raise AttemptAlreadySettled(
                f"effect {effect.key!r} already has attempt {r.id} ({r.status.value}) at "
                f"generation {effect.generation}; a retry is a new generation",
                attempt_id=r.id,
                status=r.status.value,
            )
        if r.status.holds:
            raise StateError(
                f"effect {effect.key!r} has attempt {r.id} still {r.status.value}; it is "
                "never retried on a guess — reconcile or resolve it first",
                attempt_id=r.id,
                status=r.status.value,
            )
    if not rows:
        if effect.retry_of is not None or effect.generation > 1:
            raise StateError(
                f"effect {effect.key!r} has no earlier attempt: a first try is generation 1 "
                "and follows nothing",
                retry_of=effect.retry_of,
            )
        return
    newest = rows[0]
    if effect.retry_of != newest.id:
        raise StateError(
            f"effect {effect.key!r} was tried before (attempt {newest.id}, "
            f"{newest.status.value}): a retry must name it as retry_of",
            retry_of=effect.retry_of,
            attempt_id=newest.id,
        )
    if newest.status in PERFORMED and newest.effect_class != EffectClass.READ_ONLY:
        raise AttemptAlreadySettled(
            f"effect {effect.key!r} was settled {newest.status.value} by attempt {newest.id}; "
            "a settled effect is never performed again — its record is replayed",
            attempt_id=newest.id,
            status=newest.status.value,
        )
