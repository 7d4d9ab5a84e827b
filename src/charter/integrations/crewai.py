"""CrewAI on Charter: a crew's tool calls and model calls are attempts (A1-A7),
replayed from their records when the crew is started again after a crash,
instead of being made again.

A crew runs inside a node, through :func:`kickoff`. Two adapters, each usable
on its own (an operator reconciles with them):

- :class:`CrewTools`, CrewAI tools as operations, one per tool, with the effect
  class declared for it (``unsafe`` when undeclared). Its ``tools`` are the
  tools to give the agents and tasks.
- :class:`~charter.integrations.crewai_models.CrewModel`, a CrewAI LLM whose
  every call is a ``read_only`` attempt, priced as the model adapters price.

CrewAI keeps no record of a crew it can resume, and its tool calls carry no
id a tool sees: a crew started again runs from its first task, every call
getting its record back by its key. A tool call's key is made of what is the
same on every run: the node (``<run>/<node>[/<key>]``), the task (its place
in the crew), the tool, a digest of its arguments as canonical JSON, and how
many calls of that tool with those arguments the task made before it (see
:meth:`Binding.tool_key` for what such a key cannot tell apart). A model
call's key is the task and its turn in it. When Charter stops a call (an
approval not yet given, an exhausted allowance, an outcome waiting for
evidence), :class:`~charter.Blocked`, which is not an ``Exception``, passes
through CrewAI's handlers and ends the kickoff; the node blocks as any node
does and, once a person decided, runs the crew again from its records. Needs
the ``crewai`` extra (``pip install 'charter[crewai]'``).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from charter import (
    AttemptFailed,
    Context,
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    NotApplied,
    Operation,
    Outcome,
    OutcomeUnknown,
    RecordedAttempt,
)
from charter.attempts.classify import error_answer
from charter.errors import ConfigError, MissingExtra, StateError

try:
    from crewai import Crew  # type: ignore[import-not-found,unused-ignore]
    from crewai.hooks import (  # type: ignore[import-not-found,unused-ignore]
        register_before_tool_call_hook,
    )
    from crewai.tools import BaseTool  # type: ignore[import-not-found,unused-ignore]
    from pydantic import BaseModel, ValidationError

    from charter.integrations.crewai_models import BOUND, Binding, CrewModel, bound
except ImportError:  # pragma: no cover - the main environment has no crewai
    raise MissingExtra(
        "the CrewAI integration needs crewai: pip install 'charter[crewai]'", extra="crewai"
    ) from None

ToolCost = Mapping[str, int] | Callable[[Any], Mapping[str, int]]
ToolLookup = Callable[[RecordedAttempt], Evidence | Awaitable[Evidence]]


_TASK: contextvars.ContextVar[Any] = contextvars.ContextVar("charter_crewai_task", default=None)
_SENDING: contextvars.ContextVar[Dispatch] = contextvars.ContextVar("charter_crewai_sending")
_HOOKED: list[bool] = []


def current_send() -> Dispatch:
    """The attempt a tool call is being sent as: its idempotency key and fencing
    token, for a tool whose target deduplicates or fences by them."""
    send = _SENDING.get(None)
    if send is None:
        raise StateError("current_send() is for a tool called through CrewTools")
    return send


def as_json(value: Any) -> Any:
    """A tool's answer as JSON, as the store gives it back, so that the agent is
    shown the same live and on replay."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str, sort_keys=True))


class ToolFailed(Exception):
    """A ``read_only`` tool's recorded failure, raised for CrewAI to tell the
    agent (``Error executing tool: ...``), live and on replay alike."""


class CrewTools:
    """CrewAI tools as Charter operations, one per tool, by its name.

    ``effects``: each tool's effect class (an :class:`~charter.EffectClass`, or
    an :class:`~charter.Operation` for an ``idempotent_keyed`` tool's dedupe
    window); a tool without one is ``unsafe``: an uncertain call is never
    repeated. A tool's error is read by the one rule
    (:func:`~charter.attempts.classify.error_answer`, A3): a ``read_only``
    tool's call settles FAILED and the agent is told, on replay too; any other
    tool's call is UNKNOWN, the error kept as evidence, and the crew stops until
    a lookup or a person settles it; a tool raising :class:`~charter.NotApplied`
    proves it did nothing (FAILED). ``costs``: a tool's estimate, in allowance
    units, or a function of its arguments; a call costs its estimate.
    ``lookups``: how to find out what became of an uncertain call.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool],
        *,
        effects: Mapping[str, EffectClass | Operation] | None = None,
        name: str = "tools",
        costs: Mapping[str, ToolCost] | None = None,
        lookups: Mapping[str, ToolLookup] | None = None,
    ) -> None:
        declared = dict(effects or {})
        self.name = name
        self.plain = {t.name: _checked(t) for t in tools}
        unknown = sorted(set(declared) - set(self.plain))
        if unknown:
            raise ConfigError(f"effects= names tools that are not given: {unknown}")
        self.operations: Mapping[str, Operation] = {
            n: _operation(declared.get(n, EffectClass.UNSAFE)) for n in self.plain
        }
        self.costs = dict(costs or {})
        self.lookups = dict(lookups or {})
        #: The tools to give agents and tasks: each call an attempt of the node.
        self.tools: list[BaseTool] = [_GovernedTool.of(self, t) for t in self.plain.values()]

    def estimate(self, operation: str, request: Any) -> Estimate:
        cost = self.costs.get(operation, {})
        amounts = cost(request) if callable(cost) else cost
        return Estimate(dict(amounts), f"{self.name}/declared")

    def dispatch(self, send: Dispatch) -> Outcome:
        tool = self.plain[send.operation]
        try:  # arguments the tool's schema refuses: it never runs
            if tool.args_schema is not None:
                tool.args_schema.model_validate(send.request)
        except ValidationError as exc:
            raise NotApplied(f"the tool refused its arguments: {exc}") from exc
        send.check_deadline()
        token = _SENDING.set(send)
        try:
            output = tool.run(**send.request)
            if asyncio.iscoroutine(output):  # pragma: no cover - BaseTool.run awaits its own
                output = asyncio.run(output)
        except (NotApplied, OutcomeUnknown):  # what the tool proved, or knows it cannot
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return error_answer(
                self.operations[send.operation],
                {"error": error},
                reason=f"tool {send.operation} raised {error}",
            )
        finally:
            _SENDING.reset(token)
        cost = self.estimate(send.operation, send.request).amounts
        return Outcome.succeeded(as_json(output), cost=cost)

    def reconcile(self, attempt: RecordedAttempt) -> Evidence | Awaitable[Evidence]:
        lookup = self.lookups.get(attempt.operation)
        if lookup is None:
            return Evidence.indeterminate({"tools": f"{attempt.operation}: no lookup declared"})
        return lookup(attempt)


def _operation(effect: EffectClass | Operation) -> Operation:
    return effect if isinstance(effect, Operation) else Operation(effect)


def _checked(tool: Any) -> BaseTool:
    if not isinstance(tool, BaseTool):
        raise ConfigError(f"{type(tool).__name__} is not a CrewAI tool (BaseTool)")
    if isinstance(tool, _GovernedTool):
        raise ConfigError(f"tool {tool.name!r} is governed already")
    return tool


def _never_cached(arguments: Any = None, result: Any = None) -> bool:
    """CrewAI's tool cache would answer a call without its attempt, shifting
    the occurrences that key the calls after it: Charter's record is the cache."""
    return False


class _GovernedTool(BaseTool):  # type: ignore[misc,unused-ignore]
    """A CrewAI tool whose every call is an attempt of the running node."""

    governed: Any = None  # the CrewTools this tool belongs to

    @classmethod
    def of(cls, governed: CrewTools, tool: BaseTool) -> _GovernedTool:
        made: _GovernedTool = cls(
            name=tool.name,
            description=tool.description,
            args_schema=tool.args_schema,
            result_as_answer=tool.result_as_answer,
            cache_function=_never_cached,
            governed=governed,
        )
        return made

    def _run(self, **arguments: Any) -> Any:
        binding = bound()
        request = as_json(arguments)
        key = binding.tool_key(_TASK.get(), self.name, request)
        try:
            return binding.ctx.attempt(self.governed, self.name, request, key=key)
        except AttemptFailed as exc:
            raise ToolFailed(_shown(exc)) from None


def _shown(failed: AttemptFailed) -> str:
    """What the agent is told of a read-only tool's recorded failure."""
    recorded = failed.details.get("result")
    if isinstance(recorded, dict) and isinstance(recorded.get("error"), str):
        return str(recorded["error"])
    return str(failed.details.get("reason") or failed.message)


def _note_task(context: Any) -> None:
    """CrewAI's before-tool-call hook, which knows the task: keep it for the
    governed tool called next in this thread. It blocks nothing."""
    if BOUND.get(None) is not None:
        _TASK.set(getattr(context, "task", None))


def _governed_everywhere(crew: Any) -> None:
    """Refuse a crew with a call Charter would not see: an agent's model that
    is not a :class:`CrewModel`, a tool that is not governed, or memory,
    knowledge or planning, whose model and embedding calls are not attempts."""
    if crew.memory or crew.planning or crew.knowledge_sources or crew.manager_llm:
        raise ConfigError(
            "memory, planning, knowledge and a manager's model call models outside "
            "Charter; leave them out of a crew run by charter.integrations.crewai.kickoff"
        )
    for agent in crew.agents:
        # read past the deprecated property, which warns on every read
        for llm in (agent.llm, agent.__dict__.get("function_calling_llm")):
            if llm is not None and not isinstance(llm, CrewModel):
                raise ConfigError(
                    f"agent {agent.role!r} calls a model outside Charter; give it a CrewModel",
                    agent=agent.role,
                )
    for holder in (*crew.agents, *crew.tasks):
        for tool in holder.tools or ():
            if not isinstance(tool, _GovernedTool):
                raise ConfigError(
                    f"tool {tool.name!r} is not governed; give it to CrewTools and use its tools",
                    tool=tool.name,
                )


def kickoff(
    ctx: Context, crew: Crew, inputs: Mapping[str, Any] | None = None, *, key: str | None = None
) -> Any:
    """Run ``crew`` as ``crew.kickoff(inputs)`` does, each governed tool and model
    call an attempt of ``ctx``'s node; ``key`` names this crew in the node
    (give each crew of one node its own). Run again after a crash or a wait,
    the crew starts from its first task and every call recorded is answered
    from its record. A Charter stop raises :class:`~charter.Blocked`."""
    _governed_everywhere(crew)
    if not _HOOKED:
        register_before_tool_call_hook(_note_task)
        _HOOKED.append(True)
    base = "/".join(filter(None, (ctx.run_id, ctx.node_id, key)))
    token = BOUND.set(Binding(ctx, base, crew))
    try:
        return crew.kickoff(inputs=dict(inputs or {}))
    finally:
        BOUND.reset(token)
