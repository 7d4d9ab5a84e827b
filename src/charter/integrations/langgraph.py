"""LangGraph on Charter: a graph's tool calls and chat model calls are attempts
(A1-A7), replayed from their records after a crash instead of being made again,
while LangGraph's own checkpointer stays the graph's memory.

A graph runs inside a node, through :func:`invoke` (or :func:`ainvoke`), on a
thread of its own (``<run>/<node>``, or the ``thread_id`` given): the thread's
checkpoints say where the graph stands, Charter's records say what each call
did. Two adapters, each usable on its own (an operator reconciles with them):

- :class:`GovernedTools`, LangChain tools as operations, one per tool, with the
  effect class declared for it (``unsafe`` when undeclared). Its ``tools`` are
  the LangChain tools to give a graph, and :class:`ToolNode` is LangGraph's
  ``ToolNode`` built on them. A call is keyed by its tool call's id, which the
  checkpoint keeps (``<thread>:tool:<id>``).
- :class:`~charter.integrations.langgraph_models.ChatModelCalls`, a LangChain
  chat model's calls, priced as the model adapters price them.

When Charter stops a call (an approval not yet given, an exhausted allowance,
an uncertain outcome waiting for evidence), the graph stops at a LangGraph
``interrupt`` whose value is ``{"charter": {...}}``, saved in its checkpoint,
and the node blocks as any node does. Once a person decided in Charter, the
node runs again and :func:`invoke` resumes the thread with
``Command(resume=...)``; the call is asked again and goes on as Charter now
says. The graph runs with ``durability="sync"``: each step's checkpoint is
written before the next step starts, so the ids of a step's tasks, and the
model calls' keys made from them, are the same after a crash. Needs the
``langgraph`` extra (``pip install 'charter[langgraph]'``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from charter import (
    AttemptFailed,
    Blocked,
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
    from langchain_core.tools import BaseTool, ToolException
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.config import get_config
    from langgraph.prebuilt import ToolNode as _ToolNode
    from langgraph.types import Command, interrupt
    from pydantic import BaseModel, ValidationError
except ImportError:  # pragma: no cover - exercised by a test that hides the extra
    raise MissingExtra(
        "the LangGraph integration needs langgraph and langchain-core: "
        "pip install 'charter[langgraph]'",
        extra="langgraph",
    ) from None

#: The resume value :func:`invoke` answers Charter's own interrupts with.
RESUMED = {"charter": "decided"}
#: The checkpoint metadata naming the node execution that ran a graph.
_MARK = "charter_execution"

ToolCost = Mapping[str, int] | Callable[[Any], Mapping[str, int]]
ToolLookup = Callable[[RecordedAttempt], Evidence | Awaitable[Evidence]]


@dataclasses.dataclass
class Binding:
    """One graph run in one node: its context, its thread, the Charter stop
    that ended it, and how many model calls each task made (their keys)."""

    ctx: Context
    thread: str
    stopped: Blocked | None = None
    turns: dict[str, int] = dataclasses.field(default_factory=dict)

    def model_key(self) -> str:
        """The next model call's key: the LangGraph task making it (stable across
        a resume from the checkpoint) and its turn within that task."""
        config = get_config()
        task = str(config.get("metadata", {}).get("langgraph_checkpoint_ns", ""))
        if not task:
            raise StateError("a governed chat model is called from a graph's node")
        self.turns[task] = self.turns.get(task, 0) + 1
        return f"{self.thread}:model:{task}:{self.turns[task]}"

    def stop(self, blocked: Blocked) -> NoReturn:
        """Stop the graph where Charter stopped the call: a LangGraph interrupt,
        saved in the checkpoint. ``interrupt`` hands back the resume values of
        this task's earlier stops first; the first without one raises."""
        self.stopped = blocked
        value = {
            "charter": {
                "run_id": self.ctx.run_id,
                "attempt_id": blocked.attempt_id,
                "reason": blocked.reason,
            }
        }
        while True:
            interrupt(value)


_BOUND: contextvars.ContextVar[Binding] = contextvars.ContextVar("charter_langgraph")
_SENDING: contextvars.ContextVar[Dispatch] = contextvars.ContextVar("charter_langgraph_sending")
_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "charter_langgraph_call", default=None
)


def bound() -> Binding:
    """The graph run this call belongs to (set by :func:`invoke`)."""
    found = _BOUND.get(None)
    if found is None:
        raise StateError(
            "governed LangGraph calls are made inside a graph run by "
            "charter.integrations.langgraph.invoke (or ainvoke) from a node"
        )
    return found


def current_send() -> Dispatch:
    """The attempt a tool call is being sent as: its idempotency key and fencing
    token, for a tool whose target deduplicates or fences by them."""
    send = _SENDING.get(None)
    if send is None:
        raise StateError("current_send() is for a tool called through GovernedTools")
    return send


def as_json(value: Any) -> Any:
    """A tool's answer as JSON, as the store gives it back (a pydantic model
    dumped, anything JSON cannot hold as its text), so the model is shown the
    same live and on replay."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str, sort_keys=True))


class GovernedTools:
    """LangChain tools as Charter operations, one per tool, by its name.

    ``effects``: each tool's effect class (an :class:`~charter.EffectClass`, or
    an :class:`~charter.Operation` for an ``idempotent_keyed`` tool's dedupe
    window); a tool without one is ``unsafe``: an uncertain call is never
    repeated. A tool's error is read by the one rule
    (:func:`~charter.attempts.classify.error_answer`, A3): a ``read_only``
    tool's call settles FAILED and the model is told (a ``ToolMessage`` with
    status ``error``, on replay too); any other tool's call is UNKNOWN, the
    error kept as evidence, and the graph stops until a lookup or a person
    settles it; a tool raising :class:`~charter.NotApplied` proves it did
    nothing (FAILED). A call records the tool's arguments, whole. ``costs``: a
    tool's estimate, in allowance units, or a function of its arguments giving
    it; a call costs its estimate. ``lookups``: how to
    find out what became of a tool's uncertain call (for ``reconcile``).
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
        #: The tools to give a graph: each call an attempt of the node running it.
        self.tools: list[BaseTool] = [_GovernedTool.of(self, t) for t in self.plain.values()]

    def estimate(self, operation: str, request: Any) -> Estimate:
        cost = self.costs.get(operation, {})
        amounts = cost(request) if callable(cost) else cost
        return Estimate(dict(amounts), f"{self.name}/declared")

    async def dispatch(self, send: Dispatch) -> Outcome:
        tool = self.plain[send.operation]
        send.check_deadline()
        token = _SENDING.set(send)
        try:
            output = await tool.ainvoke(send.request)
        except ValidationError as exc:  # arguments refused before the tool ran
            raise NotApplied(f"the tool refused its arguments: {exc}") from exc
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
        raise ConfigError(f"{type(tool).__name__} is not a LangChain tool (BaseTool)")
    # What the model is asked for leaves injected arguments out.
    asked = convert_to_openai_tool(tool)["function"].get("parameters", {}).get("properties", {})
    injected = set(tool.args) - set(asked)
    if injected:
        raise ConfigError(
            f"tool {tool.name!r} takes injected arguments {sorted(injected)}: a call is "
            "recorded and looked up from its arguments alone, so a governed tool takes "
            "only what the model gives it",
            tool=tool.name,
        )
    return tool


class _GovernedTool(BaseTool):
    """A LangChain tool whose every call is an attempt of the running node,
    keyed by its tool call's id."""

    governed: Any = None  # the GovernedTools this tool belongs to
    handle_tool_error: Any = True  # a read-only tool's recorded failure is told the model

    @classmethod
    def of(cls, governed: GovernedTools, tool: BaseTool) -> _GovernedTool:
        return cls(
            name=tool.name,
            description=tool.description,
            args_schema=tool.args_schema,
            return_direct=tool.return_direct,
            response_format=tool.response_format,
            governed=governed,
        )

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        with _calling(input):
            return super().invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        with _calling(input):
            return await super().ainvoke(input, config, **kwargs)

    def _run(self, **args: Any) -> Any:
        binding, request, key = self._call(args)
        try:
            return binding.ctx.attempt(self.governed, self.name, request, key=key)
        except AttemptFailed as exc:
            raise ToolException(_shown(exc)) from None
        except Blocked as exc:
            binding.stop(exc)

    async def _arun(self, **args: Any) -> Any:
        binding, request, key = self._call(args)
        try:
            return await binding.ctx.aattempt(self.governed, self.name, request, key=key)
        except AttemptFailed as exc:
            raise ToolException(_shown(exc)) from None
        except Blocked as exc:
            binding.stop(exc)

    def _call(self, args: Mapping[str, Any]) -> tuple[Binding, dict[str, Any], str]:
        call_id = _CALL_ID.get()
        if not call_id:
            raise StateError(
                f"tool {self.name!r} is governed per tool call: invoke it with the model's "
                "tool call (as ToolNode does), whose id keys the attempt"
            )
        binding = bound()
        return binding, as_json(dict(args)), f"{binding.thread}:tool:{call_id}"


@contextmanager
def _calling(input: Any) -> Iterator[None]:
    """The tool call's id, for the call made inside (a copy of this context)."""
    call_id = input.get("id") if isinstance(input, dict) and "args" in input else None
    token = _CALL_ID.set(call_id)
    try:
        yield
    finally:
        _CALL_ID.reset(token)


def _shown(failed: AttemptFailed) -> str:
    """What the model is told of a read-only tool's recorded failure."""
    recorded = failed.details.get("result")
    if isinstance(recorded, dict) and isinstance(recorded.get("error"), str):
        return f"Error: {recorded['error']}"
    return f"Error: {failed.details.get('reason') or failed.message}"


class ToolNode(_ToolNode):
    """LangGraph's ``ToolNode``, on the tools of a :class:`GovernedTools`: each
    tool call an attempt. Charter's signals are never a tool's error shown to
    the model (they are not ``Exception``\\s), whatever ``handle_tool_errors``
    says."""

    def __init__(self, tools: GovernedTools, **options: Any) -> None:
        if not isinstance(tools, GovernedTools):
            raise ConfigError("charter's ToolNode takes a GovernedTools")
        super().__init__(tools.tools, **options)
        self.governed = tools


def _config(ctx: Context, config: Mapping[str, Any] | None, key: str | None) -> dict[str, Any]:
    """The graph's config: its thread (this node's, unless given), and the node
    execution running it, kept in each checkpoint's metadata."""
    given = dict(config or {})
    configurable = dict(given.get("configurable") or {})
    configurable.setdefault("thread_id", "/".join(filter(None, (ctx.run_id, ctx.node_id, key))))
    metadata = {**(given.get("metadata") or {}), _MARK: _execution(ctx)}
    return {**given, "configurable": configurable, "metadata": metadata}


def _execution(ctx: Context) -> str:
    return f"{ctx.run_id}/{ctx.node_id}/{ctx.execution}"


def _next_input(ctx: Context, state: Any, input: Any) -> tuple[bool, Any]:
    """What to send the graph: the resume of Charter's own interrupt, nothing
    (go on from the checkpoint this execution left), or ``input``; and whether
    this execution already ran the graph to its end (nothing to send)."""
    ours = (state.metadata or {}).get(_MARK) == _execution(ctx)
    if any(_charters(i.value) for i in state.interrupts):
        return False, Command(resume=RESUMED)
    if ours:
        return not state.next, None
    return False, input


def _charters(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("charter"), dict)


def invoke(
    ctx: Context,
    graph: Any,
    input: Any,
    config: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    **options: Any,
) -> Any:
    """Run ``graph`` (compiled, with a checkpointer) as ``graph.invoke`` does,
    each governed tool and model call an attempt of ``ctx``'s node.

    The thread is ``config``'s ``thread_id``, else ``<run>/<node>[/<key>]``. Run
    again after a crash or a wait, it goes on from the thread's checkpoint
    (resuming Charter's interrupt with ``Command(resume=...)``), and a graph
    this execution already ran to its end is not run again: its state is
    returned. A Charter stop raises :class:`~charter.Blocked` once the graph
    has saved its interrupt."""
    cfg = _config(ctx, config, key)
    done, sent = _next_input(ctx, graph.get_state(cfg), input)
    if done:
        return graph.get_state(cfg).values
    binding = Binding(ctx, cfg["configurable"]["thread_id"])
    token = _BOUND.set(binding)
    try:
        result = graph.invoke(sent, cfg, durability="sync", **options)
    finally:
        _BOUND.reset(token)
    if binding.stopped is not None:
        raise binding.stopped
    return result


async def ainvoke(
    ctx: Context,
    graph: Any,
    input: Any,
    config: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    **options: Any,
) -> Any:
    """:func:`invoke` for an async node: ``graph.ainvoke``."""
    cfg = _config(ctx, config, key)
    done, sent = _next_input(ctx, await graph.aget_state(cfg), input)
    if done:
        return (await graph.aget_state(cfg)).values
    binding = Binding(ctx, cfg["configurable"]["thread_id"])
    token = _BOUND.set(binding)
    try:
        result = await graph.ainvoke(sent, cfg, durability="sync", **options)
    finally:
        _BOUND.reset(token)
    if binding.stopped is not None:
        raise binding.stopped
    return result
