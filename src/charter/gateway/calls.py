"""A client's ``tools/call`` as a Charter run of one attempt (G2, G3, G4).

Each call the gateway admits is a run of its own under the client's mission,
started by the client's principal, whose one effect (``call``) is the tool
call: admitted against the allowance, written down before it is sent,
settled after (A1-A10). A run per call is what lets one call wait for an
approval or for evidence without holding up the client's other calls, and it
is what the console, ``charter runs`` and a restarted gateway see.

The call's identity (:func:`call_key`) is the client's own key in ``_meta``
(``charter/call_key``), else, for a tool that declares ``same_call_seconds``,
its arguments within that window, else the session's request id. The store
maps it to the call's run (:mod:`charter.gateway.store`) before the attempt
is admitted, so the same call asked again, on this gateway or after it
crashed, on another, finds its run and is answered from its record: a result
replays, an outcome nobody can prove is "unknown, waiting for evidence", an
approval still pending is named again, and the upstream is called at most
once (A4). The engine's own rules decide each case; this module only routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charter import Attempt, AttemptStatus, Right, RunStatus
from charter.errors import ApprovalRequired, CharterError, LeaseHeld, NeedsIntervention
from charter.gateway.config import GatewayConfig
from charter.gateway.upstream import UpstreamTools

if TYPE_CHECKING:
    from charter import Engine, Executor, Principal

#: The effect key of a call's one effect in its run.
EFFECT = "call"
#: The ``_meta`` key a client may set to name its call (its retries carry it too).
CALL_KEY_META = "charter/call_key"


@dataclass(frozen=True)
class Answer:
    """What the client is told: the upstream's answer as recorded, or the
    gateway's own word (``charter``: a status and what to do next)."""

    result: Mapping[str, Any] | None = None
    charter: Mapping[str, Any] | None = None

    @property
    def is_error(self) -> bool:
        return self.charter is not None


def call_key(
    tool: str,
    arguments: Mapping[str, Any],
    meta: Mapping[str, Any],
    *,
    same_call_seconds: int | None,
    request: str,
) -> tuple[str, int | None]:
    """The call's identity, and the window (seconds) within which it is one call."""
    given = meta.get(CALL_KEY_META)
    if isinstance(given, str) and given:
        return "key:" + _digest(given), None
    if same_call_seconds is not None:
        identity = json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True)
        return "args:" + _digest(identity), same_call_seconds
    return "req:" + _digest(request), None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Calls:
    """The gateway's calls over one engine (see the module's text)."""

    def __init__(self, engine: Engine, config: GatewayConfig, instance: str) -> None:
        self.engine = engine
        self.config = config
        self.instance = instance

    async def call(
        self,
        who: Principal,
        *,
        mission: str,
        tools: UpstreamTools,
        tool: str,
        arguments: dict[str, Any],
        key: tuple[str, int | None],
    ) -> Answer:
        """Carry the call ``key`` of ``tools.name``'s ``tool`` for ``who``."""
        run_id, executor = await asyncio.to_thread(
            self.engine.start_call, mission, by=who, segment_id=self._segment(),
            call_key=key[0], window_seconds=key[1], tool=f"{tools.name}.{tool}",
        )  # fmt: skip
        if executor is not None:
            return await self._carry(executor, who, tools, tool, arguments, new=True)
        return await self._again(run_id, who, tools, tool, arguments)

    def _segment(self) -> str:
        """A segment name never used before (R2): the gateway's, and a random part."""
        return f"gw-{self.instance}-{uuid.uuid4().hex[:16]}"

    async def _carry(
        self,
        ex: Executor,
        who: Principal,
        tools: UpstreamTools,
        tool: str,
        arguments: dict[str, Any],
        *,
        new: bool,
    ) -> Answer:
        """Call through the engine as the run's owner; the run ends, waits or
        parks with the attempt, and the client is told what the record says."""
        try:
            attempt = await ex.acall(tools, tool, arguments, effect_key=EFFECT)
        except ApprovalRequired as exc:
            await asyncio.to_thread(ex.park, RunStatus.WAITING, f"approval for {tools.name}.{tool}")
            attempt_id = exc.details.get("attempt_id")
            scope = f"{tools.name}.{tool}"
            return await asyncio.to_thread(self._pending, who, ex.run_id, scope, attempt_id)
        except CharterError as exc:  # refused before anything moved: a new call next time
            if new:
                await asyncio.to_thread(self._refused, ex, exc)
            else:
                await asyncio.to_thread(ex.release)
            return Answer(charter={"status": "refused", "code": exc.code, "message": exc.message})
        return await asyncio.to_thread(self._settled, ex, attempt)

    def _refused(self, ex: Executor, exc: CharterError) -> None:
        self.engine.forget_call(ex.run_id)
        ex.finish(RunStatus.FAILED, f"refused: {exc.message}")

    def _settled(self, ex: Executor, attempt: Attempt) -> Answer:
        if attempt.status.settled or attempt.status is AttemptStatus.VOIDED:
            ex.finish(RunStatus.COMPLETED)
        else:
            reason = f"the call's outcome is {attempt.status.value}: reconcile or resolve it"
            ex.park(RunStatus.NEEDS_INTERVENTION, reason)
        return self._told(attempt)

    async def _again(
        self,
        run_id: str,
        who: Principal,
        tools: UpstreamTools,
        tool: str,
        arguments: dict[str, Any],
    ) -> Answer:
        """The same call asked again: answered from its run's record, after its
        owner's crash looked up (R7), and sent only if it never was."""
        attempt = await asyncio.to_thread(self._newest, run_id)
        status = None if attempt is None else attempt.status
        if attempt is not None and (attempt.status.settled or status is AttemptStatus.VOIDED):
            await asyncio.to_thread(self._close, run_id, who)
            return self._told(attempt)
        if attempt is not None and status in (AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN):
            return await self._uncertain(run_id, who, tools, attempt)
        if attempt is not None and status is AttemptStatus.PREPARED:
            waiting = await asyncio.to_thread(self.engine.approvals, run_id=run_id, pending=True)
            if waiting:  # still undecided: named again, nothing else happens
                scope = attempt.scope
                return await asyncio.to_thread(self._pending, who, run_id, scope, attempt.id)
        try:  # never sent: an approved (or expired) PREPARED attempt, or none admitted yet
            ex = await asyncio.to_thread(self._resume, run_id, who)
        except (LeaseHeld, NeedsIntervention) as exc:
            return Answer(
                charter={"status": "in_progress", "run_id": run_id, "message": exc.message}
            )
        return await self._carry(ex, who, tools, tool, arguments, new=False)

    async def _uncertain(
        self, run_id: str, who: Principal, tools: UpstreamTools, attempt: Attempt
    ) -> Answer:
        """The call was sent and its outcome is not recorded: while its sender
        holds the run it is in progress; once that sender is gone (its lease
        over, or its process provably dead) the run is taken over, the
        upstream's lookup asked, and the record answers (R1, R7)."""
        return await asyncio.to_thread(self._look_up, run_id, who, tools, attempt)

    def _look_up(self, run_id: str, who: Principal, tools: UpstreamTools, a: Attempt) -> Answer:
        coordinator = self.engine.coordinator
        if a.status is AttemptStatus.DISPATCHED:
            try:
                coordinator.recover(run_id, self._segment(), by=who)
            except LeaseHeld:
                return Answer(charter={"status": "in_progress", "run_id": run_id,
                                       "message": "the call is being sent; ask again"})  # fmt: skip
        # A lookup that cannot be made proves nothing: the attempt stays as it is.
        with contextlib.suppress(CharterError):
            coordinator.reconcile(a.id, tools, by=who)
        now = self.engine.get_attempt(a.id)
        if now.status.settled:
            self._close(run_id, who)
            return self._told(now)
        return Answer(charter={
            "status": "outcome_unknown", "run_id": run_id, "attempt_id": a.id,
            "message": "the call's outcome is unknown and it is never sent again: waiting for "
                       "evidence (a lookup, or a person's resolution)",
            "console": self._link(run_id),
        })  # fmt: skip

    def sweep(self, tools: dict[str, UpstreamTools]) -> int:
        """Look up the calls a gateway before this one left in flight (G3): each
        call's run whose sender is gone is taken over and its attempt looked up
        by its upstream's lookup, as the engine itself (no client is asking);
        what no lookup settles waits for a person or the client's retry.
        Returns how many calls were looked up."""
        looked = 0
        for mission in {c.mission for c in self.config.clients.values()}:
            for run_id in self.engine.unfinished_calls(mission):
                attempt = self._newest(run_id)
                upstream = None if attempt is None else tools.get(attempt.adapter)
                if attempt is None or upstream is None:
                    continue
                with contextlib.suppress(CharterError):
                    if attempt.status is AttemptStatus.DISPATCHED:
                        self.engine.coordinator.recover(run_id, self._segment())
                    self.engine.coordinator.reconcile(attempt.id, upstream)
                    looked += 1
        return looked

    def _close(self, run_id: str, who: Principal) -> None:
        """End a call's run whose one attempt is settled (one a takeover or a
        person settled is left waiting in the inbox until then). The record
        answers the call either way: a run that cannot end now is ended by the
        next retry."""
        if self.engine.run(run_id).status.terminal:
            return
        with contextlib.suppress(CharterError):
            self._resume(run_id, who).finish(RunStatus.COMPLETED)

    def _resume(self, run_id: str, who: Principal) -> Executor:
        """Continue the call's run as its owning segment: one that let go of it
        (a wait), or whose holder is gone, or that a takeover installed (R9)."""
        owner = self.engine.run(run_id).owner_segment
        return self.engine.coordinator.resume(run_id, owner, by=who)

    def _newest(self, run_id: str) -> Attempt | None:
        found = [a for a in self.engine.attempts(run_id=run_id) if a.effect_key == EFFECT]
        return max(found, key=lambda a: a.generation) if found else None

    def _told(self, attempt: Attempt) -> Answer:
        """The client's answer from the attempt's record (A4: never sent again)."""
        if attempt.status is AttemptStatus.VOIDED:
            return Answer(charter={"status": "voided", "attempt_id": attempt.id,
                                   "message": attempt.reason or "never sent"})  # fmt: skip
        if attempt.status in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED) and (
            attempt.result is not None or attempt.receipt is not None
        ):
            return Answer(result=recorded(attempt))
        return Answer(charter={"status": attempt.status.value, "attempt_id": attempt.id,
                               "message": attempt.reason or attempt.status.value})  # fmt: skip

    def _pending(self, who: Principal, run_id: str, scope: str, attempt_id: str | None) -> Answer:
        """Who must approve the call, where, and that asking again sends it once."""
        contract = self.engine.contract(self.engine.run(run_id).mission_id)
        held = self.engine.get_attempt(attempt_id).estimate if attempt_id else None
        four_eyes = contract.four_eyes(held)
        approvers = sorted(
            p for p in contract.principals
            if contract.allows(p, Right.APPROVE, scope) and not (four_eyes and p == who.name)
        )  # fmt: skip
        waiting = self.engine.approvals(run_id=run_id, pending=True)
        approval = waiting[-1].id if waiting else None
        return Answer(charter={
            "status": "approval_required", "attempt_id": attempt_id, "approval_id": approval,
            "approvers": approvers, "run_id": run_id, "console": self._link(run_id),
            "message": f"{scope} needs an approval by {', '.join(approvers) or 'an approver'}; "
                       "ask again once it is given: the call is then sent once",
        })  # fmt: skip

    def _link(self, run_id: str | None) -> str | None:
        base = self.config.console_url
        if base is None:
            return None
        return f"{base.rstrip('/')}/runs/{run_id}" if run_id else f"{base.rstrip('/')}/"


def recorded(attempt: Attempt) -> dict[str, Any]:
    """The upstream's ``CallToolResult`` as recorded: the structured content is
    the attempt's result and the rest its receipt, or the whole answer is the
    result (see :class:`~charter.integrations.mcp.McpTools`); a lookup's record
    becomes structured content with its text."""
    result, receipt = attempt.result, attempt.receipt
    if isinstance(receipt, Mapping) and "content" in receipt:
        return {**receipt, "structuredContent": result}
    if isinstance(result, Mapping) and "content" in result:
        return dict(result)
    text = json.dumps(result, sort_keys=True)
    body: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if isinstance(result, Mapping):
        body["structuredContent"] = dict(result)
    if attempt.status is AttemptStatus.FAILED:
        body["isError"] = True
    return body
